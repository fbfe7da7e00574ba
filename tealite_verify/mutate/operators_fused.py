"""Mutation operators for the fused norm / activation -> quantize ops: the norm's or the
quantizer's bugs inside the fusion, and the fusion's own bug, y rounded to x's dtype before
quantizing (the unfused double rounding the fused tier exists to reject).

torch's implementations: ``layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps,
zero_centered_gamma, scale) -> (q, mean, rsigma)``, ``rmsnorm_fwd_quantize(x, gamma, recipe,
*, eps, zero_centered_gamma, scale) -> (q, rsigma)``, ``act_fwd_quantize(x, recipe, *, kind,
scale) -> q``.
"""
from __future__ import annotations

from tealite import recipes as R
from tealite.backends.torch import fused as torch_fused
from tealite.backends.torch import norms as torch_norms
from tealite.backends.torch import quantize as TQB
from tealite.formats import ScaleRounding
from tealite_verify.mutate.base import Mutation, on_output, register, with_params, with_patches
from tealite_verify.mutate.operators_quant import _scale_mode_swapped, fp8_cast_truncating


def _ln_y_rounded_to_input_dtype(fn):
    # Unfused: the norm's y is rounded to x's dtype, then quantized from there.
    def mutated(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
        y, mean, rsigma = torch_norms.layernorm_fwd(x, gamma, beta, eps=eps,
                                                    zero_centered_gamma=zero_centered_gamma)
        return torch_fused.quantize_rows_fp32(y.float(), recipe, scale), mean, rsigma
    return mutated


def _fp8_scale_inv_doubled(q, args, kw):
    if q.recipe.family is not R.Family.MX and q.scale_inv is not None:
        q.scale_inv = q.scale_inv * 2
    return q


for _m in (
    Mutation("layernorm_fwd_quantize.y_rounded_to_input_dtype", "layernorm_fwd_quantize",
             "precision", "y rounded to x's dtype before quantizing (double rounding)",
             _ln_y_rounded_to_input_dtype),
    Mutation("rmsnorm_fwd_quantize.zero_centered_gamma_ignored", "rmsnorm_fwd_quantize",
             "parameter", "zero_centered_gamma ignored inside the fused kernel",
             with_params(lambda kw: dict(kw, zero_centered_gamma=False))),
    Mutation("rmsnorm_fwd_quantize.mx_scale_floor_for_rceil", "rmsnorm_fwd_quantize",
             "rounding-mode", "MX scale exponent by FLOOR where the recipe says RCEIL",
             with_patches((TQB, "mx_exponent",
                           _scale_mode_swapped({ScaleRounding.RCEIL: ScaleRounding.FLOOR})))),
    Mutation("act_fwd_quantize.fp8_truncation", "act_fwd_quantize", "rounding-mode",
             "FP8 element codes rounded toward zero", with_patches(
                 (TQB, "fp8_cast_rne", fp8_cast_truncating))),
    Mutation("act_fwd_quantize.scale_inv_exponent_up", "act_fwd_quantize", "scale-exponent",
             "FP8 scale_inv x 2, codes untouched", on_output(_fp8_scale_inv_doubled)),
):
    register(_m)
