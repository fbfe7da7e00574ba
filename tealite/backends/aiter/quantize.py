"""``quantize`` on AITER's HIP quant kernels (never run on AMD hardware; see the package
docstring).  What AITER 0.1.7 computes (csrc/kernels/quant_kernels.cu, include/ck_tile/
vec_convert.h) and why most tealite recipes are rejected:

* FP8 per-tensor / per-token (``dynamic_per_tensor_quant``, ``dynamic_per_token_scaled_quant``):
  ``scale_inv = amax * fl32(1/fmax)`` -- a product with the rounded reciprocal, neither TE's
  ``fmax/amax`` nor the ``amax/fmax`` division of AITER's own Triton kernels (the three differ
  in the last bit of the scale for about half of all amaxes); codes = RNE cast of
  ``x * fl32(1/scale_inv)`` after a clamp to +-fmax (``v_med3``).  They return no amax, which
  ``tealite.quantize`` must return for these recipes.  Rejected.
* FP8 given scale (``static_per_tensor_quant``): takes the *dequantization* scale and
  multiplies by its fp32 reciprocal, so ``DelayedScaling``'s ``x * scale`` is not reproduced
  (1/(1/s) != s in fp32); no amax either.  Rejected.
* FP8 1x128 groups: ``scale_inv = max(amax, 1e-10) * fl32(1/fmax)``, never a power of two;
  tealite's ``Float8BlockScaling`` follows TE.  Rejected.
* MXFP4 (``per_1x32_f4_quant_hip``, gfx950 only: ``v_cvt_scalef32_pk_fp4``): the scale is
  ``amax`` rounded to the *nearest* power of two with mantissa 1.5 rounding up, times 1/4
  (``fp4_scale``), and the amax starts at 1e-10 (an all-zero block gets scale byte 92, not 0).
  That is none of tealite's :class:`~tealite.formats.ScaleRounding` modes (FLOOR never rounds
  up, CEIL rounds up any mantissa > 1, EVEN from 1.75, RCEIL above 1.5 but not at exactly
  1.5), so the backend's ``PLATFORM.get().mxfp4_scale_rounding`` is None and every MXFP4
  recipe is rejected.  The adapter below is exercised by the tests with that fact overridden
  (``PLATFORM.override``, against a fake AITER), so it is ready if tealite gains the rule.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, PLATFORM, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.formats import ElementRounding
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op, QuantizedTensor

_IN = (torch.float16, torch.bfloat16)  # AITER_DISPATCH_FLOATING16_TYPES
HIP_FP8_SCALE_RULE = "amax*rcp(fmax)"

_FP8_WHY = {
    "dynamic_per_tensor_quant": (
        f"dynamic_per_tensor_quant computes scale_inv = amax * fl32(1/fmax) "
        f"({HIP_FP8_SCALE_RULE}), a rule no tealite FP8ScaleRule names, and returns no amax "
        "(tealite.quantize must return it for current scaling)"),
    "dynamic_per_token_scaled_quant": (
        f"dynamic_per_token_scaled_quant computes scale_inv = amax * fl32(1/fmax) per row "
        f"({HIP_FP8_SCALE_RULE}), a rule no tealite FP8ScaleRule names, and returns no amax "
        "(tealite.quantize must return the row amaxes)"),
    "static_per_tensor_quant": (
        "static_per_tensor_quant takes the dequantization scale and multiplies by its fp32 "
        "reciprocal (1/(1/scale) != scale in fp32), so DelayedScaling's x * scale codes are not "
        "reproduced; and it returns no amax"),
    "per_group_quant_hip": (
        "AITER's 1x128 group quant (dynamic_per_token_scaled_quant on 128-wide rows) computes "
        "scale_inv = max(amax, 1e-10) * fl32(1/fmax), never a power of two; tealite's "
        "Float8BlockScaling follows TE (fmax/amax, optionally rounded down to a power of two)"),
}


# AITER's FP8 quant entry point for each scale layout (computed, not given, scales).
_FP8_ENTRY_POINTS = {Granularity.TENSOR: "dynamic_per_tensor_quant",
                     Granularity.ROW: "dynamic_per_token_scaled_quant",
                     Granularity.BLOCK: "dynamic_per_token_scaled_quant"}  # per-group path


def _entry_point(params) -> str | None:
    r = params["recipe"]
    family = getattr(r, "family", None)
    if family is Family.MX:
        return "per_1x32_f4_quant_hip" if r.fmt == "e2m1" else None
    if family is not Family.FP8:
        return None
    if r.scale_given:
        return "static_per_tensor_quant"
    return _FP8_ENTRY_POINTS.get(r.scale_granularity)


def _why_not_mxfp4(params) -> str | None:
    r = params["recipe"]
    rounding = PLATFORM.get().mxfp4_scale_rounding
    if rounding is None or r.scale_rounding != rounding:
        return ("per_1x32_f4_quant_hip rounds the block amax to the nearest power of two "
                "(mantissa 1.5 rounds up) and divides by 4; no tealite ScaleRounding is that rule "
                "(FLOOR / CEIL / EVEN / RCEIL each differ on some amax), and an all-zero block "
                f"gets scale byte 92; recipe asks for {r.scale_rounding.value}")
    if r.element_rounding != ElementRounding.RNE:
        return "per_1x32_f4_quant_hip's elements come from v_cvt_scalef32_pk_fp4 (RNE), not " \
               f"{r.element_rounding.value}"
    if runtime().arch != "gfx950":
        return f"per_1x32_f4_quant_hip is compiled for gfx950 only (not {runtime().arch})"
    if params["dtype"] not in _IN:
        return f"per_1x32_f4_quant_hip takes float16/bfloat16 input, not {params['dtype']}"
    m, k = params["m"], params["k"]
    if m == 0 or k == 0:
        return "per_1x32_f4_quant_hip launches no kernel for an empty input"
    for flag, name, size in ((params["rowwise"], "K", k), (params["columnwise"], "M", m)):
        if flag and size % 32:
            return f"per_1x32_f4_quant_hip quantizes whole 32-element groups: {name}={size}"
    return None


def _why_not(params) -> str | None:
    ep = _entry_point(params)
    r = params["recipe"]
    if ep is None and getattr(r, "family", None) is Family.MX:
        return f"no AITER HIP quant entry point is wired for MX {params['fmt']} (MXFP8)"
    if ep is None:
        return f"no AITER HIP quant entry point for {type(r).__name__}'s scales"
    why = common_why_not(params, ep)
    if why:
        return why
    if r.family is Family.FP8 and r.scale_granularity is Granularity.BLOCK:
        return _FP8_WHY["per_group_quant_hip"]
    if ep in _FP8_WHY:
        return _FP8_WHY[ep]
    return outside(r, "per_1x32_f4_quant_hip", scale_granularity=(Granularity.MX_BLOCK,),
                   block=(32,)) or _why_not_mxfp4(params)


def _numerics(params) -> dict:
    # fp4_tie_rounding: the elements come from the gfx950 conversion instruction, whose
    # behaviour at exact ties has not been measured here.
    return {"entry_point": _entry_point(params) or "-", "compute_dtype": torch.float32,
            "fp4_tie_rounding": "hardware"}


def _mxfp4_rows(fn, x2: torch.Tensor):
    """(packed codes (rows, K/2) uint8, E8M0 scales (rows, K/32) uint8), unshuffled."""
    y, scale = fn(x2.contiguous(), shuffle=False)
    return y.view(torch.uint8), scale.view(torch.uint8)


@BACKEND.implements(Op.QUANTIZE, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                    check=_why_not, numerics=_numerics)
def quantize(x, recipe, *, rowwise, columnwise, scale):
    if not (recipe.family is Family.MX and recipe.fmt == "e2m1"):
        raise UnsupportedCase("aiter quantize: only MXFP4 has an adapter (see check)")
    fn = runtime().functions["per_1x32_f4_quant_hip"]
    out = QuantizedTensor(recipe=recipe, shape=tuple(x.shape))
    if rowwise:
        out.data, out.scale_inv = _mxfp4_rows(fn, x)
    if columnwise:
        out.columnwise_data, out.columnwise_scale_inv = _mxfp4_rows(fn, x.t())
    return out


# ---- contracts ---------------------------------------------------------------------------

_FP8_NOTES = ("clamp to +-fmax (v_med3) then hardware RNE cast of x * fl32(1/scale_inv); "
              "no amax output; bf16 subnormal inputs flushed (-fgpu-flush-denormals-to-zero)")
declare(Contract(
    backend="aiter", entry_point="dynamic_per_tensor_quant", op=Op.QUANTIZE,
    family="fp8-current", fp8="arch", scale_rule=HIP_FP8_SCALE_RULE, element_rounding="rne",
    saturation="saturate", layouts=("out:(M,K) fp8", "scale:(1,) fp32 scale_inv"),
    notes=_FP8_NOTES + "; an all-zero tensor gives scale_inv 0 and codes of 0*inf; "
          "rejected by tealite (rule, amax)"))
declare(Contract(
    backend="aiter", entry_point="dynamic_per_token_scaled_quant", op=Op.QUANTIZE,
    family="fp8-current", fp8="arch", scale_rule=HIP_FP8_SCALE_RULE, element_rounding="rne",
    saturation="saturate", layouts=("out:(M,K) fp8", "scales:(M,1) fp32 scale_inv"),
    notes=_FP8_NOTES + "; rows of 32/64/128 take the group kernel (amax floored at 1e-10); "
          "rejected by tealite (rule, amax)"))
declare(Contract(
    backend="aiter", entry_point="static_per_tensor_quant", op=Op.QUANTIZE,
    family="fp8-given", fp8="arch", scale_rule="given scale_inv, x * fl32(1/scale_inv)",
    element_rounding="rne", saturation="saturate",
    layouts=("out:(M,K) fp8", "scale:(1,) fp32 dequantization scale"),
    notes=_FP8_NOTES + "; rejected by tealite (takes scale_inv, not DelayedScaling's scale)"))
declare(Contract(
    backend="aiter", entry_point="per_1x32_f4_quant_hip", op=Op.QUANTIZE, family="mxfp4",
    scale_rule="e8m0-nearest-pow2(ties up)/4", element_rounding="rne", saturation="saturate",
    layouts=("out:(M,K/2) fp4x2, low nibble = even element", "scales:(M,K/32) e8m0",
             "scales:e8m0_shuffle with shuffle=True (not used)"),
    notes="gfx950 only; equals RCEIL except at amax mantissa exactly 1.5 (HIP rounds up) and "
          "for all-zero blocks (byte 92: amax starts at 1e-10); rejected for every tealite "
          "MXFP4 recipe", extra={"arch": ["gfx950"]}))
