"""LayerNorm and RMSNorm, forward and backward, normalizing over the last dimension.

Shapes: ``x`` is (..., H); ``gamma``/``beta`` are (H,) in x's dtype or float32.  Statistics
(``mean``, ``rsigma``) are float32 of shape x.shape[:-1], as TE returns them for backward.

    LayerNorm:  y = (x - mean) * rsigma * g + beta,   rsigma = 1/sqrt(var(x) + eps)
    RMSNorm:    y = x * rsigma * g,                    rsigma = 1/sqrt(mean(x^2) + eps)

``var`` is the biased (population) variance.  With ``zero_centered_gamma`` the effective
weight is ``g = 1 + gamma`` (TE's option for weight decay that pulls toward identity);
otherwise ``g = gamma``.  Backward returns ``dx`` in x's dtype and ``dgamma`` (and ``dbeta``)
in gamma's dtype, summed over all leading dims.
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


__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd"]
