"""AITER's quantized GEMMs as the ``aiter_triton`` backend's ``qgemm`` (under Triton's CPU
interpreter in CI with ``$TEALITE_AITER_PATH`` set, or on a GPU): each entry point on the
cases it is routed, the preshuffled MXFP4 layouts produced from plain operands, rejections
with their reasons, a missing entry point (no fallback to another), seeded wrong variants the
harness must catch, and the AITER config-cache mutation the backend guards against."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tealite import recipes as R
from tealite import registry
from tealite.backends.aiter_common.contracts import contracts
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import INTERPRET
from tealite.ops.layouts import unshuffle_e8m0_scales
from tealite_verify import profiles
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_aiter import mine_failed, ran, seeded_variant_is_caught
from tealite_verify.strategies.recipes import recipe_from_json, recipes

AT = registry.get_backend("aiter_triton")
REASON = AT.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"aiter_triton unavailable: {REASON}")
DEV = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("qgemm")
PEERS = ["aiter_triton", "torch"]
OUT = "float32" if INTERPRET else "bfloat16"  # bf16 outputs are rejected by the interpreter
# The MXFP4 GEMMs' K step (AITER's EVEN_K: whole steps only): 32 under the interpreter's capped
# configs, 256 in AITER's tuned configs on a GPU (every MI350X AFP4WFP4 config has BLOCK_SIZE_K
# 256; a K of 32 on the H100 was rejected as "not a whole number of its 256-long K steps").
MX_K_STEP = 32 if INTERPRET else 256

if REASON is None:
    from tealite.backends.aiter_triton import kernels
    from tealite.backends.aiter_triton import _qgemm_configs as QC
    from tealite.backends.aiter_triton import qgemm as Q
    FP8 = {"e4m3fn": "e4m3", "e4m3fnuz": "e4m3fnuz"}[str(kernels().fp8_dtype).split("_")[-1]]
else:
    FP8 = "e4m3"


def _cur(gran="tensor", fmt=None):
    return {"kind": "current", "fmt": fmt or FP8, "granularity": gran,
            "force_pow2_scales": False, "amax_epsilon": 0.0}


def _delayed(scale=2.0):
    return {"kind": "delayed", "fmt": FP8, "scale": scale}


def _blk(block=(128, 128), pow2=True):
    return {"kind": "block", "fmt": FP8, "block": list(block), "force_pow2_scales": pow2,
            "amax_epsilon": 0.0}


def _mx(fmt="e2m1"):
    return {"kind": "mx", "fmt": fmt, "scale_rounding": "floor", "element_rounding": "rne"}


def _case(ra, rb, layout, m, n, k, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k, "layout": layout,
            "dtype": "bfloat16", "out_dtype": OUT, "bias": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 11}
    case.update(kw)
    return case


def _run(case, backends=PEERS):
    return run_case(SPEC, case, backends=backends, device=DEV)


# ---- each entry point on the cases routed to it ------------------------------------------------

CASES = {
    "a8w8-tensor-TN-k-tail": (_case(_cur(), _cur(), "TN", 29, 48, 257), "gemm_a8w8"),
    "a8w8-row-bias-NN": (_case(_cur("row"), _cur(), "NN", 33, 17, 96, bias=True), "gemm_a8w8"),
    "a8w8-delayed-fp16": (_case(_delayed(), _cur(), "TT", 20, 40, 100, out_dtype="float16"),
                          "gemm_a8w8"),
    "per-token-row-NT": (_case(_cur("row"), _cur("row"), "NT", 33, 17, 96),
                         "gemm_a8w8_per_token_scale"),
    "per-token-mixed-TT": (_case(_delayed(0.5), _cur("row"), "TT", 18, 35, 70),
                           "gemm_a8w8_per_token_scale"),
    "blockscale-128x128-NT": (_case(_blk(), _blk((1, 128)), "NT", 20, 130, 300),
                              "gemm_a8w8_blockscale"),
    "blockscale-1x128-weights": (_case(_blk((1, 128)), _blk((1, 128)), "TN", 20, 33, 64),
                                 "gemm_a8w8_blockscale"),
    # MXFP4 shapes with K % 256 == 0: on a GPU AITER's 256-long K step rejects the others.
    "mxfp4-plain-split-k": (_case(_mx(), _mx(), "TN", 16, 24, 256), "gemm_afp4wfp4"),
    "mxfp4-plain-NN": (_case(_mx(), _mx(), "NN", 20, 40, 512), "gemm_afp4wfp4"),
    "mxfp4-shuffled-scales": (_case(_mx(), _mx(), "NT", 40, 24, 256),
                              "gemm_afp4wfp4_preshuffled_scales"),
    "mxfp4-shuffled-weight-small-m": (_case(_mx(), _mx(), "TT", 29, 64, 256),
                                      "gemm_afp4wfp4_preshuffled_weight_scales"),
    "mxfp4-shuffled-weight-ragged-n-tile": (_case(_mx(), _mx(), "TN", 40, 96, 512),
                                            "gemm_afp4wfp4_preshuffled_weight_scales"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_entry_point_matches_the_reference(name):
    case, entry = CASES[name]
    report = _run(case)
    assert ran(report).numerics.entry_point == entry
    assert report.verdict == "pass", report.describe()


@pytest.mark.parametrize("entry", ["gemm_afp4wfp4", "gemm_afp4wfp4_preshuffled_scales",
                                   "gemm_afp4wfp4_preshuffled_weight_scales"])
def test_every_mxfp4_entry_point_runs_the_same_case(entry):
    """One shape all three accept (M >= 32, N % 32 == 0, K % 256 == 0), forced to each."""
    with Q.ROUTING.override(mxfp4_preference=(entry,)):
        report = _run(_case(_mx(), _mx(), "NN", 33, 32, 256))
    assert ran(report).numerics.entry_point == entry
    assert report.verdict == "pass", report.describe()


def _aiter_recipes(draw, kind: str):
    if kind == "fp8":
        r = [draw(recipes((R.Float8CurrentScaling, R.DelayedScaling))) for _ in range(2)]
        return [dict(x, fmt=FP8) for x in r]
    if kind == "block":
        a = dict(draw(recipes((R.Float8BlockScaling,))), fmt=FP8)
        return [a, dict(draw(recipes((R.Float8BlockScaling,))), block=[1, 128], fmt=FP8)]
    return [dict(draw(recipes((R.MXBlockScaling,))), fmt="e2m1") for _ in range(2)]


@st.composite
def aiter_cases(draw):
    """The spec's cases with recipes AITER's GEMMs take (its FP8 dtype, MXFP4) and the shapes
    its kernels accept (blockscale: K a power of two >= 16 or > 128; MXFP4: K whole K steps;
    bias only for FP8)."""
    case = draw(SPEC.cases(None, profiles.shape_size()))
    kind = draw(st.sampled_from(["fp8", "block", "mx"]))
    ra, rb = _aiter_recipes(draw, kind)
    k = case["k"]
    if kind == "block" and k < 128:
        k = draw(st.sampled_from([16, 32, 64, 128]))
    if kind == "mx":
        k = MX_K_STEP * max(1, k // MX_K_STEP)
    out_dtype = "float32" if INTERPRET and case["out_dtype"] == "bfloat16" else case["out_dtype"]
    return dict(case, recipe_a=ra, recipe_b=rb, k=k, out_dtype=out_dtype,
                bias=case["bias"] and kind == "fp8")


@given(case=aiter_cases())
@settings(settings())
def test_drawn_cases_aiter_accepts_match_reference_and_torch(case):
    report = _run(case)
    ran(report)
    assert not mine_failed(report), report.describe()


# ---- rejections ------------------------------------------------------------------------------

def _params(case) -> dict:
    ra, rb = recipe_from_json(case["recipe_a"]), recipe_from_json(case["recipe_b"])
    kind = {"current": "fp8", "delayed": "fp8"}.get(case["recipe_a"]["kind"],
                                                   case["recipe_a"]["kind"])
    out = getattr(torch, case["out_dtype"])
    return dict(kind=kind, m=case["m"], n=case["n"], k=case["k"], layout=case["layout"],
                out_dtype=out, dtype=out, fmt_a=ra.fmt, fmt_b=rb.fmt, recipe_a=ra, recipe_b=rb,
                bias=case["bias"], device=DEV)


REJECTED = {
    "e5m2": (_case(_cur(fmt="e5m2"), _cur(), "TN", 8, 16, 64), "AITER's FP8 GEMMs take"),
    "other-fp8-variant": (_case(_cur(), _cur(fmt="e4m3fnuz" if FP8 == "e4m3" else "e4m3"),
                                "TN", 8, 16, 64), "AITER's FP8 GEMMs take"),
    "mxfp8": (_case(_mx("e4m3"), _mx("e4m3"), "TN", 8, 16, 64), "no MXFP8 entry point"),
    "blockscale-bias": (_case(_blk(), _blk((1, 128)), "TN", 8, 16, 256, bias=True),
                        "no bias epilogue"),
    "mxfp4-bias": (_case(_mx(), _mx(), "TN", 8, 16, 64, bias=True), "no bias epilogue"),
    "blockscale-k-not-a-scale-block": (_case(_blk(), _blk((1, 128)), "TN", 8, 16, 100),
                                       "GROUP_K=128"),
    "per-token-empty-k": (_case(_cur("row"), _cur("row"), "TN", 8, 16, 0), "K == 0"),
    "mxfp4-k-not-32": (_case(_mx(), _mx(), "TN", 8, 16, 48), "not a multiple of 32"),
}
if INTERPRET:
    REJECTED["bf16-output-interpreter"] = (
        _case(_cur(), _cur(), "TN", 8, 16, 64, out_dtype="bfloat16"), "truncates")


@pytest.mark.parametrize("name", list(REJECTED))
def test_unsupported_cases_are_rejected_with_the_reason(name):
    case, why = REJECTED[name]
    reason = AT.why_unsupported("qgemm", _params(case))
    assert reason is not None and why in reason, reason


def test_ragged_mxfp4_k_step_is_rejected_for_unmasked_scale_loads(monkeypatch):
    """With a 64-long K step in the interpreter (AITER's own 256-long one on a GPU), K = 96
    leaves a ragged last step: AITER would read E8M0 scale bytes past K/32 (unmasked loads).
    K = 256 is whole steps either way."""
    monkeypatch.setitem(QC._CAPS, "gemm_afp4wfp4", {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32,
                                                   "BLOCK_SIZE_K": 64})
    reason = AT.why_unsupported("qgemm", _params(_case(_mx(), _mx(), "TN", 16, 20, 96)))
    assert reason is not None and "EVEN_K" in reason, reason
    assert AT.why_unsupported("qgemm", _params(_case(_mx(), _mx(), "TN", 16, 20, 256))) is None


def test_missing_entry_point_rejects_its_cases_without_fallback(monkeypatch):
    at = kernels()
    entry = "gemm_a8w8_per_token_scale"
    monkeypatch.delitem(at.functions, entry)
    monkeypatch.setitem(at.missing, entry, "no such module (test)")
    row = _run(_case(_cur("row"), _cur("row"), "TN", 8, 16, 64), backends=["aiter_triton"])
    outcome = row.outcomes["aiter_triton"]
    assert outcome.status == "unsupported"
    assert f"lacks {entry}: no such module (test)" in outcome.reason
    # gemm_a8w8 still runs the cases routed to it (per-tensor), and only those.
    tensor = _run(_case(_cur(), _cur(), "TN", 8, 16, 64))
    assert tensor.outcomes["aiter_triton"].numerics.entry_point == "gemm_a8w8"
    assert tensor.verdict == "pass", tensor.describe()


def test_contracts_are_declared_for_every_entry_point():
    declared = {c.entry_point: c for c in contracts("aiter_triton") if c.op == "qgemm"}
    assert set(declared) == {"gemm_a8w8", "gemm_a8w8_per_token_scale", "gemm_a8w8_blockscale",
                             "gemm_afp4wfp4", "gemm_afp4wfp4_preshuffled_scales",
                             "gemm_afp4wfp4_preshuffled_weight_scales"}
    for c in declared.values():
        assert c.layouts and c.scale_rule == "given"
    assert declared["gemm_a8w8"].fp8 == "arch"
    assert any("e8m0_shuffle" in s for s in declared["gemm_afp4wfp4_preshuffled_scales"].layouts)
    assert any("shuffle_weight" in s
               for s in declared["gemm_afp4wfp4_preshuffled_weight_scales"].layouts)


# ---- seeded wrong variants ----------------------------------------------------------------------

def _w_scale_doubled(fn):  # gemm_a8w8(x, w, x_scale, w_scale, ...)
    return lambda x, w, xs, ws, **kw: fn(x, w, xs, ws * 2, **kw)


def _x_scale_off_by_one_row(fn):  # per-token: each row gets its neighbour's scale
    return lambda x, w, xs, ws, **kw: fn(x, w, torch.roll(xs, 1, 0).contiguous(), ws, **kw)


def _block_scales_transposed(fn):  # blockscale: w_scale's grid read the other way round
    return lambda x, w, xs, ws, **kw: fn(x, w, xs, ws.t().contiguous(), **kw)


def _nibbles_swapped(fn):  # fp4: odd / even element order of the packed bytes reversed
    return lambda x, w, xs, ws, **kw: fn(((x << 4) | (x >> 4)).contiguous(), w, xs, ws, **kw)


def _scales_unshuffled(fn):  # preshuffled: AITER handed plain (padded) scales instead
    def wrong(x, w, xs, ws, **kw):
        plain = unshuffle_e8m0_scales(ws.reshape(-1, ws.shape[1] // 32),
                                      ws.shape[0] * 32, ws.shape[1] // 32, backend="torch")
        return fn(x, w, xs, plain.reshape(ws.shape), **kw)
    return wrong


SEEDED = {
    "a8w8-w-scale": ("gemm_a8w8", _w_scale_doubled,
                     _case(_cur("row"), _cur(), "TN", 20, 24, 64, bias=True)),
    "per-token-x-scale": ("gemm_a8w8_per_token_scale", _x_scale_off_by_one_row,
                          _case(_cur("row"), _cur("row"), "NN", 20, 24, 64)),
    "blockscale-w-scale-grid": ("gemm_a8w8_blockscale", _block_scales_transposed,
                                # not pow2: power-of-two block scales are often all equal
                                _case(_blk(pow2=False), _blk((1, 128)), "TN", 20, 256, 256)),
    "fp4-nibble-order": ("gemm_afp4wfp4", _nibbles_swapped,
                         _case(_mx(), _mx(), "TN", 16, 24, 256)),
    "fp4-scale-layout": ("gemm_afp4wfp4_preshuffled_scales", _scales_unshuffled,
                         _case(_mx(), _mx(), "NT", 40, 24, 256)),
}


@pytest.mark.parametrize("name", list(SEEDED))
def test_seeded_wrong_variant_is_caught_and_the_correct_one_passes(monkeypatch, name):
    entry, wrap, case = SEEDED[name]
    outcome = seeded_variant_is_caught(_run, kernels().functions, entry, wrap, case,
                                       monkeypatch)
    assert outcome.numerics.entry_point == entry


# ---- the AITER config-cache mutation the backend avoids ---------------------------------------

def test_aiter_wrappers_mutate_their_cached_config_so_the_backend_passes_copies():
    """gemm_a8w8_per_token_scale with config=None writes its BLOCK_SIZE_K shrink (K = 32) into
    the dict _get_config's cache returns: every later call then uses BLOCK_SIZE_K = 32.  The
    backend always passes its own copy (and the cache is restored here)."""
    entry = "gemm_a8w8_per_token_scale"
    get_config = Q.aiter_module(entry)._get_config
    saved = copy.deepcopy(get_config._config_dict)
    try:
        get_config.cache_clear()
        before = get_config(16, 32, 256)["BLOCK_SIZE_K"]
        x = torch.ones(16, 32, device=DEV).to(kernels().fp8_dtype)
        w = torch.ones(32, 32, device=DEV).to(kernels().fp8_dtype)
        ones = torch.ones(16, 1, device=DEV), torch.ones(32, 1, device=DEV)
        kernels().functions[entry](x, w, *ones, dtype=torch.float32)
        after = get_config(16, 32, 256)["BLOCK_SIZE_K"]
        assert before > 32 and after == 32
    finally:
        get_config._config_dict = saved
        get_config.cache_clear()


@pytest.mark.parametrize("entry", ["gemm_a8w8_per_token_scale", "gemm_a8w8_blockscale"])
def test_split_k_that_is_not_whole_k_steps_is_rejected_and_would_be_wrong(monkeypatch, entry):
    """A tuned config with NUM_KSPLIT = 2 at K = 300 splits K into 150-long parts of 128-long
    steps: AITER's kernel then sums overlapping K ranges (proved here on its own output), so
    the backend rejects such a config (AITER's default MI350X configs do not split)."""
    m, n, k = 16, 32, 300
    g = torch.Generator().manual_seed(0)
    fp8 = kernels().fp8_dtype
    x = torch.randint(-3, 4, (m, k), generator=g).float().to(fp8).to(DEV)
    w = torch.randint(-3, 4, (n, k), generator=g).float().to(fp8).to(DEV)
    cfg = dict(QC.aiter_config(entry, m, n, k), NUM_KSPLIT=2)
    scales = ((torch.ones(m, 1), torch.ones(n, 1)) if entry == "gemm_a8w8_per_token_scale"
              else (torch.ones(m, 3), torch.ones(1, 3)))
    y = kernels().functions[entry](x, w, *(s.to(DEV) for s in scales), dtype=torch.float32,
                                   config=cfg)
    exact = x.double() @ w.double().t()  # small integers: every partial sum is exact
    assert (y.double() - exact).abs().max() > 1.0
    split = QC.aiter_config

    def two_splits(e, *args, **kw):
        return dict(split(e, *args, **kw), NUM_KSPLIT=2)

    monkeypatch.setattr(QC, "aiter_config", two_splits)
    case = (_case(_cur("row"), _cur("row"), "TN", m, n, k) if entry.endswith("token")
            else _case(_blk(), _blk((1, 128)), "TN", m, n, k))
    reason = AT.why_unsupported("qgemm", _params(case))
    assert reason is not None and "overlapping K ranges" in reason, reason


def test_an_fp8_k_step_below_nvidias_dot_minimum_is_refused_there():
    """Found by fuzzing on an H100: blockscale with K = 9 shrank AITER's K step to 16, and
    NVIDIA's FP8 tl.dot refuses K < 32 at compile time (the backend raised).  Refused on
    NVIDIA with the reason; other platforms (the interpreter here) still run it."""
    p = {"m": 4, "n": 8, "k": 9, "bias": False, "device": "cuda"}
    with aiter_triton.PLATFORM.override(nvidia=False):  # the interpreter / ROCm
        assert Q._entry_reason(Q.A8W8_BLOCK, p) is None
    with aiter_triton.PLATFORM.override(nvidia=True):
        why = Q._entry_reason(Q.A8W8_BLOCK, p)
        assert why is not None and "below the 32 NVIDIA's FP8 tl.dot compiles" in why
        big = dict(p, k=256)
        assert Q._entry_reason(Q.A8W8_BLOCK, big) is None  # a whole 128-long K step is fine


def test_blockscale_on_nvidia_declares_a_restart_per_k_step():
    """a8w8_blockscale starts a fresh FP8 dot per K step (its BLOCK_SIZE_K) and adds the
    scaled partials: on NVIDIA it declares the step as ``mma_restart_k`` so the harness sums
    the subnormal-code lift per block (tests/test_fp8_mma_block_restart.py)."""
    p = dict(_params(_case(_blk(), _blk((1, 128)), "TN", 20, 256, 1024)), device="cuda")
    with aiter_triton.PLATFORM.override(nvidia=True):
        num = Q._numerics(p)
    assert num["alignment_floor"] == "fp8_codes"
    step = QC.effective_config(Q.A8W8_BLOCK, 20, 256, 1024)["BLOCK_SIZE_K"]
    assert num["mma_restart_k"] == step
    with aiter_triton.PLATFORM.override(nvidia=False):  # AMD MFMA: no alignment model
        assert "mma_restart_k" not in Q._numerics(p)
