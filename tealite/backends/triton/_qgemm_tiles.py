"""Tile-level pieces of the quantized GEMM (qgemm.py's design and numerics): the per-block
partial-product loop (FP8 per-tensor / per-row / block, and MX's exact fallback), the
epilogue, and one MX output tile routed to the fast path or the fallback.  Shared by the dense
kernel (qgemm.py), the grouped one (_grouped_kernels.py) and the staged MX fixup
(_qgemm_mx_staged.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._io import load_f32, store_f32
from tealite.backends.triton._qgemm_operands import (
    _decode_f32, _load_codes_f32, _load_e2m1_f32, _load_u8, _mx_scaled_loop, _mx_tile_is_fast,
    _times_e8m0_pair)
from tealite.backends.triton._tiles import grouped_pid


@triton.jit
def _tile_coords(tile, M, N, I64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(rm, rn, bm, an, n0) of output tile ``tile`` in grouped order: its rows and columns,
    the rows / columns its loads read (past the edge they re-read valid ones instead of
    masking the loads; the store is masked), and its first column."""
    pid_m, pid_n = grouped_pid(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bm = rm % M
    an = rn % N
    if I64:
        bm = bm.to(tl.int64)
        an = an.to(tl.int64)
        rm = rm.to(tl.int64)
    return rm, rn, bm, an, pid_n * BLOCK_N


# ---- per-block partial products: FP8 per-tensor / per-row / block, and MX's exact fallback -----

@triton.jit
def _dot(b, a, acc, IEEE: tl.constexpr):
    if IEEE:  # fp32 operands: exact FMA products (Triton's NVIDIA default would be TF32)
        return tl.dot(b, a, acc, input_precision="ieee", out_dtype=tl.float32)
    else:
        return tl.dot(b, a, acc, out_dtype=tl.float32)


@triton.jit
def _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, stride_a, stride_b,
                    stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                    KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                    E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr, DOT_FP8: tl.constexpr,
                    F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr, A_EBITS: tl.constexpr,
                    A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr,
                    A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr, B_TYPED: tl.constexpr,
                    B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                    B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
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
            # Codes -> their exact values as bf16 (no native dot for this format pair here, or
            # MX's fallback): every FP8 / E2M1 value is a NORMAL bf16 number, whereas fp16 would
            # hold e5m2's subnormal codes as fp16 subnormals, which H100 tensor cores align at
            # the smallest normal exponent (tolerance.aligned_magnitude).  fp32 in the
            # interpreter (its bf16 dot is garbage): the same values.
            b = _load_codes_f32(b_ptrs, rk, rkh, k_left, B_TYPED, B_PACKED, B_EBITS, B_MBITS,
                                B_BIAS, B_SPECIALS, B_MIN_NORMAL, EVEN_K, EVEN_LOW)
            if A_PACKED:
                a = tl.trans(_load_e2m1_f32(a_ptrs, rkh[None, :], k_left, EVEN_K, EVEN_LOW))
            elif A_TYPED:
                if EVEN_K:
                    a = tl.load(a_ptrs).to(tl.float32)
                else:
                    a = tl.load(a_ptrs, mask=rk[:, None] < k_left, other=0.0).to(tl.float32)
            else:
                a = _decode_f32(_load_u8(a_ptrs, rk[:, None] < k_left, EVEN_K), A_EBITS,
                                A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL)
            if not F32_OPERANDS:
                b = b.to(tl.bfloat16)
                a = a.to(tl.bfloat16)
        IEEE: tl.constexpr = F32_OPERANDS and not DOT_FP8
        if KIND == 0:
            acc = _dot(b, a, acc, IEEE)
        else:
            # A fresh dot per scale block: its partial sum is scaled in fp32 before joining acc.
            part = _dot(b, a, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), IEEE)
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
def _mx_tile(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, n0, M, N, K, KS,
             stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
             stride_om, SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr,
             F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr, A_EBITS: tl.constexpr,
             A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr,
             A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr, A_MAG: tl.constexpr,
             A_LO: tl.constexpr, A_HI: tl.constexpr, B_TYPED: tl.constexpr,
             B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
             B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
             B_MAG: tl.constexpr, B_LO: tl.constexpr, B_HI: tl.constexpr,
             HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
             I64: tl.constexpr, EVEN_K: tl.constexpr, EVEN_SCALE_K: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One MX output tile: rows ``rm`` (``bm`` their wrapped reads, ``rm < M`` stored) and
    columns ``rn`` = ``n0`` + arange (``an`` wrapped), through the fast path or the exact
    fallback (the module docstring).  Shared by the dense kernel and the grouped one
    (_grouped_kernels.py), which passes one group's pointers and its row end as ``M``."""
    KIND: tl.constexpr = 2
    SA_ROWS: tl.constexpr = 1
    if _mx_tile_is_fast(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, rn < N, rm < M, K, KS,
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
            rn_h = n0 + h * HALF + tl.arange(0, HALF)
            an_h = rn_h % N
            if I64:
                an_h = an_h.to(tl.int64)
            acc_h = _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an_h, bm, K, stride_a,
                                    stride_b, stride_sa_row, stride_sa_k, stride_sb_row,
                                    stride_sb_k, KIND, SCALE_K, SA_ROWS, E8M0_BIAS, EVEN_LOW,
                                    False, F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS,
                                    A_SPECIALS, A_MIN_NORMAL, A_PACKED, B_TYPED, B_EBITS,
                                    B_MBITS, B_BIAS, B_SPECIALS, B_MIN_NORMAL, B_PACKED,
                                    EVEN_SCALE_K, BLOCK_M, HALF, SCALE_K)
            _epilogue(acc_h, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn_h, bm, an_h, M, N,
                      stride_sa_row, stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16,
                      OUT_BF16)
