"""The ``exact`` tier: bitwise equality of the stored bit patterns (NaN-aware: any NaN matches
any NaN unless ``nan_payload=True``).  For quantization codes and scales, layouts, amax and
delayed-scaling state.  Pair rule: the two backends' outputs bitwise equal
(:func:`compare_exact` of one against the other).
"""
from __future__ import annotations

import math
from dataclasses import replace

import ml_dtypes
import numpy as np
import torch

from tealite_verify.tiers.metrics import Metrics, Tier, from_mask, shape_mismatch
from tealite_verify.tiers.primitives import to_f64


def _bits(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous()
        width = t.element_size()
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
        # Unsigned, as the numpy branch below: a torch tensor compared with a numpy array of
        # the same element type (bf16 vs ml_dtypes bf16) must give the same bit patterns;
        # signed int16 views made every negative value a mismatch.
        return t.view(int_dtype).numpy().view(f"u{width}").astype(np.int64)
    arr = np.ascontiguousarray(t)
    return arr.view(f"u{arr.dtype.itemsize}").astype(np.int64)


def compare_exact(actual, expected, *, nan_payload: bool = False) -> Metrics:
    """Bitwise equality; ``actual`` and ``expected`` must have the same element type."""
    bad = shape_mismatch(Tier.EXACT, tuple(actual.shape), tuple(expected.shape))
    if bad:
        return bad
    if _elem_type(actual) != _elem_type(expected):
        return Metrics(Tier.EXACT, 0, 0, math.inf, math.inf, shape_error=(
            f"element type {_elem_type(actual)} != expected {_elem_type(expected)}"))
    a_bits, e_bits = _bits(actual), _bits(expected)
    ok = a_bits == e_bits
    a_val = to_f64(actual) if _is_float(actual) else _int_values(actual)
    e_val = to_f64(expected) if _is_float(expected) else _int_values(expected)
    if not nan_payload and _is_float(actual):
        ok |= np.isnan(a_val) & np.isnan(e_val)
    bit_dist = np.where(ok, 0, np.abs(a_bits - e_bits))
    nonfinite = int(((~np.isfinite(a_val)) | (~np.isfinite(e_val)))[~ok].sum())
    m = from_mask(Tier.EXACT, ok, a_val, e_val, err=bit_dist.astype(np.float64),
                  tol=np.zeros(ok.shape), nonfinite=nonfinite)
    # Report the value error and the bit distance apart: a distance between bit patterns
    # printed as "max|err|" read as a value (got 0.0 vs want 0.0103 showed 1.009e+09).
    with np.errstate(invalid="ignore"):
        value_err = np.abs(a_val - e_val)[~ok]
    finite = value_err[np.isfinite(value_err)]
    return replace(m, max_abs_err=float(finite.max()) if finite.size else
                   (math.inf if value_err.size else 0.0),
                   max_bit_distance=int(bit_dist.max()) if bit_dist.size else 0)


def _int_values(t) -> np.ndarray:
    """An integer (or bool) tensor's values as float64, signed as stored (a row map's -1
    reads -1, not its unsigned bit pattern)."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        return (t.to(torch.int64) if t.dtype == torch.bool else t).numpy().astype(np.float64)
    return np.asarray(t).astype(np.float64)


def _is_float(t) -> bool:
    if isinstance(t, torch.Tensor):
        return t.dtype.is_floating_point
    dt = np.asarray(t).dtype
    if dt.kind == "f":
        return True
    try:  # ml_dtypes' bfloat16 / float8 types have kind 'V'
        ml_dtypes.finfo(dt)
        return True
    except (ValueError, TypeError):
        return False


def _elem_type(t) -> str:
    if isinstance(t, torch.Tensor):
        return str(t.dtype).removeprefix("torch.")
    return np.asarray(t).dtype.name
