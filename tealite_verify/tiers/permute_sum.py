"""The bounds of MoE unpermute's merging sum and of its backward (judged as the ``ulp`` tier:
bounded comparison, ``ulp-pair`` rule).  Everything else permutation does is data movement,
judged by the ``exact`` tier.

Derivation (Higham, ch. 3; u the declared compute dtype's unit roundoff, fp32 by default).

Unpermute, ``y[t] = sum_{s kept} p_s x_s`` over k = the token's kept slots (p_s = 1 without
merging probs).  The inputs (bf16 / fp16 / fp32 values, fp32 or lower probs) are exact in the
compute dtype.  Each product is rounded once (``|fl(p x) - p x| <= u |p x|``; exact when p = 1)
and the k terms are summed in some order: a k-term dot product, so for *any* summation order
(sequential in slot order, a tree, an FMA chain)

    |y~ - y| <= gamma_k  sum_s |p_s| |x_s| = gamma_k m,

m being the reference's magnitude (the same sum on absolute values: cancellation between
experts is accounted for, so a tiny merged value of large terms is not judged by its own
ulp).  Near zero a product or partial sum may flush to zero: k absolute underflow terms of
the compute dtype (``primitives.underflow_error``), each times max(1, |p|).  The result is
rounded once into the output dtype (tiers/ulp.py's ``with_output_rounding``).  A token with
no kept slot has k = 0: bound 0, the output must be exactly 0.

Backward, ``grad_permuted[r] = p dy[t]``: one product (k = 1: ``u |p dy|``) and the output
rounding; without probs it is a copy (exact tier).  ``grad_probs[t, s] = sum_h dy[t, h]
x[r, h]``: an H-term dot product (H = hidden), ``gamma_H sum_h |dy| |x|`` plus H underflow
terms, rounded into the probs' dtype; 0 exactly for a slot with no row.

The float64 reference's own error (products of two <= 24-bit significands are exact in
float64; the sums carry gamma_k of 2^-53) is below 2^-28 of these bounds and not added.

What the bound catches: a wrong row (another token's or another expert's values: an error of
the size of m), probs of the wrong slot, a dropped slot summed anyway, a bf16 / fp16 product or
accumulator (u of 2^-8 / 2^-11 against the declared 2^-24, once the output rounding no longer
hides it: in fp32 outputs, and in grad_probs).
"""
from __future__ import annotations

import numpy as np

from tealite.numerics import Numerics

from tealite_verify.tiers.primitives import (compute_dtype, gamma, underflow_error,
                                             unit_roundoff)
from tealite_verify.tiers.ulp import with_output_rounding


def dot_tolerance(ref, magnitude, terms, out_dtype, numerics: Numerics, *,
                  prob_scale=1.0) -> np.ndarray:
    """Per-element bound of a ``terms``-term dot product (``terms`` broadcasts against ref)
    rounded once into ``out_dtype``; ``prob_scale``: max(1, |p|) for the underflow terms."""
    c_dt = compute_dtype(numerics)
    terms = np.asarray(terms, dtype=np.float64)
    e_c = gamma(terms, unit_roundoff(c_dt)) * np.asarray(magnitude) \
        + terms * underflow_error(c_dt) * np.asarray(prob_scale)
    return with_output_rounding(ref, e_c, out_dtype)


def product_tolerance(ref, out_dtype, numerics: Numerics) -> np.ndarray:
    """One product rounded in the compute dtype, then into ``out_dtype``."""
    c_dt = compute_dtype(numerics)
    e_c = unit_roundoff(c_dt) * np.abs(np.asarray(ref)) + underflow_error(c_dt)
    return with_output_rounding(ref, e_c, out_dtype)
