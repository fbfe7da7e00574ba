"""Specs for ``quantize`` (every recipe, rowwise / columnwise / both), ``dequantize`` and
``amax``.  Codes and scales are judged bit-exactly (tiers/quantized.py); MX scales and codes by
the e8m0-adjusted tier (tiers/e8m0_adjusted.py: codes re-quantized under the backend's own
scales, its declared ``mx_nonfinite`` policy, FP4 ties where declared); FP8 under AITER's rule
by the fp32-division tiers where the backend declares ``fp32_div_ulps`` (tiers/fp32_div.py).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.formats import get_format
from tealite.recipes import Granularity
from tealite.ops.quantize import QuantizedTensor
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import recipe_rules as rules
from tealite_verify.references import quantize as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.tiers import quantized, ulp
from tealite_verify.tiers.e8m0_adjusted import MXOutput
from tealite_verify.tiers.fp32_div import AiterRuleOutput
from tealite_verify.tiers.metrics import Tier
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import (FP8_SCALE_RULES, aiter_recipes, given_scale,
                                               recipe_from_json, recipes)
from tealite_verify.strategies.shapes import dim, row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate

_LIMITS = {"ci": 160, "local": 600, "large": 4096}
U8 = torch.uint8


@functools.lru_cache(maxsize=None)
def _distributions(fmt: str, dtype: str) -> st.SearchStrategy[dict]:
    """Values for quantizing to ``fmt``: exact codes, ties and scale boundaries half the time."""
    edges = st.just({"kind": "quant_edges", "fmt": fmt, "block": 32})
    specials = st.builds(lambda f: {"kind": "specials", "frac": f,
                                         "sample_dtype": "float32"}, pick(0.01, 0.2))
    return st.one_of(edges, edges, specials, distributions(dtype))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    dtype = dtype or draw(float_dtypes())
    # A third of the cases use exactly the conventions AITER's quant entry points follow,
    # rowwise and in whole MX blocks (what they accept); the rest every recipe, both scale
    # rules, every direction.
    aiter_shaped = draw(pick(False, False, True))
    entry = draw(aiter_recipes() if aiter_shaped else recipes(scale_rules=FP8_SCALE_RULES))
    recipe = recipe_from_json(entry)
    limit = _LIMITS[size]
    rowwise, columnwise = (True, False) if aiter_shaped else \
        draw(pick((True, False), (False, True), (True, True)))
    pad = False
    m, k = draw(dim(limit, allow_zero=True)), draw(dim(limit))
    blk = rules.row_block(recipe)
    if blk:
        pad = False if aiter_shaped else draw(st.booleans())
        if not pad:  # the blocked dims must be whole blocks (and even for e2m1)
            k = blk * max(1, k // blk) if rowwise else k
            m = blk * max(0 if not columnwise else 1, m // blk) if columnwise else m
    dist = draw(_distributions(recipe.fmt, dtype))
    return {"recipe": entry, "dtype": dtype, "shape": [m, k], "rowwise": rowwise,
            "columnwise": columnwise, "pad": pad, "dist": dist, "seed": draw(seeds())}


def make_inputs(case, device):
    x = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    inputs = {"x": x}
    scale = given_scale(case["recipe"])
    if scale is not None:
        inputs["scale"] = torch.tensor([scale], dtype=torch.float32, device=device)
    return inputs


def call(inputs, case, backend):
    q = tealite.quantize(inputs["x"], recipe_from_json(case["recipe"]), rowwise=case["rowwise"],
                         columnwise=case["columnwise"], scale=inputs.get("scale"),
                         pad=case["pad"], backend=backend)
    out = {"data": q.data, "scale_inv": q.scale_inv, "columnwise_data": q.columnwise_data,
           "columnwise_scale_inv": q.columnwise_scale_inv, "amax": q.amax}
    return {k: v for k, v in out.items() if v is not None}


def _mx_expected(x, prefix, recipe, scale=None) -> dict:
    """Expected entries for one direction (x is already transposed for columnwise)."""
    fmt, mode, er = recipe.fmt, recipe.scale_rounding.value, recipe.element_rounding.value
    q = rules.quantize(x, recipe)
    bits, scales = q.bits, q.scale_inv
    dname, sname = f"{prefix}data", f"{prefix}scale_inv"
    packed = ref.pack_e2m1(bits) if fmt == "e2m1" else bits
    ignoring, undefined = ref.mx_scales_nan_ignoring(x, fmt, mode)
    judge = MXOutput(x, fmt, mode, er, dname, sname, scales, ignoring, undefined)
    return {sname: Expected(scales, U8, Tier.E8M0_ADJUSTED, check=judge.check_scales,
                            check_pair=judge.pair_scales),
            dname: Expected(packed, U8, Tier.E8M0_ADJUSTED, check=judge.check_codes,
                            check_pair=judge.pair_codes)}


def _aiter_rule_expected(x, prefix, recipe, bits, scale_inv) -> dict:
    """FP8 current scaling under AITER's rule: bit-exact for a backend whose divisions are
    IEEE, the fp32_div_ulps tiers otherwise (tiers/fp32_div.py)."""
    per_row = recipe.scale_granularity is Granularity.ROW
    judge = AiterRuleOutput(x, recipe.fmt, per_row, f"{prefix}data", f"{prefix}scale_inv",
                            bits, scale_inv, ref.aiter_amax(x, per_row=per_row))
    return {judge.data: Expected(bits, U8, Tier.EXACT, check=judge.check_codes,
                                 check_pair=judge.pair_codes),
            judge.scale_inv: Expected(scale_inv, torch.float32, Tier.EXACT,
                                      check=judge.check_scales, check_pair=judge.pair_scales)}


def _fp8_expected(x, prefix, recipe, scale=None) -> dict:
    q = rules.quantize(x, recipe, scale)
    bits, scale_inv = q.bits, q.scale_inv
    if rules.divides_by_fmax(recipe):
        return _aiter_rule_expected(x, prefix, recipe, bits, scale_inv)
    dname, fmt, n = f"{prefix}data", recipe.fmt, x.shape[1]

    def check_codes(outs, numerics):
        return quantized.check_fp8_codes(outs, dname, fmt, n, bits)

    def pair_codes(ox, oy, nx, ny):
        return quantized.pair_fp8_codes(ox, oy, dname, fmt, n)

    return {dname: Expected(bits, U8, Tier.EXACT, check=check_codes, check_pair=pair_codes),
            f"{prefix}scale_inv": Expected(scale_inv, torch.float32, Tier.EXACT)}


# The expected entries of one direction, by the tier that judges the recipe's codes.
_EXPECTED_BY_TIER = {Tier.EXACT: _fp8_expected, Tier.E8M0_ADJUSTED: _mx_expected}


def reference(inputs, case):
    x = inputs["x"].astype(np.float32)
    recipe, scale = recipe_from_json(case["recipe"]), given_scale(case["recipe"])
    expected_of = _EXPECTED_BY_TIER[rules.code_tier(recipe)]
    expected = {}
    for flag, prefix, t in ((case["rowwise"], "", x), (case["columnwise"], "columnwise_", x.T)):
        if flag:
            expected.update(expected_of(np.ascontiguousarray(t), prefix, recipe, scale))
    amax = rules.reference_amax(x, recipe)
    if rules.divides_by_fmax(recipe):
        expected["amax"] = Expected(
            None, torch.float32, Tier.ABSENT, check=lambda outs, n: quantized.check_no_amax(outs),
            check_pair=lambda ox, oy, nx, ny: quantized.check_no_amax(ox))
    elif amax is not None:
        expected["amax"] = Expected(amax, torch.float32, Tier.EXACT)
    return expected


# ---- dequantize and amax -------------------------------------------------------------------

def dq_cases(dtype: str | None = None, size: str = "ci"):
    return cases(dtype, size).map(lambda c: dict(c, rowwise=True, columnwise=False))


def dq_make_inputs(case, device):
    """Codes and scales from the *reference* quantizer, so every backend decodes the same."""
    x = make_inputs(case, "cpu")["x"].float().numpy()
    recipe = recipe_from_json(case["recipe"])
    q = rules.quantize(x, recipe, given_scale(case["recipe"]))
    fmt = get_format(recipe.fmt)
    data = torch.from_numpy(ref.pack_e2m1(q.bits) if fmt.packed else q.bits)
    scale_inv = torch.from_numpy(np.asarray(q.scale_inv))
    if not fmt.packed:
        data = data.view(fmt.torch_dtype)
    return {"data": data.to(device), "scale_inv": scale_inv.to(device),
            "_recipe": recipe, "_shape": tuple(x.shape)}


def dq_call(inputs, case, backend):
    q = QuantizedTensor(recipe=inputs["_recipe"], shape=inputs["_shape"], data=inputs["data"],
                        scale_inv=inputs["scale_inv"])
    return {"y": tealite.dequantize(q, out_dtype=dtype_of(case["dtype"]), backend=backend)}


def dq_reference(inputs, case):
    recipe = recipe_from_json(case["recipe"])
    m, k = case["shape"]
    # The runner hands references float64 views of the inputs: FP8 codes arrive decoded,
    # packed e2m1 bytes and E8M0 bytes arrive as their integer values.
    data = np.asarray(inputs["data"], dtype=np.float64)
    vals = ref.decode(ref.unpack_e2m1(data.astype(np.uint8), k), recipe.fmt) \
        if get_format(recipe.fmt).packed else data
    y = vals * rules.element_scale(np.asarray(inputs["scale_inv"]), recipe, (m, k))
    out_dt = dtype_of(case["dtype"])
    # codes x scale rounded once in fp32, then once to the output dtype.
    return {"y": Expected(y, out_dt, Tier.ULP, lambda n: ulp.elementwise_tolerance(
        y, np.abs(y), out_dt, n, ops=1))}


SMOKE = (
    {"recipe": {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil",
                "element_rounding": "rne"}, "dtype": "bfloat16", "shape": [65, 96],
     "rowwise": True, "columnwise": False, "pad": False,
     "dist": {"kind": "quant_edges", "fmt": "e4m3", "block": 32}, "seed": 5},
    {"recipe": {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
                "element_rounding": "ties_away"}, "dtype": "float32", "shape": [64, 96],
     "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "quant_edges", "fmt": "e2m1", "block": 32}, "seed": 6},
    {"recipe": {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row",
                "force_pow2_scales": False, "amax_epsilon": 0.0}, "dtype": "float16",
     "shape": [33, 17], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "normal", "scale": 4.0}, "seed": 7},
    {"recipe": {"kind": "block", "fmt": "e4m3", "block": [128, 128],
                "force_pow2_scales": True, "amax_epsilon": 0.0}, "dtype": "bfloat16",
     "shape": [257, 129], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "outliers", "scale": 1.0, "frac": 0.01, "factor": 1024.0}, "seed": 8},
    {"recipe": {"kind": "delayed", "fmt": "e5m2", "scale": 0.75}, "dtype": "float32",
     "shape": [0, 31], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "normal", "scale": 1.0}, "seed": 9},
)

_RECIPE_CELLS = cov.recipe_cells("recipe", scale_rules=FP8_SCALE_RULES)
register(OpSpec(name=Op.QUANTIZE, family="quantize", cases=cases, make_inputs=make_inputs,
                call=call, reference=reference, smoke_cases=SMOKE,
                coverage=_RECIPE_CELLS + cov.direction_cells() + cov.edge_cells(cov.QUANT_EDGES)
                + cov.product_cells(cov.family_cells("recipe"),
                                    cov.direction_cells())))
register(OpSpec(name=Op.DEQUANTIZE, family="quantize", cases=dq_cases,
                make_inputs=dq_make_inputs, call=dq_call, reference=dq_reference,
                smoke_cases=tuple(dict(c, rowwise=True, columnwise=False) for c in SMOKE),
                coverage=_RECIPE_CELLS + cov.edge_cells(cov.SHAPE_EDGES + (
                    cov.TIES, cov.NONFINITE, cov.ZERO_BLOCK, cov.OVERFLOW))))
register(OpSpec(
    name=Op.AMAX, family="quantize",
    cases=lambda dtype=None, size="ci": st.fixed_dictionaries({
        # (*leading, H) with the leading product capped: the interpreter runs amax too.
        "shape": row_shapes(max_rows=_LIMITS[size], max_hidden=_LIMITS[size]).map(list),
        "dtype": st.just(dtype) if dtype else float_dtypes(), "seed": seeds(),
        "dist": distributions(dtype or "float32")}),
    make_inputs=lambda c, d: {"x": generate(c["dist"], c["shape"], dtype_of(c["dtype"]),
                                            c["seed"], d)},
    call=lambda i, c, b: {"amax": tealite.amax(i["x"], backend=b)},
    reference=lambda i, c: {"amax": Expected(ref.amax(i["x"]).reshape(1), torch.float32,
                                             Tier.EXACT)},
    smoke_cases=({"shape": [3, 0], "dtype": "float32", "seed": 1,
                  "dist": {"kind": "normal", "scale": 1.0}},
                 {"shape": [7, 33], "dtype": "bfloat16", "seed": 2,
                  "dist": {"kind": "wide", "log2_lo": -12, "log2_hi": 12}}),
    coverage=cov.edge_cells(cov.FLOAT_EDGES + (cov.NONFINITE,))))
