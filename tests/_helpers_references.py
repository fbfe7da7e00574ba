"""Shared helpers of the reference self-tests (test_references_activations.py,
test_references_norms.py, test_references_gemm.py)."""
from __future__ import annotations

import numpy as np
import torch

F64 = torch.float64


def _close(actual, expected, *, rtol=1e-12, atol=1e-14):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                               np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _central_fd(fn, x, h_rel=1e-6):
    """Gradient of the scalar fn(x) w.r.t. every element of x by central differences."""
    x = np.array(x, dtype=np.float64)
    grad = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        h = h_rel * max(1.0, abs(x[idx]))
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        grad[idx] = (fn(xp) - fn(xm)) / (xp[idx] - xm[idx])
    return grad
