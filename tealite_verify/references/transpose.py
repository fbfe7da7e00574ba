"""Reference for ``transpose`` / ``fp8_transpose``: x.T, exact (a permutation of elements: no
arithmetic, so the reference is the definition, stored in the output's element type)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

# The element types the op copies, by torch's name (ml_dtypes for the ones numpy lacks).
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
                "uint8": np.uint8, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
                "float8_e5m2": ml_dtypes.float8_e5m2,
                "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
                "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz}


def transpose(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (2-D, values exactly representable in ``dtype``) transposed, contiguous, as ``dtype``."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"transpose needs a 2-D array, got shape {x.shape}")
    return np.ascontiguousarray(x.T).astype(NUMPY_DTYPES[dtype])
