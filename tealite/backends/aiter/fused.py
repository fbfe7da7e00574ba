"""Fused norm / activation -> FP8 quantize on AITER's HIP ops: registered so that every case
is rejected with the reason (never run on AMD hardware; see the package docstring).

* ``rmsnorm2d_fwd_with_dynamicquant`` (and ``layernorm2d_fwd_with_dynamicquant``, which 0.1.7
  has commented out): per-row FP8 in ck_tile's DynamicQuantEpilogue
  (3rdparty/composable_kernel/include/ck_tile/ops/epilogue/dynamic_quant_epilogue.hpp):
  ``y_scale = row_amax / fmax`` (a division: AITER's ``amax/fmax``) but the codes are
  ``cast(y / y_scale)``, a division, where tealite's AMAX_OVER_FMAX rule multiplies by the
  reciprocal; no rsigma / mean and no amax output either.  tealite's fused ops return all
  three, so nothing can run.
* ``scaled_silu_and_mul``: FP8 codes of ``silu(a) * b * fl32(1/scale)`` with the
  *dequantization* scale (csrc/kernels/activation_kernels.cu), so ``DelayedScaling``'s
  ``x * scale`` is not reproduced; no amax output; silu only.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, rejecting
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
WHY = {
    "rmsnorm2d_fwd_with_dynamicquant": (
        "rmsnorm2d_fwd_with_dynamicquant returns neither rsigma nor the row amaxes "
        "(SaveRms=false), and its codes are cast(y / (amax/fmax)), not tealite's y * scale"),
    "layernorm2d_fwd_with_dynamicquant": (
        "layernorm2d_fwd_with_dynamicquant returns neither mean/rsigma nor the row amaxes, and "
        "its codes are cast(y / (amax/fmax)), not tealite's y * scale"),
    "scaled_silu_and_mul": (
        "scaled_silu_and_mul multiplies by fl32(1/scale) of a dequantization scale (so "
        "DelayedScaling's act(x) * scale codes are not reproduced), returns no amax, and "
        "exists for swiglu only"),
}


_rms, _ln, _act = (rejecting(e, WHY[e]) for e in (
    "rmsnorm2d_fwd_with_dynamicquant", "layernorm2d_fwd_with_dynamicquant",
    "scaled_silu_and_mul"))


@BACKEND.implements(Op.RMSNORM_FWD_QUANTIZE, dtypes=_FLOATS, check=_rms[0], numerics=_rms[1])
def rmsnorm_fwd_quantize(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
    raise UnsupportedCase(WHY["rmsnorm2d_fwd_with_dynamicquant"])


@BACKEND.implements(Op.LAYERNORM_FWD_QUANTIZE, dtypes=_FLOATS, check=_ln[0], numerics=_ln[1])
def layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
    raise UnsupportedCase(WHY["layernorm2d_fwd_with_dynamicquant"])


@BACKEND.implements(Op.ACT_FWD_QUANTIZE, dtypes=_FLOATS, check=_act[0], numerics=_act[1])
def act_fwd_quantize(x, recipe, *, kind, scale):
    raise UnsupportedCase(WHY["scaled_silu_and_mul"])


_DQ = ("per-row y_scale = amax / fmax (fp32 division), codes = cast(y / y_scale) in "
       "ck_tile (RNE); y_scale (M,1) fp32; no statistics, no amax; zero row: 0/0")
declare(Contract(backend="aiter", entry_point="rmsnorm2d_fwd_with_dynamicquant",
                 op=Op.RMSNORM_FWD_QUANTIZE, family="fp8-current", fp8="arch",
                 scale_rule="amax/fmax, codes y/scale", element_rounding="rne",
                 layouts=("out:(M,N) fp8", "yscale:(M,1) fp32"), notes=_DQ))
declare(Contract(backend="aiter", entry_point="layernorm2d_fwd_with_dynamicquant",
                 op=Op.LAYERNORM_FWD_QUANTIZE, family="fp8-current", fp8="arch",
                 scale_rule="amax/fmax, codes y/scale", element_rounding="rne",
                 layouts=("out:(M,N) fp8", "yscale:(M,1) fp32"),
                 notes=_DQ + "; commented out in aiter 0.1.7 (aiter/ops/norm.py)"))
declare(Contract(backend="aiter", entry_point="scaled_silu_and_mul", op=Op.ACT_FWD_QUANTIZE,
                 family="fp8-given", fp8="arch",
                 scale_rule="given scale_inv, x * fl32(1/scale_inv)", element_rounding="rne",
                 layouts=("input:(...,2d) [act|gate]", "out:(...,d) fp8", "scale:(1,) fp32"),
                 notes="-ffast-math; silu via __builtin_amdgcn_rcpf; ck_tile fp8 type_convert"))
