"""Specs for fused LayerNorm / RMSNorm forward -> FP8 / MXFP8 quantize.

Cases are the plain norm specs' cases (shapes, dtypes, value distributions, eps, zero-centered
gamma, LayerNorm offsets) plus a fused recipe: FP8 with a given scale (DelayedScaling), FP8
per-row current scaling (pow2 scales, amax_epsilon, both saturation policies) or MXFP8 (every
FP8 format incl. FNUZ, every scale rounding, both element roundings).

The quantized output is judged by the ``code-interval`` tier (tealite_verify/tolerance_fused.py)
with e = the plain norm spec's own bound on y for an fp32 output; mean and rsigma exactly as in
the plain norm spec.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite_verify.references import fused as fref
from tealite_verify.specs import OpSpec, register
from tealite_verify.specs import norms as norm_spec
from tealite_verify.strategies.recipes import recipe_from_json, recipes
from tealite_verify.tolerance_fused import FusedQuantJudge

# The plain norm specs' ci shapes (24 rows x 320) also bound the interpreted Triton kernels.
FUSED_KINDS = ("delayed", "current", "mx")


def fused_recipes() -> st.SearchStrategy[dict]:
    """Recipes a fused kernel produces: given-scale FP8, per-row FP8, MXFP8 (no e2m1)."""
    def per_row(r):
        return dict(r, granularity="row") if r["kind"] == "current" else r
    return recipes(FUSED_KINDS).filter(lambda r: r["fmt"] != "e2m1").map(per_row)


def fit_to_recipe(shape, recipe: dict, *, gated: bool = False) -> list:
    """MX blocks are 32 along the (output) hidden dim: round it down to whole blocks (>= 1)."""
    shape = list(shape)
    if recipe["kind"] == "mx":
        n = shape[-1] // 2 if gated else shape[-1]
        n = 32 * max(1, n // 32)
        shape[-1] = 2 * n if gated else n
    return shape


def scale_input(case, device) -> dict:
    if case["recipe"]["kind"] != "delayed":
        return {}
    return {"scale": torch.tensor([case["recipe"]["scale"]], dtype=torch.float32,
                                  device=device)}


def quantized_outputs(q) -> dict:
    out = {"data": q.data, "scale_inv": q.scale_inv, "amax": q.amax}
    return {k: v for k, v in out.items() if v is not None}


def quantized_expected(y_expected, recipe: dict, scale) -> dict:
    """Expected entries of the quantized output from the plain spec's Expected for y (built
    for an fp32 output: its bound is e on |y_fp32 - y_ref| plus y's own fp32 rounding)."""
    y = y_expected.value
    rows = fref.as_rows(y)

    def bound(numerics):
        return fref.as_rows(np.broadcast_to(y_expected.bound(numerics), y.shape))

    judge = FusedQuantJudge(rows, bound, recipe, scale)
    return judge.expected(fref.quantize_rows(fref.round_to_f32(rows), recipe, scale))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, rms: bool):
    case = draw(norm_spec.cases(dtype, size, rms=rms, bwd=False))
    case["recipe"] = draw(fused_recipes())
    case["shape"] = fit_to_recipe(case["shape"], case["recipe"])
    return case


def make_inputs(case, device, *, rms: bool):
    return dict(norm_spec._base_inputs(case, device, rms=rms), **scale_input(case, device))


def reference(x, case, *, rms: bool):
    as_fp32 = dict(case, dtype="float32")  # a fused kernel's y is fp32, never rounded to x's
    if rms:
        base = norm_spec.rms_fwd_reference(x, as_fp32)
    else:
        base = norm_spec.ln_fwd_reference(x, as_fp32)
    expected = quantized_expected(base.pop("y"), case["recipe"], x.get("scale"))
    expected.update(base)  # mean (LayerNorm) and rsigma: the plain norm spec's verdicts
    return expected


def call(inputs, case, backend, *, rms: bool):
    recipe = recipe_from_json(case["recipe"])
    kw = dict(eps=case["eps"], zero_centered_gamma=case["zero_centered_gamma"],
              scale=inputs.get("scale"), backend=backend)
    if rms:
        r = tealite.rmsnorm_fwd_quantize(inputs["x"], inputs["gamma"], recipe, **kw)
        return dict(quantized_outputs(r.out), rsigma=r.rsigma)
    r = tealite.layernorm_fwd_quantize(inputs["x"], inputs["gamma"], inputs["beta"], recipe, **kw)
    return dict(quantized_outputs(r.out), mean=r.mean, rsigma=r.rsigma)


_MX = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_ROW = {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row", "force_pow2_scales": False,
        "amax_epsilon": 0.0, "saturation": "saturate"}
_DELAYED = {"kind": "delayed", "fmt": "e5m2", "scale": 0.75, "saturation": "saturate"}


def _smoke(shape, dtype, recipe, **kw):
    case = {"shape": shape, "dtype": dtype, "weight_dtype": dtype, "zero_centered_gamma": False,
            "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0}, "seed": 7, "offset": 0.0,
            "recipe": recipe}
    case.update(kw)
    return case


SMOKE = (_smoke([5, 4, 160], "bfloat16", _MX),
         _smoke([17, 256], "float16", _ROW, zero_centered_gamma=True),
         _smoke([0, 128], "float32", _DELAYED),
         _smoke([3, 96], "float32", dict(_MX, fmt="e5m2fnuz", scale_rounding="floor"),
                weight_dtype="float32"),
         _smoke([9, 77], "bfloat16", dict(_DELAYED, fmt="e4m3", scale=64.0),
                dist={"kind": "outliers", "scale": 1.0, "frac": 0.01, "factor": 1024.0}))

for _name, _rms in (("layernorm_fwd_quantize", False), ("rmsnorm_fwd_quantize", True)):
    register(OpSpec(
        name=_name, family="fused",
        cases=lambda dtype=None, size="ci", _rms=_rms: cases(dtype, size, rms=_rms),
        make_inputs=lambda case, device, _rms=_rms: make_inputs(case, device, rms=_rms),
        call=lambda inputs, case, backend, _rms=_rms: call(inputs, case, backend, rms=_rms),
        reference=lambda x, case, _rms=_rms: reference(x, case, rms=_rms),
        smoke_cases=tuple(c if not _rms else {k: v for k, v in c.items() if k != "offset"}
                          for c in SMOKE)))
