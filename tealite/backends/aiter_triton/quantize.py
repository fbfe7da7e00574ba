"""``quantize`` through AITER's Triton quant entry points (``aiter/ops/triton/quant.py``, kernels
in ``_triton_kernels/quant.py``), rowwise only.

Recipe -> AITER entry point:

* ``Float8CurrentScaling(fmt, "tensor", scale_rule=AMAX_OVER_FMAX)`` ->
  ``dynamic_per_tensor_quant_fp8_i8``;
* ``Float8CurrentScaling(fmt, "row", scale_rule=AMAX_OVER_FMAX)`` ->
  ``dynamic_per_token_quant_fp8_i8``;
* ``MXFP4BlockScaling(EVEN, TIES_AWAY)`` -> ``dynamic_mxfp4_quant``;
* ``DelayedScaling``: rejected (``static_per_tensor_quant_fp8_i8`` reports no amax, below).

``fmt`` is the FP8 variant of the loaded AITER (``kernels().fp8_dtype``): ``e4m3`` (OCP) with
gfx950 pinned (NVIDIA, the interpreter), ``e4m3fnuz`` on gfx942.  Any other recipe is rejected by
``check`` with the reason; nothing falls back to another path.

Adapters (nothing of the result is computed here):

* FP8: AITER's kernels index rows by ``x.stride(0)`` and assume unit column stride, so x is
  made contiguous; ``qx`` is allocated in AITER's FP8 dtype (= the recipe's); the per-tensor
  ``scale_out`` is allocated as zeros because the kernel max-accumulates into it
  (``tl.atomic_max``; AITER's own callers pass ``torch.zeros(1)``).  AITER's ``scale_out``
  is the dequantization scale, i.e. tealite's ``scale_inv``, returned as is.  No amax: AITER
  computes it internally and does not return it, and AITER's rule reports none (``amax`` is
  None, tealite.recipes).
* DelayedScaling would map to ``static_per_tensor_quant_fp8_i8(qx, x, scale_in)``, which
  multiplies by ``1 / scale_in``: AITER's scale_in is TE's scale_inv, so TE's scale would have
  to be inverted first (and ``fl(1/fl(1/scale))`` is not ``scale``, so codes differ from
  TE's where that double reciprocal is inexact).  The quantize contract for DelayedScaling
  includes the amax of x (for the history), which that kernel does not produce: rejected.
* MXFP4: ``dynamic_mxfp4_quant(x)`` returns packed codes (M, K/2) (low nibble = even element,
  tealite's layout) and E8M0 scales as an (M, K/32) *view* of an (K/32, M) buffer; the
  scales are made contiguous (tealite's layout: row-major (M, K/32)).

Numerics declared per case (``numerics``): ``entry_point``; FP8: ``fp32_div_ulps`` (AITER
computes ``amax / max`` and ``1 / scale`` with Triton's ``/``: IEEE in the interpreter, CUDA's
``div.full.f32`` (<= 2 ulp) on NVIDIA; 2 is declared on every GPU, which also covers an exact
division); MXFP4: ``mx_nonfinite="ignore-nan"`` (AITER's kernels leave NaN out of the block
amax, give an Inf block scale byte 0xFE and encode NaN / Inf as +-6, where OCP / TE give the
block scale 0xFF).

Under the interpreter (``TRITON_INTERPRET=1``):

* the FP8 entry points are rejected: they cast with ``.to(fp8)``, which the interpreter gets
  wrong (ties away, top-binade collapse, NaN -> a finite code; NUMERICS.md), so their codes
  would be the interpreter's, not AITER's.  tests/test_aiter_quantize.py pins this as a strict
  expected failure and proves the cast is the only difference;
* bf16 x is handed to ``dynamic_mxfp4_quant`` as fp32 (exact): the interpreter misreads bf16
  subnormals on load (NUMERICS.md), and the kernel's first step is ``.to(tl.float32)`` of the
  loaded x, so the kernel computes the same from the exact fp32 copy.  On a GPU bf16 goes in.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import BACKEND, DEVICES, NAME, PLATFORM, kernels, why_missing
from tealite.formats import ElementRounding, FP8ScaleRule, ScaleRounding
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
PER_TENSOR = "dynamic_per_tensor_quant_fp8_i8"
PER_TOKEN = "dynamic_per_token_quant_fp8_i8"
STATIC = "static_per_tensor_quant_fp8_i8"
MXFP4 = "dynamic_mxfp4_quant"
FP8_ENTRY_POINTS = (PER_TENSOR, PER_TOKEN)
MX_BLOCK = 32
_FP8_NOTES = ("amax ignores NaN (tl.max is maxnum; a row of only NaN gives NaN); amax 0 gives "
              "scale 0 and NaN codes (1/0 = inf, 0 * inf); no amax output; Triton's fp32 '/' "
              "is approximate on CUDA (div.full.f32, <= 2 ulp)")

_CONTRACTS = {
    PER_TENSOR: declare(Contract(
        backend=NAME, entry_point=PER_TENSOR, op=Op.QUANTIZE, family="fp8-current", fp8="arch",
        scale_rule="amax/fmax", element_rounding="cast", saturation="cast",
        layouts=("x:(M,K) unit column stride", "qx:(M,K) caller-allocated",
                 "scale_out:(1,) zero-initialised, atomic max"),
        notes=_FP8_NOTES + "; per tensor: the max of the row amaxes, NaN winning",
        extra={"amax_output": "none", "amax_nan": "ignored", "zero_amax": "nan codes",
               "fp32_div": "triton '/'"})),
    PER_TOKEN: declare(Contract(
        backend=NAME, entry_point=PER_TOKEN, op=Op.QUANTIZE, family="fp8-current", fp8="arch",
        scale_rule="amax/fmax", element_rounding="cast", saturation="cast",
        layouts=("x:(M,K) unit column stride", "qx:(M,K) caller-allocated",
                 "scale_out:(M,)"),
        notes=_FP8_NOTES,
        extra={"amax_output": "none", "amax_nan": "ignored", "zero_amax": "nan codes",
               "fp32_div": "triton '/'"})),
    STATIC: declare(Contract(
        backend=NAME, entry_point=STATIC, op=Op.QUANTIZE, family="fp8-given", fp8="arch",
        scale_rule="given-scale_inv", element_rounding="cast", saturation="cast",
        layouts=("x:(M,K) unit column stride", "scale_in:(1,) dequantization scale"),
        notes="codes = cast(x * (1 / scale_in)): scale_in is TE's scale_inv, not TE's scale; "
              "not wired: DelayedScaling's quantize must report amax, which it does not "
              "produce",
        extra={"wired": False, "amax_output": "none"})),
    MXFP4: declare(Contract(
        backend=NAME, entry_point=MXFP4, op=Op.QUANTIZE, family="mxfp4", fp8=None,
        scale_rule="e8m0-even", element_rounding="ties-away", saturation="saturate",
        layouts=("x:(M,K) K%32", "codes:(M,K/2) low nibble = even element",
                 "scales:(M,K/32) view of a (K/32,M) buffer"),
        notes="NaN left out of the block amax, an Inf amax gives scale byte 0xFE, NaN / Inf "
              "elements encode as +-6 (OCP / TE: scale 0xFF)",
        extra={"nonfinite": "ignore-nan"})),
}


def contracts() -> dict[str, Contract]:
    """The contract of each AITER quant entry point (``STATIC``'s is declared, not wired)."""
    return dict(_CONTRACTS)


def fp8_name(at) -> str:
    """tealite's name of the E4M3 format the loaded AITER's FP8 kernels take."""
    return "e4m3fnuz" if at.fp8_dtype == torch.float8_e4m3fnuz else "e4m3"


def entry_point(recipe) -> tuple[str | None, str | None]:
    """(AITER entry point for ``recipe``, None) or (None, why no entry point follows it), from
    the recipe's facts: each entry point takes exactly the facts its contract names."""
    family = getattr(recipe, "family", None)
    if family is Family.MX:
        if recipe.fmt != "e2m1":
            return None, f"aiter.ops.triton.quant quantizes MX to e2m1 only, not {recipe.fmt}"
        if recipe.scale_rounding is not ScaleRounding.EVEN or \
                recipe.element_rounding is not ElementRounding.TIES_AWAY:
            return None, (f"{MXFP4} rounds scales EVEN and elements ties-away, not "
                          f"{recipe.scale_rounding.value} / {recipe.element_rounding.value}")
        why = outside(recipe, MXFP4, scale_granularity=(Granularity.MX_BLOCK,),
                      block=(MX_BLOCK,))
        return (None, why) if why else (MXFP4, None)
    if family is not Family.FP8:
        return None, f"no AITER entry point for {type(recipe).__name__}"
    if recipe.scale_given:
        return None, (f"{STATIC} does not produce the amax of x that {type(recipe).__name__}'s "
                      "quantize reports (and takes TE's scale_inv, not its scale)")
    if recipe.scale_granularity is Granularity.BLOCK:
        return None, "aiter.ops.triton.quant has no FP8 block-scaling (1x128 / 128x128) entry point"
    if recipe.scale_rule is not FP8ScaleRule.AMAX_OVER_FMAX:
        return None, (f"AITER's FP8 quant kernels follow scale_rule "
                      f"{FP8ScaleRule.AMAX_OVER_FMAX.value} (scale_inv = amax / max, x * "
                      f"(1 / scale_inv)), not {recipe.scale_rule.value}")
    why = outside(recipe, "AITER's FP8 quant kernels",
                  scale_granularity=(Granularity.TENSOR, Granularity.ROW),
                  force_pow2_scales=(False,), amax_epsilon=(0.0,), amax_granularity=(None,))
    if why:
        return None, why
    return (PER_TENSOR if recipe.scale_granularity is Granularity.TENSOR else PER_TOKEN), None


def _why_not(params) -> str | None:
    ep, why = entry_point(params["recipe"])
    if ep is None:
        return why
    gone = why_missing(ep)
    if gone is not None:
        return gone
    if params["columnwise"]:
        return (f"{ep} quantizes rows only; a columnwise (cast-transpose) output would be a "
                "tealite transpose plus a second launch, not an AITER path")
    m, k = params["m"], params["k"]
    if ep == MXFP4:
        # The kernel loads partial tiles without `other`, so a partial 32-block would take
        # undefined lanes into its amax; it also asserts (K // 2) % 2 == 0.
        if k == 0 or k % MX_BLOCK:
            return f"{MXFP4} needs K a positive multiple of {MX_BLOCK} (whole blocks), got {k}"
        if m == 0:
            return f"{MXFP4} cannot take M = 0 (its launch divides by next_power_of_2(M) = 0)"
        return aiter_triton.mxfp4_platform_reason()
    fmt = fp8_name(kernels())
    if params["fmt"] != fmt:
        return (f"{ep} of this AITER ({kernels().arch}) writes {fmt}, not {params['fmt']} "
                "(FNUZ on gfx942, OCP on gfx950)")
    if k == 0:
        return f"{ep} loads a row with no `other` for masked lanes: an empty row is undefined"
    return aiter_triton.fp8_platform_reason()


def _numerics(params) -> dict:
    ep, _ = entry_point(params["recipe"])
    if ep in FP8_ENTRY_POINTS:
        return {"entry_point": ep, "fp32_div_ulps": aiter_triton.fp32_div_ulps()}
    numerics = {"entry_point": ep, "mx_nonfinite": "ignore-nan"}
    if PLATFORM.get().misreads_bf16_subnormals and params.get("dtype") == torch.bfloat16:
        numerics["interpreter_input"] = "bf16 passed as exact fp32 (bf16 subnormal load bug)"
    return numerics


def _fp8_current(x: torch.Tensor, recipe) -> QuantizedTensor:
    at = kernels()
    xk = x.contiguous()
    qx = torch.empty(x.shape, dtype=at.fp8_dtype, device=x.device)
    if recipe.scale_granularity is Granularity.TENSOR:
        scale = torch.zeros(1, dtype=torch.float32, device=x.device)  # the atomic max's start
        qx, scale = at.dynamic_per_tensor_quant_fp8_i8(qx, xk, scale)
    else:
        scale = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        qx, scale = at.dynamic_per_token_quant_fp8_i8(qx, xk, scale)
    return QuantizedTensor(recipe=recipe, shape=tuple(x.shape), data=qx, scale_inv=scale)


def _mxfp4(x: torch.Tensor, recipe) -> QuantizedTensor:
    xk = x.float() if PLATFORM.get().misreads_bf16_subnormals and x.dtype == torch.bfloat16 \
        else x
    codes, scales = kernels().dynamic_mxfp4_quant(xk)
    return QuantizedTensor(recipe=recipe, shape=tuple(x.shape), data=codes,
                           scale_inv=scales.contiguous())


@BACKEND.implements(Op.QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not,
                    numerics=_numerics)
def quantize(x, recipe, *, rowwise, columnwise, scale):
    ep, why = entry_point(recipe)
    if ep == MXFP4:
        return _mxfp4(x, recipe)
    if ep in FP8_ENTRY_POINTS:
        return _fp8_current(x, recipe)
    raise AssertionError(f"check admitted a recipe with no entry point: {why}")
