"""LayerNorm and RMSNorm, forward and backward, normalizing over the last dimension.

Shapes: ``x`` is (..., H); ``gamma``/``beta`` are (H,) in x's dtype or float32.  Statistics
(``mean``, ``rsigma``) are float32 of shape x.shape[:-1], as TE returns them for backward.

    LayerNorm:  y = (x - mean) * rsigma * g + beta,   rsigma = 1/sqrt(var(x) + eps)
    RMSNorm:    y = x * rsigma * g,                    rsigma = 1/sqrt(mean(x^2) + eps)

``var`` is the biased (population) variance.  With ``zero_centered_gamma`` the effective
weight is ``g = 1 + gamma`` (TE's option for weight decay that pulls toward identity);
otherwise ``g = gamma``.  Backward returns ``dx`` in x's dtype and ``dgamma`` (and ``dbeta``)
in gamma's dtype, summed over all leading dims.

Fused add + RMSNorm + pad (AITER's ``fused_add_rmsnorm_pad``; forward only, no statistics):

    r = x + residual (fp32; r = x without a residual)
    y = r * rsqrt(mean(r^2) + eps) * weight            rounded to x's dtype
    residual_out = r                                   rounded to residual's dtype

``y`` has shape (..., H_out), H_out = H rounded up to a multiple of ``pad_to_multiple``
(0: no padding, H_out = H); the columns H..H_out are 0.  The mean is over the H real columns.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import tealite.registry as registry
from tealite._checks import (check_finite_number, check_same_device, check_shape,
                             check_tensor, require)
from tealite.types import Op


class LayerNormFwd(NamedTuple):
    y: torch.Tensor
    mean: torch.Tensor
    rsigma: torch.Tensor


class LayerNormBwd(NamedTuple):
    dx: torch.Tensor
    dgamma: torch.Tensor
    dbeta: torch.Tensor


class RMSNormFwd(NamedTuple):
    y: torch.Tensor
    rsigma: torch.Tensor


class RMSNormBwd(NamedTuple):
    dx: torch.Tensor
    dgamma: torch.Tensor


class AddRMSNormPad(NamedTuple):
    y: torch.Tensor
    residual_out: torch.Tensor | None  # None when no residual was given


def _check_weight(name: str, w: torch.Tensor, x: torch.Tensor) -> None:
    check_tensor(name, w, ndim=1, dtypes=(x.dtype, torch.float32))
    check_shape(name, w, (x.shape[-1],), "the normalized (last) dim of x")


def _check_stats(name: str, s: torch.Tensor, x: torch.Tensor) -> None:
    check_tensor(name, s, dtypes=(torch.float32,))
    check_shape(name, s, x.shape[:-1], "x.shape[:-1], one statistic per row")


def _params(x: torch.Tensor, gamma: torch.Tensor, zero_centered_gamma: bool, **tensors) -> dict:
    require(isinstance(zero_centered_gamma, bool), "zero_centered_gamma must be a bool")
    require(x.shape[-1] > 0, f"x's last (normalized) dim must be > 0, got shape {tuple(x.shape)}")
    device = check_same_device(x=x, gamma=gamma, **tensors)
    rows = x.numel() // x.shape[-1]
    return dict(dtype=x.dtype, weight_dtype=gamma.dtype, rows=rows, hidden=x.shape[-1],
                zero_centered_gamma=zero_centered_gamma, device=registry.device_kind(device))


def layernorm_fwd(x, gamma, beta, *, eps: float = 1e-5, zero_centered_gamma: bool = False,
                  backend: str | None = None) -> LayerNormFwd:
    check_tensor("x", x, min_ndim=1)
    _check_weight("gamma", gamma, x)
    _check_weight("beta", beta, x)
    require(beta.dtype == gamma.dtype, f"beta dtype {beta.dtype} must equal gamma's {gamma.dtype}")
    eps = check_finite_number("eps", eps, positive=True)
    params = _params(x, gamma, zero_centered_gamma, beta=beta)
    impl = registry.dispatch(Op.LAYERNORM_FWD, params, backend)
    return LayerNormFwd(*impl.fn(x, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma))


def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma: bool = False,
                  backend: str | None = None) -> LayerNormBwd:
    check_tensor("x", x, min_ndim=1)
    check_tensor("dy", dy, dtypes=(x.dtype,))
    check_shape("dy", dy, x.shape, "same as x")
    _check_stats("mean", mean, x)
    _check_stats("rsigma", rsigma, x)
    _check_weight("gamma", gamma, x)
    params = _params(x, gamma, zero_centered_gamma, dy=dy, mean=mean, rsigma=rsigma)
    impl = registry.dispatch(Op.LAYERNORM_BWD, params, backend)
    return LayerNormBwd(*impl.fn(dy, x, mean, rsigma, gamma,
                                 zero_centered_gamma=zero_centered_gamma))


def rmsnorm_fwd(x, gamma, *, eps: float = 1e-5, zero_centered_gamma: bool = False,
                backend: str | None = None) -> RMSNormFwd:
    check_tensor("x", x, min_ndim=1)
    _check_weight("gamma", gamma, x)
    eps = check_finite_number("eps", eps, positive=True)
    params = _params(x, gamma, zero_centered_gamma)
    impl = registry.dispatch(Op.RMSNORM_FWD, params, backend)
    return RMSNormFwd(*impl.fn(x, gamma, eps=eps, zero_centered_gamma=zero_centered_gamma))


def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma: bool = False,
                backend: str | None = None) -> RMSNormBwd:
    check_tensor("x", x, min_ndim=1)
    check_tensor("dy", dy, dtypes=(x.dtype,))
    check_shape("dy", dy, x.shape, "same as x")
    _check_stats("rsigma", rsigma, x)
    _check_weight("gamma", gamma, x)
    params = _params(x, gamma, zero_centered_gamma, dy=dy, rsigma=rsigma)
    impl = registry.dispatch(Op.RMSNORM_BWD, params, backend)
    return RMSNormBwd(*impl.fn(dy, x, rsigma, gamma, zero_centered_gamma=zero_centered_gamma))


def padded_hidden(hidden: int, pad_to_multiple: int) -> int:
    """H_out: ``hidden`` rounded up to a multiple of ``pad_to_multiple`` (0: unchanged)."""
    if pad_to_multiple == 0:
        return hidden
    return -(-hidden // pad_to_multiple) * pad_to_multiple


def add_rmsnorm_pad(x, weight, *, eps: float = 1e-5, residual=None, pad_to_multiple: int = 0,
                    backend: str | None = None) -> AddRMSNormPad:
    check_tensor("x", x, min_ndim=1)
    _check_weight("weight", weight, x)
    eps = check_finite_number("eps", eps, positive=True)
    require(isinstance(pad_to_multiple, int) and not isinstance(pad_to_multiple, bool)
            and pad_to_multiple >= 0,
            f"pad_to_multiple must be an int >= 0 (0: no padding), got {pad_to_multiple!r}")
    require(x.shape[-1] > 0, f"x's last (normalized) dim must be > 0, got shape {tuple(x.shape)}")
    tensors = {"x": x, "weight": weight}
    if residual is not None:
        # x's dtype or float32: then residual_out (fp32 sum, one rounding to the residual's
        # dtype) is the correctly rounded sum; a bf16 residual with float32 x would round twice.
        check_tensor("residual", residual, dtypes=(x.dtype, torch.float32))
        check_shape("residual", residual, x.shape, "same as x")
        tensors["residual"] = residual
    device = check_same_device(**tensors)
    hidden = x.shape[-1]
    params = dict(dtype=x.dtype, weight_dtype=weight.dtype, rows=x.numel() // hidden,
                  hidden=hidden, hidden_out=padded_hidden(hidden, pad_to_multiple),
                  residual_dtype=None if residual is None else residual.dtype,
                  device=registry.device_kind(device))
    impl = registry.dispatch(Op.ADD_RMSNORM_PAD, params, backend)
    return AddRMSNormPad(*impl.fn(x, weight, eps=eps, residual=residual,
                                  pad_to_multiple=pad_to_multiple,
                                  hidden_out=params["hidden_out"]))


__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_pad"]
