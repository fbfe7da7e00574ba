"""LayerNorm / RMSNorm references, float64, with analytic backward passes.

Backward formulas (per row, H = normalized size, g = effective weight, xhat = normalized x):
  LayerNorm: dx = rsigma * (g dy - mean(g dy) - xhat * mean(g dy xhat))
  RMSNorm:   dx = rsigma * (g dy - xhat * mean(g dy xhat))
  dgamma = sum over rows of dy * xhat;  dbeta = sum over rows of dy.
Backward uses the statistics it is given (as kernels do), not recomputed ones.
"""
from __future__ import annotations

import numpy as np


def effective_weight(gamma, zero_centered_gamma: bool):
    return gamma + 1.0 if zero_centered_gamma else gamma


def _rows_sum(t):
    return t.reshape(-1, t.shape[-1]).sum(axis=0)


def layernorm_fwd(x, gamma, beta, *, eps: float, zero_centered_gamma: bool = False):
    mean = x.mean(axis=-1)
    var = ((x - mean[..., None]) ** 2).mean(axis=-1)
    rsigma = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean[..., None]) * rsigma[..., None]
    y = xhat * effective_weight(gamma, zero_centered_gamma) + beta
    return y, mean, rsigma


def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma: bool = False):
    rs = rsigma[..., None]
    xhat = (x - mean[..., None]) * rs
    gdy = dy * effective_weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - gdy.mean(axis=-1, keepdims=True)
               - xhat * (gdy * xhat).mean(axis=-1, keepdims=True))
    return dx, _rows_sum(dy * xhat), _rows_sum(dy)


def rmsnorm_fwd(x, gamma, *, eps: float, zero_centered_gamma: bool = False):
    rsigma = 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)
    y = x * rsigma[..., None] * effective_weight(gamma, zero_centered_gamma)
    return y, rsigma


def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma: bool = False):
    rs = rsigma[..., None]
    xhat = x * rs
    gdy = dy * effective_weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - xhat * (gdy * xhat).mean(axis=-1, keepdims=True))
    return dx, _rows_sum(dy * xhat)
