"""Float64 references of the multi-tensor ops (TE's multi_tensor_* kernels), per tensor.

Written from the update formulas (tealite/ops/multi_tensor.py states them), never from a
backend.  The hyper-parameters are what a kernel receives: Python floats rounded to float32
(``f32``), ``1 - beta`` formed in float32 from the rounded beta, and the bias corrections
``1 - beta^step`` formed in double on the host from the float32 beta and then rounded to float32
(TE's host code).  Every arithmetic operation on tensor values is then exact (float64).

The Adam and SGD updates are written against plain arithmetic operators and a ``sqrt``
argument so that tealite_verify/tiers/multi_tensor.py can evaluate the very same formula on
error-tracking numbers (its bound is the formula's own running error analysis).

Scale and compute-scale are exact: the reference performs the float32 roundings the op
specifies (one fp32 multiply, one rounding into the output dtype; the fp32 division of
compute-scale) with ml_dtypes / numpy float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tealite_verify.references.quantize import fmt_max

F32 = np.float32
OUT_TYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def f32(value: float) -> float:
    """A Python float as the float32 kernel argument, back as a float."""
    return float(F32(value))


# ---- scale, norms ---------------------------------------------------------------------------

def scale(x, s: float, out_dtype: str) -> np.ndarray:
    """round_out(fl32(x * fl32(s))): the fp32 product of two fp32 values is exact in float64,
    so rounding it to fp32 and then to the output type reproduces the op bit for bit."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to Inf is the op's result
        prod = (np.asarray(x, np.float64) * f32(s)).astype(F32)
        return prod.astype(OUT_TYPES[out_dtype])


def noop_flag(tensors, initial: int = 0) -> np.ndarray:
    """int32 (1,): 1 when any element of any tensor is NaN or Inf (or the flag was set)."""
    bad = any(not np.isfinite(np.asarray(t, np.float64)).all() for t in tensors)
    return np.array([1 if (bad or initial) else 0], dtype=np.int32)


def sum_of_squares(x, inv_scale: float | None = None) -> float:
    x = np.asarray(x, np.float64).reshape(-1)
    if inv_scale is not None:
        x = x * inv_scale
    return float(np.sum(x * x))


def l2norms(tensors, inv_scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(total (1,), per tensor (N,)) in float64."""
    sums = np.array([sum_of_squares(t, inv_scale) for t in tensors], dtype=np.float64)
    return np.sqrt(np.array([sums.sum()])), np.sqrt(sums)


# ---- optimizers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class AdamConstants:
    """The step's hyper-parameters as the kernel sees them (see the module docstring)."""

    lr: float
    beta1: float
    beta2: float
    one_minus_beta1: float
    one_minus_beta2: float
    eps: float
    weight_decay: float
    bc1: float
    bc2: float
    adam_w_mode: bool

    @classmethod
    def of(cls, lr, beta1, beta2, eps, step, weight_decay, adam_w_mode, bias_correction):
        b1, b2 = f32(beta1), f32(beta2)
        bc1, bc2 = (f32(1.0 - b1 ** step), f32(1.0 - b2 ** step)) if bias_correction else (1.0, 1.0)
        return cls(f32(lr), b1, b2, f32(1.0 - b1), f32(1.0 - b2), f32(eps), f32(weight_decay),
                   bc1, bc2, bool(adam_w_mode))


def adam_update(g, p, m, v, c: AdamConstants, sqrt=np.sqrt):
    """One Adam / AdamW step per element: (p, m, v) after it."""
    if not c.adam_w_mode:
        g = g + p * c.weight_decay
    m = m * c.beta1 + g * c.one_minus_beta1
    v = v * c.beta2 + (g * g) * c.one_minus_beta2
    update = (m / c.bc1) / (sqrt(v / c.bc2) + c.eps)
    if c.adam_w_mode:
        update = update + p * c.weight_decay
    return p - update * c.lr, m, v


@dataclass(frozen=True)
class SGDConstants:
    lr: float
    momentum: float
    one_minus_dampening: float
    weight_decay: float
    scale: float
    nesterov: bool
    first_run: bool
    wd_after_momentum: bool

    @classmethod
    def of(cls, lr, momentum, dampening, nesterov, weight_decay, first_run, wd_after_momentum,
           scale):
        return cls(f32(lr), f32(momentum), f32(1.0 - f32(dampening)), f32(weight_decay),
                   f32(scale), bool(nesterov), bool(first_run), bool(wd_after_momentum))


def sgd_update(g, w, mom, c: SGDConstants):
    """One SGD step per element: (w, mom) after it."""
    g = g * c.scale
    if c.weight_decay != 0 and not c.wd_after_momentum:
        g = g + w * c.weight_decay
    if c.momentum != 0:
        mom = g if c.first_run else mom * c.momentum + g * c.one_minus_dampening
        g = g + mom * c.momentum if c.nesterov else mom
    if c.weight_decay != 0 and c.wd_after_momentum:
        g = g + w * c.weight_decay
    return w - g * c.lr, mom


# ---- compute scale --------------------------------------------------------------------------

def compute_scale(amax, fmt: str, margin: int, force_pow2: bool, epsilon: float):
    """(scale, scale_inv) float32 per amax: TE's rule in float32 (tealite/ops/multi_tensor.py)."""
    a = np.asarray(amax, dtype=F32).reshape(-1)
    if epsilon > 0:
        a = np.maximum(a, F32(epsilon))  # NaN-propagating, like torch.maximum
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = (F32(fmt_max(fmt)) / a).astype(F32)
        s = (s / F32(2.0 ** margin)).astype(F32)
    s = np.where(np.isinf(s), np.finfo(F32).max, s).astype(F32)
    s = np.where((a == 0) | ~np.isfinite(a), F32(1.0), s).astype(F32)
    if force_pow2:
        s = (s.view(np.int32) & np.int32(~((1 << 23) - 1))).view(F32)
    with np.errstate(divide="ignore"):
        inv = (F32(1.0) / s).astype(F32)
    return s, inv
