"""LayerNorm / RMSNorm references, float64, with analytic backward passes.

Backward formulas (per row, H = normalized size, g = effective weight, xhat = normalized x):
  LayerNorm: dx = rsigma * (g dy - mean(g dy) - xhat * mean(g dy xhat))
  RMSNorm:   dx = rsigma * (g dy - xhat * mean(g dy xhat))
  dgamma = sum over rows of dy * xhat;  dbeta = sum over rows of dy.
Backward uses the statistics it is given (as kernels do), not recomputed ones.
Written against the array namespace ``xp`` of x: numpy, or torch float64 on the reference
device (references._device); numpy in, numpy out for callers.

``add_rmsnorm_pad`` (numpy only): the RMSNorm of r = x + residual, zero-padded to the output
width, and r itself rounded once to the residual's dtype (:func:`round_once`).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

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


_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _round_to_odd_f32(v):
    """float64 -> float32 rounded to odd: truncate toward zero, then set the last bit where
    the truncation dropped anything.  Rounding that to a format of p <= 22 bits to nearest
    gives the correctly rounded result (the two extra bits keep every tie and every
    half-way decision of the narrow format intact)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        f = v.astype(np.float32)
        over = np.abs(f.astype(np.float64)) > np.abs(v)
        f = np.where(over & np.isfinite(v), np.nextafter(f, np.float32(0)), f)
        inexact = np.isfinite(v) & (f.astype(np.float64) != v)
    bits = f.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def round_once(v, dtype: str):
    """float64 ``v`` rounded once, to nearest even, to ``dtype`` (numpy / ml_dtypes array).
    ml_dtypes' and numpy's float64 casts to bf16 / fp16 may go through float32 (two
    roundings), so those go through a round-to-odd float32 first."""
    if dtype == "float32":
        return np.asarray(v, dtype=np.float64).astype(np.float32)
    with np.errstate(over="ignore"):
        return _round_to_odd_f32(v).astype(_NP_DTYPES[dtype])


def add_rmsnorm_pad(x, weight, *, eps: float, residual=None, hidden_out: int,
                    residual_dtype: str | None = None):
    """(y (..., hidden_out), r, residual_out): y the RMSNorm of r = x (+ residual) in
    float64 with exact zeros in the padded columns; residual_out = r rounded once to
    ``residual_dtype`` (None without a residual)."""
    r = x if residual is None else x + residual
    rsigma = 1.0 / np.sqrt(np.mean(r * r, axis=-1) + eps)
    y = np.zeros((*x.shape[:-1], hidden_out), dtype=np.float64)
    y[..., :x.shape[-1]] = r * rsigma[..., None] * weight
    res_out = None if residual is None else round_once(r, residual_dtype)
    return y, r, res_out
