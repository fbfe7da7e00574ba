"""FP8 attention backward as a recipe (``attention_bwd(..., recipe=)``, spec
``attention_bwd_fp8``): the front end's validation and dispatch, the torch emulation judged
by the attention tier's FP8 terms, and a simulated flash backend that rounds P^T and dS^T to
E4M3 with a dynamic per-block scale (AITER's scheme, tiers/attention.py "FP8") passing, while
its seeded bugs (dS not descaled, P's descale applied twice, dS cast without its scale, do's
descale doubled) fail.  No AITER needed (the real kernel: tests/test_aiter_attention.py)."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite import registry
from tealite.backends.torch import attention as TA
from tealite.types import Op
from tealite_verify.runner import run_case
from tealite_verify.specs import attention_fp8 as fp8spec
from tealite_verify.specs import get_spec

E4M3 = torch.float8_e4m3fn
FMAX = float(torch.finfo(E4M3).max)
BLOCK = 8  # the simulated kernel's tile edge (query rows x keys): several tiles per case
CASES = (fp8spec.make_case("bshd", "none", "float32", d_qk=16, d_v=16),
         fp8spec.make_case("sbhd", "causal_bottom_right", "bfloat16", sq=7, sk=12, heads_kv=1,
                           d_qk=16, d_v=16),
         fp8spec.make_case("bshd", "causal", "float16", sq=11, sk=11, d_qk=16, d_v=16,
                           dist_dout={"kind": "normal", "scale": 1e-3}))
IDS = ["bshd-fp32", "sbhd-bf16-br", "bshd-fp16-small-dout"]


def _report(case, backends=("torch",)):
    return run_case(get_spec(fp8spec.BWD_NAME), case, backends=list(backends), device="cpu")


def _fails(rep, backend) -> set[str]:
    return {c.output for c in rep.failures if c.lhs == backend and c.rhs == "reference"}


# ---- front end -----------------------------------------------------------------------------

def _bwd_args(dtype=torch.float16):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 5, 2, 8, generator=g).to(dtype) for _ in range(4))
    out, lse = tealite.attention_fwd(q, k, v, backend="torch")
    return do, q, k, v, out, lse


@pytest.mark.parametrize("recipe", [R.Float8CurrentScaling(granularity="row"),
                                    R.DelayedScaling(), R.MXBlockScaling(), "e4m3"])
def test_the_backward_takes_only_the_forwards_recipe(recipe):
    with pytest.raises(tealite.TealiteArgumentError, match="recipe must be a per-tensor FP8"):
        tealite.attention_bwd(*_bwd_args(), recipe=recipe, backend="torch")


def test_a_recipe_case_dispatches_attention_bwd_fp8():
    args = _bwd_args()
    with registry.trace() as records:
        tealite.attention_bwd(*args, recipe=R.Float8CurrentScaling(), backend="torch")
        tealite.attention_bwd(*args, backend="torch")
    assert [r.op for r in records] == [Op.ATTENTION_BWD_FP8.value, Op.ATTENTION_BWD.value]


def test_the_emulation_is_the_backward_of_the_dequantized_operands():
    do, q, k, v, out, lse = _bwd_args()
    rec = R.Float8CurrentScaling()
    got = tealite.attention_bwd(do, q, k, v, out, lse, recipe=rec, backend="torch")
    deq = [TA.fp8_dequantized(t, rec) for t in (do, q, k, v)]
    want = tealite.attention_bwd(*deq, out.float(), lse, backend="torch")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.half(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["triton", "sdpa", "aiter"])
def test_backends_without_fp8_attention_backward_never_see_a_recipe(backend):
    b = registry.get_backend(backend)
    assert Op.ATTENTION_BWD.value in b.impls and Op.ATTENTION_BWD_FP8.value not in b.impls


# ---- the torch emulation -------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_emulation_passes_and_a_wrong_operand_scale_is_caught(case, monkeypatch):
    """The emulation passes; dout dequantized with its scale instead of its descale (codes *
    scale), or nothing quantized at all, fails."""
    rep = _report(case)
    assert rep.verdict == "pass", rep.describe()
    good = TA.fp8_dequantized
    calls = []

    def dout_scale_for_descale(t, r):  # called for dout, q, k, v in that order
        calls.append(t)
        s = FMAX / float(t.abs().amax())
        return good(t, r) * (s * s if len(calls) % 4 == 1 else 1.0)

    for wrong in (dout_scale_for_descale, lambda t, r: t.float()):
        monkeypatch.setattr(TA, "fp8_dequantized", wrong)
        assert _fails(_report(case), "torch"), wrong


# ---- a simulated flash backend: AITER's FP8 scheme with exact casts -------------------------

def _block_quantized(x: torch.Tensor, bug: str | None = None) -> torch.Tensor:
    """x (h, rows, cols) through E4M3 per BLOCK x BLOCK tile with the dynamic scale
    FMAX / max(|tile|, 1e-9), descaled after (AITER's _compute_fp8_scaling_factors)."""
    out = torch.empty_like(x)
    for i in range(0, x.shape[-2], BLOCK):
        for j in range(0, x.shape[-1], BLOCK):
            t = x[..., i:i + BLOCK, j:j + BLOCK]
            amax = t.abs().amax().clamp_min(1e-9)
            if bug == "no_scale":
                out[..., i:i + BLOCK, j:j + BLOCK] = t.to(E4M3).float()
                continue
            codes = (t * (FMAX / amax)).to(E4M3).float()
            descale = amax / FMAX
            if bug == "not_descaled":
                descale = 1.0
            elif bug == "descale_twice":
                descale = descale * descale
            out[..., i:i + BLOCK, j:j + BLOCK] = codes * descale
    return out


def _simulated_bwd(bug: str | None, where: str):
    """A flash-style FP8 backward (any layout and mask): the torch emulation's
    per-sequence algebra with P^T and dS^T block-quantized before the products; ``bug``
    seeded into ``where`` ("p" or "ds")."""
    def fn(dout, q, k, v, out, lse, config):
        rec = config.recipe
        do8, q8, k8, v8 = (TA.fp8_dequantized(t, rec) for t in (dout, q, k, v))
        if bug == "do_descale_doubled":
            do8 = do8 * 2
        group = q.shape[-2] // k.shape[-2]
        grads = [torch.zeros(t.shape, dtype=torch.float32) for t in (q, k, v)]
        gq, gk, gv = (TA._as_bshd(g, config.layout) for g in grads)
        dob, ob = TA._as_bshd(do8, config.layout), TA._as_bshd(out.float(), config.layout)
        for i, qi, ki, qb, kb, vb, lq, lk in TA._sequences(q8, k8, v8, config):
            qh, kh, vh = (TA._heads_first(qb[qi]), TA._heads_first(kb[ki], group),
                          TA._heads_first(vb[ki], group))
            s = TA._scores(qh, kh, config, i, lq, lk)
            row_lse = lse[TA._lse_index(config, i, qi)][..., None]
            p = torch.where(torch.isfinite(row_lse), torch.exp(s - row_lse), 0.0)
            do_h, o_h = TA._heads_first(dob[qi]), TA._heads_first(ob[qi])
            ds = p * (do_h @ vh.transpose(-1, -2) - (do_h * o_h).sum(-1)[..., None])
            pq = _block_quantized(p, bug if where == "p" else None)
            dsq = _block_quantized(ds, bug if where == "ds" else None)
            gq[qi] = (dsq @ kh * config.softmax_scale).transpose(0, 1)
            gk[ki] = TA._group_sum(dsq.transpose(-1, -2) @ qh * config.softmax_scale,
                                   group).transpose(0, 1)
            gv[ki] = TA._group_sum(pq.transpose(-1, -2) @ do_h, group).transpose(0, 1)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
    return fn


NUMERICS = {"compute_dtype": torch.float32, "attention_p_rounded_to": E4M3,
            "attention_ds_rounded_to": E4M3, "attention_dynamic_block_scale": True,
            "amax_floor": 1e-9}
SIM = "_t_fp8_flash_bwd"


@pytest.fixture
def simulated():
    def make(bug=None, where="ds", numerics=NUMERICS):
        backend = registry.Backend(name=SIM)
        backend.implements(Op.ATTENTION_BWD_FP8, numerics=numerics)(_simulated_bwd(bug, where))
        registry.register_backend(backend, replace=True)
        return SIM
    try:
        yield make
    finally:
        registry.unregister_backend(SIM)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_simulated_flash_fp8_backward_passes(case, simulated):
    rep = _report(case, backends=(simulated(),))
    assert rep.verdict == "pass", rep.describe()


@pytest.mark.parametrize("bug, where, outputs", [
    ("not_descaled", "ds", {"dq", "dk"}),
    ("descale_twice", "p", {"dv"}),
    ("no_scale", "ds", {"dq", "dk"}),
    ("do_descale_doubled", "ds", {"dq", "dk", "dv"}),
])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_simulated_bug_is_caught(case, bug, where, outputs, simulated):
    if bug == "no_scale" and case["dist_dout"]["scale"] >= 1:
        pytest.skip("dS large enough for E4M3's normal range: a missing scale rounds "
                    "legitimately (the small-dout case shows the underflow)")
    rep = _report(case, backends=(simulated(bug, where),))
    assert _fails(rep, SIM) >= outputs, rep.describe()


def test_the_block_descale_of_the_subnormal_term_is_what_catches_a_missing_scale(simulated):
    """dS ~ 1e-6 (dout ~ 1e-3) cast to E4M3 without its dynamic scale underflows to 0 or a
    few subnormal codes: judged with the block-scaled absolute term it fails; declared
    without the dynamic scale (a blanket half subnormal step, 2^-10 per element) the same
    kernel passes -- the term must scale with the block's descale."""
    bad = _report(CASES[2], backends=(simulated("no_scale", "ds"),))
    assert _fails(bad, SIM) >= {"dq", "dk"}, bad.describe()
    blanket = {k: v for k, v in NUMERICS.items() if k != "attention_dynamic_block_scale"}
    covered = _report(CASES[2], backends=(simulated("no_scale", "ds", blanket),))
    assert covered.verdict == "pass", covered.describe()
