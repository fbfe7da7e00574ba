"""Dropout reference, from the definition (tealite/ops/dropout.py's docstring): given a kept
mask, ``y = fl_dtype(fl32(x) * fl32(1 / (1 - p)))`` where kept and +0 where dropped.  Which
elements are kept is the backend's generator's business (judged by tiers/statistical.py), so
the reference takes the mask as an input.  numpy float32 arithmetic (IEEE round to nearest
even) and ml_dtypes casts, bit-exact."""
from __future__ import annotations

import ml_dtypes
import numpy as np

_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def scale_fp32(p: float) -> np.float32:
    """fl32(1 / (1 - p)): the quotient in float64, rounded once; 0 when nothing is kept."""
    return np.float32(0.0) if p == 1.0 else np.float32(1.0 / (1.0 - p))


def apply_mask(x, keep, p: float, dtype: str) -> np.ndarray:
    """The kept elements scaled in fp32 and rounded once to ``dtype``, the rest +0."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)  # exact: x is in a <= fp32 dtype
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = x32 * scale_fp32(p)
    out = np.where(np.asarray(keep, bool), scaled, np.float32(0.0))
    return out.astype(_NP_DTYPES[dtype])
