"""Shared by the reference-device test modules (test_reference_device_gemm.py,
test_reference_device_agreement.py, test_reference_device_routing.py): the CUDA-only marker,
the hostile float64 values both the agreement and the routing checks feed the references, and
running a reference under a reference device."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tealite_verify.references import _device

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _hostile_values(seed=0):
    """NaN, +-Inf, +-0, subnormals, huge (x**3 overflows), exp/erfc tails, then random."""
    rng = np.random.default_rng(seed)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, 2.2e-308, 1e-300,
               1.7e308, 1e300, 1e154, 1e103, 1e102, 1e8, 1e-8, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
               40.0, 709.0, 710.0, 745.0, 800.0]
    tails = [-5.0, -5.5, -6.0, -8.0, -10.0, -20.0, -26.0, -27.0, -30.0, -37.0, -38.0, -38.5,
             -39.0, -40.0, -50.0]
    random = np.concatenate([rng.standard_normal(200) * 8.0,
                             rng.choice([-1.0, 1.0], 200) * np.exp(rng.uniform(-700, 700, 200))])
    x = np.concatenate([special, [-v for v in special], tails, random])
    return x[: x.size - x.size % 32].reshape(-1, 32)


def _on(device, fn, *args, **kwargs):
    with _device.reference_device(device):
        return fn(*args, **kwargs)
