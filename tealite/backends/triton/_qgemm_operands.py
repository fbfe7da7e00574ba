"""Operand tiles of the quantized GEMM (qgemm.py): exact decoding of FP8 / E2M1 codes, MX
operands scaled exactly by their E8M0 powers of two, the per-tile check that routes a tile to
that fast path, and the fallback's exact scaling of a block's partial product; host side, which
formats load as fp8-typed tiles on the device (``dot_fp8`` / ``typed_operands``, shared by the
dense and grouped launches).  See qgemm.py's docstring for the design; ``_fast_byte_range``
states the exactness condition."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import INTERPRET, PLATFORM
from tealite.formats import get_format

# Code specials, per format family (see _decode_f32).
_NO_SPECIALS, _OCP_E4M3, _IEEE, _FNUZ = 0, 1, 2, 3


def _decode_constants(fmt_name: str) -> dict:
    """Bit layout of a code format for ``_decode_f32`` (kernel constexprs, without prefix), and
    ``MAG``: the magnitude bits of a code byte (both nibbles of a packed E2M1 byte)."""
    f = get_format(fmt_name)
    ebits = f.bits - 1 - f.mbits
    bias = {"e4m3fnuz": 8, "e5m2fnuz": 16}.get(f.name, (1 << (ebits - 1)) - 1)
    specials = _FNUZ if f.fnuz else {"e4m3": _OCP_E4M3, "e5m2": _IEEE}.get(f.name, _NO_SPECIALS)
    return dict(EBITS=ebits, MBITS=f.mbits, BIAS=bias, SPECIALS=specials,
                MIN_NORMAL=float(2.0 ** (1 - bias)), PACKED=f.packed,
                MAG=0x7 if f.packed else (1 << (f.bits - 1)) - 1)


def _fast_byte_range(fmt_name: str, e8m0_bias: int) -> tuple[int, int]:
    """E8M0 bytes [lo, hi] for which code x 2^(byte - bias) is, for every finite nonzero code
    of the format, a NORMAL bf16 number (so exact: codes have <= 3 mantissa bits, bf16 has 7
    and fp32's exponent range), and the power itself a normal fp32.  Below lo the smallest
    codes (subnormal steps 2^(1 - code bias - mbits)) would leave bf16's normal range: bf16
    subnormals stop at 2^-133 and flush-to-zero hardware loses them altogether; above hi the
    largest code overflows; 0xFF (NaN) is above every hi."""
    c = _decode_constants(fmt_name)
    smallest = 1 - c["BIAS"] - c["MBITS"]  # log2 of the smallest positive code
    largest = get_format(fmt_name).emax  # exponent of the largest finite code
    return e8m0_bias - 126 - smallest, e8m0_bias + 127 - largest


# ---- which code tiles load fp8-typed (host side) ----------------------------------------------------------------------

def _native_fp8_formats(device) -> frozenset:
    """FP8 formats this device's tensor cores multiply natively (through Triton's fp8 types);
    a simulated platform's (``PLATFORM.override(native_fp8_formats=...)``) for any device."""
    simulated = PLATFORM.get().native_fp8_formats
    if simulated is not None:
        return simulated
    if INTERPRET or torch.device(device).type != "cuda":
        return frozenset()
    if PLATFORM.get().rocm:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        if arch.startswith("gfx942"):
            return frozenset({"e4m3fnuz", "e5m2fnuz"})
        if arch.startswith("gfx950"):
            return frozenset({"e4m3", "e5m2"})
        return frozenset()
    if torch.cuda.get_device_capability(device) >= (8, 9):
        return frozenset({"e4m3", "e5m2"})
    return frozenset()


def dot_fp8(fmt_a: str, fmt_b: str, device) -> bool:
    """Whether the kernel multiplies these formats natively (else decodes both to bf16)."""
    native = _native_fp8_formats(device)
    return fmt_a in native and fmt_b in native


def typed_operands(kind: str, fmt_a: str, fmt_b: str, device) -> tuple[bool, bool]:
    """Whether A's / B's codes load as fp8-typed tiles.  MX converts each operand on its own
    (to scaled bf16), so each may use the hardware's fp8 conversion; the FP8 kinds multiply fp8
    tiles only when both formats are native."""
    if kind != "mx":
        native = dot_fp8(fmt_a, fmt_b, device)
        return native, native
    formats = _native_fp8_formats(device)
    return fmt_a in formats, fmt_b in formats


# ---- in-kernel codecs -------------------------------------------------------------------------

@triton.jit
def _decode_f32(c, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr):
    """fp32 values of FP8 / E2M1 codes ``c`` (int32), built with integer ops: exact (NaN / Inf
    codes included)."""
    sign = (c >> (EBITS + MBITS)) & 1
    e = (c >> MBITS) & ((1 << EBITS) - 1)
    m = c & ((1 << MBITS) - 1)
    # fp32 bits of 2^(max(e,1) - BIAS) * (1 + m / 2^MBITS); a subnormal (e == 0) is that minus
    # the implicit 2^(1 - BIAS), an exact subtraction.
    bits = ((tl.maximum(e, 1) + (127 - BIAS)) << 23) | (m << (23 - MBITS))
    v = bits.to(tl.float32, bitcast=True)
    v = tl.where(e == 0, v - MIN_NORMAL, v)
    if SPECIALS == 1:  # OCP E4M3: S.1111.111 is NaN, no infinities
        v = tl.where((c & 0x7F) == 0x7F, float("nan"), v)
    if SPECIALS == 2:  # OCP E5M2: IEEE-like, all-ones exponent is Inf (m == 0) or NaN
        special = tl.where(m == 0, float("inf"), float("nan"))
        v = tl.where(e == (1 << EBITS) - 1, special, v)
    if SPECIALS == 3:  # FNUZ: the "negative zero" code 0x80 is the single NaN
        v = tl.where(c == 0x80, float("nan"), v)
    # The sign goes in as a bit: triton 3.6 lowers ``-v`` to ``0 - v`` on CUDA, which turns the
    # -0 codes into +0 (measured on an H100).
    return (v.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _load_u8(ptrs, mask, EVEN_K: tl.constexpr):
    """int32 codes of a uint8 tile (0 where masked: a zero code adds nothing to a dot)."""
    if EVEN_K:
        c = tl.load(ptrs)
    else:
        c = tl.load(ptrs, mask=mask, other=0)
    return c.to(tl.int32)


@triton.jit
def _e2m1_f32(n):
    """fp32 values of E2M1 nibbles ``n`` (int32, 0..15), exact.  The three magnitude bits go
    where an fp32's lowest two exponent bits and first mantissa bit are, which is the code's
    value x 2^-126 (0.5 lands on the subnormal 2^-127); the multiply restores it exactly:
    Triton keeps fp32 subnormals in plain multiplies (no .ftz on NVIDIA, "ieee" denormal mode
    on AMD by default).  Three integer ops and a multiply, where the generic decoder takes ~12."""
    v = (((n & 7) << 22) | ((n & 8) << 28)).to(tl.float32, bitcast=True)
    return v * 8.507059173023462e37  # 2^126


@triton.jit
def _load_e2m1_f32(ptrs, rkh, k_left, EVEN_K: tl.constexpr, EVEN_LOW: tl.constexpr):
    """fp32 (R, 2H) tile of a packed E2M1 operand from a (R, H) byte tile (``rkh`` the byte
    index along K, broadcast to (1, H)): element 2p is one nibble of byte p, 2p + 1 the other.
    Bytes load contiguously; the nibbles are decoded apart and interleaved in registers."""
    if EVEN_K:
        c = tl.load(ptrs).to(tl.int32)
        lo = c & 0xF
        hi = c >> 4
    else:
        c = tl.load(ptrs, mask=2 * rkh < k_left, other=0).to(tl.int32)
        lo = c & 0xF
        hi = tl.where(2 * rkh + 1 < k_left, c >> 4, 0)  # not the padding nibble of odd K
    if not EVEN_LOW:
        lo, hi = hi, lo
    even = _e2m1_f32(lo)
    odd = _e2m1_f32(hi)
    return tl.reshape(tl.join(even, odd), (even.shape[0], 2 * even.shape[1]))


@triton.jit
def _load_codes_f32(ptrs, rk, rkh, k_left, TYPED: tl.constexpr, PACKED: tl.constexpr,
                    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                    SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr, EVEN_K: tl.constexpr,
                    EVEN_LOW: tl.constexpr):
    """Exact fp32 values of a K-last (R, BLOCK_K) code tile (0 past K): the hardware's
    conversion for fp8-typed pointers (``TYPED``), else integer decoding of bytes."""
    if PACKED:
        x = _load_e2m1_f32(ptrs, rkh[None, :], k_left, EVEN_K, EVEN_LOW)
    elif TYPED:
        if EVEN_K:
            x = tl.load(ptrs).to(tl.float32)
        else:
            x = tl.load(ptrs, mask=rk[None, :] < k_left, other=0.0).to(tl.float32)
    else:
        x = _decode_f32(_load_u8(ptrs, rk[None, :] < k_left, EVEN_K), EBITS, MBITS, BIAS,
                        SPECIALS, MIN_NORMAL)
    return x


@triton.jit
def _per_element(s, SCALE_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """(R, BLOCK_K) tile of the (R, BLOCK_K // SCALE_K) per-block values ``s``."""
    R: tl.constexpr = s.shape[0]
    NS: tl.constexpr = BLOCK_K // SCALE_K
    return tl.reshape(tl.broadcast_to(s[:, :, None], (R, NS, SCALE_K)), (R, BLOCK_K))


@triton.jit
def _times_e8m0_pair(part, byte_b, byte_a, E8M0_BIAS: tl.constexpr):
    """``part * 2^(byte_b[i] + byte_a[j] - 2 E8M0_BIAS)`` (byte 0xFF: NaN), rounded once at
    most: the power is split into two halves of equal sign, each a normal fp32, so the first
    product only leaves fp32's range when the final one does (then the error is below the
    smallest normal, or the result overflows as the exact one does)."""
    e = byte_b.to(tl.int32)[:, None] + byte_a.to(tl.int32)[None, :] - 2 * E8M0_BIAS
    e1 = e >> 1
    e2 = e - e1
    p1 = ((tl.maximum(e1, -126) + 127) << 23).to(tl.float32, bitcast=True)
    p2 = ((tl.maximum(e2, -126) + 127) << 23).to(tl.float32, bitcast=True)
    nan = (byte_b.to(tl.int32)[:, None] == 255) | (byte_a.to(tl.int32)[None, :] == 255)
    return tl.where(nan, float("nan"), (part * p1) * p2)


# ---- MX: exactly scaled operands, one fp32-accumulated dot over all of K -----------------------

@triton.jit
def _round_bf16_f32(v):
    """fp32 ``v`` rounded to bf16 (RNE, integer ops), kept in fp32: the interpreter's stand-in
    for ``.to(tl.bfloat16)``, so its fp32 dot sees the GPU's bf16 operand values (a no-op on
    the fast range's exact values; it reproduces what bf16 would lose outside it)."""
    bits = v.to(tl.int32, bitcast=True)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(v != v, v, r.to(tl.float32, bitcast=True))


@triton.jit
def _mx_operand(ptrs, byte, rk, rkh, k_left, TYPED: tl.constexpr,
                PACKED: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                BIAS: tl.constexpr, SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr,
                SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                EVEN_LOW: tl.constexpr, F32_OPERANDS: tl.constexpr, BLOCK_K: tl.constexpr):
    """(R, BLOCK_K) tile of code x 2^(byte - E8M0_BIAS) (``byte``: the tile's (R, BLOCK_K //
    SCALE_K) scale bytes), exact: the tile passed ``_mx_tile_is_fast``, so each byte is in the
    format's fast range (``_fast_byte_range``), where every such value is a normal bf16 number
    (or 0, or the code's Inf / NaN), or its block's codes are all zero (0 x any finite power
    below the range is 0).  bf16 for the tensor cores; fp32 holding the same bf16 values where
    bf16 dots are not trusted (the interpreter)."""
    x = _load_codes_f32(ptrs, rk, rkh, k_left, TYPED, PACKED, EBITS, MBITS, BIAS, SPECIALS,
                        MIN_NORMAL, EVEN_K, EVEN_LOW)
    # 2^(byte - bias) from its exponent field: a normal fp32 inside the fast range (0.0 for
    # byte 0, which only meets zero codes here).
    s = ((byte.to(tl.int32) + (127 - E8M0_BIAS)) << 23).to(tl.float32, bitcast=True)
    v = x * _per_element(s, SCALE_K, BLOCK_K)
    if F32_OPERANDS:
        v = _round_bf16_f32(v)
    else:
        v = v.to(tl.bfloat16)
    return v


@triton.jit
def _mx_scaled_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, n_scales, stride_a, stride_b,
                    stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                    SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr,
                    A_TYPED: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr,
                    A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr,
                    A_PACKED: tl.constexpr, B_TYPED: tl.constexpr, B_EBITS: tl.constexpr,
                    B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_SPECIALS: tl.constexpr,
                    B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
                    F32_OPERANDS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = sum over K of (b x s_b)(a x s_a): exact operands, one dot chain, fp32 sums."""
    NS: tl.constexpr = BLOCK_K // SCALE_K
    rk = tl.arange(0, BLOCK_K)
    rkh = tl.arange(0, BLOCK_K // 2)  # byte index along K of a packed E2M1 tile
    rs = tl.arange(0, NS)
    # Both tiles load K-last, in storage order; A's is transposed in registers for the dot.
    if B_PACKED:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rkh[None, :]
    else:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rk[None, :]
    if A_PACKED:
        a_ptrs = a_ptr + an[:, None] * stride_a + rkh[None, :]
    else:
        a_ptrs = a_ptr + an[:, None] * stride_a + rk[None, :]
    sb_ptrs = sb_ptr + bm[:, None] * stride_sb_row + rs[None, :] * stride_sb_k
    sa_ptrs = sa_ptr + an[:, None] * stride_sa_row + rs[None, :] * stride_sa_k
    # The scale bytes are fetched one step ahead by hand: Triton's pipeliner leaves loads of
    # under 32 bits per thread in place, which would expose their latency every step.
    s_mask = rs[None, :] < n_scales
    sb_byte = tl.load(sb_ptrs, mask=s_mask, other=E8M0_BIAS)
    sa_byte = tl.load(sa_ptrs, mask=s_mask, other=E8M0_BIAS)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        sb_ptrs += NS * stride_sb_k
        sa_ptrs += NS * stride_sa_k
        s_mask = ((kb + 1) * NS + rs)[None, :] < n_scales
        sb_next = tl.load(sb_ptrs, mask=s_mask, other=E8M0_BIAS)
        sa_next = tl.load(sa_ptrs, mask=s_mask, other=E8M0_BIAS)
        b = _mx_operand(b_ptrs, sb_byte, rk, rkh, k_left, B_TYPED, B_PACKED, B_EBITS, B_MBITS,
                        B_BIAS, B_SPECIALS, B_MIN_NORMAL, SCALE_K, E8M0_BIAS, EVEN_K, EVEN_LOW,
                        F32_OPERANDS, BLOCK_K)
        a = _mx_operand(a_ptrs, sa_byte, rk, rkh, k_left, A_TYPED, A_PACKED, A_EBITS, A_MBITS,
                        A_BIAS, A_SPECIALS, A_MIN_NORMAL, SCALE_K, E8M0_BIAS, EVEN_K, EVEN_LOW,
                        F32_OPERANDS, BLOCK_K)
        if F32_OPERANDS:  # exact fp32 FMA products (Triton's NVIDIA default would be TF32)
            acc = tl.dot(b, tl.trans(a), acc, input_precision="ieee", out_dtype=tl.float32)
        else:
            acc = tl.dot(b, tl.trans(a), acc, out_dtype=tl.float32)
        b_ptrs += BLOCK_K // 2 if B_PACKED else BLOCK_K
        a_ptrs += BLOCK_K // 2 if A_PACKED else BLOCK_K
        sb_byte = sb_next
        sa_byte = sa_next
    return acc


@triton.jit
def _byte_range(s_ptr, rows, row_ok, stride_row, stride_k, n_scales, NEUTRAL: tl.constexpr,
                ROWS: tl.constexpr):
    """(min, max) of the scale bytes of rows ``rows`` where ``row_ok`` (not the wrapped
    re-reads past the edge: they belong to another tile); NEUTRAL where there are none."""
    SCAN: tl.constexpr = 64
    rs = tl.arange(0, SCAN)
    lo = tl.full((ROWS, SCAN), NEUTRAL, dtype=tl.int32)
    hi = tl.full((ROWS, SCAN), NEUTRAL, dtype=tl.int32)
    for c in range(0, tl.cdiv(n_scales, SCAN)):
        cols = c * SCAN + rs
        byte = tl.load(s_ptr + rows[:, None] * stride_row + cols[None, :] * stride_k,
                       mask=row_ok[:, None] & (cols[None, :] < n_scales),
                       other=NEUTRAL).to(tl.int32)
        lo = tl.minimum(lo, byte)
        hi = tl.maximum(hi, byte)
    return tl.min(tl.min(lo, axis=1), axis=0), tl.max(tl.max(hi, axis=1), axis=0)


@triton.jit
def _count_lost_codes(ptr, s_ptr, rows, row_ok, K, n_scales, stride, stride_row, stride_k,
                      LO: tl.constexpr, TYPED: tl.constexpr, PACKED: tl.constexpr,
                      MAG: tl.constexpr, SCALE_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Number of nonzero codes in blocks whose byte is < LO (their scaled values may be below
    bf16's normal range), in the K-last code rows ``rows``."""
    NS: tl.constexpr = BLOCK_K // SCALE_K
    rk = tl.arange(0, BLOCK_K)
    rkh = tl.arange(0, BLOCK_K // 2)
    rs = tl.arange(0, NS)
    lost = tl.zeros((rows.shape[0], BLOCK_K), dtype=tl.int32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        cols = kb * NS + rs
        byte = tl.load(s_ptr + rows[:, None] * stride_row + cols[None, :] * stride_k,
                       mask=row_ok[:, None] & (cols[None, :] < n_scales), other=LO).to(tl.int32)
        low = _per_element(byte < LO, SCALE_K, BLOCK_K)
        if PACKED:  # both nibbles of a byte, each counted where it lies inside K
            c = tl.load(ptr + rows[:, None] * stride + kb * (BLOCK_K // 2) + rkh[None, :],
                        mask=2 * rkh[None, :] < k_left, other=0).to(tl.int32)
            lo = tl.where(2 * rkh[None, :] < k_left, c & MAG, 0)
            hi = tl.where(2 * rkh[None, :] + 1 < k_left, (c >> 4) & MAG, 0)
            mag = tl.reshape(tl.join(lo, hi), (rows.shape[0], BLOCK_K))
        else:
            c_ptrs = ptr + rows[:, None] * stride + kb * BLOCK_K + rk[None, :]
            if TYPED:
                c = tl.load(c_ptrs, mask=rk[None, :] < k_left, other=0.0).to(tl.uint8,
                                                                             bitcast=True)
            else:
                c = tl.load(c_ptrs, mask=rk[None, :] < k_left, other=0)
            mag = c.to(tl.int32) & MAG
        lost += (low & (mag != 0)).to(tl.int32)
    return tl.sum(tl.sum(lost, axis=1), axis=0)


@triton.jit
def _mx_tile_is_fast(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, an_ok, bm_ok, K, n_scales,
                     stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                     SCALE_K: tl.constexpr, A_TYPED: tl.constexpr, A_PACKED: tl.constexpr,
                     A_MAG: tl.constexpr, A_LO: tl.constexpr, A_HI: tl.constexpr,
                     B_TYPED: tl.constexpr, B_PACKED: tl.constexpr, B_MAG: tl.constexpr,
                     B_LO: tl.constexpr, B_HI: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Whether every scaled operand value of this tile is exact in bf16: all scale bytes in
    [LO, HI], except blocks below LO whose codes are all zero (the amax == 0 blocks every
    E8M0 rule gives byte 0)."""
    b_lo, b_hi = _byte_range(sb_ptr, bm, bm_ok, stride_sb_row, stride_sb_k, n_scales, B_LO,
                             BLOCK_M)
    a_lo, a_hi = _byte_range(sa_ptr, an, an_ok, stride_sa_row, stride_sa_k, n_scales, A_LO,
                             BLOCK_N)
    fast = (b_hi <= B_HI) & (a_hi <= A_HI)
    if fast & ((b_lo < B_LO) | (a_lo < A_LO)):
        lost = _count_lost_codes(b_ptr, sb_ptr, bm, bm_ok, K, n_scales, stride_b, stride_sb_row,
                                 stride_sb_k, B_LO, B_TYPED, B_PACKED, B_MAG, SCALE_K, BLOCK_K)
        lost += _count_lost_codes(a_ptr, sa_ptr, an, an_ok, K, n_scales, stride_a, stride_sa_row,
                                  stride_sa_k, A_LO, A_TYPED, A_PACKED, A_MAG, SCALE_K, BLOCK_K)
        fast = lost == 0
    return fast
