"""Bounds of the multi-tensor ops (judged by the ``ulp`` tier's comparison, tiers/bounded.py).

**Optimizer updates (Adam / AdamW, SGD): running error analysis of the formula itself.**  The
reference's update (tealite_verify/references/multi_tensor.py) is evaluated once more on
:class:`Tracked` numbers: a float64 value plus an absolute error bound that every operation
propagates to first order exactly (sum: the errors add; product ``a b``: ``|a| e_b + |b| e_a +
e_a e_b``; quotient: ``(e_a + |a/b| e_b) / (|b| - e_b)``, infinite when the denominator's interval
reaches 0; square root: ``min(e / sqrt(v), sqrt(e))``, since ``|sqrt(x) - sqrt(v)| = |x - v| /
(sqrt(x) + sqrt(v))``) and then adds the operation's own rounding in the compute dtype,
``u (|value| + e)`` plus one underflow error (tiers/primitives.py: the smallest normal, for
flush-to-zero hardware).  An FMA contracts two roundings into one, so the bound also holds for
a backend that fuses.  Inputs are exact (bf16 / fp16 / fp32 values are exact in fp32) and so
are the hyper-parameters, which the reference forms exactly as the kernel receives them.

The operation count this gives per element for AdamW with fp32 math: m (2 products, 1 sum),
v (3 products, 1 sum), the two bias-correction divisions, sqrt, + eps, the division, the
decay (product, sum), lr * update, the subtraction: 16 roundings; L2 mode moves the decay
(2) in front of the moments.  SGD: the scale product, decay (2), momentum (2 products, 1 sum),
nesterov (2), lr (1), subtraction (1).  A division by ``sqrt(v) + eps`` magnifies the
errors of m by 1/eps at v = 0: the propagation carries that, it is not a blanket term.  Where
the L2-mode gradient ``g + wd p`` cancels to about its rounding error, v's error can exceed
``eps`` and the bound becomes infinite: the computed update is then genuinely undetermined by
fp32 arithmetic (any order of the same roundings may differ arbitrarily), and the tier says so
rather than pretending to a bound.

The output is then rounded into its storage dtype: nothing more for an fp32 output (the last
operation's rounding is counted), half an ulp of the output at ``|ref| + e`` for a bf16 / fp16
param (the cast of the fp32 result, or of the fp32 master weight).

**L2 norms.**  ``S = sum x_i^2`` over n elements in fp32, in any order (TE: per chunk, then
the chunk partials; torch: its own tree): each square rounds once and the n - 1 additions of
non-negative terms give, by Higham (3.5) for any summation tree, ``|S' - S| <= gamma_n S`` plus
an underflow error per square.  With the unscale product first every square carries one more
product rounding: gamma_{n+2}.  The square root then moves the error to ``min(e / sqrt(S),
sqrt(e))`` and rounds once (fp32 output: no further rounding).  The total norm is the same
bound over all elements of all tensors.

Scale, the noop flag and compute-scale are exact (tiers/exact.py): one fp32 product rounded
into the output dtype, a flag, and TE's fp32 scale rule, which the reference performs.
"""
from __future__ import annotations

import numpy as np
import torch

from tealite.numerics import Numerics

from tealite_verify.tiers.primitives import (compute_dtype, gamma, underflow_error,
                                             unit_roundoff)
from tealite_verify.tiers.ulp import with_output_rounding


class Tracked:
    """A float64 array with an absolute error bound of the computation that produced it
    (see the module docstring).  Python floats mixed in are exact constants."""

    __slots__ = ("value", "err", "u", "eta")

    def __init__(self, value, err, u: float, eta: float):
        self.value = np.asarray(value, dtype=np.float64)
        self.err = np.asarray(err, dtype=np.float64)
        self.u, self.eta = u, eta

    def _rounded(self, value, err) -> "Tracked":
        with np.errstate(invalid="ignore", over="ignore"):
            return Tracked(value, err + self.u * (np.abs(value) + err) + self.eta, self.u,
                           self.eta)

    @staticmethod
    def _parts(x):
        return (x.value, x.err) if isinstance(x, Tracked) else (np.float64(x), np.float64(0.0))

    def __add__(self, other):
        b, eb = self._parts(other)
        return self._rounded(self.value + b, self.err + eb)

    __radd__ = __add__

    def __sub__(self, other):
        b, eb = self._parts(other)
        return self._rounded(self.value - b, self.err + eb)

    def __mul__(self, other):
        b, eb = self._parts(other)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(b) * self.err
            if isinstance(other, Tracked):  # a constant is exact: no 0 * inf cross term
                err = err + np.abs(self.value) * eb + self.err * eb
        return self._rounded(self.value * b, err)

    __rmul__ = __mul__

    def __truediv__(self, other):
        b, eb = self._parts(other)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = self.value / b
            room = np.abs(b) - eb
            err = np.where(room > 0, (self.err + np.abs(q) * eb) / np.where(room > 0, room, 1.0),
                           np.inf)
        return self._rounded(q, err)


def tracked_sqrt(x: Tracked) -> Tracked:
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(x.value)
        err = np.where(root > 0, np.minimum(x.err / np.where(root > 0, root, 1.0),
                                            np.sqrt(x.err)), np.sqrt(x.err))
    return x._rounded(root, err)


def exact_input(values, numerics: Numerics) -> Tracked:
    c_dt = compute_dtype(numerics)
    return Tracked(values, np.zeros(np.shape(values)), unit_roundoff(c_dt),
                   underflow_error(c_dt))


def storage_tolerance(result: Tracked, out_dtype: torch.dtype) -> np.ndarray:
    """The bound of ``result`` stored in ``out_dtype`` (see the module docstring)."""
    roundings = 0 if out_dtype == torch.float32 else 1
    return with_output_rounding(result.value, result.err, out_dtype, roundings=roundings)


def norm_tolerance(sum_of_squares, n, numerics: Numerics, *, unscaled: bool) -> np.ndarray:
    """The fp32 2-norm's bound from its float64 sum of squares over ``n`` elements."""
    c_dt = compute_dtype(numerics)
    u = unit_roundoff(c_dt)
    s = np.asarray(sum_of_squares, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    e = gamma(n + (2 if unscaled else 0), u) * s + n * underflow_error(c_dt)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(s)
        e_root = np.where(root > 0, np.minimum(e / np.where(root > 0, root, 1.0), np.sqrt(e)),
                          np.sqrt(e))
    return e_root + u * (root + e_root) + underflow_error(c_dt)
