"""Bit-exact reference quantizers: numpy, with ml_dtypes as the oracle for every cast.

Every rounding decision is explicit in a name or argument.  Arithmetic that the recipe defines
in fp32 (TE's ``fp8_max / amax``, ``x * scale``, RCEIL's ``amax * (1/max)``) is done in numpy
float32, which is IEEE round-to-nearest-even, so the result is the bit pattern a correct kernel
must produce.  ml_dtypes casts are fed float32 only: its float64 casts round twice (through
float32), which would be wrong for values not representable in float32.

Formats are looked up in ml_dtypes by name; format facts (max, emax, mantissa width) come from
``ml_dtypes.finfo``, not from tealite's own table.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

ML_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
F32 = np.float32
E8M0_NAN = 0xFF


def fmt_max(fmt: str) -> float:
    return float(ml_dtypes.finfo(ML_DTYPES[fmt]).max)


def fmt_emax(fmt: str) -> int:
    """Exponent of the largest power of two <= max (the MX spec's emax_elem)."""
    return int(np.frexp(fmt_max(fmt))[1]) - 1


def fmt_mbits(fmt: str) -> int:
    return int(ml_dtypes.finfo(ML_DTYPES[fmt]).nmant)


# ---- element rounding --------------------------------------------------------------------

def round_elements(v, fmt: str, *, rounding: str = "rne", saturate: bool = True) -> np.ndarray:
    """Round float32 values to ``fmt`` codes (an ml_dtypes array).

    ``rounding``: "rne" or "ties_away".  ``saturate``: clamp finite values beyond max to
    +-max first (NaN stays NaN); otherwise ml_dtypes' overflow behaviour (NaN, or inf for
    e5m2) applies.
    """
    v = np.asarray(v, dtype=F32)
    ml = ML_DTYPES[fmt]
    if saturate:
        m = F32(fmt_max(fmt))
        v = np.where(np.isnan(v), v, np.clip(v, -m, m)).astype(F32)
    q = v.astype(ml)
    if rounding == "ties_away":
        q64, v64 = q.astype(np.float64), v.astype(np.float64)
        finite = np.sort(np.unique(np.abs(codes_table(fmt))))
        past_max = 2 * finite[-1] - finite[-2]  # the first step beyond max (480 for e4m3)
        with np.errstate(invalid="ignore", over="ignore"):
            other = 2.0 * v64 - q64  # the other candidate if v is a midpoint (exact)
            other_q = other.astype(F32).astype(ml)
            representable = other_q.astype(np.float64) == other
            # A tie between max and the step past it rounds away into overflow, which is
            # whatever the format does beyond its range (NaN, or inf for e5m2; e2m1 has
            # neither and saturates).
            overflow_tie = (np.abs(other) == past_max) & (fmt != "e2m1")
            overflowed = (np.sign(v64) * 2 * past_max).astype(F32).astype(ml)
            tie = (np.isfinite(v64) & (v64 != q64) & (representable | overflow_tie)
                   & (np.abs(other) > np.abs(q64)))
        q = np.where(tie, np.where(overflow_tie, overflowed, other_q), q)
    elif rounding != "rne":
        raise ValueError(f"unknown element rounding {rounding!r}")
    return q


def codes_table(fmt: str) -> np.ndarray:
    """float64 values of every finite code of ``fmt``."""
    n = 16 if fmt == "e2m1" else 256
    vals = np.arange(n, dtype=np.uint8).view(ML_DTYPES[fmt]).astype(np.float64)
    return vals[np.isfinite(vals)]


def codes_to_bits(q: np.ndarray) -> np.ndarray:
    """Bit patterns (uint8) of an ml_dtypes FP8/FP4 array."""
    bits = np.ascontiguousarray(q).view(np.uint8)
    return bits & 0x0F if q.dtype == ML_DTYPES["e2m1"] else bits


def pack_e2m1(bits: np.ndarray) -> np.ndarray:
    """Pack 4-bit codes along the last dim, two per byte, low nibble = even element.
    An odd last dim is padded with a zero nibble."""
    bits = np.asarray(bits, dtype=np.uint8)
    if bits.shape[-1] % 2:
        bits = np.concatenate([bits, np.zeros(bits.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (bits[..., 0::2] | (bits[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray, n: int) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(
        packed.shape[:-1] + (2 * packed.shape[-1],))
    return out[..., :n]


def decode(bits: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values of code bit patterns."""
    return np.asarray(bits, np.uint8).view(ML_DTYPES[fmt]).astype(np.float64) \
        if fmt != "e2m1" else (np.asarray(bits, np.uint8) & 0x0F).view(
            ML_DTYPES["e2m1"]).astype(np.float64)


# ---- E8M0 scales (MX) ----------------------------------------------------------------------

def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for positive finite float32 values, exact (subnormals included)."""
    return (np.frexp(a.astype(np.float64))[1] - 1).astype(np.int64)


def _is_pow2(a: np.ndarray) -> np.ndarray:
    return np.frexp(a.astype(np.float64))[0] == 0.5


def e8m0_scale(amax, fmt: str, mode: str) -> np.ndarray:
    """Biased E8M0 scale bytes for block amaxes (float32), per ScaleRounding ``mode``.

    amax == 0 gives byte 0 (2^-127, the clamp floor); NaN or Inf amax gives 0xFF (NaN).
    Exponents are clamped to [-127, 127].
    """
    a = np.asarray(amax, dtype=F32)
    finite_pos = np.isfinite(a) & (a > 0)
    safe = np.where(finite_pos, a, F32(1.0)).astype(F32)
    emax = fmt_emax(fmt)
    if mode == "floor":
        e = _floor_log2(safe) - emax
    elif mode == "ceil":
        e = _floor_log2(safe) + (~_is_pow2(safe)) - emax
    elif mode == "even":
        # Round amax half-up at the element's mantissa width, clear the mantissa, then FLOOR.
        mbits = fmt_mbits(fmt)
        bits = safe.view(np.uint32).astype(np.uint64)
        bits = bits + (1 << (23 - mbits - 1))
        e = ((bits >> 23) & 0xFF).astype(np.int64) - 127 - emax  # subnormal: field 0
    elif mode == "rceil":
        ratio = (safe * (F32(1.0) / F32(fmt_max(fmt)))).astype(F32)  # both steps in fp32
        nonzero = ratio > 0
        safe_ratio = np.where(nonzero, ratio, F32(1.0))
        # A ratio that underflows to 0 has ceil(log2 0) = -inf: the clamp floor.
        e = np.where(nonzero, _floor_log2(safe_ratio) + (~_is_pow2(safe_ratio)), -127)
    else:
        raise ValueError(f"unknown scale rounding {mode!r}")
    biased = np.clip(e, -127, 127) + 127
    biased = np.where(a == 0, 0, biased)
    biased = np.where(np.isnan(a) | np.isinf(a), E8M0_NAN, biased)
    return biased.astype(np.uint8)


def e8m0_value(biased: np.ndarray) -> np.ndarray:
    b = np.asarray(biased, dtype=np.int64)
    return np.where(b == E8M0_NAN, np.nan, np.ldexp(1.0, b - 127))


def _blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    m, k = x.shape
    nb = -(-k // block)
    padded = np.zeros((m, nb * block), dtype=x.dtype)
    padded[:, :k] = x
    return padded.reshape(m, nb, block), nb


def mx_quantize(x, fmt: str, scale_mode: str, element_rounding: str, block: int = 32):
    """Rowwise MX quantization of a 2-D float32 array.

    Returns (code bits uint8 (M, K) -- unpacked for e2m1 --, scale bytes uint8 (M, ceil(K/32))).
    A partial last block takes its amax over its real elements.  Codes in a block whose scale
    is NaN are unspecified (set to 0 here) and are not compared by the harness.
    """
    x = np.asarray(x, dtype=F32)
    m, k = x.shape
    blocks, nb = _blocks(x, block)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(blocks), axis=-1) if k else np.zeros((m, 0), F32)
    scales = e8m0_scale(amax, fmt, scale_mode)
    return mx_codes_with_scales(x, scales, fmt, element_rounding, block), scales


def mx_scales_nan_ignoring(x, fmt: str, scale_mode: str, block: int = 32):
    """E8M0 scale bytes under AITER Triton's handling of non-finite inputs (its MXFP4 kernels;
    the OCP / TE rule of :func:`mx_quantize` gives 0xFF instead): NaN elements are left out
    of the block amax (``tl.max`` is a maxnum reduction); an Inf amax takes the largest
    exponent (the clamp at 127: byte 0xFE).  Returns (bytes (M, nb), mask of blocks holding
    nothing but NaN, whose byte is undefined: AITER rounds the NaN amax's bit pattern, so the
    byte depends on the NaN payload the target produces)."""
    x = np.asarray(x, dtype=F32)
    m, k = x.shape
    blocks, nb = _blocks(x, block)
    a = np.abs(blocks)
    nan = np.isnan(a)
    real = np.arange(nb * block).reshape(nb, block) < k  # padding is not part of a block
    amax = np.where(nan, F32(0), a).max(axis=-1) if k else np.zeros((m, 0), F32)
    all_nan = (nan | ~real).all(axis=-1) if k else np.zeros((m, 0), bool)
    inf = np.isinf(amax)
    scales = e8m0_scale(np.where(inf, F32(1), amax).astype(F32), fmt, scale_mode)
    scales = np.where(inf, E8M0_NAN - 1, scales).astype(np.uint8)
    return scales, all_nan


def mx_scaled_values(x, scales, block: int = 32) -> np.ndarray:
    """x / 2^e per block in float64 (exact), shape (M, K); NaN where the scale is NaN."""
    x = np.asarray(x, dtype=F32)
    m, k = x.shape
    blocks, nb = _blocks(x, block)
    scaled = blocks.astype(np.float64) / e8m0_value(scales)[..., None]
    return scaled.reshape(m, nb * block)[:, :k]


def mx_codes_with_scales(x, scales, fmt: str, element_rounding: str, block: int = 32):
    """Code bits (M, K) of x quantized with the given E8M0 scales (the re-quantization the
    E8M0-adjusted tolerance tier uses).  Codes under a NaN scale are 0 (unspecified)."""
    scaled = mx_scaled_values(x, scales, block)
    # Exact in float64; values below float32's range round to 0 in every element format.
    with np.errstate(invalid="ignore", over="ignore"):
        codes = round_elements(scaled.astype(F32), fmt, rounding=element_rounding, saturate=True)
    bits = codes_to_bits(codes)
    nan_scale = np.repeat(np.asarray(scales) == E8M0_NAN, block, axis=-1)[:, : bits.shape[1]]
    return np.where(nan_scale, 0, bits).astype(np.uint8)


def mx_dequantize(bits, scales, fmt: str, block: int = 32) -> np.ndarray:
    """float64 values of MX codes (unpacked bits (M, K)) and E8M0 scales (M, nb)."""
    vals = decode(bits, fmt)
    scale = np.repeat(e8m0_value(scales), block, axis=-1)[:, : vals.shape[-1]]
    return vals * scale


# ---- FP8 with fp32 scales (current / per-row / block / delayed) ------------------------------

def te_scale_from_amax(amax, fmt: str, *, force_pow2: bool = False,
                       amax_epsilon: float = 0.0) -> np.ndarray:
    """TE's compute_scale_from_amax, in float32 (see tealite.recipes)."""
    a = np.maximum(np.asarray(amax, dtype=F32), F32(amax_epsilon))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = (F32(fmt_max(fmt)) / a).astype(F32)
    s = np.where(np.isinf(s), np.finfo(F32).max, s)
    s = np.where((a == 0) | np.isnan(a) | np.isinf(a), F32(1.0), s).astype(F32)
    if force_pow2:
        s = np.ldexp(F32(1.0), _floor_log2(s)).astype(F32)
    return s


def scaled_cast(x, scale, fmt: str, *, saturate: bool = True) -> np.ndarray:
    """Code bits of round_rne(x * scale) with the product rounded in float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = (np.asarray(x, dtype=F32) * np.asarray(scale, dtype=F32)).astype(F32)
    return codes_to_bits(round_elements(v, fmt, rounding="rne", saturate=saturate))


def reciprocal(scale) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return (F32(1.0) / np.asarray(scale, dtype=F32)).astype(F32)


def amax(x, axis=None) -> np.ndarray:
    """max |x| in float32 (exact), NaN-propagating; 0 for an empty reduction."""
    x = np.abs(np.asarray(x, dtype=F32))
    if x.size == 0:
        shape = () if axis is None else tuple(s for i, s in enumerate(x.shape)
                                              if i != axis % x.ndim)
        return np.zeros(shape, F32)
    return np.max(x, axis=axis).astype(F32)


def block_amax(x, block: tuple[int, int]) -> np.ndarray:
    """amax per (bm, bn) block of a 2-D float32 array; partial edge blocks use real elements."""
    x = np.abs(np.asarray(x, dtype=F32))
    m, k = x.shape
    bm, bn = block
    mb, nb = -(-m // bm), -(-k // bn)
    padded = np.zeros((mb * bm, nb * bn), F32)
    padded[:m, :k] = x
    return padded.reshape(mb, bm, nb, bn).max(axis=(1, 3)) if padded.size else \
        np.zeros((mb, nb), F32)


# ---- AITER's rule (FP8ScaleRule.AMAX_OVER_FMAX): scale_inv = amax / max, x * (1 / scale_inv)

def aiter_amax(x, *, per_row: bool) -> np.ndarray:
    """AITER's amax of a 2-D float32 array, as its Triton quant kernels reduce it.

    Per row: max |x| ignoring NaN (``tl.max`` is a maxnum reduction), NaN only for a row of
    nothing but NaN; an empty row gives 0.  Per tensor (shape (1,)): the max of the row
    amaxes with NaN winning (AITER's ``tl.atomic_max`` of positive fp32 compares the bit
    patterns as integers, and a positive NaN's are above Inf's); no rows give 0.
    """
    a = np.abs(np.asarray(x, dtype=F32))
    m, k = a.shape
    if k == 0:
        rows = np.zeros(m, F32)
    else:
        nan = np.isnan(a)
        rows = np.where(nan, F32(0), a).max(axis=1)  # 0 is neutral: |x| >= 0
        rows = np.where(nan.all(axis=1), F32(np.nan), rows).astype(F32)
    if per_row:
        return rows
    if m == 0:
        return np.zeros(1, F32)
    return np.array([np.nan if np.isnan(rows).any() else rows.max()], F32)


def aiter_scale_inv(amax, fmt: str) -> np.ndarray:
    """scale_inv = fl32(amax / max): 0 for amax 0, Inf for Inf, NaN for NaN (no special cases)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (np.asarray(amax, dtype=F32) / F32(fmt_max(fmt))).astype(F32)


def aiter_scaled(x, scale_inv, *, recip=None) -> np.ndarray:
    """The fp32 values AITER's kernels cast: fl32(x * fl32(1 / scale_inv)), or with a given
    fp32 ``recip`` instead of the correctly rounded reciprocal.  1/0 = Inf, so zeros give
    NaN (0 * Inf); 1/Inf = 0, so +-Inf elements give NaN and finite ones +-0."""
    r = reciprocal(scale_inv) if recip is None else np.asarray(recip, dtype=F32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (np.asarray(x, dtype=F32) * r).astype(F32)


def recip_ulp_bounds(scale_inv, ulps: int) -> tuple[np.ndarray, np.ndarray]:
    """The smallest and largest fp32 within ``ulps`` units in the last place (of the exact
    value's binade) of 1 / scale_inv, and never excluding the correctly rounded one: what an
    approximate fp32 reciprocal with that error bound (e.g. CUDA's div.full.f32, 2 ulp) may
    return (``ulps`` = 0: the correctly rounded value).  Special values (0, Inf, NaN) are
    exact."""
    s = np.asarray(scale_inv, dtype=F32).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = 1.0 / s
    finite = np.isfinite(exact) & (exact != 0)
    safe = np.where(finite, np.abs(exact), 1.0)
    ulp = np.ldexp(1.0, np.maximum(np.frexp(safe)[1] - 1, -126) - 23)
    lo = np.where(finite, exact - ulps * ulp, exact)
    hi = np.where(finite, exact + ulps * ulp, exact)
    # Round inward to fp32 (lo up, hi down): the fp32 values inside [lo, hi].
    lo32, hi32 = lo.astype(F32), hi.astype(F32)
    lo32 = np.where(lo32.astype(np.float64) < lo, np.nextafter(lo32, F32(np.inf)), lo32)
    hi32 = np.where(hi32.astype(np.float64) > hi, np.nextafter(hi32, F32(-np.inf)), hi32)
    rn = reciprocal(scale_inv)
    with np.errstate(invalid="ignore"):
        return np.fmin(lo32, rn).astype(F32), np.fmax(hi32, rn).astype(F32)


def fp8_quantize(x, fmt: str, granularity: str, *, scale=None, force_pow2: bool = False,
                 amax_epsilon: float = 0.0, saturate: bool = True, block=None,
                 scale_rule: str = "fmax/amax"):
    """Rowwise FP8 quantization with fp32 scales.

    granularity: "tensor" (scale (1,)), "row" (scale (M,)), "block" (scale per ``block``),
    "given" (per-tensor with the given ``scale``, i.e. DelayedScaling).
    scale_rule (current scaling, "tensor" / "row"): "fmax/amax" (TE's, the default) or
    "amax/fmax" (AITER's: see :func:`aiter_amax`, :func:`aiter_scale_inv`, :func:`aiter_scaled`;
    no epsilon, no power-of-two rounding).
    Returns (code bits (M, K), scale_inv float32, amax float32).
    """
    x = np.asarray(x, dtype=F32)
    if scale_rule == "amax/fmax":
        if granularity not in ("tensor", "row") or force_pow2 or amax_epsilon:
            raise ValueError("scale_rule 'amax/fmax' is per-tensor or per-row current scaling "
                             "without force_pow2 or amax_epsilon")
        a = aiter_amax(x, per_row=granularity == "row")
        s_inv = aiter_scale_inv(a, fmt)
        v = aiter_scaled(x, s_inv[:, None] if granularity == "row" else s_inv[0])
        return codes_to_bits(round_elements(v, fmt, rounding="rne", saturate=saturate)), s_inv, a
    if scale_rule != "fmax/amax":
        raise ValueError(f"unknown scale rule {scale_rule!r}")
    if granularity == "tensor":
        a = amax(x).reshape(1)
        s = te_scale_from_amax(a, fmt, force_pow2=force_pow2, amax_epsilon=amax_epsilon)
        expand = s[0]
    elif granularity == "given":
        a = amax(x).reshape(1)
        s = np.asarray(scale, dtype=F32).reshape(1)
        expand = s[0]
    elif granularity == "row":
        a = amax(x, axis=1)
        s = te_scale_from_amax(a, fmt, force_pow2=force_pow2, amax_epsilon=amax_epsilon)
        expand = s[:, None]
    elif granularity == "block":
        a = block_amax(x, block)
        s = te_scale_from_amax(a, fmt, force_pow2=force_pow2, amax_epsilon=amax_epsilon)
        expand = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)[: x.shape[0],
                                                                              : x.shape[1]]
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    return scaled_cast(x, expand, fmt, saturate=saturate), reciprocal(s), a


def delayed_scaling_update(history, scale, fmt: str, margin: int, algo: str):
    """TE's amax_and_scale_update in float32 (see tealite.ops.quantize)."""
    h = np.asarray(history, dtype=F32)
    amax = h[0] if algo == "most_recent" else (np.nan if np.isnan(h).any() else h.max())
    amax = F32(amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        new = F32(F32(fmt_max(fmt)) / amax) / F32(2.0 ** margin)
    keep = not (amax > 0) or not np.isfinite(amax)
    new_scale = np.asarray(scale, dtype=F32).reshape(1) if keep else np.array([new], F32)
    new_history = np.concatenate([[F32(0)], h[2:], h[:1]]) if h.size > 1 else np.zeros(1, F32)
    return new_history.astype(F32), new_scale.astype(F32)
