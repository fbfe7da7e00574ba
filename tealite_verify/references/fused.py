"""References for fused norm / activation -> quantize: the float64 norm or activation
(references/norms.py, activations.py) as the 2-D rows a fused kernel writes, rounded to
nearest float32.

The reference quantized output is the recipe's bit-exact quantization of that round32(y)
(``recipe_rules.quantize``, which calls references/quantize.py with the recipe's facts as
plain arguments): what a fused kernel whose fp32 y happened to equal round32(y_ref) would
write.  A real kernel's fp32 y carries its own rounding error, so its codes are not bit-exact
against it: tealite_verify/tiers/code_interval.py judges them against an error bound on y, and
that quantization is the tier's e = 0 limit (bit-exact).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def as_rows(y) -> np.ndarray:
    """y (..., N) as the 2-D (rows, N) a fused quantized output is stored as."""
    y = np.asarray(y)
    return y.reshape(int(np.prod(y.shape[:-1], dtype=np.int64)), y.shape[-1])


def round_to_f32(y) -> np.ndarray:
    """float64 -> float32, round to nearest even (numpy's cast)."""
    with np.errstate(over="ignore"):
        return np.asarray(y, dtype=np.float64).astype(F32)
