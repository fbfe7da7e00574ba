"""Floating-point primitives every tier's bound is built from: unit roundoff, Higham's gamma,
the ulp of a format, the overflow threshold and the underflow error of one operation.

Array arguments may be numpy arrays or torch tensors on the reference device (a bound computed
there); a scalar stays a Python float.
"""
from __future__ import annotations

import numpy as np
import torch

from tealite.numerics import Numerics

# (explicit mantissa bits, minimum normal exponent) per floating dtype.
_FORMATS = {
    torch.float64: (52, -1022),
    torch.float32: (23, -126),
    torch.bfloat16: (7, -126),
    torch.float16: (10, -14),
    "tf32": (10, -126),
    # FP8 (a kernel that rounds an intermediate to it: FP8 attention's P)
    torch.float8_e4m3fn: (3, -6),
    torch.float8_e4m3fnuz: (3, -7),
    torch.float8_e5m2: (2, -14),
}


def _fmt(dtype):
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise ValueError(f"no float format known for {dtype!r}") from None


def unit_roundoff(dtype) -> float:
    """u = 2^-(p) for a format with p-1 explicit mantissa bits (round to nearest)."""
    mant, _ = _fmt(dtype)
    return 2.0 ** -(mant + 1)


def gamma(n, u: float):
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term reduction."""
    nu = np.asarray(n, dtype=np.float64) * u
    # n*u >= 1: the a-priori bound is vacuous (a bf16 sum of 256+ terms can lose every bit).
    with np.errstate(divide="ignore"):
        g = np.where(nu < 1, nu / np.where(nu < 1, 1 - nu, 1.0), np.inf)
    # A scalar n gives a Python float: a 0-d numpy array times a torch tensor (a bound on the
    # reference device) would try to turn the tensor into numpy.
    return float(g) if g.ndim == 0 else g


def ulp(dtype, value) -> np.ndarray:
    """Spacing of ``dtype``'s representable numbers at magnitude |value| (elementwise).

    Zero and values below ``dtype``'s normal range get the subnormal spacing 2^(emin-mant);
    +-Inf gets 2^(-1-mant) and NaN the subnormal spacing (what frexp's exponent 0 gave).
    A torch tensor (a bound computed on the reference device) gets the same values as a
    float64 tensor on its device.
    """
    mant, emin = _fmt(dtype)
    if isinstance(value, torch.Tensor):
        return _ulp_torch(mant, emin, value)
    v = np.abs(np.asarray(value, dtype=np.float64))
    # floor(log2 v) is the biased exponent field minus 1023 for normal float64 v; zero and
    # float64 subnormals read -1023 and are lifted to emin below.  Read off the bits: this
    # runs on every compared element, and frexp + ldexp cost twice as much.
    field = v.view(np.int64) >> 52
    e = np.maximum(field - 1023, emin)
    if field.size and field.max() == 2047:  # Inf / NaN
        e = np.where(field == 2047, np.where(np.isnan(v), emin, -1), e)
    if emin - mant >= -1022:  # 2^(e - mant) is a normal float64: build it from its bits
        return ((e - mant + 1023) << 52).view(np.float64)
    return np.ldexp(1.0, (e - mant).astype(np.int64))


def _ulp_torch(mant: int, emin: int, value: torch.Tensor) -> torch.Tensor:
    v = value.detach().to(torch.float64).abs()
    field = v.view(torch.int64) >> 52
    e = torch.clamp_min(field - 1023, emin)
    e = torch.where(field == 2047, torch.where(torch.isnan(v), emin, -1), e)
    if emin - mant >= -1022:
        return ((e - mant + 1023) << 52).view(torch.float64)
    return torch.ldexp(torch.ones_like(v), e - mant)


def overflow_threshold(dtype) -> float:
    """Smallest magnitude that round-to-nearest sends to infinity in ``dtype``."""
    fmax = torch.finfo(dtype).max
    return float(fmax) + 0.5 * float(ulp(dtype, fmax))


def underflow_error(dtype) -> float:
    """Absolute error one operation can make near zero: the smallest normal of its format.

    Not half a subnormal step: flush-to-zero hardware (AMD GPUs' default fp32 denormal mode
    in many kernels) and exp overflow inside 1/(1+exp(-x)) both turn a subnormal
    intermediate into 0.  Values below the compute format's normal range are judged at that
    absolute resolution, scaled by what the intermediate is multiplied by afterwards
    (``underflow_scale`` of the ulp tier).
    """
    return float(torch.finfo(dtype).tiny)


def compute_dtype(numerics: Numerics):
    """The declared compute dtype (default float32)."""
    return numerics.compute_dtype or torch.float32


def accumulator_u(numerics: Numerics) -> float:
    """The accumulator's unit roundoff: declared, else fp32's round to nearest."""
    u = numerics.accumulator_unit_roundoff
    return unit_roundoff(torch.float32) if u is None else u


def to_f64(t) -> np.ndarray:
    """A tensor or array as a float64 numpy array on the host."""
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)
