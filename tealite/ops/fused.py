"""Fused norm -> quantize and activation -> quantize (TE's fused LayerNorm/RMSNorm + FP8 cast
and fused activation + FP8 cast), forward only.

A fused kernel computes the norm (or activation) output ``y`` in fp32 and quantizes that fp32
``y`` directly: ``y`` is never rounded to x's dtype.  So the codes are those of
``tealite.quantize(y_fp32.reshape(-1, N), recipe)``, not of ``quantize(layernorm_fwd(x).y)``.

Recipes (the ones a single pass over a row can produce; anything else is rejected here):

=================================================  ==============================================
``DelayedScaling`` (``scale=`` float32 (1,))       per-tensor FP8 with the GIVEN scale;
                                                   ``amax`` = amax of y over the whole tensor (1,)
``Float8CurrentScaling(granularity="row")``        per-row FP8, scale from the row's amax of y
                                                   (the recipe's scale rule); ``amax`` = row
                                                   amaxes (rows,)
``MXBlockScaling``                                 MX: an E8M0 scale per 32 consecutive elements
                                                   of a row; N must be a multiple of 32.  FP8
                                                   elements (MXFP8, TE's fused casts) or E2M1
                                                   (MXFP4: AITER fuses it, with its own rounding
                                                   conventions; packed like tealite.quantize)
=================================================  ==============================================

Per-tensor *current* scaling needs the amax of the whole output before the first code is
written (two passes), and FP8 block scaling is not fused by TE either: quantize the plain
norm output with ``tealite.quantize`` for those.  ``Float8CurrentScaling`` under AITER's
scale rule (``scale_rule=AMAX_OVER_FMAX``) reports no amax (``amax`` is None), as
``tealite.quantize`` does under that rule.

Outputs a caller does not need: ``return_stats=False`` (the norms) says the caller does not
need ``mean`` / ``rsigma``, ``return_amax=False`` that it does not need ``out.amax``.  A
backend whose kernel does not produce them (AITER's fused kernels compute neither the norm
statistics nor an amax) then returns None for them; one that does may still return them.
With the defaults (True) such a backend rejects the case: nothing is silently missing.

The quantized output ``out`` is a :class:`tealite.QuantizedTensor` of the 2-D output
(rows, N) = y.reshape(-1, N), rowwise only, with the same fields and conventions as
``tealite.quantize`` of that recipe (``scale_inv`` = 1/scale in fp32, E8M0 bytes for MX;
``amax`` as above, None for MX), so ``tealite.dequantize(out)`` works on it.  N is x's last
dim for the norms and the pointwise activations, half of it for the gated kinds.  The norm
statistics (``mean``, ``rsigma``: float32, shape x.shape[:-1]) are those of the plain norms.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

import tealite.recipes as R
import tealite.registry as registry
from tealite._checks import check_finite_number, check_shape, check_tensor, require
from tealite.ops import activations as _acts
from tealite.ops import norms as _norms
from tealite.ops.quantize import check_given_scale
from tealite.types import Op, QuantizedTensor

FUSED_RECIPES = (R.DelayedScaling, R.Float8CurrentScaling, R.MXBlockScaling)


class LayerNormFwdQuantized(NamedTuple):
    out: QuantizedTensor
    mean: torch.Tensor
    rsigma: torch.Tensor


class RMSNormFwdQuantized(NamedTuple):
    out: QuantizedTensor
    rsigma: torch.Tensor


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        require(isinstance(value, bool), f"{name} must be a bool, got {value!r}")


def _check_recipe(recipe, scale, x: torch.Tensor, n_out: int) -> None:
    """The recipe is one a fused kernel can produce in one pass, and ``scale`` matches it."""
    require(isinstance(recipe, FUSED_RECIPES),
            f"recipe must be one of {[t.__name__ for t in FUSED_RECIPES]} for a fused "
            f"quantize, got {type(recipe).__name__}")
    if isinstance(recipe, R.Float8CurrentScaling):  # a fused kernel's own amax is per row
        require(recipe.granularity == "row",
                "recipe Float8CurrentScaling must have granularity='row' for a fused quantize "
                f"(per-tensor current scaling needs the whole output's amax first), got "
                f"{recipe.granularity!r}")
    if recipe.scale_granularity is R.Granularity.MX_BLOCK:
        require(n_out % recipe.block == 0,
                f"the quantized (last) dim of the output must be a multiple of {recipe.block} "
                f"for MX quantization, got {n_out} (x shape {tuple(x.shape)})")
    check_given_scale(recipe, scale, x.device)


def _recipe_params(recipe, n_out: int, **flags) -> dict:
    return dict(recipe=recipe, kind=recipe.kind, fmt=recipe.fmt, n_out=n_out, **flags)


def layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps: float = 1e-5,
                           zero_centered_gamma: bool = False, scale: torch.Tensor | None = None,
                           return_stats: bool = True, return_amax: bool = True,
                           backend: str | None = None) -> LayerNormFwdQuantized:
    """LayerNorm forward whose output y (fp32) is quantized with ``recipe`` in the same pass."""
    _check_flags(return_stats=return_stats, return_amax=return_amax)
    check_tensor("x", x, min_ndim=1)
    _norms._check_weight("gamma", gamma, x)
    _norms._check_weight("beta", beta, x)
    require(beta.dtype == gamma.dtype, f"beta dtype {beta.dtype} must equal gamma's {gamma.dtype}")
    eps = check_finite_number("eps", eps, positive=True)
    params = _norms._params(x, gamma, zero_centered_gamma, beta=beta)
    _check_recipe(recipe, scale, x, x.shape[-1])
    params.update(_recipe_params(recipe, x.shape[-1], return_stats=return_stats,
                                 return_amax=return_amax))
    impl = registry.dispatch(Op.LAYERNORM_FWD_QUANTIZE, params, backend)
    return LayerNormFwdQuantized(*impl.fn(x, gamma, beta, recipe, eps=eps,
                                          zero_centered_gamma=zero_centered_gamma, scale=scale))


def rmsnorm_fwd_quantize(x, gamma, recipe, *, eps: float = 1e-5,
                         zero_centered_gamma: bool = False, scale: torch.Tensor | None = None,
                         return_stats: bool = True, return_amax: bool = True,
                         backend: str | None = None) -> RMSNormFwdQuantized:
    """RMSNorm forward whose output y (fp32) is quantized with ``recipe`` in the same pass."""
    _check_flags(return_stats=return_stats, return_amax=return_amax)
    check_tensor("x", x, min_ndim=1)
    _norms._check_weight("gamma", gamma, x)
    eps = check_finite_number("eps", eps, positive=True)
    params = _norms._params(x, gamma, zero_centered_gamma)
    _check_recipe(recipe, scale, x, x.shape[-1])
    params.update(_recipe_params(recipe, x.shape[-1], return_stats=return_stats,
                                 return_amax=return_amax))
    impl = registry.dispatch(Op.RMSNORM_FWD_QUANTIZE, params, backend)
    return RMSNormFwdQuantized(*impl.fn(x, gamma, recipe, eps=eps,
                                        zero_centered_gamma=zero_centered_gamma, scale=scale))


def act_fwd_quantize(x: torch.Tensor, kind: str, recipe, *, scale: torch.Tensor | None = None,
                     return_amax: bool = True, backend: str | None = None) -> QuantizedTensor:
    """Activation forward (any kind of :mod:`tealite.ops.activations`, gated ones included)
    whose output (fp32) is quantized with ``recipe`` in the same pass."""
    _check_flags(return_amax=return_amax)
    _acts._check_x(x, kind)
    n_out = _acts.output_shape(x.shape, kind)[-1]
    _check_recipe(recipe, scale, x, n_out)
    params = _acts._params(x, kind)
    # "kind" is the recipe's kind in a fused op's params; the activation goes as "act_kind".
    params.update(_recipe_params(recipe, n_out, return_amax=return_amax),
                  rows=math.prod(x.shape[:-1]), act_kind=kind)
    impl = registry.dispatch(Op.ACT_FWD_QUANTIZE, params, backend)
    return impl.fn(x, recipe, kind=kind, scale=scale)


__all__ = ["layernorm_fwd_quantize", "rmsnorm_fwd_quantize", "act_fwd_quantize",
           "LayerNormFwdQuantized", "RMSNormFwdQuantized"]
