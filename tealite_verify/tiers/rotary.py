"""The RoPE bound (judged as the ``ulp`` tier: bounded comparison, ``ulp-pair`` rule).

Derivation.  For a rotated element ``k`` with partner ``q`` (tealite/ops/rope.py) the exact
result is ``y = x cos f + s x_q sin f`` (s = -1 or +1; in backward the partner's own sin).
``f`` is the float32 freqs value the kernel reads: the reference takes cos / sin of that
same number in float64, so the argument's conditioning (a large ``f`` at a large position) is
not the kernel's error, only how well it evaluates cos / sin there.  The kernel computes:

1. ``c~ = cos f + dc``, ``s~ = sin f + ds`` with ``|dc|, |ds| <= e_t``, the declared
   absolute error of its fp32 cos / sin (``trig_ulps`` units of 2^-24, default 2);
2. one FMA pair per element, ``fl(x c~ + s fl(x_q s~))``, or unfused products and a sum:
   either is a two-term dot product, ``|err| <= gamma_2 (|x c~| + |x_q s~|)`` (Higham,
   u the compute dtype's unit roundoff);
3. one rounding into the output dtype.

With ``m = |x| |cos f| + |x_q| |sin f|`` and ``w = |x| + |x_q|``:
``|x c~ + s x_q s~ - y| <= e_t w`` and ``|x c~| + |x_q s~| <= m + e_t w``, so the compute
error is

    e_c = e_t w + gamma_2 (m + e_t w)  (+ 3 underflow terms: a subnormal product may flush)

and the bound is ``e_c + 0.5 ulp_out(|y| + e_c)`` (tiers/ulp.py's output rounding).  The tail
``d2 <= k < d`` is a copy: ``w = 0``, ``m = |x|``, and the bound is the output rounding of an
exact value (any change of a tail element is caught).  In a bf16 / fp16 output the rounding
dominates (a result one output ulp off is caught); in fp32 the bound is a few units of u
times ``m`` plus the trig error: a cos / sin evaluated in bf16 (error 2^-9) or from an fp16
argument is caught, and so is a rotation with a wrong sign, partner or position (an error of
the size of ``m``).
"""
from __future__ import annotations

import numpy as np

from tealite.numerics import Numerics

from tealite_verify.tiers.primitives import (compute_dtype, gamma, underflow_error,
                                             unit_roundoff)
from tealite_verify.tiers.ulp import with_output_rounding

TRIG_UNIT = 2.0 ** -24
DEFAULT_TRIG_ULPS = 2.0


def trig_error(numerics: Numerics) -> float:
    """The declared absolute error of the kernel's fp32 cos / sin."""
    ulps = numerics.trig_ulps if numerics.trig_ulps is not None else DEFAULT_TRIG_ULPS
    return float(ulps) * TRIG_UNIT


def rope_tolerance(ref, magnitude, weight, out_dtype, numerics: Numerics) -> np.ndarray:
    """Per-element bound (see the module docstring): ``magnitude`` = m, ``weight`` = w."""
    c_dt = compute_dtype(numerics)
    g2 = gamma(2, unit_roundoff(c_dt))
    e_t = trig_error(numerics)
    w = np.asarray(weight)
    e_c = e_t * w + g2 * (np.asarray(magnitude) + e_t * w) + 3 * underflow_error(c_dt)
    return with_output_rounding(ref, e_c, out_dtype)
