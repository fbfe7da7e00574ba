"""MX GEMM with the E8M0 scales applied in the accumulator (qgemm.py ``VARIANTS["mx"] ==
"acc"``; the default, "fold", scales the operands: _qgemm_operands.py).

Per 32-long scale block along K, one FP8 ``tl.dot`` of the raw codes (K = 32: one wgmma k32
on sm_90) into a fresh fp32 tile ``part``, then ``acc = fma(part, s, acc)`` with ``s[i, j] =
2^(e_B[i] + e_A[j] - 2 bias)`` built as the product of the two scale vectors' powers of two.
A K step of BLOCK_K = 32 NS holds NS blocks, unrolled (``tl.static_range``); their scale bytes
are fetched one step ahead.  Per element and block that is one multiply and one FMA on the
CUDA cores beside 32 tensor-core MACs: on an H100 (128 fp32 lanes, ~4096 FP8 MACs per clock
and SM) the scaling takes about twice the MMA's time, so the variant is CUDA-core bound at
roughly half the FP8 peak, unless it overlaps across warps.

Exactness: ``s`` is exact when e_B + e_A - 2 bias lies in fp32's range, subnormals included
([-149, 127]); the FMA then adds the exact product ``part x s`` with one rounding.  Each tile
checks that on its scale bytes (``mx_acc_tile_exact``: the extreme bytes bound every pair,
and 0xFF, NaN, is out); a tile that fails runs the same loop with ``_times_e8m0_pair`` (the power
split in two normal halves, 0xFF gives NaN): exact where the result is a normal fp32.

Numerics (qgemm.py ``_dense_numerics``): on NVIDIA each block is a fresh FP8 MMA (products cut
at 2^(E - 13), subnormal codes aligned at the smallest normal: the per-tensor kind's model) of
at most 32 products, its partial scaled exactly and added in fp32 (a K/32-term fp32 sum).
Block c errs by <= gamma_32(2^-13) max(|B_c||A_c|, L_c) <= gamma_32(2^-13) max(|B||A|, L) (L:
the largest product, subnormal codes lifted: ``alignment_floor``), so the tier's gamma_K(u)
max(|B||A|, L) >= K u (...) covers the ceil(K/32) blocks with K u = ceil(K/32)
gamma_32(2^-13) + gamma_ceil(K/32)(2^-24): u is just above 2^-13, as loose as per-tensor FP8
(the tier has no per-block maxima).  In the interpreter (no FP8 MMA) the codes are decoded to
fp32 and multiplied exactly (``input_precision="ieee"``): fp32 sums throughout, the default.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from tealite._checks import require
from tealite.backends.triton import INTERPRET, PLATFORM
from tealite.backends.triton._qgemm_operands import (_byte_range, _decode_f32, _load_u8, dot_fp8,
                                                     _times_e8m0_pair)


# Kernel variants, chosen on the host (qgemm.py imports this dict as its own).  "mx": "fold"
# (the E8M0 scales folded exactly into bf16 operands inside the GEMM: _qgemm_operands.py),
# "acc" (this module; dense qgemm, OCP FP8 codes on both sides, NVIDIA or the interpreter;
# its own declared rounding), "staged" (dense qgemm: operands staged once as exact bf16, a
# bf16 GEMM, an exact fixup: _qgemm_mx_staged.py) or "auto" (the default: "staged" where
# ``_qgemm_mx_staged.staged_pays``, else "fold").  "acc" stays opt-in: on the H100's Triton 3.6
# every "acc" config failed to compile (PassManager failure in TritonGPUPipeline, fifth
# session; Triton 3.9 cross-compiles it), so it is untimed.
# TEALITE_TRITON_QGEMM_MX chooses one at import (for processes such as fuzz workers).
MX_VARIANTS = ("auto", "fold", "acc", "staged")
VARIANTS = {"mx": os.environ.get("TEALITE_TRITON_QGEMM_MX", "auto")}
require(VARIANTS["mx"] in MX_VARIANTS,
        f"TEALITE_TRITON_QGEMM_MX must be one of {MX_VARIANTS}, got {VARIANTS['mx']!r}")

@triton.jit
def _column(x, j: tl.constexpr, NS: tl.constexpr):
    """Column ``j`` of the (R, NS) int32 tile ``x`` (exact: one term, the rest zeros)."""
    rs = tl.arange(0, NS)
    return tl.sum(tl.where(rs[None, :] == j, x, 0), axis=1)


@triton.jit
def _pow2_f32(byte, E8M0_BIAS: tl.constexpr):
    """2^(byte - E8M0_BIAS) as fp32 from its bits, for bytes whose power is an fp32 number
    (normal, or subnormal down to 2^-149): the tile check keeps the bytes there."""
    e = byte + (127 - E8M0_BIAS)  # fp32 exponent field of a normal power
    sub = 1 << tl.minimum(tl.maximum(22 + e, 0), 22)  # 2^(e - 127) below the normal range
    return tl.where(e > 0, e << 23, sub).to(tl.float32, bitcast=True)


@triton.jit
def mx_acc_tile_exact(sa_ptr, sb_ptr, an, bm, an_ok, bm_ok, n_scales, stride_sa_row,
                      stride_sa_k, stride_sb_row, stride_sb_k, E8M0_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Whether this tile needs the exact pair scaling: unless every scale pair has an fp32
    power 2^(b + a - 2 bias) (exact, subnormal or not) and no byte is 0xFF (NaN), when
    ``fma(part, s, acc)`` is exact but for its one rounding.  The extreme bytes of each side
    bound every pair."""
    b_lo, b_hi = _byte_range(sb_ptr, bm, bm_ok, stride_sb_row, stride_sb_k, n_scales, E8M0_BIAS,
                             BLOCK_M)
    a_lo, a_hi = _byte_range(sa_ptr, an, an_ok, stride_sa_row, stride_sa_k, n_scales, E8M0_BIAS,
                             BLOCK_N)
    return (b_hi == 255) | (a_hi == 255) | (b_hi + a_hi > 2 * E8M0_BIAS + 127) | \
        (b_lo + a_lo < 2 * E8M0_BIAS - 149)


@triton.jit
def _codes(ptrs, mask, TYPED: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
           BIAS: tl.constexpr, SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr,
           EVEN_K: tl.constexpr):
    """A code tile as the dot takes it: the fp8 tile itself where typed (the tensor cores
    multiply it), else its exact fp32 values (0 where masked)."""
    if TYPED:
        if EVEN_K:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = _decode_f32(_load_u8(ptrs, mask, EVEN_K), EBITS, MBITS, BIAS, SPECIALS, MIN_NORMAL)
    return x


@triton.jit
def mx_acc_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, n_scales, stride_a, stride_b,
                stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                exact, SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr,
                A_TYPED: tl.constexpr, A_EBITS: tl.constexpr, A_MBITS: tl.constexpr,
                A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr,
                B_TYPED: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr,
                B_BIAS: tl.constexpr, B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr,
                EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """acc = sum over 32-long K blocks c of (B_c A_c^T) x 2^(e_B[:, c] + e_A[:, c] - 2 bias):
    ``exact`` (``mx_acc_tile_exact``: a runtime flag, uniform over the tile) False: one
    multiply and one FMA per element; True: ``_times_e8m0_pair``.  One loop for both, so one
    set of pipeline buffers (two loops had two: twice the shared memory)."""
    NS: tl.constexpr = BLOCK_K // SCALE_K
    IEEE: tl.constexpr = not (A_TYPED and B_TYPED)  # decoded fp32 codes: exact FMA products
    rk = tl.arange(0, SCALE_K)
    rs = tl.arange(0, NS)
    b_ptrs = b_ptr + bm[:, None] * stride_b + rk[None, :]
    a_ptrs = a_ptr + rk[:, None] + an[None, :] * stride_a  # (32, BN): K down the rows
    sb_ptrs = sb_ptr + bm[:, None] * stride_sb_row + rs[None, :] * stride_sb_k
    sa_ptrs = sa_ptr + an[:, None] * stride_sa_row + rs[None, :] * stride_sa_k
    # Scale bytes one step ahead by hand: Triton's pipeliner leaves sub-32-bit loads in place.
    s_mask = rs[None, :] < n_scales
    sb_byte = tl.load(sb_ptrs, mask=s_mask, other=E8M0_BIAS).to(tl.int32)
    sa_byte = tl.load(sa_ptrs, mask=s_mask, other=E8M0_BIAS).to(tl.int32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        sb_ptrs += NS * stride_sb_k
        sa_ptrs += NS * stride_sa_k
        s_mask = ((kb + 1) * NS + rs)[None, :] < n_scales
        sb_next = tl.load(sb_ptrs, mask=s_mask, other=E8M0_BIAS).to(tl.int32)
        sa_next = tl.load(sa_ptrs, mask=s_mask, other=E8M0_BIAS).to(tl.int32)
        for j in tl.static_range(NS):
            k_left = K - kb * BLOCK_K - j * SCALE_K
            b = _codes(b_ptrs + j * SCALE_K, rk[None, :] < k_left, B_TYPED, B_EBITS, B_MBITS,
                       B_BIAS, B_SPECIALS, B_MIN_NORMAL, EVEN_K)
            a = _codes(a_ptrs + j * SCALE_K, rk[:, None] < k_left, A_TYPED, A_EBITS, A_MBITS,
                       A_BIAS, A_SPECIALS, A_MIN_NORMAL, EVEN_K)
            if IEEE:
                part = tl.dot(b, a, input_precision="ieee", out_dtype=tl.float32)
            else:  # FP8 tiles: the tensor cores' FP8 MMA, a fresh accumulator per block
                part = tl.dot(b, a, out_dtype=tl.float32)
            byte_b = _column(sb_byte, j, NS)
            byte_a = _column(sa_byte, j, NS)
            if exact:
                acc += _times_e8m0_pair(part, byte_b, byte_a, E8M0_BIAS)
            else:
                s = _pow2_f32(byte_b, E8M0_BIAS)[:, None] * _pow2_f32(byte_a, E8M0_BIAS)[None, :]
                acc = tl.fma(part, s, acc)
        b_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        sb_byte = sb_next
        sa_byte = sa_next
    return acc


@triton.jit
def mx_acc_product(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, an_ok, bm_ok, K, n_scales, stride_a,
                   stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                   SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr, A_TYPED: tl.constexpr,
                   A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr,
                   A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr, B_TYPED: tl.constexpr,
                   B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                   B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tile's fp32 product (before the epilogue): exact pair scaling where
    ``mx_acc_tile_exact``, else the fast scaling, in one loop."""
    exact = mx_acc_tile_exact(sa_ptr, sb_ptr, an, bm, an_ok, bm_ok, n_scales, stride_sa_row,
                              stride_sa_k, stride_sb_row, stride_sb_k, E8M0_BIAS, BLOCK_M,
                              BLOCK_N)
    return mx_acc_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, n_scales, stride_a, stride_b,
                       stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k, exact, SCALE_K,
                       E8M0_BIAS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL,
                       B_TYPED, B_EBITS, B_MBITS, B_BIAS, B_SPECIALS, B_MIN_NORMAL, EVEN_K,
                       BLOCK_M, BLOCK_N, BLOCK_K)


# ---- host side ----------------------------------------------------------------------------------

def mx_acc_fits(kind: str, fmt_a: str, fmt_b: str, device) -> bool:
    """Whether the variant can run these operands: MX with OCP FP8 codes on both sides,
    multiplied natively (NVIDIA sm_89+) or interpreted.  ROCm (its FP8 MMA's rounding is not
    measured here) and MXFP4 / FNUZ codes keep the folded path."""
    if kind != "mx" or PLATFORM.get().rocm or not {fmt_a, fmt_b} <= {"e4m3", "e5m2"}:
        return False
    return INTERPRET or dot_fp8(fmt_a, fmt_b, device)


def mx_acc_runs(kind: str, fmt_a: str, fmt_b: str, device) -> bool:
    """Whether dense qgemm runs the variant: chosen (VARIANTS) and it fits."""
    return VARIANTS["mx"] == "acc" and mx_acc_fits(kind, fmt_a, fmt_b, device)
