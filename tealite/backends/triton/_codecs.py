"""Shared in-kernel codecs: FP8 encoding from fp32 bits, TE's scale rule, format constants.

FP8 codes are built from fp32 arithmetic and integer bit operations, not with ``.to(fp8)``:
the same source then gives the same bits on NVIDIA, on gfx942 (FNUZ, where OCP casts do not
exist), on gfx950, and in the interpreter (whose fp32 -> fp8 cast rounds ties away and
collapses part of the top binade).  Rounding to the format's grid uses the fp32 "magic
number" trick: for |v| with unbiased exponent e and target spacing 2^s
(s = max(e, emin) - mbits), (|v| + 2^(s+23)) - 2^(s+23) is |v| rounded to nearest-even on
that grid, because the sum's fp32 ulp is exactly 2^s.

Kernels in this package import from here.  Stable API (other kernels call these):

* ``_encode_fp8(v, fmax, **_fmt_constants(fmt))`` -> uint8 FP8 codes, RNE, saturating;
  ``_encode_fp8_rounded(..., TIES_AWAY)`` the same with a choice of element rounding.
  Both (and ``_encode_fp8_sat``) take an optional last constexpr ``HW_FP8`` (default False):
  the host passes ``hw_fp8(device)`` to let OCP RNE encodes use the hardware conversion
  (``_encode_fp8_hw``), which gives the same bits (tested exhaustively near every code
  boundary on the GPU) with ~5 instructions per element instead of ~30.
* ``_encode_fp4(v, TIES_AWAY)`` -> int32 E2M1 codes (low 4 bits), saturating;
  ``_encode_fp4_arith(v)`` the same RNE codes by fp32 arithmetic (fewer instructions);
  ``_fp4_arith_magnitude(mag_bits)`` its unsigned part, from magnitude bits.
* ``_into_word(word, codes, j, BITS)`` -> a 32-bit word of codes of the packed cast-transposes.
* ``_tile_ids(pid, tiles_m, tiles_n, GROUP_M)`` -> (pid_m, pid_n) of a tiled 2-D launch,
  row-major (GROUP_M 1) or grouped by GROUP_M tile rows (cast-transpose DRAM locality).
* ``_te_scale(amax, fmax, eps, POW2)`` -> TE's fp32 scale from an amax.
* ``_e8m0_scale(amax, **_mx_scale_constants(fmt_name, mode))`` -> int32 biased E8M0 byte.
* ``_mx_descale(x, byte)`` -> fp32 x / 2^(byte-127) rounded as the reference (0 for NaN scale).
* ``_fp8_overflow(v, code, **_overflow_constants(fmt), FNUZ=...)`` -> the codes of a
  non-saturating cast (Saturation.NONFINITE) from the saturated ones;
  ``_encode_fp8_sat(v, fmax, SATURATE, **_fmt_constants(fmt), **_overflow_constants(fmt))``
  chooses between the two.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from tealite.backends.triton import INTERPRET, PLATFORM
from tealite.formats import get_format


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def hw_fp8(device) -> bool:
    """Whether kernels on ``device`` may build OCP FP8 codes with the hardware conversion.

    Only NVIDIA CUDA sm_89+ compiled (not interpreted): there Triton lowers an fp32 -> fp8e4nv
    / fp8e5 ``.to()`` to ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``, RNE with saturation, the
    integer encoder's rule.  Not the interpreter (its cast rounds ties away), not ROCm
    (gfx942 has FNUZ formats; gfx950's conversion is not verified here), not older GPUs
    (Triton emulates the conversion there)."""
    device = torch.device(device)
    if INTERPRET or device.type != "cuda" or PLATFORM.get().rocm:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_capability(index) >= (8, 9)


@triton.jit
def _encode_fp8(v, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                HW_FP8: tl.constexpr = False):
    """uint8 FP8 codes of fp32 values ``v`` (RNE, saturating to +-fmax).  The constexprs come
    from ``_fmt_constants(fmt)``; ``_encode_fp8_rounded`` adds ties-away rounding."""
    return _encode_fp8_rounded(v, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE, False,
                               HW_FP8)


@triton.jit
def _encode_fp8_hw(v, fmax, MBITS: tl.constexpr, NAN_CODE: tl.constexpr,
                   FINITE: tl.constexpr = False):
    """OCP e4m3 (MBITS 3) / e5m2 (MBITS 2) codes by the hardware conversion: only where
    ``hw_fp8`` is true, which makes them ``_encode_fp8_int``'s bits (RNE, saturating; fmax
    the format's max, a code, so clamping before or after rounding is the same).

    The clamp keeps a saturating result whatever the lowering; NaN codes are then set to the
    integer encoder's: NAN_CODE with the input's sign bit (the conversion's NaN sign is not
    specified).  ``FINITE`` (no NaN or Inf in ``v``) leaves out both: on sm_89+ Triton lowers
    the cast to ``cvt.rn.satfinite``, which saturates every finite value by itself (checked
    on the GPU by tests/test_triton_ct_variants.py; the cross-compiled PTX shows the cvt)."""
    c = v if FINITE else tl.minimum(tl.maximum(v, -fmax), fmax)
    if MBITS == 2:
        q = c.to(tl.float8e5, fp_downcast_rounding="rtne")
    else:
        q = c.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    code = q.to(tl.uint8, bitcast=True)
    if not FINITE:
        nan = tl.where(v.to(tl.int32, bitcast=True) < 0, NAN_CODE | 0x80, NAN_CODE)
        code = tl.where(v != v, nan.to(tl.uint8), code)
    return code


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


@triton.jit
def _encode_fp8_rounded(v, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                        FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                        TIES_AWAY: tl.constexpr, HW_FP8: tl.constexpr = False,
                        FINITE: tl.constexpr = False):
    """``_encode_fp8`` with the element rounding chosen: RNE, or (``TIES_AWAY``) round to
    nearest with exact ties moved away from zero (MX recipes allow it for FP8 elements).
    Saturating to +-fmax in both modes, as the MX spec requires.  With ``HW_FP8`` (host:
    ``hw_fp8(device)``) OCP RNE codes come from the hardware conversion; FNUZ and ties-away
    always use the integer encoder.  ``FINITE``: the caller guarantees that ``v`` is finite
    (the MX kernels' descaled values: a block with NaN or Inf gets the NaN scale, and
    ``_mx_descale`` then gives 0), so the NaN fix-ups (and the hardware path's clamp) are left
    out: the same codes for every finite value, unspecified ones for NaN / Inf."""
    if HW_FP8 and not FNUZ and not TIES_AWAY:
        code = _encode_fp8_hw(v, fmax, MBITS, NAN_CODE, FINITE)
    else:
        code = _encode_fp8_int(v, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE, TIES_AWAY,
                               FINITE)
    return code


@triton.jit
def _encode_fp8_int(v, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                    FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                    TIES_AWAY: tl.constexpr, FINITE: tl.constexpr = False):
    """The integer encoder behind ``_encode_fp8_rounded``: every target, the interpreter
    included.

    The tie is detected after RNE: ``a - r`` is exact (both on the fp32 grid, |a - r| <= half
    a code step), and equals half the step exactly only at a midpoint."""
    bits = v.to(tl.int32, bitcast=True)
    neg = bits < 0
    a = tl.minimum(tl.abs(v), fmax)
    if not FINITE:
        a = tl.where(v != v, 0.0, a)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.maximum(e, EMIN) - MBITS
    magic = ((s + 23 + 127) << 23).to(tl.float32, bitcast=True)
    r = (a + magic) - magic
    if TIES_AWAY:
        half = ((s - 1 + 127) << 23).to(tl.float32, bitcast=True)
        step = ((s + 127) << 23).to(tl.float32, bitcast=True)
        r = tl.where(a - r == half, r + step, r)
    r = tl.minimum(r, fmax)
    rb = r.to(tl.int32, bitcast=True)
    re = ((rb >> 23) & 0xFF) - 127
    normal = re >= EMIN
    mant_n = (rb >> (23 - MBITS)) & ((1 << MBITS) - 1)
    code_n = ((re + BIAS) << MBITS) | mant_n
    code_s = (r * SUB_SCALE).to(tl.int32)  # SUB_SCALE = 2^(MBITS - EMIN), exact
    code = tl.where(normal, code_n, code_s)
    if FNUZ:
        sign = tl.where(neg & (code != 0), 0x80, 0)  # FNUZ has no -0
    else:
        sign = tl.where(neg, 0x80, 0)
    code = code | sign
    if FINITE:
        pass
    elif FNUZ:
        code = tl.where(v != v, NAN_CODE, code)
    else:
        code = tl.where(v != v, NAN_CODE | tl.where(neg, 0x80, 0), code)
    return code.to(tl.uint8)


@triton.jit
def _encode_fp4(v, TIES_AWAY: tl.constexpr):
    """int32 E2M1 codes (low 4 bits: S.EE.M) of fp32 values ``v``, saturating to +-6.

    RNE, or round to nearest with ties away from zero (``TIES_AWAY``, AITER's Triton MXFP4).
    E2M1 has 8 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6), so the magnitude code is the number
    of midpoints (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) that |v| passes: a comparison ladder,
    ~15 ops, no integer bit work.  A tie goes to the even code under RNE, so the midpoint
    above an odd code (0.75, 1.75, 3.5) counts when reached (``>=``) and the others only when
    passed (``>``); ties-away counts every midpoint reached.  Beyond 5 (Inf too) the code is
    7 (6.0): saturation.  A negative value that rounds to zero keeps its sign (0b1000), as
    hardware casts and the reference do.  E2M1 has no NaN: NaN (every comparison false,
    magnitude code 0) gives the code ml_dtypes (the reference's oracle) gives, 0b1000 for a
    positive-signed NaN and 0b0000 for a negative-signed one; MX never relies on it (a block
    containing NaN gets the NaN scale and unspecified codes).  Callers pack two codes per
    byte, low nibble = even element."""
    a = tl.abs(v)
    if TIES_AWAY:
        code = ((a >= 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32)
                + (a >= 1.25).to(tl.int32) + (a >= 1.75).to(tl.int32)
                + (a >= 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
                + (a >= 5.0).to(tl.int32))
    else:
        code = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32)
                + (a > 1.25).to(tl.int32) + (a >= 1.75).to(tl.int32)
                + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
                + (a > 5.0).to(tl.int32))
    sign = (v.to(tl.int32, bitcast=True) >> 28) & 8  # arithmetic shift: bit 31 -> bit 3
    return code | tl.where(v != v, sign ^ 8, sign)



@triton.jit
def _encode_fp4_arith(v, FINITE: tl.constexpr = False):
    """``_encode_fp4(v, TIES_AWAY=False)``'s codes (RNE) by fp32 arithmetic instead of the
    comparison ladder: about half the instructions per element (Hopper has no E2M1
    conversion, and the ladder left the MXFP4 kernels instruction-bound).

    |v| is clamped to 6.0 on its bits (6.0 is a code, so clamping before rounding is
    saturation).  The E2M1 grid step is 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]: with f the
    exponent field of |v| raised to at least 127, adding M = 2^(f - 105) (an fp32 whose ulp
    is that step) rounds |v| to the grid in one IEEE RNE addition, and the low bits of the sum
    count the steps: code = bits(|v| + M) - bits(M) + 2 (f - 127).  A value rounding up into
    the next binade carries into the right code by itself.  Sign and NaN as the ladder
    (NaN: 0b1000 for a positive-signed NaN, 0b0000 for a negative-signed one).  Proven equal
    to the ladder on every fp32 input in the deciding range (tests/test_triton_ct_variants.py)."""
    bits = v.to(tl.int32, bitcast=True)
    code = _fp4_arith_magnitude(bits & 0x7FFFFFFF)  # NaN -> 6.0's code (fixed below)
    sign = (bits >> 28) & 8  # arithmetic shift: bit 31 -> bit 3
    if not FINITE:  # FINITE: v is finite (the caller's guarantee, as _encode_fp8_rounded's)
        code = tl.where(v != v, sign ^ 8, code | sign)
    else:
        code = code | sign
    return code


@triton.jit
def _fp4_arith_magnitude(mag):
    """E2M1 magnitude code (0..7, RNE, saturating) of int32 fp32 bit patterns ``mag`` >= 0
    (sign bit clear): ``_encode_fp4_arith``'s rounding without the sign, for callers that
    already hold magnitudes (quantize_mx's bf16-pair rowwise kernel).  NaN / Inf patterns
    give 7."""
    mag = tl.minimum(mag, 0x40C00000)  # Inf / NaN / > 6 -> 6.0
    f = tl.maximum(mag >> 23, 127)
    magic = (f + 22) << 23
    y = mag.to(tl.float32, bitcast=True) + magic.to(tl.float32, bitcast=True)
    return y.to(tl.int32, bitcast=True) - magic + 2 * (f - 127)


# ---- tile order ------------------------------------------------------------------------------

@triton.jit
def _tile_ids(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` over a (tiles_m, tiles_n) tile grid.

    GROUP_M == 1: row-major (pid_m = pid // tiles_n).  GROUP_M > 1: the programs run in
    groups of GROUP_M tile rows, column by column inside a group (Triton's grouped matmul
    order).  A cast-transpose writes its columnwise output (K, M) in runs of BM bytes per
    row of x.T; with row-major order the programs resident at one time share one tile row,
    so those runs are BM bytes at a stride of M bytes (a new DRAM page for each).  Grouping
    makes the resident programs write GROUP_M * BM contiguous bytes of each x.T row while
    still reading runs of x rows.  Only the order changes, never a tile's work or bits.
    ``tiles_m`` may be 0 (an empty x still runs one program: it gets tile (0, 0))."""
    if GROUP_M == 1:
        pid_m = pid // tiles_n
        pid_n = pid % tiles_n
    else:
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        group_rows = tl.maximum(tl.minimum(tiles_m - first_m, GROUP_M), 1)
        pid_m = first_m + (pid % per_group) % group_rows
        pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n



@triton.jit
def _into_word(word, codes, j, BITS: tl.constexpr):
    """``word`` (int32) with the uint8 ``codes`` of sub-tile ``j`` in bits [j*BITS, (j+1)*BITS):
    the packed cast-transposes (quantize.py, quantize_mx.py) build a row of x.T as 32-bit
    words, codes in little-endian byte (nibble) order, as the byte layout has them."""
    return word | (codes.to(tl.int32) << (j * BITS))

# ---- MX (E8M0 block scales) ------------------------------------------------------------------

@triton.jit
def _log2_parts(bits):
    """(floor(log2 a), a is a power of two) for the bits of a positive finite fp32 ``a``,
    exact for subnormals too: their mantissa, converted to fp32 (exact below 2^24), gives
    its own exponent field.  Integer-only, so a GPU that flushes subnormals agrees."""
    field = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    mant_log = ((mant.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    flog = tl.where(field > 0, field - 127, mant_log - 149)
    pow2 = tl.where(field > 0, mant == 0, (mant & (mant - 1)) == 0)
    return flog, pow2


@triton.jit
def _e8m0_scale(amax, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                FMAX: tl.constexpr):
    """int32 biased E8M0 scale byte of fp32 block amaxes (>= 0), exactly as
    ``tealite_verify.references.quantize.e8m0_scale``.

    MODE (``_mx_scale_constants``): 0 FLOOR  floor(log2 amax) - EMAX;
    1 CEIL  ceil(log2 amax) - EMAX;  2 EVEN  amax rounded half-up at the element's MBITS
    mantissa width (integer add on the fp32 bits), mantissa cleared, then FLOOR;
    3 RCEIL  ceil(log2(amax * r)) with r = 1/FMAX rounded to fp32 and the product rounded in
    fp32 (TE / cuBLAS UE8M0); a product that underflows to 0 gives the clamp floor.
    The exponent is clamped to [-127, 127] and biased by 127; amax == 0 gives 0; NaN or Inf
    amax gives 255 (the E8M0 NaN).  log2 is taken from the fp32 bits (``_log2_parts``), exact
    for subnormal amax.  RCEIL's product is the one fp32 multiply: it assumes IEEE subnormal
    results (Triton's default; a flush-to-zero target would change scales only for block
    amaxes below 2^-117)."""
    bits = amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    field = (bits >> 23) & 0xFF
    if MODE == 3:
        # 1.0 / FMAX is a Python (fp64) constant; it becomes an fp32 constant by one RNE
        # rounding, equal to the fp32 division 1/FMAX for every format (_mx_scale_constants
        # checks this on the host).
        ratio = bits.to(tl.float32, bitcast=True) * (1.0 / FMAX)
        rbits = ratio.to(tl.int32, bitcast=True)
        flog, pow2 = _log2_parts(rbits)
        e = tl.where(rbits > 0, flog + tl.where(pow2, 0, 1), -127)
    elif MODE == 2:
        bumped = bits + (1 << (22 - MBITS))
        e = ((bumped >> 23) & 0xFF) - 127 - EMAX
    else:
        flog, pow2 = _log2_parts(bits)
        if MODE == 1:
            e = flog + tl.where(pow2, 0, 1) - EMAX
        else:
            e = flog - EMAX
    biased = tl.minimum(tl.maximum(e, -127), 127) + 127
    biased = tl.where(bits == 0, 0, biased)
    return tl.where(field == 255, 255, biased)


@triton.jit
def _mx_descale(x, byte):
    """fp32 ``x / 2^(byte - 127)``: the exact quotient rounded once to fp32 (RNE, fp32
    subnormals included), as the reference's float64 division then fp32 cast.  It is one
    multiply by the power of two 2^(127 - byte), itself exact in fp32 (2^-127, byte 254, is
    an fp32 subnormal built from its bits).  ``byte`` (any integer dtype, broadcastable to x)
    of 255 (the NaN scale) gives +0.0, so the codes of such a block are 0, the value the
    reference writes for those unspecified codes."""
    b = byte.to(tl.int32)
    field = 254 - b
    mult = tl.where(field > 0, field << 23, 0x00400000).to(tl.float32, bitcast=True)
    return tl.where(b == 255, 0.0, x * mult)


_SCALE_MODES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}


def _mx_scale_constants(fmt_name: str, mode) -> dict:
    """Constexpr kwargs of ``_e8m0_scale`` for element format ``fmt_name`` and a
    ScaleRounding (or its value string): MODE, EMAX (emax_elem), MBITS, FMAX."""
    fmt = get_format(fmt_name)
    mode = getattr(mode, "value", mode)
    if mode not in _SCALE_MODES:
        raise ValueError(f"unknown scale rounding {mode!r}; known: {sorted(_SCALE_MODES)}")
    # RCEIL's reciprocal is written 1.0 / FMAX in the kernel: fp64 then one rounding to fp32.
    # That equals the fp32 division only when the double rounding is harmless; check it.
    if np.float32(1.0 / fmt.max) != np.float32(1.0) / np.float32(fmt.max):
        raise AssertionError(f"1/{fmt.max} rounds differently through fp64")
    return dict(MODE=_SCALE_MODES[mode], EMAX=fmt.emax, MBITS=fmt.mbits, FMAX=float(fmt.max))


# ---- non-saturating FP8 casts (Saturation.NONFINITE) -------------------------------------------

@triton.jit
def _fp8_overflow(v, code, OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                  OVF_CODE: tl.constexpr, FNUZ: tl.constexpr):
    """Replace the saturated codes of values that RNE would round past the format's max by
    the format's overflow code (NaN; Inf for OCP e5m2), as a non-saturating cast does.
    ``code`` is ``_encode_fp8``'s uint8 output for ``v``; constants from
    ``_overflow_constants``.  A value exactly at the midpoint above max overflows only when
    max has an odd mantissa (RNE would round it up)."""
    a = tl.abs(v)
    over = (a > OVF_THRESH) | (a == float("inf"))
    if OVF_TIE:
        over = over | (a == OVF_THRESH)
    if FNUZ:
        ovf = tl.full(code.shape, OVF_CODE, tl.int32)  # one NaN, no sign
    else:
        ovf = OVF_CODE | tl.where(v < 0, 0x80, 0)
    return tl.where(over, ovf.to(tl.uint8), code)


def _overflow_constants(fmt) -> dict:
    """Constexpr kwargs of ``_fp8_overflow`` for an FP8 Format."""
    step = 2.0 ** (fmt.emax - fmt.mbits)  # code spacing in max's binade
    odd = round(fmt.max / step) % 2 == 1
    code = 0x7C if fmt.name == "e5m2" else _fmt_constants(fmt)["NAN_CODE"]
    return dict(OVF_THRESH=fmt.max + step / 2, OVF_TIE=odd, OVF_CODE=code)


@triton.jit
def _encode_fp8_sat(v, fmax, SATURATE: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                    BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                    SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                    OVF_CODE: tl.constexpr, HW_FP8: tl.constexpr = False):
    """uint8 FP8 codes (RNE) under a recipe's Saturation: saturating (SATURATE) or
    non-finite on overflow.  Constexprs: ``_fmt_constants(fmt)`` and
    ``_overflow_constants(fmt)``.  The overflow fix-up works from ``v`` on the saturated
    codes, so ``HW_FP8`` (same saturated bits) is allowed for both."""
    code = _encode_fp8(v, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE, HW_FP8)
    if not SATURATE:
        code = _fp8_overflow(v, code, OVF_THRESH, OVF_TIE, OVF_CODE, FNUZ)
    return code


@triton.jit
def _mag_max(x, AXIS: tl.constexpr):
    """max |x| along AXIS, NaN-propagating: the integer max of the magnitude bits (NaN
    patterns sort above Inf; tl.max on floats would drop NaN)."""
    mag = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(mag, axis=AXIS).to(tl.float32, bitcast=True)
