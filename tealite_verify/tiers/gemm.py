"""The ``gemm`` tier (K-aware, Higham).

``|fl(A.B) - A.B| <= gamma_K(u_acc) |A||B|`` (tensor cores: exact products and fp32
accumulation, so u_acc = 2^-24), plus the backend's declared extra roundings (inputs rounded to
TF32, split-K partial sums in the input dtype, the accumulator rounded to the input dtype
before an unfused epilogue), the fp32 epilogue, GELU's Lipschitz constant (max |gelu'| =
1.1289) and the final rounding to the output dtype.  It is the deterministic bound, never
exceeded by a correct kernel whatever its summation order.

Declared numerics read (the fields of :class:`tealite.numerics.Numerics`, documented there):
``compute_dtype``, ``accumulator_unit_roundoff``, ``accumulator_rounded_to``,
``matmul_input_rounding``, ``partial_sums_rounded_to``, ``operands_dequantized_to``,
``alignment_floor`` (``tealite.numerics.FP8_CODE_ALIGNMENT`` for Hopper's FP8 tensor cores:
the accumulation error then scales with :func:`aligned_magnitude` of the codes),
``epilogue_in_accumulator`` and ``subnormal_inputs``.  The comparison is tiers/bounded.py's, and
so is the pair rule (the sum of the two backends' bounds).  tiers/probabilistic.py swaps the
accumulation term for an opt-in probabilistic one.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tealite.numerics import Numerics

from tealite_verify.references._device import namespace
from tealite_verify.tiers.primitives import (accumulator_u, compute_dtype, gamma, ulp,
                                             underflow_error, unit_roundoff)

GELU_LIPSCHITZ = 1.1289  # max over x of |d/dx x*Phi(x)|, at x ~ 1.41 (rounded up)


def aligned_magnitude(x, dtype) -> np.ndarray:
    """|x| with nonzero subnormals of ``dtype`` raised to twice its smallest normal.

    Measured on an H100 (triton 3.6 fp16 ``tl.dot``): an fp16 subnormal operand's product is
    aligned as if the operand had the smallest normal exponent, so the truncated low bits of a
    sum are relative to 2^emin, not to the product's true size (exact 2.2357557e-07 came out
    2.2357472e-07, 30 fp32 ulps).  Twice the smallest normal bounds 2^emin times any
    significand below 2."""
    xp = namespace(x)
    ax = xp.abs(xp.asarray(x))
    floor = 2.0 * float(torch.finfo(dtype).tiny)
    return xp.where(ax != 0, xp.maximum(ax, floor), ax)


def normal_magnitude(x, dtype) -> np.ndarray:
    """|x| with the subnormals of ``dtype`` set to zero: what a kernel that treats subnormal
    inputs as zero (declared ``subnormal_inputs: "may_flush"``) multiplies."""
    xp = namespace(x)
    ax = xp.abs(xp.asarray(x))
    return xp.where(ax < float(torch.finfo(dtype).tiny), 0.0 * ax, ax)


def gemm_error(p_abs, p, k: int, numerics: Numerics, *,
               accumulation_gamma=gamma, flushed_abs=None) -> np.ndarray:
    """Bound on |computed P - P| for P = op(B) @ op(A) before the epilogue.

    ``p_abs`` = |op(B)| @ |op(A)| and ``p`` = the exact product, both float64.
    ``accumulation_gamma(k, u_acc)``: the K-term accumulation's relative bound (Higham's
    gamma_K; tiers/probabilistic.py passes the probabilistic one).  ``flushed_abs``: products a
    ``subnormal_inputs: "may_flush"`` kernel may drop whole (see gemm_tolerances).
    """
    u_acc = accumulator_u(numerics)
    coef = accumulation_gamma(k, u_acc) if k > 0 else 0.0
    if numerics.operands_dequantized_to is not None:
        # Each operand was rounded once (code x scale) before an exact product.
        coef = coef + 2 * unit_roundoff(numerics.operands_dequantized_to)
    # Products that underflow (or are flushed) lose up to the smallest normal each.
    eta = k * underflow_error(torch.float32)
    if numerics.matmul_input_rounding == "tf32":
        coef = coef + 2 * unit_roundoff("tf32")
    partial = numerics.partial_sums_rounded_to
    if partial is not None and k > 1:
        # Split-K in cuBLAS (an assumption, not documented by NVIDIA): at most ~log2(K)
        # levels of partial sums kept in `partial`, and at most ceil(K/64) partial sums, each
        # of which may lose half a subnormal step of `partial` near zero (measured on an H100:
        # fp16 sums of subnormal products were off by 5 fp16 subnormal steps at K=1481).
        coef = coef + gamma(math.ceil(math.log2(k)) + 1, unit_roundoff(partial))
        eta = eta + math.ceil(k / 64) * 0.5 * float(ulp(partial, 0.0))
    err = coef * p_abs + eta
    if flushed_abs is not None and numerics.subnormal_inputs == "may_flush":
        # Before the accumulator's rounding: the flushed sum may sit in a higher binade than
        # the exact one, with a coarser ulp (a local-size fuzz false alarm on this CPU: bf16
        # 4.807e-35 exact, 4.834e-35 flushed, rounded to the bf16 4.852e-35).
        err = err + flushed_abs
    rounded_to = numerics.accumulator_rounded_to
    if rounded_to is not None:
        err = err + 0.5 * ulp(rounded_to, namespace(p).abs(p) + err)
    return err


def gemm_tolerances(p_abs, p, pre, k: int, out_dtype, numerics, *, alpha: float,
                    epilogue_abs, gelu_out=None, flushed_abs=None,
                    accumulation_gamma=gamma) -> dict[str, np.ndarray]:
    """Bounds for the ``gemm`` tier: {"pre": ..., "out": ...}.

    ``epilogue_abs`` = |beta C| + |bias| (broadcast), ``pre`` the exact pre-activation and
    ``gelu_out`` the exact GELU output (None without GELU).  ``flushed_abs``: the part of
    ``p_abs`` made of products with a subnormal operand, for a backend that declares
    ``subnormal_inputs: "may_flush"``: it may drop each of them whole (the computed product
    is then the rounding of the product of the normal operands, within e_p of it).
    """
    xp = namespace(p_abs, p, pre)  # numpy, or torch on the reference device
    u_c = unit_roundoff(compute_dtype(numerics))
    e_p = gemm_error(p_abs, p, k, numerics, accumulation_gamma=accumulation_gamma,
                     flushed_abs=flushed_abs)
    if numerics.epilogue_in_accumulator and k > 0:
        # The epilogue term rides through all K accumulations (Higham: gamma_K of it).
        u_acc = accumulator_u(numerics)
        e_p = e_p + accumulation_gamma(k, u_acc) * epilogue_abs
    e_pre = abs(alpha) * e_p + 3 * u_c * (abs(alpha) * (xp.abs(p) + e_p) + epilogue_abs)
    tol = {"pre": e_pre + 0.5 * ulp(out_dtype, xp.abs(pre) + e_pre)}
    if gelu_out is None:
        tol["out"] = tol["pre"]
    else:
        e_y = GELU_LIPSCHITZ * e_pre + 8 * u_c * (xp.abs(pre) + e_pre)
        tol["out"] = e_y + 0.5 * ulp(out_dtype, xp.abs(gelu_out) + e_y)
    return tol
