"""AITER's fused norm / activation -> quantize Triton kernels as tealite's
``rmsnorm_fwd_quantize``, ``layernorm_fwd_quantize`` and ``act_fwd_quantize``.

=====================================  ================================================  =====
tealite op and recipe                  AITER entry point                                 runs
=====================================  ================================================  =====
rmsnorm, per-row FP8, AMAX_OVER_FMAX   ``rmsnorm2d_fwd_with_dynamicquant``               GPU
rmsnorm, DelayedScaling (saturate)     ``fused_rms_fp8_per_tensor_static_quant``         GPU
rmsnorm, MXFP4 EVEN / TIES_AWAY        ``fused_rms_mxfp4_quant``                         both
layernorm, per-row FP8, AMAX_OVER_FMAX ``layernorm2d_fwd_with_dynamicquant``             GPU
swiglu/geglu/reglu, MXFP4 EVEN/T.A.    ``act_mul_and_mxfp4_quant``                       both
swiglu/geglu/reglu, per-row FP8,       ``act_mul_and_fp8_group_quant`` with one group    GPU
AMAX_OVER_FMAX, N/2 a power of two     per row (group_size = N/2)
=====================================  ================================================  =====

"GPU": rejected under Triton's interpreter, whose fp32 -> fp8 ``.to()`` is wrong (ties away,
values rounding up into the next binade collapse, NaN becomes a finite code); AITER's FP8
kernels cast with ``.to()``, so their codes there would be the interpreter's.
tests/test_aiter_fused.py proves the cast is the cause and keeps the case as a strict xfail.

What the kernels do not produce, and the contract differences (declared below; the judge,
tealite_verify/tolerance_fused.py, checks each against the reference under exactly these):

* no norm statistics: every case needs ``return_stats=False``; no amax: ``return_amax=False``
  for DelayedScaling (AITER's rule reports no amax anyway);
* per-row FP8: scale_inv = amax / max and codes = cast(y * (1 / scale_inv)) (AITER's rule),
  with Triton's ``/`` (``fp32_div_ulps``: 0 in the interpreter, 2 on a GPU: CUDA's
  ``div.full.f32``); the norm kernels store scale_inv = 1 where amax / max is 0
  (``scale_inv_zero_as_one``), the group-quant kernel floors amax at 1e-10 (``amax_floor``)
  and clamps to +-max; neither is tealite.quantize's AMAX_OVER_FMAX (0 -> NaN codes);
* DelayedScaling: the kernel takes the dequantization scale and multiplies by its reciprocal:
  the adapter passes scale_inv = fl32(1 / scale) (which is also the scale_inv returned), so
  the codes are cast(clamp(y * fl32(1 / scale_inv))) (``given_scale_as_scale_inv``);
* MXFP4: EVEN scales, ties-away elements, NaN left out of block amaxes
  (``mx_nonfinite="ignore-nan"``), scales returned unshuffled (M, N/32).

Adapters (nothing of the result is computed here): x as the contiguous 2-D (rows, H) its
kernels take; outputs allocated in the recipe's FP8 dtype where AITER lets the caller choose
(its DTYPE_MAX comes from that dtype, so an int8 output would quantize to int8: never passed);
the group-quant scales (rows, 1) reshaped to (rows,).  Under the interpreter only, bf16 x and
gamma go to the MXFP4 kernels as exact fp32 copies: the interpreter misreads bf16 subnormals
on load, and both kernels' first step is ``.to(tl.float32)`` of what they load, so they
compute the same.  FP8 formats must be the pinned arch's family (OCP on gfx950 / NVIDIA,
FNUZ on gfx942).
"""
from __future__ import annotations

import math

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import BACKEND, DEVICES, NAME, PLATFORM, kernels, why_missing
from tealite.backends.aiter_triton.norms import interpreter_bf16_reason, rows_2d
from tealite.formats import ElementRounding, FP8ScaleRule, Saturation, ScaleRounding, get_format
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity, describe
from tealite.types import Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
RMS_DYN = "rmsnorm2d_fwd_with_dynamicquant"
LN_DYN = "layernorm2d_fwd_with_dynamicquant"
RMS_STATIC = "fused_rms_fp8_per_tensor_static_quant"
RMS_MXFP4 = "fused_rms_mxfp4_quant"
ACT_MXFP4 = "act_mul_and_mxfp4_quant"
ACT_FP8 = "act_mul_and_fp8_group_quant"
FP8_ENTRY_POINTS = (RMS_DYN, LN_DYN, RMS_STATIC, ACT_FP8)
MXFP4_ENTRY_POINTS = (RMS_MXFP4, ACT_MXFP4)
# tealite's gated kind -> AITER's activation name (act(first half) * second half, as TE).
ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}
GROUP_AMAX_FLOOR = 1e-10  # _fp8_quant_op: tl.maximum(max |x|, 1e-10)

_ROW_NOTES = ("scale_inv = amax / max (Triton '/', approximate on CUDA), codes = "
              "cast(y * (1 / scale_inv)); ")
_MX_NOTES = ("EVEN scales (amax rounded at E2M1's mantissa, then floor), ties-away elements, "
             "NaN left out of the block amax; y in fp32 straight from the norm / activation")
_CONTRACT_ARGS = {
    RMS_DYN: dict(op=Op.RMSNORM_FWD_QUANTIZE, family="fp8-current", fp8="arch",
                  scale_rule="amax/fmax", element_rounding="cast", saturation="cast",
                  layouts=("x:(M,N)", "out:(M,N) fp8, caller's dtype", "yscale:(M,) fp32"),
                  notes=_ROW_NOTES + "scale_inv 1 where amax / max is 0; no rsigma, no amax",
                  extra={"zero_amax": "scale_inv 1", "outputs_missing": "rsigma, amax"}),
    LN_DYN: dict(op=Op.LAYERNORM_FWD_QUANTIZE, family="fp8-current", fp8="arch",
                 scale_rule="amax/fmax", element_rounding="cast", saturation="cast",
                 layouts=("x:(M,N)", "out:(M,N) fp8, caller's dtype", "yscale:(M,) fp32"),
                 notes=_ROW_NOTES + "scale_inv 1 where amax / max is 0; no mean / rsigma, no "
                                    "amax",
                 extra={"zero_amax": "scale_inv 1", "outputs_missing": "mean, rsigma, amax"}),
    RMS_STATIC: dict(op=Op.RMSNORM_FWD_QUANTIZE, family="fp8-given", fp8="arch",
                     scale_rule="given scale_inv, y * fl32(1/scale_inv)",
                     element_rounding="cast", saturation="saturate",
                     layouts=("x:(M,N)", "scale:(1,) dequantization scale (TE's scale_inv)"),
                     notes="clamp to +-max, then .to(fp8); the adapter passes fl32(1/scale); "
                           "no rsigma, no amax",
                     extra={"outputs_missing": "rsigma, amax"}),
    RMS_MXFP4: dict(op=Op.RMSNORM_FWD_QUANTIZE, family="mxfp4", scale_rule="e8m0-even",
                    element_rounding="ties-away", saturation="saturate",
                    layouts=("x:(M,N) N%32", "codes:(M,N/2) low nibble = even element",
                             "scales:(M,N/32) unshuffled"),
                    notes=_MX_NOTES + "; no rsigma",
                    extra={"nonfinite": "ignore-nan", "outputs_missing": "rsigma"}),
    ACT_MXFP4: dict(op=Op.ACT_FWD_QUANTIZE, family="mxfp4", scale_rule="e8m0-even",
                    element_rounding="ties-away", saturation="saturate",
                    layouts=("x:(M,2N) [act|gate]", "codes:(M,N/2) low nibble = even element",
                             "scales:(M,N/32) unshuffled"),
                    notes=_MX_NOTES + "; silu / gelu (erf) / relu gated kinds only",
                    extra={"nonfinite": "ignore-nan"}),
    ACT_FP8: dict(op=Op.ACT_FWD_QUANTIZE, family="fp8-current", fp8="arch",
                  scale_rule="amax/fmax", element_rounding="cast", saturation="saturate",
                  layouts=("x:(M,2N) [act|gate]", "group_size = N (one group per row, a "
                           "power of two)", "scales:(M,1) fp32"),
                  notes=_ROW_NOTES + "amax floored at 1e-10; clamp to +-max; no amax",
                  extra={"amax_floor": GROUP_AMAX_FLOOR, "outputs_missing": "amax"}),
}
for _entry, _args in _CONTRACT_ARGS.items():
    declare(Contract(backend=NAME, entry_point=_entry, **_args))


def _fp8_family_reason(fmt: str) -> str | None:
    """AITER's FP8 kernels compile for the pinned arch's FP8 family only."""
    fnuz_arch = kernels().fp8_dtype == torch.float8_e4m3fnuz
    if get_format(fmt).fnuz != fnuz_arch:
        arch = kernels().arch
        return (f"FP8 format {fmt} is not the FP8 family of AITER's arch {arch} "
                f"({'FNUZ' if fnuz_arch else 'OCP'})")
    return None


def _mx_route(recipe, entry: str | None) -> tuple[str | None, str | None]:
    if entry is None:
        return None, "AITER has no fused LayerNorm -> MX kernel"
    if (recipe.fmt, recipe.scale_rounding, recipe.element_rounding) != \
            ("e2m1", ScaleRounding.EVEN, ElementRounding.TIES_AWAY):
        return None, (f"AITER's fused MX kernels are MXFP4 with EVEN scales and ties-away "
                      f"elements; the recipe asks {describe(recipe)}")
    why = outside(recipe, "AITER's fused MX kernels", scale_granularity=(Granularity.MX_BLOCK,),
                  block=(32,))
    return (None, why) if why else (entry, None)


def _row_route(recipe, entry: str | None) -> tuple[str | None, str | None]:
    if entry is None:
        return None, "AITER has no fused per-row FP8 kernel for this op"
    if recipe.scale_rule is not FP8ScaleRule.AMAX_OVER_FMAX:
        return None, (f"AITER's fused FP8 kernels follow scale_rule "
                      f"{FP8ScaleRule.AMAX_OVER_FMAX.value} (scale_inv = amax / max), not "
                      f"{recipe.scale_rule.value}")
    why = outside(recipe, "AITER's fused FP8 kernels", scale_granularity=(Granularity.ROW,),
                  force_pow2_scales=(False,), amax_epsilon=(0.0,))
    return (None, why) if why else (entry, _fp8_family_reason(recipe.fmt))


def route(op: str, recipe, *, kind: str | None = None,
          n_out: int = 0) -> tuple[str | None, str | None]:
    """(AITER entry point for the case, None) or (None, why none follows it)."""
    if op == Op.ACT_FWD_QUANTIZE and kind not in ACTIVATIONS:
        return None, (f"AITER fuses quantization only after the gated activations "
                      f"{sorted(ACTIVATIONS)} (act_mul_and_*), not {kind}")
    family = getattr(recipe, "family", None)
    if family is Family.MX:
        return _mx_route(recipe, {Op.RMSNORM_FWD_QUANTIZE: RMS_MXFP4,
                                  Op.ACT_FWD_QUANTIZE: ACT_MXFP4}.get(op))
    if family is not Family.FP8:
        return None, f"no AITER fused kernel for {type(recipe).__name__}"
    if recipe.scale_given:
        if op != Op.RMSNORM_FWD_QUANTIZE:
            return None, "AITER has no fused given-scale FP8 kernel for this op"
        if recipe.saturation is not Saturation.SATURATE:
            return None, f"{RMS_STATIC} clamps to +-max (saturates), the recipe asks nonfinite"
        why = outside(recipe, RMS_STATIC, scale_granularity=(Granularity.TENSOR,))
        return (None, why) if why else (RMS_STATIC, _fp8_family_reason(recipe.fmt))
    entry = {Op.RMSNORM_FWD_QUANTIZE: RMS_DYN, Op.LAYERNORM_FWD_QUANTIZE: LN_DYN,
             Op.ACT_FWD_QUANTIZE: ACT_FP8}[op]
    if entry == ACT_FP8 and (n_out & (n_out - 1) or n_out == 0):
        return None, (f"{ACT_FP8} is used with one quantization group per row, whose size "
                      f"(the output width {n_out}) must be a power of two")
    return _row_route(recipe, entry)


def _outputs_reason(entry: str, params) -> str | None:
    if params.get("return_stats", False):
        return (f"AITER's {entry} computes no mean / rsigma: the case must not need them "
                "(return_stats=False)")
    if entry == RMS_STATIC and params.get("return_amax", True):
        return f"AITER's {entry} computes no amax: the case must not need it (return_amax=False)"
    return None


def _check_for(op: str):
    def check(params) -> str | None:
        if params.get("zero_centered_gamma"):
            return "AITER's fused norm kernels have no zero-centered gamma"
        entry, why = route(op, params["recipe"], kind=params.get("act_kind"),
                           n_out=params["n_out"])
        if entry is None or why:
            return why
        why = _outputs_reason(entry, params)
        if why:
            return why
        why = aiter_triton.fp8_platform_reason() if entry in FP8_ENTRY_POINTS else None
        if why:
            return f"{entry} under Triton's interpreter: {why}"
        if entry in FP8_ENTRY_POINTS:
            why = interpreter_bf16_reason(params["dtype"])  # bf16 loads of subnormals
            if why:
                return why
        if entry in MXFP4_ENTRY_POINTS:
            why = aiter_triton.mxfp4_platform_reason()
            if why:
                return f"{entry}: {why}"
        return why_missing(entry)
    return check


def _numerics_for(op: str):
    def numerics(params) -> dict:
        entry, _ = route(op, params["recipe"], kind=params.get("act_kind"),
                         n_out=params["n_out"])
        out = {"compute_dtype": torch.float32, "entry_point": entry}
        if entry in FP8_ENTRY_POINTS:
            out["fp32_div_ulps"] = aiter_triton.fp32_div_ulps()
        if entry in (RMS_DYN, LN_DYN):
            out["scale_inv_zero_as_one"] = True
        if entry == ACT_FP8:
            out["amax_floor"] = GROUP_AMAX_FLOOR
        if entry == RMS_STATIC:
            out["given_scale_as_scale_inv"] = True
        if entry in MXFP4_ENTRY_POINTS:
            out["mx_nonfinite"] = "ignore-nan"
        return out
    return numerics


def _as_loaded(t: torch.Tensor, entry: str) -> torch.Tensor:
    """What the kernel is handed: under the interpreter bf16 goes to the MXFP4 kernels as its
    exact fp32 copy (they widen to fp32 first thing; the interpreter misreads bf16 subnormals)."""
    if PLATFORM.get().misreads_bf16_subnormals and entry in MXFP4_ENTRY_POINTS and \
            t.dtype == torch.bfloat16:
        return t.float()
    return t.contiguous()


def _fp8_out(rows: int, n: int, recipe, device) -> torch.Tensor:
    return torch.empty((rows, n), dtype=get_format(recipe.fmt).torch_dtype, device=device)


def _quantized(recipe, rows: int, n: int, data, scale_inv) -> QuantizedTensor:
    return QuantizedTensor(recipe=recipe, shape=(rows, n), data=data, scale_inv=scale_inv)


def _norm_quantize(op, x, gamma, beta, recipe, eps, scale) -> QuantizedTensor:
    entry, _ = route(op, recipe)
    at = kernels()
    x2, g = _as_loaded(rows_2d(x), entry), _as_loaded(gamma, entry)
    rows, n = x2.shape
    if entry == RMS_MXFP4:
        # The first result is the (codes, scales) pair in every version: v0.1.7.post2 returns
        # three values, v0.1.7.post3 on four (the unquantized y was added second).
        codes, scales = at.fused_rms_mxfp4_quant(x2, g, eps)[0]
        return _quantized(recipe, rows, n, codes, scales)
    if entry == RMS_STATIC:
        scale_inv = torch.reciprocal(scale)  # AITER takes the dequantization scale
        codes = at.fused_rms_fp8_per_tensor_static_quant(
            x2, g, eps, scale_inv, dtype_quant=get_format(recipe.fmt).torch_dtype)[0]
        return _quantized(recipe, rows, n, codes, scale_inv)
    out = _fp8_out(rows, n, recipe, x.device)
    yscale = torch.empty(rows, dtype=torch.float32, device=x.device)
    if entry == RMS_DYN:
        at.rmsnorm2d_fwd_with_dynamicquant(out, x2, yscale, g, eps)
    else:
        at.layernorm2d_fwd_with_dynamicquant(out, x2, yscale, g, beta.contiguous(), eps)
    return _quantized(recipe, rows, n, out, yscale)


@BACKEND.implements(Op.RMSNORM_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.RMSNORM_FWD_QUANTIZE),
                    numerics=_numerics_for(Op.RMSNORM_FWD_QUANTIZE))
def rmsnorm_fwd_quantize(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
    return _norm_quantize(Op.RMSNORM_FWD_QUANTIZE, x, gamma, None, recipe, eps, scale), None


@BACKEND.implements(Op.LAYERNORM_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.LAYERNORM_FWD_QUANTIZE),
                    numerics=_numerics_for(Op.LAYERNORM_FWD_QUANTIZE))
def layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
    q = _norm_quantize(Op.LAYERNORM_FWD_QUANTIZE, x, gamma, beta, recipe, eps, scale)
    return q, None, None


@BACKEND.implements(Op.ACT_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(Op.ACT_FWD_QUANTIZE),
                    numerics=_numerics_for(Op.ACT_FWD_QUANTIZE))
def act_fwd_quantize(x, recipe, *, kind, scale):
    n = x.shape[-1] // 2
    entry, _ = route(Op.ACT_FWD_QUANTIZE, recipe, kind=kind, n_out=n)
    x2 = _as_loaded(rows_2d(x), entry)
    rows = math.prod(x.shape[:-1])
    if entry == ACT_MXFP4:
        codes, scales = kernels().act_mul_and_mxfp4_quant(x2, ACTIVATIONS[kind])
        return _quantized(recipe, rows, n, codes, scales)
    codes, scales = kernels().act_mul_and_fp8_group_quant(
        x2, ACTIVATIONS[kind], n, dtype_quant=get_format(recipe.fmt).torch_dtype)
    return _quantized(recipe, rows, n, codes, scales.reshape(rows))
