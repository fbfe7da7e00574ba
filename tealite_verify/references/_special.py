"""Special functions in float64 from Python's libm-backed ``math`` module (independent of
torch's vectorized kernels)."""
from __future__ import annotations

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def erfc(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erfc(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    # erfc form: 0.5 * (1 + erf(x/sqrt2)) cancels catastrophically for x << 0.
    return 0.5 * erfc(-x / SQRT2)


def normal_pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
