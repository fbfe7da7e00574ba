"""Fused norm / activation -> FP8 / MXFP8 quantize (tealite.ops.fused): the reference, the
``code-interval`` tier (tealite_verify/tiers/code_interval.py), seeded wrong backends that the
specs catch, legitimate differences they accept, the Triton kernels under the interpreter, and
bad input.

Wrong and legitimate backends are the torch composition (fp32 y, then the torch quantize) with
one thing changed, registered through the ``make_backend`` fixture (always unregistered).
Crafted inputs go through the real specs with only ``make_inputs`` replaced.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics
from hypothesis import HealthCheck, given, settings

import tealite
from tealite import recipes as R
from tealite import registry
from tealite.backends.torch import activations as TACT
from tealite.backends.torch import fused as TF
from tealite.backends.torch import norms as TNORM
from tealite.backends.torch import quantize as TQB
from tealite.formats import ElementRounding, ScaleRounding, get_format
from tealite.ops.activations import GATED
from tealite_verify.tiers import code_interval as TFU
from tealite_verify import recipe_rules as rules
from tealite_verify.references import activations as act_ref
from tealite_verify.references import fused as fref
from tealite_verify.references import norms as norm_ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.strategies.recipes import given_scale, recipe_from_json

from _helpers_bad_input import raises

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
MX = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
ROW = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
       "amax_epsilon": 0.0, "saturation": "saturate"}
GIVEN = {"kind": "delayed", "fmt": "e4m3", "scale": 1.0, "saturation": "saturate"}
RECIPES = {"mx": MX, "row": ROW, "given": GIVEN}
MID = 1.0625  # e4m3 midpoint between 1.0 (even code) and 1.125 (odd): RNE rounds it down
ABOVE_MID = MID * (1 + 2.0 ** -10)  # rounds up in fp32; its bf16 rounding is MID (rounds down)


# ---- helpers -------------------------------------------------------------------------------

def act_spec(x, kind, recipe, scale=None):
    """(spec, case) running the act_fwd_quantize spec on a crafted x."""
    inputs = {"x": x}
    if recipe["kind"] == "delayed":
        inputs["scale"] = torch.tensor([recipe["scale"] if scale is None else scale])
    spec = dataclasses.replace(get_spec("act_fwd_quantize"), make_inputs=lambda c, d: {
        k: v.clone().to(d) for k, v in inputs.items()})
    case = {"kind": kind, "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."),
            "dist": {"kind": "crafted"}, "seed": 0, "recipe": recipe}
    return spec, case


def norm_case(op, recipe, *, shape=(6, 64), dtype="bfloat16", seed=3, **kw):
    case = {"shape": list(shape), "dtype": dtype, "weight_dtype": "float32",
            "zero_centered_gamma": False, "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0},
            "seed": seed, "recipe": recipe}
    if op == "layernorm_fwd_quantize":
        case["offset"] = 0.0
    case.update(kw)
    return case


def y_fp32(op, x, *args, **kw):
    if op == "act_fwd_quantize":
        return TACT.act_fwd(x.float(), kind=kw["kind"])
    if op == "layernorm_fwd_quantize":
        return TNORM.layernorm_fwd(x.float(), *(a.float() for a in args), eps=kw["eps"],
                                   zero_centered_gamma=kw["zero_centered_gamma"])
    return TNORM.rmsnorm_fwd(x.float(), *(a.float() for a in args), eps=kw["eps"],
                             zero_centered_gamma=kw["zero_centered_gamma"])


def register(make_backend, op, y_fn=lambda y: y, quant=None, x_fn=lambda x: x):
    """A backend for ``op``: the torch composition with y -> y_fn(y) before quantizing and
    ``quant(y2d, recipe, scale)`` (default: the torch quantize) as the quantizer."""
    quant = quant or TF.quantize_rows_fp32
    b = make_backend("fused_" + op.split("_")[0])

    def finish(y32, recipe, scale):
        q = quant(y_fn(y32).reshape(-1, y32.shape[-1]), recipe, scale)
        q.recipe = recipe
        return q

    if op == "act_fwd_quantize":
        def fn(x, recipe, *, kind, scale):
            return finish(y_fp32(op, x_fn(x), kind=kind), recipe, scale)
    elif op == "layernorm_fwd_quantize":
        def fn(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
            y, mean, rs = y_fp32(op, x, gamma, beta, eps=eps,
                                 zero_centered_gamma=zero_centered_gamma)
            return finish(y, recipe, scale), mean, rs
    else:
        def fn(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
            y, rs = y_fp32(op, x, gamma, eps=eps, zero_centered_gamma=zero_centered_gamma)
            return finish(y, recipe, scale), rs
    b.implements(op, dtypes=FLOATS)(fn)
    return b.name


def with_recipe(change):
    """A quantizer that runs the torch quantize under a changed recipe."""
    def quant(y2, recipe, scale):
        return TF.quantize_rows_fp32(y2, change(recipe), scale)
    return quant


def run(spec, case, name):
    report = run_case(spec, case, backends=["torch", name])
    info = report.describe()
    for b in ("torch", name):
        assert report.outcomes[b].status == "ok", info
    assert all(c.metrics.passed for c in report.comparisons
               if c.lhs == "torch" and c.rhs == "reference"), info
    return report, info


def assert_caught(spec, case, name, outputs):
    report, info = run(spec, case, name)
    bad = {c.output for c in report.failures if c.lhs == name and c.rhs == "reference"}
    assert bad & set(outputs), "wrong backend not caught:\n" + info
    assert [c for c in report.failures if {c.lhs, c.rhs} == {"torch", name}], \
        "wrong backend not caught pairwise:\n" + info
    return report


def assert_passes(spec, case, name):
    report, info = run(spec, case, name)
    assert report.verdict == "pass", info
    return report


def excused(report, name, output):
    return sum(c.metrics.excused for c in report.comparisons
               if c.lhs == name and c.rhs == "reference" and c.output == output)


def gated_x(a, b, dtype=torch.float32):
    """x = [a | b] rows for a gated kind (first half activated, second half the gate)."""
    return torch.cat([torch.as_tensor(a), torch.as_tensor(b)], dim=-1).to(dtype)


# ---- reference and tier primitives ------------------------------------------------------------

def _reference_rows(y, entry: dict, scale=None) -> rules.Quantized:
    """The fused reference's quantized output: the recipe's reference quantization of the
    float64 y's rows rounded to float32 (what specs/norm_quant.py builds)."""
    return rules.quantize(fref.round_to_f32(fref.as_rows(y)), recipe_from_json(entry),
                          given_scale(entry) if scale is None else scale)


@pytest.mark.parametrize("name", RECIPES)
def test_reference_quantization_of_fp32_y_matches_tealite_quantize(name):
    """The fused reference's quantization of round32(y) is the plain quantize of the fp32 y
    (checked against the torch backend, an independent implementation)."""
    y = (torch.randn(7, 64, generator=torch.Generator().manual_seed(1)) * 3).float()
    r = RECIPES[name]
    scale = torch.tensor([4.0]) if name == "given" else None
    q = TQB.quantize(y, recipe_from_json(r), rowwise=True, columnwise=False, scale=scale)
    want = _reference_rows(y.double().numpy(), r, None if scale is None else scale.numpy())
    assert np.array_equal(q.data.view(torch.uint8).numpy(), want.bits)
    assert np.array_equal(q.scale_inv.numpy(), want.scale_inv)
    if want.amax is not None:
        assert np.array_equal(q.amax.numpy(), want.amax)


@pytest.mark.parametrize("name", RECIPES)
def test_reference_outputs_pass_the_tier_bit_exactly_at_zero_bound(name):
    """The tier with e = 0 accepts exactly the reference's quantization of round32(y_ref)
    (reference norm / activation, then reference quantize), with nothing excused."""
    g = np.random.default_rng(0)
    x, gamma, beta = g.normal(size=(4, 64)) * 3, g.normal(size=64), g.normal(size=64)
    r = RECIPES[name]
    scale = np.array([2.0], np.float32) if name == "given" else None
    ys = [norm_ref.layernorm_fwd(x, gamma, beta, eps=1e-5)[0],
          norm_ref.rmsnorm_fwd(x, gamma, eps=1e-5)[0], act_ref.act_fwd(x, "geglu")]
    fmt = get_format(r["fmt"])
    for y in ys:
        q = _reference_rows(y, r, scale)
        assert q.bits.shape == fref.as_rows(y).shape
        judge = TFU.FusedQuantJudge(fref.as_rows(y), lambda n: 0.0, recipe_from_json(r), scale)
        outs = {"data": torch.from_numpy(q.bits).view(fmt.torch_dtype),
                "scale_inv": torch.from_numpy(q.scale_inv)}
        if q.amax is not None:
            outs["amax"] = torch.from_numpy(np.asarray(q.amax, np.float32))
        assert all(m.passed and m.excused == 0 for m in _all_pass(judge, outs))


def _judge_outputs(y32, recipe, scale=None):
    """(judge with e = 0 on y_ref = y32, torch-backend outputs for y32)."""
    r = recipe_from_json(recipe)
    st = None if scale is None else torch.tensor([scale])
    q = TQB.quantize(torch.from_numpy(y32), r, rowwise=True, columnwise=False, scale=st)
    outs = {"data": q.data, "scale_inv": q.scale_inv, "amax": q.amax}
    judge = TFU.FusedQuantJudge(y32.astype(np.float64), lambda n: 0.0, r,
                                None if scale is None else np.array([scale], np.float32))
    return judge, {k: v for k, v in outs.items() if v is not None}


def _all_pass(judge, outs):
    return [judge.check_data(outs, Numerics()), judge.check_scale_inv(outs, Numerics())] + \
        ([judge.check_amax(outs, Numerics())] if "amax" in outs else [])


@pytest.mark.parametrize("name", RECIPES)
def test_zero_bound_is_bit_exact(name):
    """e = 0: the exact outputs pass with nothing excused; one code one step off, one scale
    one exponent off, or one amax one ulp off fails."""
    y = (np.random.default_rng(5).normal(size=(5, 64)) * 2).astype(np.float32)
    judge, outs = _judge_outputs(y, RECIPES[name], 2.0 if name == "given" else None)
    assert all(m.passed and m.excused == 0 for m in _all_pass(judge, outs))
    bad = dict(outs, data=outs["data"].clone())
    bad["data"].view(torch.uint8)[2, 5] += 1
    assert not judge.check_data(bad, Numerics()).passed
    if name == "mx":
        bad = dict(outs, scale_inv=outs["scale_inv"].clone())
        bad["scale_inv"][1, 0] += 1
        assert not judge.check_scale_inv(bad, Numerics()).passed
    else:
        bad = dict(outs, amax=torch.nextafter(outs["amax"], torch.tensor(np.inf)))
        assert not judge.check_amax(bad, Numerics()).passed
        if name == "row":  # scale_inv must be the rule's for the reported amax
            assert not judge.check_scale_inv(dict(outs, scale_inv=outs["scale_inv"] * 2),
                                             {}).passed


def test_zero_bound_catches_ties_away():
    """At an exact tie only e = 0 can tell RNE from ties-away (any e > 0 spans both codes,
    see test_tie_is_excused_for_any_positive_bound)."""
    y = np.full((1, 32), MID, np.float32)
    judge, outs = _judge_outputs(y, MX)
    away = TQB.quantize(torch.from_numpy(y), R.MXBlockScaling(
        "e4m3", ScaleRounding.RCEIL, ElementRounding.TIES_AWAY), rowwise=True, columnwise=False,
        scale=None)
    assert not judge.check_data(dict(outs, data=away.data), Numerics()).passed


def test_tie_is_excused_for_any_positive_bound():
    y = np.array([[MID]], np.float64)
    for e, allowed in ((0.0, [0x38]), (2.0 ** -22, [0x38, 0x39])):  # 2^-22: 2 fp32 ulps
        lo, hi = TFU.y_interval(y, e)
        c_lo, c_hi, c_mid = TFU.fp8_code_bounds(lo, hi, lo, np.float32(1.0), "e4m3", True)
        for code in (0x38, 0x39, 0x3A):
            m = TFU.codes_within(np.array([[code]], np.uint8), c_lo, c_hi, c_mid, "e4m3", lo, hi)
            assert m.passed == (code in allowed), (e, code, m.summary())


def test_overflow_codes_order_beyond_max():
    """NONFINITE casts: an interval straddling the overflow threshold allows max and NaN,
    nothing else; an interval inside the range never allows NaN."""
    lo, hi = TFU.y_interval(np.array([[464.0]]), 1.0)  # e4m3: max 448, overflow above 464
    c_lo, c_hi, c_mid = TFU.fp8_code_bounds(lo, hi, lo, np.float32(1.0), "e4m3", False)
    for code, ok in ((0x7E, True), (0x7F, True), (0xFF, True), (0x7D, False)):
        m = TFU.codes_within(np.array([[code]], np.uint8), c_lo, c_hi, c_mid, "e4m3", lo, hi)
        assert m.passed == ok, (hex(code), m.summary())
    lo, hi = TFU.y_interval(np.array([[400.0]]), 1.0)
    c = TFU.fp8_code_bounds(lo, hi, lo, np.float32(1.0), "e4m3", False)
    assert not TFU.codes_within(np.array([[0x7F]], np.uint8), *c, "e4m3", lo, hi).passed


def test_mx_bytes_reachable_from_the_amax_interval():
    """A block amax interval across 448 * 2^k (RCEIL's boundary) reaches two bytes, one strictly
    inside a binade reaches one; NaN gives 0xFF only; zero reaches byte 0."""
    a = np.array([[448.0 * 2.0 ** -8]], np.float32)
    lo, hi = TFU.mx_allowed_bytes(a * np.float32(1 - 1e-6), a * np.float32(1 + 1e-6), "e4m3",
                                  "rceil")
    assert (lo[0, 0], hi[0, 0]) == (119, 120)
    lo, hi = TFU.mx_allowed_bytes(a * np.float32(1.3), a * np.float32(1.31), "e4m3", "rceil")
    assert lo[0, 0] == hi[0, 0] == 120
    assert TFU.check_mx_scales(np.array([[0xFF]]), np.array([[np.nan]], np.float32),
                               np.array([[np.nan]], np.float32), np.array([[np.nan]], np.float32),
                               "e4m3", "floor").passed
    one, inf = np.ones((1, 1), np.float32), np.full((1, 1), np.inf, np.float32)
    for byte, ok in ((254, True), (0, True), (0xFF, False)):  # a bound overflowing fp32
        assert TFU.check_mx_scales(np.array([[byte]]), 0 * one, inf, one, "e4m3",
                                   "rceil").passed == ok
    assert TFU.mx_allowed_bytes(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32),
                                "e4m3", "floor")[1][0, 0] == 0


@pytest.mark.parametrize("op", ["layernorm_fwd_quantize", "rmsnorm_fwd_quantize",
                                "act_fwd_quantize"])
def test_drawn_cases_cover_the_fused_recipes(op):
    """The specs draw every fused recipe variant (FNUZ formats, E2M1, every MX scale mode,
    both element roundings, both saturation policies, both FP8 scale rules) and never an
    unfusable one; MX output rows are whole 32-blocks."""
    seen = set()

    @given(case=get_spec(op).cases())
    @settings(database=None, max_examples=300, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    def collect(case):
        r = case["recipe"]
        seen.update({("kind", r["kind"]), ("fmt", r["fmt"]), ("sat", r.get("saturation")),
                     ("mode", r.get("scale_rounding")), ("er", r.get("element_rounding")),
                     ("rule", r.get("scale_rule"))})
        assert r.get("granularity", "row") == "row"
        if r["kind"] == "mx":
            n = case["shape"][-1] // (2 if case.get("kind") in GATED else 1)
            assert n % 32 == 0 and n > 0
        if op == "act_fwd_quantize":
            seen.add(("gated", case["kind"] in GATED))

    collect()
    want = {("kind", k) for k in ("delayed", "current", "mx")} | \
        {("fmt", f) for f in ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1")} | \
        {("rule", None), ("rule", "amax/fmax")} | \
        {("mode", m) for m in ("floor", "ceil", "even", "rceil")} | \
        {("er", "rne"), ("er", "ties_away"), ("sat", "saturate"), ("sat", "nonfinite")}
    if op == "act_fwd_quantize":
        want |= {("gated", True), ("gated", False)}
    assert want <= seen, want - seen


# ---- seeded wrong backends ---------------------------------------------------------------------

def test_bf16_rounded_y_is_caught_where_outside_the_bound(make_backend):
    """Quantizing y rounded to bf16 double-rounds: y just above an e4m3 midpoint becomes the
    midpoint (bf16), then RNE goes down.  Caught for reglu (crafted) and LayerNorm (random)."""
    name = register(make_backend, "act_fwd_quantize", lambda y: y.bfloat16().float())
    x = gated_x(torch.ones(3, 32), torch.full((3, 32), ABOVE_MID))
    assert_caught(*act_spec(x, "reglu", GIVEN), name, ["data"])
    name = register(make_backend, "layernorm_fwd_quantize", lambda y: y.bfloat16().float())
    assert_caught(get_spec("layernorm_fwd_quantize"),
                  norm_case("layernorm_fwd_quantize", ROW, shape=(16, 256)), name, ["data"])


@pytest.mark.parametrize("name", RECIPES)
def test_scale_one_exponent_off_is_caught(make_backend, name):
    """Codes made consistently under a scale one exponent off (so the code check alone would
    pass for MX): the scale check catches it."""
    if name == "mx":
        def quant(y2, recipe, scale):
            q = TF.quantize_rows_fp32(y2, recipe, scale)
            e = q.scale_inv.int() + 1 - 127
            v = torch.ldexp(y2.reshape(y2.shape[0], -1, 32).double(), -e[..., None].double())
            q.data = TQB.fp8_cast_rne(v.float(), get_format(recipe.fmt)).reshape(y2.shape)
            q.scale_inv = (e + 127).to(torch.uint8)
            return q
    elif name == "row":
        def quant(y2, recipe, scale):
            s = 2 * TQB._te_scale(y2.abs().amax(1), get_format(recipe.fmt), False, 0.0)
            q = TF.quantize_rows_fp32(y2, recipe, scale)
            q.data = TQB.fp8_cast_rne(y2 * s[:, None], get_format(recipe.fmt))
            q.scale_inv = torch.reciprocal(s)
            return q
    else:
        def quant(y2, recipe, scale):
            q = TF.quantize_rows_fp32(y2, recipe, 2 * scale)
            q.scale_inv = torch.reciprocal(2 * scale)
            return q
    op = "rmsnorm_fwd_quantize"
    wrong = register(make_backend, op, quant=quant)
    assert_caught(get_spec(op), norm_case(op, RECIPES[name], shape=(5, 96), dtype="float16"),
                  wrong, ["scale_inv"])


def test_floor_instead_of_rceil_is_caught(make_backend):
    wrong = register(make_backend, "layernorm_fwd_quantize", quant=with_recipe(
        lambda r: dataclasses.replace(r, scale_rounding=ScaleRounding.FLOOR)))
    assert_caught(get_spec("layernorm_fwd_quantize"),
                  norm_case("layernorm_fwd_quantize", MX, shape=(8, 128)), wrong, ["scale_inv"])


@pytest.mark.parametrize("kind", ["swiglu", "geglu", "sreglu"])
def test_swapped_gate_halves_are_caught(make_backend, kind):
    def swap(x):
        n = x.shape[-1] // 2
        return torch.cat([x[..., n:], x[..., :n]], dim=-1)
    wrong = register(make_backend, "act_fwd_quantize", x_fn=swap)
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert_caught(*act_spec(x, kind, MX), wrong, ["data", "scale_inv"])


# ---- legitimate differences ------------------------------------------------------------------

def _up_one_ulp(y):
    return torch.nextafter(y, torch.full_like(y, np.inf))


@pytest.mark.parametrize("name", RECIPES)
def test_fp32_rounding_of_y_at_a_code_boundary_is_accepted(make_backend, name):
    """y exactly on an e4m3 tie (RNE: down); a kernel whose fp32 y is one ulp higher (well
    inside the bound) writes the code above.  Accepted, and counted as excused."""
    legit = register(make_backend, "act_fwd_quantize", _up_one_ulp)
    b = torch.full((2, 32), MID)
    # Row / block amax 1.75: per-row scale 448 / 1.75 = 256, MX scale 2^-8 (2^-7 once the
    # amax is an ulp higher), given scale 1: MID times each is still an e4m3 tie.
    b[:, 0] = 1.75
    spec, case = act_spec(gated_x(torch.ones(2, 32), b), "reglu", RECIPES[name])
    report = assert_passes(spec, case, legit)
    # Per row the higher amax lowers the scale just enough that MID's code stays put: there
    # the difference is the amax (excused), elsewhere the code above the tie.
    assert excused(report, legit, "amax" if name == "row" else "data") > 0, report.describe()


def test_amax_at_a_scale_boundary_is_accepted(make_backend):
    """A block amax exactly 448 * 2^-8 sits on RCEIL's boundary: one fp32 ulp more gives the
    next byte.  A kernel whose y is one ulp higher gets that byte; its codes are judged under
    it (re-quantized), and pass.  Per row, the amax one ulp off gives another scale: passes."""
    legit = register(make_backend, "act_fwd_quantize", _up_one_ulp)
    b = torch.linspace(-1.5, 1.5, 64).reshape(2, 32)
    b[:, 3] = 1.75
    for recipe in (MX, ROW):
        report = assert_passes(*act_spec(gated_x(torch.ones(2, 32), b), "reglu", recipe), legit)
        if recipe is MX:
            assert excused(report, legit, "scale_inv") == 2, report.describe()
        else:
            assert excused(report, legit, "amax") == 2, report.describe()


# ---- triton under the interpreter ------------------------------------------------------------

TRITON = registry.get_backend("triton")
needs_triton = pytest.mark.skipif(TRITON.unavailable_reason() is not None
                                  or "act_fwd_quantize" not in TRITON.impls,
                                  reason=f"triton backend: {TRITON.unavailable_reason()}")
# Interpreted kernels take CPU tensors; compiled ones (a GPU run) CUDA tensors.
TRITON_DEV = "cpu" if TRITON.unavailable_reason() or "cpu" in TRITON.impls[
    "act_fwd_quantize"].support.devices else "cuda"


@needs_triton
@pytest.mark.parametrize("op", ["layernorm_fwd_quantize", "act_fwd_quantize"])
def test_triton_smoke_cases_pass(op):
    spec = get_spec(op)
    for case in spec.smoke_cases[:3]:
        report = run_case(spec, case, backends=["torch", "triton"], device=TRITON_DEV)
        assert report.verdict == "pass", report.describe()


@needs_triton
@pytest.mark.parametrize("wrong,recipe", [({"MODE": 0}, MX), ({"BIAS": 7}, ROW),
                                          ({"POW2": True}, ROW), ({"EMIN": -5}, GIVEN)],
                         ids=["floor-for-rceil", "bias", "pow2", "subnormal-threshold"])
def test_triton_seeded_kernel_bug_is_caught(make_backend, monkeypatch, wrong, recipe):
    """The fused kernels launched with one wrong constant are reported by the harness."""
    from tealite.backends.triton import fused as tfu
    good = tfu._constants
    b = make_backend("triton_fused_seeded")

    def seeded(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
        with monkeypatch.context() as m:
            m.setattr(tfu, "_constants", lambda *a: dict(good(*a), **wrong))
            return tfu.rmsnorm_fwd_quantize(x, gamma, recipe, eps=eps, scale=scale,
                                            zero_centered_gamma=zero_centered_gamma)

    b.implements("rmsnorm_fwd_quantize", devices=TRITON.impls["act_fwd_quantize"].support.devices
                 )(seeded)
    fmt = "e4m3fnuz" if "BIAS" in wrong else "e4m3"
    case = norm_case("rmsnorm_fwd_quantize", dict(recipe, fmt=fmt),
                     shape=(6, 64), dist={"kind": "wide", "log2_lo": -12, "log2_hi": 6})
    report = run_case(get_spec("rmsnorm_fwd_quantize"), case, backends=["torch", b.name],
                      device=TRITON_DEV)
    assert report.outcomes[b.name].status == "ok", report.describe()
    bad = {c.output for c in report.failures if c.lhs == b.name and c.rhs == "reference"}
    assert bad & {"data", "scale_inv"}, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]


# ---- bad input -------------------------------------------------------------------------------

H = 64


def _ln(x=None, recipe=R.MXFP8BlockScaling(), **kw):
    x = torch.ones(3, H) if x is None else x
    return tealite.layernorm_fwd_quantize(x, torch.ones(x.shape[-1]), torch.zeros(x.shape[-1]),
                                          recipe, **kw)


def test_valid_baselines():
    assert _ln().out.data.shape == (3, H)
    r = tealite.rmsnorm_fwd_quantize(torch.ones(2, 3, H), torch.ones(H),
                                     R.Float8CurrentScaling(granularity="row"))
    assert r.out.scale_inv.shape == (6,) and r.rsigma.shape == (2, 3)
    q = tealite.act_fwd_quantize(torch.ones(0, 2 * H), "swiglu", R.DelayedScaling(),
                                 scale=torch.ones(1))
    assert q.data.shape == (0, H) and q.amax.tolist() == [0.0]
    # MXFP4 (AITER fuses it): codes packed two per byte, as tealite.quantize packs them.
    q = tealite.act_fwd_quantize(torch.ones(4, 2 * 64), "swiglu", R.MXFP4BlockScaling(),
                                 backend="torch")
    assert q.data.shape == (4, 32) and q.data.dtype == torch.uint8 and q.scale_inv.shape == (4, 2)


@pytest.mark.parametrize("recipe,match", [
    ("e4m3", r"recipe must be one of \['DelayedScaling', 'Float8CurrentScaling', "
             r"'MXBlockScaling'\] for a fused quantize, got str"),
    (R.Float8CurrentScaling(), r"granularity='row' for a fused quantize .* got 'tensor'"),
    (R.Float8BlockScaling(), r"recipe must be one of .* got Float8BlockScaling"),
])
def test_unfusable_recipes_are_rejected(recipe, match):
    with raises(match):
        _ln(recipe=recipe)
    with raises(match):
        tealite.act_fwd_quantize(torch.ones(2, H), "gelu", recipe)


def test_mx_needs_whole_blocks_of_the_output():
    with raises(r"quantized \(last\) dim of the output must be a multiple of 32 .* got 48"):
        _ln(x=torch.ones(2, 48))
    with raises(r"multiple of 32 for MX quantization, got 16 \(x shape \(2, 32\)\)"):
        tealite.act_fwd_quantize(torch.ones(2, 32), "swiglu", R.MXFP8BlockScaling())
    tealite.act_fwd_quantize(torch.ones(2, 32), "gelu", R.MXFP8BlockScaling())  # 32 outputs


def test_scale_argument_checks():
    d = R.DelayedScaling()
    with raises(r"DelayedScaling needs scale= \(float32, shape \(1,\)\)"):
        _ln(recipe=d)
    with raises(r"scale dtype must be one of \(float32\), got float16"):
        _ln(recipe=d, scale=torch.ones(1, dtype=torch.float16))
    with raises(r"scale must have shape \(1,\) \(one per-tensor scale\), got \(2,\)"):
        _ln(recipe=d, scale=torch.ones(2))
    with raises(r"scale must be on x's device cpu, got meta"):
        _ln(recipe=d, scale=torch.ones(1, device="meta"))
    with raises(r"scale= is only for DelayedScaling, not MXBlockScaling"):
        _ln(scale=torch.ones(1))


def test_norm_and_activation_checks_are_the_plain_ops():
    with raises(r"gamma must have shape \(64,\) \(the normalized \(last\) dim of x\), got \(3,\)"):
        tealite.rmsnorm_fwd_quantize(torch.ones(2, H), torch.ones(3), R.MXFP8BlockScaling())
    with raises(r"eps must be > 0, got 0.0"):
        _ln(eps=0.0)
    with raises(r"kind must be one of .* got 'tanh'"):
        tealite.act_fwd_quantize(torch.ones(2, H), "tanh", R.MXFP8BlockScaling())
    with raises(r"x's last dim must be even for gated kind swiglu"):
        tealite.act_fwd_quantize(torch.ones(2, 65), "swiglu", R.Float8CurrentScaling(
            granularity="row"))
    with raises(r"x dtype must be one of \(float32, bfloat16, float16\), got float64"):
        _ln(x=torch.ones(2, H, dtype=torch.float64))


@pytest.mark.parametrize("lo,hi,code,ok", [
    (-0.0, 2.0 ** -9, 0x00, True),    # +0 inside [-0, x]: reached by tiny positive y
    (-0.0, 2.0 ** -9, 0x80, True),    # -0 inside [-0, x]
    (-0.5, 0.0, 0x80, True),          # -0 inside [-x, +0]: reached by tiny negative y
    (-0.5, 0.0, 0x00, True),
    (-0.0, 2.0 ** -9, 0x02, False),   # 2^-8 lies above the interval: still caught
    (-0.5, 0.0, 0x01, False),         # +2^-9 lies above +0: still caught
])
def test_code_interval_admits_either_zero_where_the_interval_reaches_zero(lo, hi, code, ok):
    """Two fuzz findings (findings/*-mismatch-*.json): the code-interval tier compared the
    endpoints as codes and the inside strictly, so a +0 code failed an interval from -0 up
    (and -0 one up to +0), although values of either sign inside round to those zeros."""
    lo_a, hi_a = np.array([lo], np.float32), np.array([hi], np.float32)
    one = np.float32(1.0)
    c_lo, c_hi, c_mid = TFU.fp8_code_bounds(lo_a, hi_a, lo_a, one, "e4m3", True)
    m = TFU.codes_within(np.array([code], np.uint8), c_lo, c_hi, c_mid, "e4m3", lo_a, hi_a)
    assert m.passed is ok, m.summary()
