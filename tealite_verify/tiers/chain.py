"""Pieces of a bound propagated through a chain of ops (tiers/moe_layer.py, tiers/modules.py):
the rounding of a stored intermediate and a GEMM step (each operand's propagated error
through the other's magnitude, plus the GEMM's own Higham bound and its output rounding).
Magnitudes ``m`` are |exact| + its error bound, so that the own terms bound the error at the
backend's actual (perturbed) inputs.
"""
from __future__ import annotations

import numpy as np

from tealite_verify.tiers.primitives import gamma, underflow_error, unit_roundoff


def rounding(mag, dtype) -> np.ndarray:
    """The error of storing a value of magnitude <= ``mag`` in ``dtype``: half an ulp
    (relative u) plus the dtype's smallest normal (underflow, flush to zero)."""
    return unit_roundoff(dtype) * mag + underflow_error(dtype)


def matmul(e_a, m_a, abs_a, e_b, m_b, k: int, u: float, out_mag, dtype, *,
           extra_rel: float = 0.0, bias_mag=0.0) -> np.ndarray:
    """Bound on |fl(â @ b̂ [+ bias]) - a @ b [- bias]| for |â - a| <= e_a, |b̂ - b| <= e_b:
    propagated e_a @ m_b + |a| @ e_b (m_b = |b| + e_b covers the cross term), own
    (γ_{K+1} + ``extra_rel``) (m_a @ m_b + |bias|) (fp32 accumulation of K products and the
    bias; ``extra_rel`` for scale multiplications), and the output's rounding to ``dtype``."""
    prop = e_a @ m_b + abs_a @ e_b
    own = (gamma(k + 1, u) + extra_rel) * (m_a @ m_b + bias_mag)
    return prop + own + rounding(out_mag + prop + own, dtype)


def row_sum(e_v, m_v, u: float, out_mag, dtype) -> np.ndarray:
    """Bound on a column sum over rows (a bias gradient) in fp32 of a perturbed input."""
    prop = e_v.sum(axis=0)
    own = gamma(e_v.shape[0], u) * m_v.sum(axis=0)
    return prop + own + rounding(out_mag + prop + own, dtype)
