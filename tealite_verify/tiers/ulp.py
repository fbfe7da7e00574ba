"""The ``ulp`` tier (elementwise ops, norms, dequantize): output rounding plus a compute error.

``tol = roundings * 0.5 * ulp_out(|ref| + e_c) + e_c`` with the compute error
``e_c = (ops * u_c + gamma_n(u_c)) * magnitude``.  ``ulp_out`` is the spacing of the output
dtype (subnormal spacing below the normal range), ``u_c`` the unit roundoff of the backend's
declared compute dtype, ``gamma_n = n u / (1 - n u)`` Higham's bound for a reduction of length
``n``, and ``magnitude`` the op's condition magnitude: the same formula evaluated on absolute
values (so cancellation is accounted for and tiny outputs of large intermediates are not
judged by their own ulp).  With a low-precision output the output rounding dominates and a
one-ULP error in the result is caught; in fp32 the bound is the compute error.  Every
operation also gets an absolute underflow term (Higham's eta, widened to the smallest normal:
see ``primitives.underflow_error``).

Declared numerics read: ``compute_dtype``.  The comparison is tiers/bounded.py's, and so is the
pair rule (the sum of the two backends' bounds).
"""
from __future__ import annotations

import numpy as np

from tealite.numerics import Numerics

from tealite_verify.references._device import namespace
from tealite_verify.tiers.primitives import (compute_dtype, gamma, ulp, underflow_error,
                                             unit_roundoff)


def with_output_rounding(ref, compute_err, out_dtype, *, roundings: int = 1) -> np.ndarray:
    """Add ``roundings`` round-to-nearest steps into ``out_dtype`` to a compute-error bound."""
    xp = namespace(ref, compute_err)
    e = xp.asarray(compute_err)
    return roundings * 0.5 * ulp(out_dtype, xp.abs(xp.asarray(ref)) + e) + e


def elementwise_tolerance(ref, magnitude, out_dtype, numerics: Numerics, *,
                          ops: float = 4.0, reduction: int = 0, roundings: int = 1,
                          underflow_scale=1.0) -> np.ndarray:
    """The ``ulp`` tier's bound (see the module docstring)."""
    c_dt = compute_dtype(numerics)
    u_c = unit_roundoff(c_dt)
    coef = ops * u_c + (gamma(reduction, u_c) if reduction > 0 else 0.0)
    xp = namespace(ref, magnitude, underflow_scale)
    e_c = coef * xp.abs(xp.asarray(magnitude))
    e_c = e_c + (ops + reduction) * underflow_error(c_dt) * xp.asarray(underflow_scale)
    return with_output_rounding(ref, e_c, out_dtype, roundings=roundings)
