"""Shared in-kernel codecs: FP8 encoding from fp32 bits, TE's scale rule, format constants.

FP8 codes are built from fp32 arithmetic and integer bit operations, not with ``.to(fp8)``:
the same source then gives the same bits on NVIDIA, on gfx942 (FNUZ, where OCP casts do not
exist), on gfx950, and in the interpreter (whose fp32 -> fp8 cast rounds ties away and
collapses part of the top binade).  Rounding to the format's grid uses the fp32 "magic
number" trick: for |v| with unbiased exponent e and target spacing 2^s
(s = max(e, emin) - mbits), (|v| + 2^(s+23)) - 2^(s+23) is |v| rounded to nearest-even on
that grid, because the sum's fp32 ulp is exactly 2^s.

Kernels in this package import from here; new shared encoders (E8M0 scales, E2M1) belong here.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _encode_fp8(v, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr):
    """uint8 FP8 codes of fp32 values ``v`` (RNE, saturating to +-fmax)."""
    bits = v.to(tl.int32, bitcast=True)
    neg = bits < 0
    is_nan = v != v
    a = tl.minimum(tl.abs(v), fmax)
    a = tl.where(is_nan, 0.0, a)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.maximum(e, EMIN) - MBITS
    magic = ((s + 23 + 127) << 23).to(tl.float32, bitcast=True)
    r = (a + magic) - magic
    r = tl.minimum(r, fmax)
    rb = r.to(tl.int32, bitcast=True)
    re = ((rb >> 23) & 0xFF) - 127
    normal = re >= EMIN
    mant_n = (rb >> (23 - MBITS)) & ((1 << MBITS) - 1)
    code_n = ((re + BIAS) << MBITS) | mant_n
    # Subnormal codes: r / 2^(EMIN - MBITS) is a small exact integer.
    code_s = (r * SUB_SCALE).to(tl.int32)  # SUB_SCALE = 2^(MBITS - EMIN), exact
    code = tl.where(normal, code_n, code_s)
    if FNUZ:
        sign = tl.where(neg & (code != 0), 0x80, 0)  # FNUZ has no -0
    else:
        sign = tl.where(neg, 0x80, 0)
    code = code | sign
    if FNUZ:
        code = tl.where(is_nan, NAN_CODE, code)
    else:
        code = tl.where(is_nan, NAN_CODE | tl.where(neg, 0x80, 0), code)
    return code.to(tl.uint8)


@triton.jit
def _te_scale(amax, fmax, eps, POW2: tl.constexpr):
    """TE's compute_scale_from_amax in fp32 (see tealite.recipes)."""
    a = tl.maximum(amax, eps)
    a = tl.where(amax != amax, amax, a)
    # IEEE division (TE uses __fdiv_rn): Triton's "/" is an approximate divide on CUDA, which
    # was measured on an H100 to put scale_inv one ulp off.
    scale = tl.math.div_rn(fmax, a)
    scale = tl.where(scale == float("inf"), 3.4028234663852886e38, scale)
    bad = (a == 0.0) | (a != a) | (a == float("inf"))
    scale = tl.where(bad, 1.0, scale)
    if POW2:
        scale = (scale.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return scale


def _fmt_constants(fmt) -> dict:
    bias = 8 if fmt.name == "e4m3fnuz" else 16 if fmt.name == "e5m2fnuz" else \
        (1 << (fmt.bits - 1 - fmt.mbits - 1)) - 1
    emin = 1 - bias
    nan_code = 0x80 if fmt.fnuz else (0x7F if fmt.name == "e4m3" else 0x7E)
    return dict(MBITS=fmt.mbits, EMIN=emin, BIAS=bias, FNUZ=fmt.fnuz, NAN_CODE=nan_code,
                SUB_SCALE=float(2.0 ** (fmt.mbits - emin)))
