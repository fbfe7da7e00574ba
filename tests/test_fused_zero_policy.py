"""Zero-row / zero-block policies of the fused quantizing ops (issue 13).

A fused kernel computes its row (or MX block) amax from its own fp32 y.  Where every y_ref of
the row is within the norm's / activation's error bound of 0, a correct kernel may get amax == 0
(its fp32 y underflowed, or was flushed) and take the recipe's documented zero policy: TE's
rule scale 1, AITER's rule scale_inv 0 and NaN codes (0 * 1/0), AITER's fused norms scale_inv 1,
MX byte 0.  Another correct kernel gets the tiny amax and finite codes.  The code-interval tier
must accept both, and still fail the zero policy on a row whose amax is clearly nonzero.

Found by ``fuzz --op all --backend torch --minutes 4 --seed 11`` on the 2-core Xeon: swiglu
with a = -92.08, b = 57.63 in fp32 (AITER's rule per row); torch's fp32 silu(a) = a / (1 +
exp(-a)) overflows exp and gives -0, y_ref = -5.4e-37, the bound 5.1e-34: NaN codes were
rejected because the tier allowed NaN only where an end of y's interval was exactly 0.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

from tealite.backends.torch import activations as TACT
from tealite.backends.torch import fused as TF
from tealite.backends.torch import norms as TNORM
from tealite.backends.torch import quantize as TQB
from tealite_verify.tiers import code_interval as TFU
from tealite_verify.references import activations as act_ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.strategies.recipes import recipe_from_json

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TINY = float(torch.finfo(torch.float32).tiny)
ROW = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
       "amax_epsilon": 0.0, "saturation": "saturate"}
AITER_ROW = dict(ROW, scale_rule="amax/fmax")
RECIPES = {
    "te-row": ROW,
    "te-row-pow2": dict(ROW, fmt="e5m2", force_pow2_scales=True),
    "aiter-row": AITER_ROW,
    "aiter-row-nonfinite": dict(AITER_ROW, fmt="e5m2", saturation="nonfinite"),
    "mx-e4m3-rceil": {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil",
                      "element_rounding": "rne"},
    "mx-e2m1-even": {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
                     "element_rounding": "ties_away"},
    "given": {"kind": "delayed", "fmt": "e4m3", "scale": 1.0, "saturation": "saturate"},
}
# silu(-89.5) = -89.5 e^-89.5 = -1.2e-37; fp32 exp(89.5) overflows, so torch's silu is -0.
UNDERFLOW_A, GATE_B = -89.5, 8192.0  # y_ref = -9.8e-34: an MX block byte of 11, not 0


# ---- backends ------------------------------------------------------------------------------

def _flush(y):
    """FTZ of an fp32 tensor: what a kernel with denormals flushed writes."""
    return torch.where(y.abs() < TINY, torch.zeros_like(y), y)


def _zero_row(y, row=1):
    y = y.clone()
    y.reshape(-1, y.shape[-1])[row] = 0.0
    return y


def act_backend(make_backend, y_of):
    """act_fwd_quantize: fp32 y = y_of(x, kind), then the torch backend's quantize."""
    b = make_backend("zero_policy_act")

    @b.implements("act_fwd_quantize", dtypes=FLOATS)
    def fn(x, recipe, *, kind, scale):
        return TF.quantize_rows_fp32(y_of(x, kind), recipe, scale)
    return b.name


def torch_y(x, kind):
    return TACT.act_fwd(x.float(), kind=kind)


def exact_y(x, kind):
    """The correctly rounded fp32 y: keeps the tiny values torch's fp32 silu loses."""
    return torch.from_numpy(act_ref.act_fwd(x.double().numpy(), kind)).float()


def norm_backend(make_backend, op, fix_inputs=lambda t: t, fix_y=lambda y: y):
    """A fused norm: the torch composition on fix_inputs(each input), y -> fix_y(y)."""
    b = make_backend("zero_policy_" + op.split("_")[0])
    if op == "layernorm_fwd_quantize":
        def fn(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
            y, mean, rs = TNORM.layernorm_fwd(*(fix_inputs(t.float()) for t in (x, gamma, beta)),
                                              eps=eps, zero_centered_gamma=zero_centered_gamma)
            return TF.quantize_rows_fp32(fix_y(y), recipe, scale), mean, rs
    else:
        def fn(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
            y, rs = TNORM.rmsnorm_fwd(*(fix_inputs(t.float()) for t in (x, gamma)), eps=eps,
                                      zero_centered_gamma=zero_centered_gamma)
            return TF.quantize_rows_fp32(fix_y(y), recipe, scale), rs
    b.implements(op, dtypes=FLOATS)(fn)
    return b.name


# ---- cases ---------------------------------------------------------------------------------

def crafted(op, inputs, recipe, **case):
    """(spec, case) running ``op``'s spec on the given input tensors."""
    inputs = dict(inputs)
    if recipe["kind"] == "delayed":
        inputs["scale"] = torch.tensor([recipe["scale"]])
    spec = dataclasses.replace(get_spec(op), make_inputs=lambda c, d: {
        k: v.clone().to(d) for k, v in inputs.items()})
    x = inputs["x"]
    case = dict({"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."),
                 "dist": {"kind": "crafted"}, "seed": 0, "recipe": recipe}, **case)
    if op != "act_fwd_quantize":
        case.setdefault("weight_dtype", "float32")
        case.setdefault("zero_centered_gamma", False)
        case.setdefault("eps", 1e-5)
    return spec, case


def swiglu_x(recipe, normal_row=True):
    """Row 0: every y_ref = silu(-89.5) * 8192, within its bound of 0; row 1: y ~ 1 (MX: 32
    outputs per row, whole blocks)."""
    n = 32
    a = torch.full((2, n), UNDERFLOW_A)
    b = torch.full((2, n), GATE_B)
    if normal_row:
        a[1], b[1] = torch.linspace(0.5, 3.0, n), torch.linspace(-2.0, 2.0, n)
    return torch.cat([a, b], dim=-1)


def verdicts(spec, case, names):
    report = run_case(spec, case, backends=list(names))
    info = report.describe()
    for n in names:
        assert report.outcomes[n].status == "ok", info
    bad = {(c.lhs, c.rhs, c.output) for c in report.failures}
    return report, bad, info


# ---- the tier primitive ----------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi,r,nan_ok", [
    (-1e-36, 1e-36, np.inf, True),    # 0 strictly inside, r = 1/0: y = +-0 gives 0 * Inf
    (-1e-36, -0.0, np.inf, True),
    (1e-36, 2e-36, np.inf, False),    # 0 outside: y * Inf is +-Inf, never NaN
    (-1e-36, 1e-36, 3.0, False),      # finite r: no NaN from a finite y
])
def test_zero_times_inf_only_where_zero_is_inside(lo, hi, r, nan_ok):
    got = TFU.zero_times_inf(np.float32([lo]), np.float32([hi]), np.float32([r]))
    assert bool(got[0]) is nan_ok


# ---- a correct backend that underflows passes, under every recipe --------------------------

@pytest.mark.parametrize("name", RECIPES)
def test_act_underflowed_row_and_exact_row_both_pass(make_backend, name):
    """torch's fp32 swiglu underflows row 0 to -0 (zero policy); the correctly rounded y keeps
    -9.8e-34 (finite codes from the tiny amax).  Both are right; so is every pair."""
    recipe = RECIPES[name]
    exact = act_backend(make_backend, exact_y)
    spec, case = crafted("act_fwd_quantize", {"x": swiglu_x(recipe)}, recipe, kind="swiglu")
    assert torch.all(torch_y(swiglu_x(recipe), "swiglu")[0] == 0)  # the premise
    assert torch.all(exact_y(swiglu_x(recipe), "swiglu")[0] != 0)
    report, bad, info = verdicts(spec, case, ["torch", exact])
    assert report.verdict == "pass", info


@pytest.mark.parametrize("name", RECIPES)
def test_act_wrongly_zeroed_row_is_caught(make_backend, name):
    """Zeroing row 1 (amax ~ 6) takes the zero policy where it is not allowed: caught."""
    recipe = RECIPES[name]
    wrong = act_backend(make_backend, lambda x, kind: _zero_row(torch_y(x, kind)))
    spec, case = crafted("act_fwd_quantize", {"x": swiglu_x(recipe)}, recipe, kind="swiglu")
    _, bad, info = verdicts(spec, case, ["torch", wrong])
    assert any(lhs == wrong and rhs == "reference" for lhs, rhs, _ in bad), info
    assert not any(lhs == "torch" and rhs == "reference" for lhs, rhs, _ in bad), info


def test_the_fuzz_finding_passes_and_its_zeroed_normal_row_is_caught(make_backend):
    """The finding's own case (seed 11 campaign): torch passes; a backend that zeroes its row
    4 (y = -3025) is caught."""
    case = {"dist": {"kind": "wide", "log2_hi": 12, "log2_lo": -12, "sample_dtype": "float32"},
            "dtype": "float32", "kind": "swiglu", "recipe": AITER_ROW, "return_amax": False,
            "seed": 3, "shape": [7, 2]}
    spec = get_spec("act_fwd_quantize")
    assert run_case(spec, case, backends=["torch"]).verdict == "pass"
    wrong = act_backend(make_backend, lambda x, kind: _zero_row(torch_y(x, kind), row=4))
    _, bad, info = verdicts(spec, case, [wrong])
    assert (wrong, "reference", "data") in bad and (wrong, "reference", "scale_inv") in bad, info


@pytest.mark.parametrize("name", ["te-row", "aiter-row", "mx-e4m3-rceil", "given"])
def test_rmsnorm_flushed_subnormal_row_passes_and_zeroed_normal_row_is_caught(make_backend,
                                                                              name):
    """RMSNorm of a row of fp32 subnormals (y ~ 3e-39, bound ~ 6e-35): a kernel that flushes
    subnormal inputs gets y = 0 there (zero policy) and torch keeps them: both pass.  A kernel
    that zeroes the normal row 1 is caught."""
    recipe = RECIPES[name]
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    x[0] = torch.linspace(-8.0, 8.0, 64) * 2.0 ** -140
    inputs = {"x": x, "gamma": torch.linspace(0.5, 1.5, 64)}
    spec, case = crafted("rmsnorm_fwd_quantize", inputs, recipe)
    ftz = norm_backend(make_backend, "rmsnorm_fwd_quantize", fix_inputs=_flush)
    report, _, info = verdicts(spec, case, ["torch", ftz])
    assert report.verdict == "pass", info
    wrong = norm_backend(make_backend, "rmsnorm_fwd_quantize", fix_y=_zero_row)
    _, bad, info = verdicts(spec, case, [wrong])
    assert any(lhs == wrong for lhs, _, _ in bad), info


@pytest.mark.parametrize("name", ["te-row-pow2", "aiter-row-nonfinite", "mx-e2m1-even"])
def test_layernorm_flushed_subnormal_output_passes(make_backend, name):
    """LayerNorm with subnormal gamma and beta (y ~ 1e-39 everywhere, bound ~ 1e-37): a kernel
    that flushes its subnormal y gets all-zero rows; torch keeps them.  Both pass."""
    recipe = RECIPES[name]
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    w = torch.linspace(-4.0, 4.0, 64) * 2.0 ** -132
    spec, case = crafted("layernorm_fwd_quantize", {"x": x, "gamma": w, "beta": w.flip(0)},
                         recipe, offset=0.0)
    ftz = norm_backend(make_backend, "layernorm_fwd_quantize", fix_y=_flush)
    report, _, info = verdicts(spec, case, ["torch", ftz])
    assert report.verdict == "pass", info


# ---- AITER's fused norms: scale_inv 1 for a zero amax ---------------------------------------

def _aiter_outputs(y32, zero_as_one):
    """The torch backend's AITER-rule quantize of fp32 y; with ``zero_as_one`` a zero row
    gets scale_inv 1 and the codes of y * 1 (AITER's fused norms: tl.where(scale == 0, 1,
    scale)); y is 0 there, so its codes are 0."""
    q = TQB.quantize(torch.from_numpy(np.asarray(y32, np.float32)), recipe_from_json(AITER_ROW),
                     rowwise=True, columnwise=False, scale=None)
    sinv, data = q.scale_inv.clone(), q.data
    if zero_as_one:
        zero = sinv == 0
        sinv[zero] = 1.0
        data = torch.where(zero[:, None], torch.zeros_like(data), data)
    return {"data": data, "scale_inv": sinv}


@pytest.mark.parametrize("zero_as_one", [False, True])
def test_aiter_zero_row_policy_where_the_amax_is_within_its_bound(zero_as_one):
    """y_ref row 0 = 3e-37 with e = 1e-35 (0 inside): y = 0 there (NaN codes and scale_inv 0,
    or with ``scale_inv_zero_as_one`` codes 0 and scale_inv 1) passes, as do the finite codes
    of the tiny amax.  Row 1 (amax 2) taking the zero policy fails both checks."""
    numerics = Numerics(scale_inv_zero_as_one=zero_as_one)
    y_ref = np.array([[3e-37, -2e-37], [2.0, -1.0]])
    e = np.array([[1e-35, 1e-35], [1e-7, 1e-7]])
    judge = TFU.FusedQuantJudge(y_ref, lambda n: e, recipe_from_json(AITER_ROW))
    for row0 in (np.zeros(2), y_ref[0]):
        y32 = np.stack([row0, y_ref[1]]).astype(np.float32)
        outs = _aiter_outputs(y32, zero_as_one and not row0.any())
        assert judge.check_data(outs, numerics).passed, row0
        assert judge.check_scale_inv(outs, numerics).passed, row0
    wrong = _aiter_outputs(np.zeros((2, 2), np.float32), zero_as_one)
    assert not judge.check_scale_inv(wrong, numerics).passed
    assert not judge.check_data(wrong, numerics).passed
