"""Tolerance tiers for quantized outputs (codes and scales).

``exact``
    Codes and scales bit-exact (``tolerance.compare_exact``): the default for every recipe.

``e8m0-adjusted`` (MX scales)
    A block's E8M0 scale may differ from the reference by exactly one exponent only where the
    scale rule is RCEIL and amax * (1/max) lies within fp32 rounding (2^-22 relative) of a power
    of two -- the one place where a correct GPU and a correct CPU computation can disagree.
    Every block's codes are then checked against the *re-quantization of the block's original
    values with the backend's own scale* (never by rescaling the reference codes: quantization
    is nonlinear at subnormals and saturation).  Any other scale difference fails.

``fp4-ties`` (codes, for a backend that declares ``fp4_tie_rounding="hardware"``)
    A code may differ by one step from the re-quantization only where the scaled input lies
    exactly on the midpoint between the two codes; such codes are counted in ``excused``.

Only the exponents that ceil(log2(amax/max)) can take under a 2^-22 relative error of the
ratio are excused (``rceil_allowed_bytes``), not any +-1.

Codes under a NaN scale (0xFF) are unspecified by every recipe and are not compared.
Padding nibbles of an odd e2m1 row are not compared either.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from tealite_verify.references import quantize as ref
from tealite_verify.tolerance import Metrics, compare_bounded

RCEIL_AMBIGUITY = 2.0 ** -22


def rceil_ambiguous(block_amax, fmt: str) -> np.ndarray:
    """True where amax/max is within fp32 rounding of a power of two."""
    a = np.asarray(block_amax, dtype=np.float64)
    r = a / ref.fmt_max(fmt)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.exp2(np.round(np.log2(np.where(r > 0, r, 1.0))))
        return np.isfinite(r) & (r > 0) & (np.abs(r / p - 1.0) <= RCEIL_AMBIGUITY)


def rceil_allowed_bytes(block_amax, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] biased bytes that ceil(log2(amax/max)) can take when the ratio carries an
    fp32 rounding error of up to 2^-22 relative (lo == hi outside the ambiguity zone)."""
    a = np.asarray(block_amax, dtype=np.float64)
    r = np.where(np.isfinite(a) & (a > 0), a / ref.fmt_max(fmt), 1.0)
    with np.errstate(divide="ignore"):
        lo = np.ceil(np.log2(r * (1 - RCEIL_AMBIGUITY)))
        hi = np.ceil(np.log2(r * (1 + RCEIL_AMBIGUITY)))
    clamp = lambda e: (np.clip(e, -127, 127) + 127).astype(np.int64)  # noqa: E731
    return clamp(lo), clamp(hi)


def _metrics(tier, ok, actual, expected, excused=0, numel=None) -> Metrics:
    ok = np.asarray(ok, bool)
    numel = int(ok.size) if numel is None else numel
    bad = ~ok
    if not bad.any():
        return Metrics(tier, numel, 0, 0.0, 0.0, excused=excused)
    flat = int(np.argmax(bad))
    idx = tuple(int(i) for i in np.unravel_index(flat, ok.shape))
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    return Metrics(tier, numel, int(bad.sum()), float(diff[bad].max()), math.inf,
                   worst_index=idx, worst_actual=float(actual[idx]),
                   worst_expected=float(expected[idx]), worst_tol=0.0, excused=excused)


def block_amax(x, block: int = 32) -> np.ndarray:
    x = np.abs(np.asarray(x, dtype=np.float32))
    m, k = x.shape
    nb = -(-k // block)
    padded = np.zeros((m, nb * block), np.float32)
    padded[:, :k] = x
    with np.errstate(invalid="ignore"):
        return padded.reshape(m, nb, block).max(axis=-1) if k else np.zeros((m, 0), np.float32)


def check_mx_scales(actual, expected, x, fmt: str, scale_mode: str) -> Metrics:
    """The e8m0-adjusted tier on scale bytes (M, nb)."""
    a = np.asarray(actual, np.uint8)
    e = np.asarray(expected, np.uint8)
    if a.shape != e.shape:
        return Metrics("e8m0-adjusted", 0, 0, math.inf, math.inf,
                       shape_error=f"scale shape {a.shape} != expected {e.shape}")
    d = a.astype(np.int64) - e.astype(np.int64)
    adjustable = (np.abs(d) == 1) & (e != ref.E8M0_NAN) & (a != ref.E8M0_NAN)
    if scale_mode == "rceil":
        amax = block_amax(x)
        lo, hi = rceil_allowed_bytes(amax, fmt)
        adjustable &= rceil_ambiguous(amax, fmt) & (a >= lo) & (a <= hi)
    else:
        adjustable &= False
    ok = (d == 0) | adjustable
    return _metrics("e8m0-adjusted", ok, a, e, excused=int(adjustable.sum()))


def check_mx_codes(actual_bits, actual_scales, x, fmt: str, element_rounding: str, *,
                   tie_tolerant: bool = False, block: int = 32) -> Metrics:
    """Codes (M, K unpacked) against the re-quantization of x with the backend's scales."""
    a = np.asarray(actual_bits, np.uint8)
    scales = np.asarray(actual_scales, np.uint8)
    m, k = np.shape(x)
    want_scales = (m, -(-k // block))
    if scales.shape != want_scales:
        return Metrics("e8m0-adjusted", 0, 0, math.inf, math.inf,
                       shape_error=f"scale shape {scales.shape} != expected {want_scales}")
    want = ref.mx_codes_with_scales(x, scales, fmt, element_rounding, block)
    if a.shape != want.shape:
        return Metrics("e8m0-adjusted", 0, 0, math.inf, math.inf,
                       shape_error=f"codes shape {a.shape} != expected {want.shape}")
    live = ~np.repeat(scales == ref.E8M0_NAN, block, axis=-1)[:, : a.shape[1]]
    ok = (a == want) | ~live
    excused = 0
    if tie_tolerant and not ok.all():
        v = ref.mx_scaled_values(x, scales, block)
        va, vw = ref.decode(a, fmt), ref.decode(want, fmt)
        sign_bit = 0x08 if fmt == "e2m1" else 0x80
        with np.errstate(invalid="ignore"):
            # Same sign *bit* (so the ties at +-0.25 next to +-0 count), midpoint exactly.
            tie = ~ok & (v == (va + vw) / 2) & ((a & sign_bit) == (want & sign_bit))
        excused = int(tie.sum())
        ok |= tie
    tier = "fp4-ties" if tie_tolerant else "e8m0-adjusted"
    return _metrics(tier, ok, a, want, excused, numel=int(live.sum()))


def check_mx_codes_pair(bits_x, scales_x, bits_y, scales_y, x, fmt: str, element_rounding: str,
                        *, tie_tolerant: bool = False, block: int = 32) -> Metrics:
    """Backend vs backend: each side's codes must be the re-quantization of x under its own
    scales (so blocks whose scales differ are judged too), and where the scales agree the
    codes must agree (up to declared FP4 ties)."""
    mx = check_mx_codes(bits_x, scales_x, x, fmt, element_rounding, tie_tolerant=tie_tolerant,
                        block=block)
    my = check_mx_codes(bits_y, scales_y, x, fmt, element_rounding, tie_tolerant=tie_tolerant,
                        block=block)
    if mx.shape_error or my.shape_error:
        return mx if mx.shape_error else my
    worse = mx if mx.mismatches >= my.mismatches else my
    return Metrics("e8m0-adjusted-pair", mx.numel, mx.mismatches + my.mismatches,
                   worse.max_abs_err, worse.max_ratio, worse.worst_index, worse.worst_actual,
                   worse.worst_expected, worse.worst_tol, excused=mx.excused + my.excused)


def dequantized_bound(x, scale, fmt: str, *, dequant_dtype_u: float = 2.0 ** -24) -> np.ndarray:
    """Largest legitimate |dequantize(quantize(x)) - x| per element for codes of ``fmt`` with
    per-element dequantization scale ``scale`` (float64 arrays, broadcastable).

    Half a code step at |x|/scale (subnormal step below the normal range), plus what
    saturation clips off beyond max, plus four fp32 roundings relative to |x| (x * scale before
    the cast, scale_inv = 1/scale, code x scale_inv, and the dequantized output).  This is the ``dequantized`` tier: it compares values, not codes, so it can judge
    two recipes (or two backends with different rounding conventions) against each other.
    """
    info = ml_dtypes.finfo(ref.ML_DTYPES[fmt])
    mant, emin = int(info.nmant), int(info.minexp)
    x = np.abs(np.asarray(x, np.float64))
    s = np.asarray(scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = x / s
        _, e = np.frexp(np.where(v > 0, v, 1.0))
        step = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)
        fmax = ref.fmt_max(fmt)
        clipped = np.where(v > fmax, (v - fmax) * s, 0.0)
        return 0.5 * step * s + clipped + 4 * dequant_dtype_u * np.minimum(x, fmax * s)


def check_dequantized(y, x, bound, *, tier: str = "dequantized") -> Metrics:
    """|y - x| <= bound elementwise (NaN matches NaN, Inf matches the same Inf)."""
    return compare_bounded(torch.as_tensor(np.asarray(y, np.float64)), np.asarray(x, np.float64),
                           np.asarray(bound, np.float64), torch.float64, tier=tier)
