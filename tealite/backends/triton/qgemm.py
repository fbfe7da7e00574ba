"""Quantized GEMM (FP8 per-tensor / per-row, FP8 block-scaled, MXFP8 / MXFP4) with the scales
applied inside the kernel.

Operands arrive in their K-last orientation (see tealite.ops.qgemm): A codes (N, K), B codes
(M, K), ``D = B @ A.T`` (M, N).  The kernel is the textbook tiled ``X @ Y`` with X = a (BM, BK)
tile of B and Y = a (BK, BN) tile of A read through its strides (K has unit stride: the TN
fast path of every FP8 tensor core).  Scales:

* per-tensor / per-row (``KIND_FP8``): ``acc`` sums code products over all of K; the epilogue
  multiplies by ``s_B[i]`` then ``s_A[j]`` (a per-tensor scale is a row scale of stride 0).
* block (``KIND_BLOCK``, 128-long K blocks) and MX (``KIND_MX``, 32-long K blocks, E8M0
  scales 2^(byte-127), byte 0xFF = NaN): each K step is inside one scale block (BLOCK_K
  divides the scale block), its partial product is taken from a fresh ``tl.dot`` and added
  as ``acc += (part * s_B[i]) * s_A[j]`` in fp32.  A's 128x128 weight blocks index their scale
  row by ``j // 128``.  Multiplying by the two scales one after the other (not by their
  product) keeps an intermediate inside fp32's range unless the two scales sit at opposite
  ends of it (then the true result is out of range too, or within the underflow term).

Dot operands (one constexpr choice, ``DOT_FP8``, same kernel source everywhere):

* native FP8 where the target has it (``_native_fp8_formats``): the codes are passed as
  their torch FP8 dtype, so the loaded tile *is* the Triton fp8 type (tl.float8e4nv /
  tl.float8e5 on NVIDIA sm_89+ and gfx950, tl.float8e4b8 / tl.float8e5b16 on gfx942), with no
  op between the pipelined load and the tensor-core dot.
* otherwise codes travel as uint8 and ``_decode_f16`` turns them into fp16 with integer ops
  (exact for all four FP8 formats and E2M1, NaN/Inf codes included); fp16 dot, fp32 acc.
  Always so in Triton's CPU interpreter, whose fp8 handling is not trusted (NUMERICS.md) and
  whose bf16 ``tl.dot`` is garbage; its fp16 dot is exact products + fp32 sums.
* E2M1 (MXFP4) is always decoded: two codes per byte, low nibble = even element (TE, AITER).

Numerics (declared to the ``gemm`` tier, tealite_verify/tolerance.py; see ``_numerics``):
products of codes are exact; sums are fp32, except the WGMMA accumulator of native FP8 dots on
NVIDIA (~14 bits between promotions): all of K for per-tensor / per-row (Triton's sm_90
default never promotes, as scaled_mm's fast path), one scale block for block / MX (each block
is a fresh dot).  Per-tensor / per-row scales and the bias cost three fp32 roundings in the
epilogue (inside the tier's epilogue term); block / MX scale each partial with two.  One
rounding to out_dtype (bf16 by integer RNE, _io.py).

Performance: a classic tiled kernel with grouped ordering, no TMA or warp specialization
(portable to ROCm); configs in ``_CUDA`` / ``_HIP``; benchmarks/qgemm_configs.py times the
candidates against torch._scaled_mm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from tealite import recipes as R
from tealite._checks import require
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.backends.triton.gemm import grouped_pid
from tealite.formats import get_format

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
KIND_FP8, KIND_BLOCK, KIND_MX = 0, 1, 2
_KINDS = {"fp8": KIND_FP8, "block": KIND_BLOCK, "mx": KIND_MX}
# Scale-block lengths along K: Float8BlockScaling (TE, DeepSeek-V3) and the OCP MX spec.
_BLOCK_SCALE_K = 128
_MX_SCALE_K = 32
_E8M0_BIAS = 127  # OCP MX: scale = 2^(byte - 127)
_E2M1_EVEN_IN_LOW_NIBBLE = True  # TE and AITER pack element 2i in bits 0-3 of byte i
# Code specials, per format family (see _decode_f16).
_NO_SPECIALS, _OCP_E4M3, _IEEE, _FNUZ = 0, 1, 2, 3
# Hopper FP8 WGMMA keeps ~14 mantissa bits in its accumulator between promotions (DeepSeek-V3
# report; the scaled_mm backend declares the same).
_FP8_MMA_UNIT_ROUNDOFF = 2.0**-14


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
def _decode_f16(c, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr):
    """fp16 values of codes ``c``: exact, every value of these formats is an fp16 value."""
    return _decode_f32(c, EBITS, MBITS, BIAS, SPECIALS, MIN_NORMAL).to(tl.float16)


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
    SCALE_K) scale bytes), exact: every byte of the tile is in
    the format's fast range (``_fast_byte_range``), where each such value is a normal bf16
    number (or 0, or the code's Inf / NaN).  bf16 for the tensor cores; fp32 (the same
    values) where bf16 dots are not trusted (the interpreter)."""
    x = _load_codes_f32(ptrs, rk, rkh, k_left, TYPED, PACKED, EBITS, MBITS, BIAS, SPECIALS,
                        MIN_NORMAL, EVEN_K, EVEN_LOW)
    # 2^(byte - bias) from its exponent field: a normal fp32 inside the fast range.
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
                      LO: tl.constexpr, TYPED: tl.constexpr, PACKED: tl.constexpr, MAG: tl.constexpr,
                      SCALE_K: tl.constexpr, BLOCK_K: tl.constexpr):
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


# ---- per-block partial products: FP8 per-tensor / per-row / block, and MX's exact fallback -----

@triton.jit
def _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, stride_a, stride_b,
                    stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                    KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                    E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr, DOT_FP8: tl.constexpr,
                    A_TYPED: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr,
                    A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr,
                    A_PACKED: tl.constexpr, B_TYPED: tl.constexpr, B_EBITS: tl.constexpr,
                    B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_SPECIALS: tl.constexpr,
                    B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """acc = sum over K steps of the step's code product; block / MX kinds scale each step's
    partial (a fresh dot inside one scale block) before adding it."""
    rk = tl.arange(0, BLOCK_K)
    rkh = tl.arange(0, BLOCK_K // 2)  # byte index along K of a packed E2M1 tile
    if B_PACKED:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rkh[None, :]
    else:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rk[None, :]
    if A_PACKED:  # loaded (BN, BK/2) K-last, unpacked, then transposed for the dot
        a_ptrs = a_ptr + an[:, None] * stride_a + rkh[None, :]
    else:
        a_ptrs = a_ptr + rk[:, None] + an[None, :] * stride_a
    b_step = BLOCK_K // 2 if B_PACKED else BLOCK_K
    a_step = BLOCK_K // 2 if A_PACKED else BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        if DOT_FP8:  # fp8-typed pointers: the tiles are the tensor cores' fp8 operands
            if EVEN_K:
                b = tl.load(b_ptrs)
                a = tl.load(a_ptrs)
            else:
                b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
                a = tl.load(a_ptrs, mask=rk[:, None] < k_left, other=0.0)
        else:
            # codes -> exact fp16 (no native dot for this format pair here, MX's fallback, or
            # the interpreter: see the module docstring).
            b = _load_codes_f32(b_ptrs, rk, rkh, k_left, B_TYPED, B_PACKED, B_EBITS, B_MBITS,
                                B_BIAS, B_SPECIALS, B_MIN_NORMAL, EVEN_K, EVEN_LOW)
            b = b.to(tl.float16)
            if A_PACKED:
                a = tl.trans(_load_e2m1_f32(a_ptrs, rkh[None, :], k_left, EVEN_K,
                                            EVEN_LOW)).to(tl.float16)
            elif A_TYPED:
                if EVEN_K:
                    a = tl.load(a_ptrs).to(tl.float16)
                else:
                    a = tl.load(a_ptrs, mask=rk[:, None] < k_left, other=0.0).to(tl.float16)
            else:
                a = _decode_f16(_load_u8(a_ptrs, rk[:, None] < k_left, EVEN_K), A_EBITS,
                                A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL)
        if KIND == 0:
            acc = tl.dot(b, a, acc, out_dtype=tl.float32)
        else:
            # A fresh dot per scale block: its partial sum is scaled in fp32 before joining acc.
            part = tl.dot(b, a, out_dtype=tl.float32)
            sk = (kb * BLOCK_K) // SCALE_K
            s_b = tl.load(sb_ptr + bm * stride_sb_row + sk * stride_sb_k)
            s_a = tl.load(sa_ptr + (an // SA_ROWS) * stride_sa_row + sk * stride_sa_k)
            if KIND == 1:
                acc += (part * s_b[:, None]) * s_a[None, :]
            else:
                acc += _times_e8m0_pair(part, s_b, s_a, E8M0_BIAS)
        b_ptrs += b_step
        a_ptrs += a_step
    return acc


# ---- the kernel -------------------------------------------------------------------------------

@triton.jit
def _epilogue(acc, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, M, N, stride_sa_row,
              stride_sb_row, stride_om, KIND: tl.constexpr, HAS_BIAS: tl.constexpr,
              BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr):
    if KIND == 0:  # per-tensor scales are row scales of stride 0
        acc = (acc * tl.load(sb_ptr + bm * stride_sb_row)[:, None]) * \
            tl.load(sa_ptr + an * stride_sa_row)[None, :]
    mask_n = rn < N
    if HAS_BIAS:
        acc += load_f32(bias_ptr, rn, mask_n, BIAS_BF16)[None, :]
    store_f32(out_ptr, rm[:, None] * stride_om + rn[None, :], acc,
              (rm[:, None] < M) & mask_n[None, :], OUT_BF16)


@triton.jit
def _qgemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, M, N, K, KS,
                  stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                  stride_om,
                  KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                  E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr, DOT_FP8: tl.constexpr,
                  F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr, A_EBITS: tl.constexpr,
                  A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr,
                  A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr, A_MAG: tl.constexpr,
                  A_LO: tl.constexpr, A_HI: tl.constexpr, B_TYPED: tl.constexpr,
                  B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                  B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
                  B_MAG: tl.constexpr, B_LO: tl.constexpr, B_HI: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
                  I64: tl.constexpr, EVEN_K: tl.constexpr, EVEN_SCALE_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr):
    """out (M, N) = B (M, K) @ A (N, K)^T with scales; K has unit stride in A and B (a packed
    E2M1 operand holds element k in byte k // 2).  ``KS``: MX scale blocks along K."""
    pid_m, pid_n = grouped_pid(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows / columns past the edge re-read valid ones (wrap) instead of masking the loads; the
    # store is masked.
    bm = rm % M
    an = rn % N
    if I64:
        bm = bm.to(tl.int64)
        an = an.to(tl.int64)
        rm = rm.to(tl.int64)
    if KIND != 2:
        acc = _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, stride_a, stride_b,
                              stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                              KIND, SCALE_K, SA_ROWS, E8M0_BIAS, EVEN_LOW, DOT_FP8, A_TYPED,
                              A_EBITS, A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL, A_PACKED,
                              B_TYPED, B_EBITS, B_MBITS, B_BIAS, B_SPECIALS, B_MIN_NORMAL,
                              B_PACKED, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        _epilogue(acc, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, M, N, stride_sa_row,
                  stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16, OUT_BF16)
    elif _mx_tile_is_fast(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, rn < N, rm < M, K, KS,
                          stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row,
                          stride_sb_k, SCALE_K, A_TYPED, A_PACKED, A_MAG, A_LO, A_HI, B_TYPED,
                          B_PACKED, B_MAG, B_LO, B_HI, BLOCK_M, BLOCK_N, BLOCK_K):
        acc = _mx_scaled_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, KS, stride_a, stride_b,
                              stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k, SCALE_K,
                              E8M0_BIAS, EVEN_LOW, A_TYPED, A_EBITS, A_MBITS, A_BIAS,
                              A_SPECIALS, A_MIN_NORMAL, A_PACKED, B_TYPED, B_EBITS, B_MBITS,
                              B_BIAS, B_SPECIALS, B_MIN_NORMAL, B_PACKED, F32_OPERANDS, EVEN_K,
                              BLOCK_M, BLOCK_N, BLOCK_K)
        _epilogue(acc, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, M, N, stride_sa_row,
                  stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16, OUT_BF16)
    else:
        # Exact fallback, one 32-long scale block per step.  It keeps a partial product beside
        # the accumulator, so it covers the tile in two column halves: its registers then
        # peak where the fast path's do (no spills leaking into the fast loop).
        HALF: tl.constexpr = BLOCK_N // 2
        for h in tl.static_range(2):
            rn_h = pid_n * BLOCK_N + h * HALF + tl.arange(0, HALF)
            an_h = rn_h % N
            if I64:
                an_h = an_h.to(tl.int64)
            acc_h = _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an_h, bm, K, stride_a,
                                    stride_b, stride_sa_row, stride_sa_k, stride_sb_row,
                                    stride_sb_k, KIND, SCALE_K, SA_ROWS, E8M0_BIAS, EVEN_LOW,
                                    False, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS,
                                    A_MIN_NORMAL, A_PACKED, B_TYPED, B_EBITS, B_MBITS, B_BIAS,
                                    B_SPECIALS, B_MIN_NORMAL, B_PACKED, EVEN_SCALE_K, BLOCK_M,
                                    HALF, SCALE_K)
            _epilogue(acc_h, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn_h, bm, an_h, M, N,
                      stride_sa_row, stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16,
                      OUT_BF16)


# ---- formats and targets ----------------------------------------------------------------------

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


def _native_fp8_formats(device) -> frozenset:
    """FP8 formats this device's tensor cores multiply natively (through Triton's fp8 types)."""
    if INTERPRET or torch.device(device).type != "cuda":
        return frozenset()
    if torch.version.hip is not None:
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
    """Whether the kernel multiplies these formats natively (else decodes both to fp16)."""
    native = _native_fp8_formats(device)
    return fmt_a in native and fmt_b in native


# ---- configs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class QGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # AMD-only launch options (Triton on CUDA rejects them): passed on ROCm only.
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None

    def launch_options(self) -> dict:
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if torch.version.hip is not None and not INTERPRET:
            if self.waves_per_eu is not None:
                opts["waves_per_eu"] = self.waves_per_eu
            if self.matrix_instr_nonkdim is not None:
                opts["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
        return opts

    def name(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}_s{self.num_stages}")


_C = QGemmConfig
# Interpreter: small asymmetric blocks so CI shapes (M, N <= 48, K <= 256) span several
# programs, M/N/K tails, for block scaling several K steps per 128-long scale block, and for
# MX two 32-long scale blocks per K step (the fast path's per-element scale expansion).
_INTERPRETER = _C(16, 32, 64, 2, 4, 1)
# NVIDIA (H100: 132 SMs, 228 KB smem/SM, 255 registers/thread).  Native FP8 per-tensor /
# per-row: 128x256x128 x 3 stages = 144 KB smem, 224 registers (the shape of Triton's FP8
# matmul tutorial config).  Block / MX keep a second (BM, BN) fp32 tile (the partial
# product) live, which spills at 128x256 (cross-compiled for sm_90 with triton 3.9: 255
# registers + 160-208 B stack), so 128x128.  MX steps 32 along K (one E8M0 scale per step),
# hence deeper pipelines.  Decoded (fp16) operands: half the K depth of FP8.
_CUDA = {
    ("fp8", True, "large"): _C(128, 256, 128, 8, 8, 3),
    ("fp8", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "large"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("mx", True, "large"): _C(128, 128, 32, 8, 8, 6),
    ("mx", True, "small"): _C(128, 128, 32, 8, 8, 6),
    ("fp8", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("fp8", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("mx", False, "large"): _C(128, 128, 32, 8, 8, 4),
    ("mx", False, "small"): _C(128, 128, 32, 8, 8, 4),
}
# ROCm (MI300 / MI350, unmeasured): 64 KB LDS -> 2 stages (the stream pipeliner keeps one tile
# in registers), 16x16 MFMA, wavefronts of 64.  Cross-compiled with triton 3.9: 256x256x64
# native FP8 spills 32 VGPRs on gfx942, 256x128x128 none (228 VGPRs).
_HIP_OPTS = dict(waves_per_eu=0, matrix_instr_nonkdim=16)
_HIP = {
    ("fp8", True): _C(256, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("block", True): _C(128, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("mx", True): _C(128, 128, 32, 8, 8, 2, **_HIP_OPTS),
    ("fp8", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("block", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("mx", False): _C(128, 128, 32, 8, 8, 2, **_HIP_OPTS),
}
# Tried in order when a config does not fit the device (OutOfResources).
_FALLBACKS = (_C(128, 128, 32, 8, 4, 3), _C(64, 64, 32, 8, 4, 2), _C(32, 32, 32, 4, 4, 1))
_working: dict[tuple, QGemmConfig] = {}  # table key -> a config that compiled on this device


def _scale_k(kind: str) -> int | None:
    return {"block": _BLOCK_SCALE_K, "mx": _MX_SCALE_K}.get(kind)


def _table_key(kind: str, native: bool, m: int, n: int, device) -> tuple:
    if torch.version.hip is not None:
        return ("hip", kind, native)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    big = triton.cdiv(m, 128) * triton.cdiv(n, 256) >= sms
    return (kind, native, "large" if big else "small")


def pick_config(kind: str, native: bool, m: int, n: int, device) -> QGemmConfig:
    """The fixed config for this problem (the interpreter always uses one small config)."""
    if INTERPRET:
        return _INTERPRETER
    key = _table_key(kind, native, m, n, device)
    return _working.get(key) or (_HIP[key[1:]] if key[0] == "hip" else _CUDA[key])


# ---- host side --------------------------------------------------------------------------------

def _scale_operand(recipe, scales: torch.Tensor, rows: int, k: int, name: str):
    """(scales as the kernel reads them, row stride, K stride, rows per scale row)."""
    if isinstance(recipe, R.MXBlockScaling):
        want, per = (rows, triton.cdiv(k, _MX_SCALE_K)), 1
        s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    elif isinstance(recipe, R.Float8BlockScaling):
        per = recipe.block[0]
        want = (triton.cdiv(rows, per), triton.cdiv(k, _BLOCK_SCALE_K))
        s = scales
    else:
        row = isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row"
        require(scales.numel() == (rows if row else 1),
                 f"{name} scales: {'one per row' if row else 'one per tensor'} expected "
                 f"({rows if row else 1}), got shape {tuple(scales.shape)}")
        s = scales.reshape(-1)
        return s, (s.stride(0) if row else 0), 0, 1
    require(tuple(s.shape) == want,
             f"{name} scales: shape {want} expected for {R.describe(recipe)}, got {tuple(s.shape)}")
    return s, s.stride(0), s.stride(1), per


def _codes_operand(codes: torch.Tensor, fmt: str, rows: int, k: int, typed: bool, name: str):
    """The codes as the kernel reads them: their torch FP8 dtype where ``typed`` (the device
    converts / multiplies that format natively), else bytes."""
    f = get_format(fmt)
    want = (rows, triton.cdiv(k, 2) if f.packed else k)
    require(tuple(codes.shape) == want,
             f"{name} codes: shape {want} expected for {fmt}, got {tuple(codes.shape)}")
    if codes.stride(1) != 1 and codes.numel():  # the kernel assumes unit stride along K
        codes = codes.contiguous()
    return codes.view(f.torch_dtype) if typed else codes.view(torch.uint8)


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
           bias, config: QGemmConfig | None = None) -> torch.Tensor:
    """Run the kernel; ``config`` overrides the fixed choice (benchmarks)."""
    kind = "mx" if isinstance(recipe_a, R.MXBlockScaling) else \
        "block" if isinstance(recipe_a, R.Float8BlockScaling) else "fp8"
    device = a_codes.device
    native = dot_fp8(recipe_a.fmt, recipe_b.fmt, device)
    # MX converts each operand on its own (to scaled bf16), so each may use the hardware's fp8
    # conversion; the FP8 kinds multiply fp8 tiles only when both formats are native.
    typed_a, typed_b = (native, native) if kind != "mx" else \
        (recipe_a.fmt in _native_fp8_formats(device), recipe_b.fmt in _native_fp8_formats(device))
    a = _codes_operand(a_codes, recipe_a.fmt, n, k, typed_a, "a")
    b = _codes_operand(b_codes, recipe_b.fmt, m, k, typed_b, "b")
    sa, sa_row, sa_k, sa_rows = _scale_operand(recipe_a, a_scales, n, k, "a")
    sb, sb_row, sb_k, sb_rows = _scale_operand(recipe_b, b_scales, m, k, "b")
    require(sb_rows == 1, "b (activations) must use 1x128 block scaling")
    out = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return out
    bias_arg = as_kernel_arg(bias.contiguous()) if bias is not None else out
    args = (a, b, sa, sb, bias_arg, as_kernel_arg(out), m, n, k, triton.cdiv(k, _MX_SCALE_K),
            a.stride(0), b.stride(0),
            sa_row, sa_k, sb_row, sb_k, out.stride(0))
    flags = dict(KIND=_KINDS[kind], SCALE_K=_scale_k(kind) or 1, SA_ROWS=sa_rows,
                 E8M0_BIAS=_E8M0_BIAS, EVEN_LOW=_E2M1_EVEN_IN_LOW_NIBBLE,
                 DOT_FP8=native and kind != "mx", F32_OPERANDS=INTERPRET, A_TYPED=typed_a,
                 B_TYPED=typed_b, HAS_BIAS=bias is not None,
                 BIAS_BF16=bias is not None and bias.dtype == torch.bfloat16,
                 OUT_BF16=out_dtype == torch.bfloat16,
                 I64=max(_span(a), _span(b), _span(out)) + 256 > _INT32_MAX,
                 **_operand_constants("A", recipe_a.fmt), **_operand_constants("B", recipe_b.fmt))
    chosen = config or pick_config(kind, native, m, n, device)
    tries = (chosen,) if config is not None or INTERPRET else (chosen, *_FALLBACKS)
    for i, cfg in enumerate(tries):
        try:
            _launch_one(cfg, args, flags, kind, m, n, k)
            if i:  # remember what fits this device for this key
                _working[_table_key(kind, native, m, n, device)] = cfg
            return out
        except OutOfResources:
            if i == len(tries) - 1:
                raise
    return out


def _operand_constants(prefix: str, fmt: str) -> dict:
    lo, hi = _fast_byte_range(fmt, _E8M0_BIAS)
    return {f"{prefix}_{c}": v for c, v in dict(_decode_constants(fmt), LO=lo, HI=hi).items()}


def _launch_one(cfg: QGemmConfig, args, flags, kind: str, m: int, n: int, k: int) -> None:
    block_k = cfg.block_k
    if kind == "block":  # a K step never straddles two scale blocks
        block_k = min(block_k, _BLOCK_SCALE_K)
        require(_BLOCK_SCALE_K % block_k == 0, f"BLOCK_K {block_k} must divide the scale "
                                                f"block {_BLOCK_SCALE_K}")
    if kind == "mx":  # a K step holds whole scale blocks (its scales expand per element)
        require(block_k % _MX_SCALE_K == 0, f"BLOCK_K {block_k} must be a multiple of the MX "
                                             f"scale block {_MX_SCALE_K}")
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _qgemm_kernel[grid](*args, **flags, EVEN_K=k % block_k == 0,
                        EVEN_SCALE_K=k % _MX_SCALE_K == 0, BLOCK_M=cfg.block_m,
                        BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
                        **cfg.launch_options())


# ---- registration -----------------------------------------------------------------------------

def _numerics(params) -> dict:
    numerics = {"compute_dtype": torch.float32}
    kind, k = params["kind"], params["k"]
    if kind == "mx":
        # Exact products, fp32 sums, nothing else: the fast path multiplies exactly scaled
        # operands (bf16 or fp32 tensor-core / FMA products are exact, accumulated in fp32);
        # the fallback's fp16 code products are exact, summed in fp32 per 32-long block, and
        # each block sum is multiplied by its power of two exactly (below fp32's normal range
        # it loses less than the smallest normal: inside the tier's underflow term).
        return numerics
    if kind == "block":
        # Each K block's partial sum is multiplied by its two scales in fp32 before it is added
        # (two roundings per partial): the tier's "each operand rounded once in fp32" term,
        # 2u * |B||A|.
        numerics["operands_dequantized_to"] = torch.float32
    if (params["device"] == "cuda" and torch.version.hip is None
            and dot_fp8(params["fmt_a"], params["fmt_b"], torch.device("cuda"))):
        if kind == "fp8":
            # acc is the WGMMA accumulator over all of K (Triton's sm_90 default never promotes
            # FP8 dot partial sums), so model the whole sum at ~14 bits, as scaled_mm does.
            numerics["accumulator_unit_roundoff"] = _FP8_MMA_UNIT_ROUNDOFF
        elif k > 0:
            # A fresh dot per scale block: at most min(K, scale block) terms summed at ~14 bits,
            # then at most K partials summed in fp32.  The tier bounds gamma_K(u) |B||A| and
            # gamma_K(u) >= K u, so u = (that sum's bound) / K is a true declaration.
            inner = min(k, _scale_k(kind))
            u = (_gamma(inner, _FP8_MMA_UNIT_ROUNDOFF) + _gamma(k, 2.0**-24)) / k
            numerics["accumulator_unit_roundoff"] = max(u, 2.0**-24)
    return numerics


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u) if n * u < 1 else math.inf


@BACKEND.implements("qgemm", dtypes=_FLOATS, devices=DEVICES, numerics=_numerics)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    out = launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m=m, n=n, k=k,
                 out_dtype=out_dtype, bias=bias)
    return out, {}
