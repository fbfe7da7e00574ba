"""Spec for fused activation forward -> FP8 / MXFP8 quantize, every kind (gated and pointwise).

Cases are the plain activation spec's cases plus a fused recipe (see specs/norm_quant.py); for
MX the output's hidden dim (half of x's for gated kinds) is whole 32-blocks.  The quantized
output is judged by the ``code-interval`` tier with e = the plain activation spec's own bound
on y for an fp32 output.
"""
from __future__ import annotations

from hypothesis import strategies as st

import tealite
from tealite.ops.activations import GATED, KINDS
from tealite_verify.specs import OpSpec, register
from tealite_verify.specs import activations as act_spec
from tealite_verify.specs.norm_quant import (fit_to_recipe, fused_recipes, quantized_expected,
                                             quantized_outputs, scale_input)
from tealite_verify.strategies.recipes import recipe_from_json


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    case = draw(act_spec.cases(dtype, size, bwd=False))
    case["recipe"] = draw(fused_recipes())
    case["shape"] = fit_to_recipe(case["shape"], case["recipe"], gated=case["kind"] in GATED)
    return case


def make_inputs(case, device):
    return dict(act_spec.make_inputs(case, device), **scale_input(case, device))


def reference(x, case):
    # A fused kernel's y is fp32, never rounded to x's dtype: the bound for an fp32 output.
    base = act_spec.fwd_reference(x, dict(case, dtype="float32"))
    return quantized_expected(base["y"], case["recipe"], x.get("scale"))


def call(inputs, case, backend):
    q = tealite.act_fwd_quantize(inputs["x"], case["kind"], recipe_from_json(case["recipe"]),
                                 scale=inputs.get("scale"), backend=backend)
    return quantized_outputs(q)


_RECIPES = (
    {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"},
    {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row", "force_pow2_scales": True,
     "amax_epsilon": 0.0, "saturation": "saturate"},
    {"kind": "delayed", "fmt": "e5m2", "scale": 8.0, "saturation": "saturate"},
    {"kind": "mx", "fmt": "e5m2fnuz", "scale_rounding": "even", "element_rounding": "rne"},
)


def _smoke(i, kind):
    recipe = _RECIPES[i % len(_RECIPES)]
    shape = fit_to_recipe([7, 128], recipe, gated=kind in GATED)
    return {"kind": kind, "shape": shape, "dtype": ("bfloat16", "float16", "float32")[i % 3],
            "dist": {"kind": "normal", "scale": 2.0}, "seed": 11, "recipe": recipe}


register(OpSpec(name="act_fwd_quantize", family="fused", cases=cases, make_inputs=make_inputs,
                call=call, reference=reference,
                smoke_cases=tuple(_smoke(i, k) for i, k in enumerate(KINDS))))
