"""The ``aiter_triton`` fused norm / activation -> quantize entry points, and the judge's
knobs for AITER's conventions (tealite_verify/tiers/code_interval.py).

Without AITER: torch stand-ins that follow each declared AITER convention pass when they
declare it and fail when they do not (the knobs are real), and MXFP4 / AITER's rule are fused
recipes.  With AITER (``$TEALITE_AITER_PATH``, on a GPU or under ``TRITON_INTERPRET=1``): the
MXFP4 entry points pass the harness and seeded wrong variants are caught; a missing entry point
is rejected with the loader's reason; the FP8 entry points, rejected under the interpreter, are
shown to differ there only by the interpreter's fp32 -> fp8 cast (strict xfail).  On NVIDIA the
MXFP4 entry points are rejected (AITER's E8M0 byte comes from a negative float -> uint8 cast that
NVIDIA saturates: ``NVIDIA_MXFP4_SCALE_CAST``); their tests run there with the rejection lifted,
as strict expected failures on exactly the cases that reach that cast (derived on the CPU).
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tealite import recipes as R
from tealite import registry
from tealite.backends import aiter_triton
from tealite.backends.aiter_common import contracts
from tealite.backends.aiter_triton import INTERPRET, NAME
from tealite.backends.aiter_triton import fused as F
from tealite.backends.torch import norms as TNORM
from tealite.formats import FP8ScaleRule, get_format
from tealite.ops.quantize import QuantizedTensor
from tealite_verify.runner import run_case
from tealite_verify.specs import activations as act_spec
from tealite_verify.specs import get_spec
from tealite_verify.specs import norms as norm_spec
from tealite_verify.specs.act_quant import AITER_KINDS
from tealite_verify.specs.norm_quant import fit_to_recipe

BACKEND = registry.get_backend(NAME)
REASON = BACKEND.unavailable_reason()
needs_aiter = pytest.mark.skipif(REASON is not None, reason=f"aiter_triton: {REASON}")
DEV = "cpu" if INTERPRET or REASON is not None else "cuda"
ON_NVIDIA = DEV == "cuda" and torch.version.hip is None
SCALE_CAST = aiter_triton.NVIDIA_MXFP4_SCALE_CAST
# AITER's MXFP4 on NVIDIA, run with the rejection lifted, where it is wrong: strict.
nvidia_xfail = pytest.mark.xfail(ON_NVIDIA, strict=True, raises=AssertionError,
                                 reason=SCALE_CAST)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)

MXFP4 = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even", "element_rounding": "ties_away"}
ROW = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
       "amax_epsilon": 0.0, "saturation": "saturate", "scale_rule": "amax/fmax"}
# 7: fl32(1 / fl32(1 / 7)) != 7, so a kernel taking scale_inv multiplies by another value.
GIVEN = {"kind": "delayed", "fmt": "e4m3", "scale": 7.0, "saturation": "saturate"}
ZERO_ROWS = {"kind": "zero_rows", "scale": 1.0, "frac": 0.25}


def norm_case(op, recipe, *, shape=(6, 128), dtype="float32", **kw):
    c = {"shape": list(shape), "dtype": dtype, "weight_dtype": dtype,
         "zero_centered_gamma": False, "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0},
         "seed": 3, "recipe": recipe, "return_stats": False, "return_amax": False}
    if op == "layernorm_fwd_quantize":
        c["offset"] = 0.0
    c.update(kw)
    return c


def act_case(kind, recipe, *, shape=(5, 128), dtype="float32", **kw):
    c = {"kind": kind, "shape": list(shape), "dtype": dtype, "seed": 1, "recipe": recipe,
         "dist": {"kind": "normal", "scale": 2.0}, "return_amax": False}
    c.update(kw)
    return c


def report(op, c, backends):
    return run_case(get_spec(op), c, backends=backends, device=DEV)


def failed_outputs(rep, backend) -> set[str]:
    return {c.output for c in rep.failures if c.lhs == backend and c.rhs == "reference"}


# ---- the judge's knobs for AITER's conventions, with torch stand-ins (no AITER needed) -----------

def _aiter_rule_rows(y32, recipe, *, zero_as_one=False, floor=0.0, sinv_ulps=0):
    """AITER's per-row FP8 in torch: scale_inv = max(amax, floor) / max (optionally 0 -> 1,
    or moved ``sinv_ulps`` fp32 steps up), codes = RNE(y * (1 / scale_inv))."""
    y2 = y32.reshape(-1, y32.shape[-1])
    fmt = get_format(recipe.fmt)
    amax = y2.abs().amax(dim=1) if y2.shape[1] else y2.new_zeros(y2.shape[0])
    # A tensor divisor: CUDA torch divides by a CPU scalar as a * fl32(1 / b) (one rounding
    # more: 1e-10 / 448 lands an ulp off), and the stand-in must be AITER's IEEE division.
    sinv = torch.clamp(amax, min=floor) / torch.full_like(amax, fmt.max)
    for _ in range(sinv_ulps):
        sinv = torch.where(sinv == 0, sinv, torch.nextafter(sinv, torch.full_like(sinv, 1e30)))
    if zero_as_one:
        sinv = torch.where(sinv == 0, torch.ones_like(sinv), sinv)
    codes = (y2 * torch.reciprocal(sinv)[:, None]).to(fmt.torch_dtype)
    return QuantizedTensor(recipe=recipe, shape=tuple(y2.shape), data=codes, scale_inv=sinv)


def _stand_in(make_backend, numerics, **conv):
    b = make_backend("aiter_like")

    @b.implements("rmsnorm_fwd_quantize", dtypes=FLOATS, numerics=numerics)
    def fn(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
        y32, _ = TNORM.rmsnorm_fwd(x.float(), gamma.float(), eps=eps,
                                   zero_centered_gamma=zero_centered_gamma)
        return _aiter_rule_rows(y32, recipe, **conv), None
    return b.name


F32 = {"compute_dtype": torch.float32}


@pytest.mark.parametrize("conv,declared,broken", [
    ({"zero_as_one": True}, {"scale_inv_zero_as_one": True}, set()),
    ({"zero_as_one": True}, {}, {"scale_inv"}),
    ({"floor": 1e-10}, {"amax_floor": 1e-10}, set()),
    ({"floor": 1e-10}, {}, {"scale_inv"}),
    ({"sinv_ulps": 1, "zero_as_one": True}, {"fp32_div_ulps": 2, "scale_inv_zero_as_one": True},
     set()),
    ({"sinv_ulps": 4096, "zero_as_one": True},
     {"fp32_div_ulps": 2, "scale_inv_zero_as_one": True}, {"scale_inv"}),
], ids=["zero-as-one", "zero-as-one-undeclared", "amax-floor", "amax-floor-undeclared",
        "div-ulps", "div-far-beyond-ulps"])
def test_aiter_rule_knobs_pass_when_declared_and_fail_when_not(make_backend, conv, declared,
                                                                 broken):
    """A backend following one of AITER's fused conventions passes exactly when it declares
    it: the knob is not slack, it selects the convention the reference is configured with.
    (An approximate division's few ulps lie inside the amax interval a fused y already has:
    declared they pass, and a scale_inv far beyond them is still caught.)"""
    name = _stand_in(make_backend, dict(F32, **declared), **conv)
    c = norm_case("rmsnorm_fwd_quantize", ROW, dist=ZERO_ROWS)
    rep = report("rmsnorm_fwd_quantize", c, ["torch", name])
    assert rep.outcomes[name].status == "ok", rep.describe()
    assert failed_outputs(rep, name) == broken, rep.describe()
    assert not failed_outputs(rep, "torch"), rep.describe()


def test_given_scale_through_its_reciprocal_is_judged_with_that_multiplier(make_backend):
    """DelayedScaling through a kernel that takes scale_inv: codes of y * fl32(1/fl32(1/s))."""
    b = make_backend("aiter_like_given")

    @b.implements("rmsnorm_fwd_quantize", dtypes=FLOATS,
                  numerics=dict(F32, given_scale_as_scale_inv=True))
    def fn(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
        y32, _ = TNORM.rmsnorm_fwd(x.float(), gamma.float(), eps=eps,
                                   zero_centered_gamma=False)
        sinv = torch.reciprocal(scale)
        fmt = get_format(recipe.fmt)
        v = torch.clamp(y32 * torch.reciprocal(sinv), -fmt.max, fmt.max)
        return QuantizedTensor(recipe=recipe, shape=tuple(y32.shape),
                               data=v.to(fmt.torch_dtype), scale_inv=sinv), None
    rep = report("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", GIVEN),
                 ["torch", b.name])
    assert rep.verdict == "pass", rep.describe()
    assert torch.reciprocal(torch.reciprocal(torch.tensor(7.0))).item() != 7.0  # a real case


def test_fused_ops_take_mxfp4_and_aiters_rule():
    import tealite
    x, g = torch.randn(3, 64), torch.randn(64)
    r = tealite.rmsnorm_fwd_quantize(x, g, R.MXFP4BlockScaling("even", "ties_away"),
                                     backend="torch", return_stats=False)
    assert r.out.data.shape == (3, 32) and r.out.scale_inv.shape == (3, 2)
    rule = R.Float8CurrentScaling(granularity="row", scale_rule=FP8ScaleRule.AMAX_OVER_FMAX)
    r = tealite.rmsnorm_fwd_quantize(x, g, rule, backend="torch")
    assert r.out.amax is None and r.out.scale_inv.shape == (3,) and r.rsigma is not None
    with pytest.raises(ValueError, match="return_stats must be a bool"):
        tealite.rmsnorm_fwd_quantize(x, g, rule, return_stats=None)


# ---- AITER's entry points ------------------------------------------------------------------------

@pytest.fixture
def at():
    from tealite.backends.aiter_triton import kernels
    return kernels()


@pytest.fixture
def mxfp4_on_nvidia():
    """Lift the backend's NVIDIA rejection of AITER's MXFP4 entry points (a no-op elsewhere)."""
    with aiter_triton.lift_platform_rejections(mxfp4_on_nvidia=True):
        yield


@needs_aiter
def test_every_entry_point_declares_its_contract():
    declared = {c.entry_point: c for c in contracts.contracts(NAME)}
    for entry in F.FP8_ENTRY_POINTS + F.MXFP4_ENTRY_POINTS:
        c = declared[entry]
        assert c.op in BACKEND.impls and c.family in contracts.TE_CONVENTIONS
    assert declared[F.RMS_MXFP4].scale_rule == "e8m0-even"
    assert declared[F.ACT_MXFP4].element_rounding == "ties-away"


# (op, case, reaches NVIDIA's saturated cast: an output block's E8M0 byte is below 127, i.e. its
# amax rounds below 4; as measured on the H100, and derived by
# test_nvidia_expectations_follow_from_the_outputs)
MX_CASES = [
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", MXFP4), True),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", MXFP4, dtype="bfloat16",
                                       shape=(2, 3, 96), dist=ZERO_ROWS), True),
    ("act_fwd_quantize", act_case("swiglu", MXFP4), False),
    ("act_fwd_quantize", act_case("geglu", MXFP4, dtype="float16", shape=(3, 192)), False),
    ("act_fwd_quantize", act_case("reglu", MXFP4, dtype="bfloat16"), False),
]
MX_PARAMS = [pytest.param(op, c, id=f"{op}-{c.get('kind', 'norm')}-{c['dtype']}",
                          marks=[nvidia_xfail] if cast else [])
             for op, c, cast in MX_CASES]


@needs_aiter
@pytest.mark.parametrize("op,c", MX_PARAMS)
def test_mxfp4_entry_points_match_the_reference(mxfp4_on_nvidia, op, c):
    rep = report(op, c, ["torch", NAME])
    assert rep.outcomes[NAME].status == "ok" and rep.verdict == "pass", rep.describe()
    assert rep.outcomes[NAME].numerics.entry_point in F.MXFP4_ENTRY_POINTS


@st.composite
def aiter_mxfp4_cases(draw, op):
    """The specs' own cases (shapes, dtypes, distributions) with AITER's MXFP4 conventions."""
    if op == "act_fwd_quantize":
        c = draw(act_spec.cases(None, "ci", bwd=False, kinds=AITER_KINDS))
    else:
        c = dict(draw(norm_spec.cases(None, "ci", rms=True, bwd=False)),
                 zero_centered_gamma=False, return_stats=False)
    c.update(recipe=MXFP4, return_amax=False)
    c["shape"] = fit_to_recipe(c["shape"], MXFP4, gated=op == "act_fwd_quantize")
    return c


@nvidia_xfail  # the specs' small scales (2^-6) reach it at once
@needs_aiter
@pytest.mark.parametrize("op", ["rmsnorm_fwd_quantize", "act_fwd_quantize"])
def test_drawn_mxfp4_cases_match_the_reference(mxfp4_on_nvidia, op):
    """More drawn cases for the entry points that run under the interpreter (the differential
    test draws AITER-shaped cases only a part of the time)."""
    @given(c=aiter_mxfp4_cases(op))
    @settings(max_examples=8, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    def check(c):
        rep = report(op, c, ["torch", NAME])
        assert rep.outcomes[NAME].status == "ok" and rep.verdict == "pass", rep.describe()
    check()


def _rms_mx_drops_eps(fn):
    def wrong(x, w, eps, *args, **kw):
        return fn(x, w, 0.0, *args, **kw)
    return wrong


def _act_mx_scale_off_by_one(fn):
    def wrong(*args, **kw):
        codes, scales = fn(*args, **kw)
        return codes, scales + 1  # one exponent too large, codes unchanged
    return wrong


SEEDED = [  # (op, case, entry, wrong variant, outputs it breaks, reaches the cast as MX_CASES)
    ("rmsnorm_fwd_quantize",
     norm_case("rmsnorm_fwd_quantize", MXFP4, eps=1e-3,
               dist={"kind": "normal", "scale": 2.0 ** -6}),
     F.RMS_MXFP4, _rms_mx_drops_eps, {"data", "scale_inv"}, True),
    ("act_fwd_quantize", act_case("swiglu", MXFP4), F.ACT_MXFP4, _act_mx_scale_off_by_one,
     {"data", "scale_inv"}, False),
]


@needs_aiter
@pytest.mark.parametrize("op,c,entry,wrap,broken", [
    pytest.param(*s[:5], id=i, marks=[nvidia_xfail] if s[5] else [])
    for s, i in zip(SEEDED, ["rms-eps-dropped", "act-scale-off-by-one"])])
def test_a_seeded_wrong_variant_is_caught(op, c, entry, wrap, broken, at, monkeypatch,
                                          mxfp4_on_nvidia):
    assert report(op, c, [NAME]).verdict == "pass"
    monkeypatch.setitem(at.functions, entry, wrap(at.functions[entry]))
    rep = report(op, c, [NAME])
    assert broken <= failed_outputs(rep, NAME), rep.describe()


@needs_aiter
@pytest.mark.parametrize("op,c,entry", [
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", MXFP4), F.RMS_MXFP4),
    ("act_fwd_quantize", act_case("swiglu", MXFP4), F.ACT_MXFP4),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", ROW), F.RMS_DYN),
])
def test_a_missing_entry_point_is_rejected_with_its_reason(op, c, entry, at, monkeypatch,
                                                          mxfp4_on_nvidia):
    # (both rejections lifted: on NVIDIA the MXFP4 one is checked before the missing entry)
    monkeypatch.delitem(at.functions, entry)
    monkeypatch.setitem(at.missing, entry, "ModuleNotFoundError: moved in this version (test)")
    with aiter_triton.lift_platform_rejections(fp8_in_interpreter=True):
        outcome = report(op, c, [NAME]).outcomes[NAME]
    assert outcome.status == "unsupported"
    assert f"lacks {entry}" in outcome.reason and "moved in this version" in outcome.reason


@needs_aiter
@pytest.mark.parametrize("op,c,why", [
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", MXFP4, return_stats=True),
     "return_stats=False"),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", dict(MXFP4,
                                       element_rounding="rne")), "ties-away"),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", dict(ROW, scale_rule="fmax/amax")),
     "amax/fmax"),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", GIVEN, return_amax=True),
     "return_amax=False"),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", dict(GIVEN,
                                       saturation="nonfinite")), "clamps"),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", MXFP4, zero_centered_gamma=True),
     "zero-centered"),
    ("layernorm_fwd_quantize", norm_case("layernorm_fwd_quantize", MXFP4), "no fused LayerNorm"),
    ("act_fwd_quantize", act_case("gelu", MXFP4), "gated activations"),
    ("act_fwd_quantize", act_case("swiglu", ROW, shape=(5, 192)), "power of two"),
])
def test_cases_aiter_does_not_follow_are_rejected_with_the_reason(op, c, why):
    outcome = report(op, c, [NAME]).outcomes[NAME]
    assert outcome.status == "unsupported" and why in outcome.reason, outcome.reason


def test_nvidia_expectations_follow_from_the_outputs():
    """Which MXFP4 cases reach NVIDIA's saturated cast, derived: those where a block's right
    E8M0 byte (the torch backend's, which passes the reference) is below 127 (a negative
    unbiased exponent: AITER writes 127 there on NVIDIA).  (No AITER needed.)"""
    for op, c, cast in MX_CASES + [(s[0], s[1], s[5]) for s in SEEDED]:
        rep = run_case(get_spec(op), c, backends=["torch"], device="cpu")
        scales = rep.outcomes["torch"].outputs["scale_inv"].view(torch.uint8).numpy()
        assert bool((scales < 127).any()) == cast, (op, c)


@needs_aiter
@pytest.mark.skipif(not ON_NVIDIA, reason="NVIDIA only (AITER's MXFP4 quantizer is right in "
                    "the interpreter and on AMD)")
@pytest.mark.parametrize("op,c", [(op, c) for op, c, _ in MX_CASES[1:3]])
def test_mxfp4_entry_points_are_rejected_on_nvidia(op, c):
    outcome = report(op, c, [NAME]).outcomes[NAME]
    assert outcome.status == "unsupported" and SCALE_CAST in outcome.reason, outcome.reason


# ---- FP8 under the interpreter: the cast, proven and pinned ------------------------------------

@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=offs < n)


def interpreter_cast(v: torch.Tensor, dtype) -> torch.Tensor:
    """fp32 -> ``dtype`` by Triton's ``.to()`` (the interpreter's when interpreting)."""
    flat = v.reshape(-1).contiguous()
    out = torch.empty(flat.shape, dtype=dtype, device=v.device)
    if flat.numel():
        block = triton.next_power_of_2(flat.numel())
        _cast_kernel[(1,)](flat, out, flat.numel(), BLOCK=block)
    return out.reshape(v.shape)


@needs_aiter
@pytest.mark.skipif(not INTERPRET, reason="the interpreter's fp8 cast bug")
def test_interpreter_fp8_cast_is_the_cause(at):
    """The interpreter's fp32 -> e4m3 ``.to()`` rounds ties away and collapses values that
    round up into the next binade (one-line kernel, against torch's RNE); AITER's fused
    RMSNorm -> FP8 codes are bit for bit that cast of the exact fp32 values its kernel casts
    (y dumped by the kernel itself, times fl32(1 / its scale_inv)), and RNE of those values
    differs: the mismatch is the interpreter's, not AITER's numerics."""
    v = torch.tensor([-8.5, 7.99, 15.9, 0.3], dtype=torch.float32)
    got = interpreter_cast(v, torch.float8_e4m3fn).float().tolist()
    want = v.to(torch.float8_e4m3fn).float().tolist()
    assert want == [-8.0, 8.0, 16.0, 0.3125] and got[0] == -9.0 and got[1] < 8.0

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 128, generator=g), torch.randn(128, generator=g)
    out = torch.empty(16, 128, dtype=torch.float8_e4m3fn)
    yscale = torch.empty(16)
    y = at.rmsnorm2d_fwd_with_dynamicquant(out, x, yscale, w, 1e-5, dump_rms_norm=True)
    v = y * torch.reciprocal(yscale)[:, None]
    assert torch.equal(out.view(torch.uint8), interpreter_cast(v, out.dtype).view(torch.uint8))
    assert not torch.equal(out.view(torch.uint8), v.to(out.dtype).view(torch.uint8))


FP8_CASES = [
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", ROW, dist=ZERO_ROWS), F.RMS_DYN),
    ("layernorm_fwd_quantize", norm_case("layernorm_fwd_quantize", ROW), F.LN_DYN),
    ("rmsnorm_fwd_quantize", norm_case("rmsnorm_fwd_quantize", GIVEN), F.RMS_STATIC),
    ("act_fwd_quantize", act_case("swiglu", ROW), F.ACT_FP8),
]


@needs_aiter
@pytest.mark.xfail(INTERPRET, strict=True,
                   reason="interpreter: fp32 -> fp8 .to() misrounds (proof: "
                          "test_interpreter_fp8_cast_is_the_cause)")
@pytest.mark.parametrize("op,c,entry", FP8_CASES, ids=[e for _, _, e in FP8_CASES])
def test_fp8_entry_points_fail_only_under_the_interpreter(op, c, entry, monkeypatch):
    """The FP8 entry points with the interpreter rejection lifted: they fail in the
    interpreter (strict xfail: if it gets fixed this XPASSes and the rejection must go) and
    pass on a GPU."""
    with aiter_triton.lift_platform_rejections(fp8_in_interpreter=True):
        rep = report(op, c, ["torch", NAME])
    assert rep.outcomes[NAME].status == "ok", rep.describe()
    assert rep.outcomes[NAME].numerics.entry_point == entry
    assert rep.verdict == "pass", rep.describe()


@needs_aiter
@pytest.mark.skipif(not INTERPRET, reason="the interpreter rejection")
@pytest.mark.parametrize("op,c,entry", FP8_CASES, ids=[e for _, _, e in FP8_CASES])
def test_fp8_entry_points_are_rejected_under_the_interpreter(op, c, entry):
    outcome = report(op, c, [NAME]).outcomes[NAME]
    assert outcome.status == "unsupported" and "interpreter" in outcome.reason
