"""Special functions in float64, written against the array namespace of their input.

For numpy arrays erf / erfc are Python's libm-backed ``math`` functions per element
(independent of torch's vectorized kernels); on a reference device they are torch.special's
float64 kernels, a few ulp from libm (see references._device).
"""
from __future__ import annotations

import math

from tealite_verify.references._device import namespace, on_reference_device

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@on_reference_device
def erf(x):
    return namespace(x).erf(x)


@on_reference_device
def erfc(x):
    return namespace(x).erfc(x)


@on_reference_device
def normal_cdf(x):
    # erfc form: 0.5 * (1 + erf(x/sqrt2)) cancels catastrophically for x << 0.  The divisor
    # is an array, not a Python float: torch on CUDA turns division by a scalar into a
    # multiplication by its rounded reciprocal, and erfc's tail (condition ~2 z^2) amplifies
    # that one-ulp change of its argument ~100-fold (measured on the H100 at x = -5..-10).
    return 0.5 * erfc(-x / namespace(x).asarray(SQRT2))


@on_reference_device
def normal_pdf(x):
    return namespace(x).exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


@on_reference_device
def sigmoid(x):
    # Split by sign so exp never overflows.
    xp = namespace(x)
    x = xp.asarray(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
