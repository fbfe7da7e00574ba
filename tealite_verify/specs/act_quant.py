"""Spec for fused activation forward -> FP8 / MXFP8 quantize, every kind (gated and pointwise).

Cases are the plain activation spec's cases plus a fused recipe and ``return_amax`` (see
specs/norm_quant.py; AITER-shaped cases use the gated kinds AITER fuses); for MX the output's
hidden dim (half of x's for gated kinds) is whole 32-blocks.  The quantized output is judged
by the ``code-interval`` tier with e = the plain activation spec's own bound on y for an fp32
output.
"""
from __future__ import annotations

from hypothesis import strategies as st

import tealite
from tealite.ops.activations import GATED, KINDS
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.specs import OpSpec, register
from tealite_verify.specs import activations as act_spec
from tealite_verify.specs.norm_quant import (FUSED_RECIPES, draw_recipe_and_outputs,
                                             fit_to_recipe, output_flags, quantized_expected,
                                             quantized_outputs, scale_input)
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.recipes import FP8_SCALE_RULES, recipe_from_json

# The gated kinds AITER's act_mul_and_* kernels compute (silu, gelu, relu on the first half).
AITER_KINDS = ("swiglu", "geglu", "reglu")


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    case = draw(act_spec.cases(dtype, size, bwd=False))
    if draw_recipe_and_outputs(draw, case, norm=False) and case["kind"] not in AITER_KINDS:
        case["kind"] = draw(pick(*AITER_KINDS))  # a gated kind: an even width
        case["shape"][-1] = 2 * max(1, case["shape"][-1] // 2)
    case["shape"] = fit_to_recipe(case["shape"], case["recipe"], gated=case["kind"] in GATED)
    return case


def make_inputs(case, device):
    return dict(act_spec.make_inputs(case, device), **scale_input(case, device))


def reference(x, case):
    # A fused kernel's y is fp32, never rounded to x's dtype: the bound for an fp32 output.
    base = act_spec.fwd_reference(x, dict(case, dtype="float32"))
    return quantized_expected(base["y"], case["recipe"], x.get("scale"),
                              amax_required=output_flags(case, norm=False)["return_amax"])


def call(inputs, case, backend):
    q = tealite.act_fwd_quantize(inputs["x"], case["kind"], recipe_from_json(case["recipe"]),
                                 scale=inputs.get("scale"), backend=backend,
                                 **output_flags(case, norm=False))
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


_AITER_SMOKE = (
    dict(_smoke(0, "swiglu"), dtype="float16", return_amax=False,
         recipe={"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
                 "element_rounding": "ties_away"}),
    dict(_smoke(1, "geglu"), dtype="float32", return_amax=False,
         recipe={"kind": "current", "fmt": "e4m3", "granularity": "row",
                 "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate",
                 "scale_rule": "amax/fmax"}),
)

register(OpSpec(name=Op.ACT_FWD_QUANTIZE, family="fused", cases=cases, make_inputs=make_inputs,
                call=call, reference=reference,
                smoke_cases=tuple(_smoke(i, k) for i, k in enumerate(KINDS)) + _AITER_SMOKE,
                coverage=(cov.recipe_cells("recipe", FUSED_RECIPES,
                                     scale_rules=FP8_SCALE_RULES, granularity=("row",))
                          + cov.layout_cells("kind", KINDS) + cov.edge_cells(cov.FINITE_EDGES))))
