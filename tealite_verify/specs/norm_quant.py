"""Specs for fused LayerNorm / RMSNorm forward -> FP8 / MXFP8 quantize.

Cases are the plain norm specs' cases (shapes, dtypes, value distributions, eps, zero-centered
gamma, LayerNorm offsets) plus a fused recipe: FP8 with a given scale (DelayedScaling), FP8
per-row current scaling (TE's rule with pow2 scales, amax_epsilon, both saturation policies,
or AITER's amax/fmax rule) or MX (every FP8 format incl. FNUZ and E2M1, every scale rounding,
both element roundings), and the outputs the caller needs: ``return_stats`` (mean / rsigma)
and ``return_amax`` (absent from a case: True).  A third of the cases are AITER-shaped: the
conventions AITER's fused kernels follow (AITER's rule per row, given-scale FP8 that
saturates, MXFP4 with EVEN scales and ties-away elements), plain gamma and no statistics or
amax requested, so the aiter backends' fused entry points get cases they accept.

The quantized output is judged by the ``code-interval`` tier (tealite_verify/tiers/code_interval.py)
with e = the plain norm spec's own bound on y for an fp32 output; mean and rsigma exactly as in
the plain norm spec (when not requested, a backend may leave them out).
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite import recipes as R
from tealite.formats import ElementRounding, Saturation, ScaleRounding, get_format
from tealite.ops.fused import FUSED_RECIPES
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import recipe_rules as rules
from tealite_verify.references import fused as fref
from tealite_verify.references import quantize as qref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs import norms as norm_spec
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.recipes import (AITER_RULE, FP8_SCALE_RULES, given_scale,
                                               recipe_from_json, recipes)
from tealite_verify.tiers import bounded
from tealite_verify.tiers.code_interval import FusedQuantJudge
from tealite_verify.tiers.metrics import absent

# The plain norm specs' ci shapes (24 rows x 320) also bound the interpreted Triton kernels.
# The recipes a fused norm / activation kernel writes are the front-end's list (recipe
# classes: a given scale, per-row current scaling, MX blocks): the op's contract, not a recipe
# fact, so the spec reads it from the op; a recipe joins it when the fused op takes it.


@functools.lru_cache(maxsize=None)  # built once: drawn from on every case
def fused_recipes() -> st.SearchStrategy[dict]:
    """Recipes a fused kernel produces: given-scale FP8, per-row FP8 under either scale rule,
    MX with FP8 or E2M1 elements."""
    # The class first (a third each): drawn as one_of, the two scale rules make current
    # scaling crowd out the MX modes in short derandomized runs.
    return pick(*FUSED_RECIPES).flatmap(
        lambda cls: recipes((cls,), scale_rules=FP8_SCALE_RULES, granularity=("row",)))


@functools.lru_cache(maxsize=None)
def aiter_fused_recipes() -> st.SearchStrategy[dict]:
    """The conventions of AITER's fused Triton kernels: per-row FP8 under AITER's rule, given-
    scale FP8 that saturates (its kernel clamps), MXFP4 with EVEN scales and ties-away elements
    (drawn three times as often: the one that runs under Triton's interpreter too)."""
    options = {
        "mxfp4": recipes((R.MXBlockScaling,), fmt=("e2m1",),
                         scale_rounding=(ScaleRounding.EVEN,),
                         element_rounding=(ElementRounding.TIES_AWAY,)),
        "row": recipes((R.Float8CurrentScaling,), scale_rules=(AITER_RULE,),
                       granularity=("row",)),
        "given": recipes((R.DelayedScaling,), saturation=(Saturation.SATURATE,)),
    }
    return pick("mxfp4", "mxfp4", "mxfp4", "row", "given").flatmap(options.get)


def draw_recipe_and_outputs(draw, case: dict, *, norm: bool) -> bool:
    """Add a fused recipe and the requested outputs to ``case``: AITER-shaped a third of the
    time (no statistics or amax requested, plain gamma), anything otherwise.  Returns whether
    the case is AITER-shaped."""
    if draw(pick(False, False, True)):
        case["recipe"] = draw(aiter_fused_recipes())
        case["return_amax"] = False
        if norm:
            case["return_stats"], case["zero_centered_gamma"] = False, False
        return True
    case["recipe"] = draw(fused_recipes())
    case["return_amax"] = draw(st.booleans())
    if norm:
        case["return_stats"] = draw(st.booleans())
    return False


def output_flags(case, *, norm: bool) -> dict:
    """The front-end's return_* arguments (cases stored before they existed: True)."""
    flags = {"return_amax": case.get("return_amax", True)}
    if norm:
        flags["return_stats"] = case.get("return_stats", True)
    return flags


def fit_to_recipe(shape, entry: dict, *, gated: bool = False) -> list:
    """MX blocks are 32 along the (output) hidden dim: round it down to whole blocks (>= 1)."""
    shape = list(shape)
    blk = rules.row_block(recipe_from_json(entry))
    if blk:
        n = shape[-1] // 2 if gated else shape[-1]
        n = blk * max(1, n // blk)
        shape[-1] = 2 * n if gated else n
    return shape


def scale_input(case, device) -> dict:
    scale = given_scale(case["recipe"])
    if scale is None:
        return {}
    return {"scale": torch.tensor([scale], dtype=torch.float32, device=device)}


def quantized_outputs(q) -> dict:
    out = {"data": q.data, "scale_inv": q.scale_inv, "amax": q.amax}
    return {k: v for k, v in out.items() if v is not None}


def quantized_expected(y_expected, entry: dict, scale, *, amax_required: bool = True) -> dict:
    """Expected entries of the quantized output from the plain spec's Expected for y (built
    for an fp32 output: its bound is e on |y_fp32 - y_ref| plus y's own fp32 rounding)."""
    y = y_expected.value
    rows = fref.as_rows(y)

    def bound(numerics):
        return fref.as_rows(np.broadcast_to(y_expected.bound(numerics), y.shape))

    recipe = recipe_from_json(entry)
    given = scale if scale is not None or not recipe.scale_given else given_scale(entry)
    judge = FusedQuantJudge(rows, bound, recipe, scale, amax_required=amax_required)
    return _judged_expected(judge, recipe,
                            rules.quantize(fref.round_to_f32(rows), recipe, given))


def _judged_expected(judge: FusedQuantJudge, recipe, reference: rules.Quantized) -> dict:
    """Expected entries for data, scale_inv and amax, each judged by ``judge``; ``reference``
    is the reference quantization of round32(y_ref) (the e = 0 answer)."""
    bits = reference.bits
    if get_format(recipe.fmt).packed:
        bits = qref.pack_e2m1(bits)
    amax = None if reference.amax is None else np.asarray(reference.amax, np.float32)
    values = {"data": (bits, torch.uint8),
              "scale_inv": (reference.scale_inv, rules.scale_dtype(recipe)),
              "amax": (amax, torch.float32)}
    return {name: Expected(*values[name], tier, check=judge.check(name),
                           check_pair=judge.check_pair(name))
            for name, tier in judge.tiers().items()}


def optional(name: str, exp: Expected) -> Expected:
    """``exp`` for an output the caller did not request: judged when present, else absent."""
    def check(outputs, numerics):
        got = outputs.get(name)
        if got is None:
            return absent("not requested")
        return bounded.compare_bounded(got, exp.value, exp.bound(numerics), exp.out_dtype,
                                       tier=exp.tier)
    return Expected(exp.value, exp.out_dtype, exp.tier, exp.bound, check=check)


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, rms: bool):
    case = draw(norm_spec.cases(dtype, size, rms=rms, bwd=False))
    draw_recipe_and_outputs(draw, case, norm=True)
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
    flags = output_flags(case, norm=True)
    expected = quantized_expected(base.pop("y"), case["recipe"], x.get("scale"),
                                  amax_required=flags["return_amax"])
    # mean (LayerNorm) and rsigma: the plain norm spec's verdicts (if requested or returned).
    expected.update(base if flags["return_stats"] else
                    {k: optional(k, v) for k, v in base.items()})
    return expected


def call(inputs, case, backend, *, rms: bool):
    recipe = recipe_from_json(case["recipe"])
    kw = dict(eps=case["eps"], zero_centered_gamma=case["zero_centered_gamma"],
              scale=inputs.get("scale"), backend=backend, **output_flags(case, norm=True))
    if rms:
        r = tealite.rmsnorm_fwd_quantize(inputs["x"], inputs["gamma"], recipe, **kw)
        stats = {"rsigma": r.rsigma}
    else:
        r = tealite.layernorm_fwd_quantize(inputs["x"], inputs["gamma"], inputs["beta"], recipe,
                                           **kw)
        stats = {"mean": r.mean, "rsigma": r.rsigma}
    return dict(quantized_outputs(r.out), **{k: v for k, v in stats.items() if v is not None})


_MX = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_ROW = {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row", "force_pow2_scales": False,
        "amax_epsilon": 0.0, "saturation": "saturate"}
_DELAYED = {"kind": "delayed", "fmt": "e5m2", "scale": 0.75, "saturation": "saturate"}
_MXFP4_AITER = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
                "element_rounding": "ties_away"}
_ROW_AITER = dict(_ROW, fmt="e4m3", scale_rule=AITER_RULE)
_NOTHING_EXTRA = {"return_stats": False, "return_amax": False}


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
                dist={"kind": "outliers", "scale": 1.0, "frac": 0.01, "factor": 1024.0}),
         _smoke([6, 160], "float16", _MXFP4_AITER, **_NOTHING_EXTRA),
         _smoke([5, 96], "float32", _ROW_AITER, **_NOTHING_EXTRA,
                dist={"kind": "zero_rows", "scale": 1.0, "frac": 0.25}))

for _name, _rms in ((Op.LAYERNORM_FWD_QUANTIZE, False), (Op.RMSNORM_FWD_QUANTIZE, True)):
    register(OpSpec(
        name=_name, family="fused",
        cases=lambda dtype=None, size="ci", _rms=_rms: cases(dtype, size, rms=_rms),
        make_inputs=lambda case, device, _rms=_rms: make_inputs(case, device, rms=_rms),
        call=lambda inputs, case, backend, _rms=_rms: call(inputs, case, backend, rms=_rms),
        reference=lambda x, case, _rms=_rms: reference(x, case, rms=_rms),
        smoke_cases=tuple(c if not _rms else {k: v for k, v in c.items() if k != "offset"}
                          for c in SMOKE),
        coverage=(cov.recipe_cells("recipe", FUSED_RECIPES,
                                     scale_rules=FP8_SCALE_RULES, granularity=("row",))
                  + cov.layout_cells("zero_centered_gamma", (True, False))
                  + cov.edge_cells(cov.FINITE_EDGES))))
