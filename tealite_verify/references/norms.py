"""LayerNorm / RMSNorm references, float64, with analytic backward passes.

Backward formulas (per row, H = normalized size, g = effective weight, xhat = normalized x):
  LayerNorm: dx = rsigma * (g dy - mean(g dy) - xhat * mean(g dy xhat))
  RMSNorm:   dx = rsigma * (g dy - xhat * mean(g dy xhat))
  dgamma = sum over rows of dy * xhat;  dbeta = sum over rows of dy.
Backward uses the statistics it is given (as kernels do), not recomputed ones.
Written against the array namespace ``xp`` of x: numpy, or torch float64 on the reference
device (references._device); numpy in, numpy out for callers.
"""
from __future__ import annotations

from tealite_verify.references._device import namespace, on_reference_device


def effective_weight(gamma, zero_centered_gamma: bool):
    return gamma + 1.0 if zero_centered_gamma else gamma


def _rows_sum(t):
    return namespace(t).sum(t.reshape(-1, t.shape[-1]), axis=0)


@on_reference_device
def layernorm_fwd(x, gamma, beta, *, eps: float, zero_centered_gamma: bool = False):
    xp = namespace(x)
    mean = xp.mean(x, axis=-1)
    var = xp.mean((x - mean[..., None]) ** 2, axis=-1)
    rsigma = 1.0 / xp.sqrt(var + eps)
    xhat = (x - mean[..., None]) * rsigma[..., None]
    y = xhat * effective_weight(gamma, zero_centered_gamma) + beta
    return y, mean, rsigma


@on_reference_device
def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma: bool = False):
    xp = namespace(x)
    rs = rsigma[..., None]
    xhat = (x - mean[..., None]) * rs
    gdy = dy * effective_weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - xp.mean(gdy, axis=-1, keepdims=True)
               - xhat * xp.mean(gdy * xhat, axis=-1, keepdims=True))
    return dx, _rows_sum(dy * xhat), _rows_sum(dy)


@on_reference_device
def rmsnorm_fwd(x, gamma, *, eps: float, zero_centered_gamma: bool = False):
    xp = namespace(x)
    rsigma = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1) + eps)
    y = x * rsigma[..., None] * effective_weight(gamma, zero_centered_gamma)
    return y, rsigma


@on_reference_device
def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma: bool = False):
    rs = rsigma[..., None]
    xhat = x * rs
    gdy = dy * effective_weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - xhat * namespace(x).mean(gdy * xhat, axis=-1, keepdims=True))
    return dx, _rows_sum(dy * xhat)
