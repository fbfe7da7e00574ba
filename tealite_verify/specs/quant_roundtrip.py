"""Spec ``quant_roundtrip``: dequantize(quantize(x)) under two recipes, judged on values.

The ``dequantized`` tier (tiers/dequantized.py) compares each round trip with x,
and the two recipes' round trips with each other under the sum of their bounds: the
cross-recipe check (e.g. MXFP8 RCEIL vs FP8 current scaling vs MXFP4 with AITER's EVEN /
ties-away convention, which cannot be compared code by code).
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.types import Op
from tealite.formats import Saturation
from tealite_verify import recipe_rules as rules
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import given_scale, recipe_from_json, recipes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import dequantized
from tealite_verify.tiers.metrics import Tier

_LIMIT = {"ci": 96, "local": 400, "large": 2048}


@st.composite
def cases(draw, dtype=None, size="ci"):
    # Saturating casts only: an overflow to NaN / Inf has no value bound to judge.
    saturating = recipes(saturation=(Saturation.SATURATE,))
    return {"recipe_a": draw(saturating), "recipe_b": draw(saturating),
            "dtype": dtype or draw(float_dtypes()),
            "shape": [draw(dim(_LIMIT[size], allow_zero=True)), draw(dim(_LIMIT[size]))],
            "dist": draw(distributions(dtype or "float32", wide=False)), "seed": draw(seeds())}


def make_inputs(case, device):
    x = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    inputs = {"x": x}
    for side in "ab":
        scale = given_scale(case[f"recipe_{side}"])
        if scale is not None:
            inputs[f"scale_{side}"] = torch.tensor([scale], dtype=torch.float32, device=device)
    return inputs


def call(inputs, case, backend):
    out = {}
    for side in "ab":
        recipe = recipe_from_json(case[f"recipe_{side}"])
        q = tealite.quantize(inputs["x"], recipe, scale=inputs.get(f"scale_{side}"),
                             pad=rules.row_block(recipe) is not None, backend=backend)
        out[f"y_{side}"] = tealite.dequantize(q, out_dtype=torch.float32, backend=backend)
        out[f"scale_{side}"] = q.scale_inv
    return out


def reference(inputs, case):
    x = inputs["x"].astype(np.float64)

    recipes_ = {side: recipe_from_json(case[f"recipe_{side}"]) for side in "ab"}

    def bound(outs, side):
        r = recipes_[side]
        s = rules.element_scale(outs[f"scale_{side}"].detach().cpu().double().numpy(), r,
                                x.shape)
        return dequantized.dequantized_bound(x, s, r.fmt)

    def y(outs, side):
        return outs[f"y_{side}"].detach().cpu().double().numpy()

    def check(side):
        return lambda outs, numerics: dequantized.check_dequantized(y(outs, side), x,
                                                                    bound(outs, side))

    def cross(outs, numerics):
        return dequantized.check_pair(y(outs, "a"), y(outs, "b"), bound(outs, "a"),
                                      bound(outs, "b"), cross_recipe=True)

    def pair(side):
        return lambda ox, oy, nx, ny: dequantized.check_pair(
            y(ox, side), y(oy, side), bound(ox, side), bound(oy, side))

    return {"y_a": Expected(x, torch.float32, Tier.DEQUANTIZED, check=check("a"),
                            check_pair=pair("a")),
            "y_b": Expected(x, torch.float32, Tier.DEQUANTIZED, check=check("b"),
                            check_pair=pair("b")),
            "cross": Expected(x, torch.float32, Tier.DEQUANTIZED, check=cross,
                              check_pair=lambda ox, oy, nx, ny: cross(oy, ny))}


_MX4_AITER = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
              "element_rounding": "ties_away"}
_MX4_OCP = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
_MX8 = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_CUR = {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row", "force_pow2_scales": False,
        "amax_epsilon": 0.0, "saturation": "saturate"}

register(OpSpec(
    name="quant_roundtrip", family="quantize", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, drives=(Op.QUANTIZE, Op.DEQUANTIZE),
    smoke_cases=tuple({"recipe_a": a, "recipe_b": b, "dtype": "bfloat16", "shape": [33, 100],
                       "dist": {"kind": "normal", "scale": 2.0}, "seed": 31}
                      for a, b in ((_MX4_AITER, _MX4_OCP), (_MX8, _CUR)))))
