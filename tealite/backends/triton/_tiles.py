"""The @triton.jit tile helpers of the bf16 / fp16 / fp32 GEMM (see gemm.py for the design and
numerics), shared by the dense kernel (gemm.py), the quantized one (qgemm.py) and the grouped
ones (_grouped_kernels.py): a grouped tile runs exactly the dense kernel's tile code."""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._io import load_f32, store_f32


@triton.jit
def grouped_pid(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` with GROUP_M row-blocks walked column by column, so
    consecutive programs share A and B tiles in L2 (the last group may be shorter)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def gelu_erf_f32(x):
    """Exact (erf) GELU in fp32, as torch's gelu(approximate='none'): x/2 * (1 + erf(x/sqrt2))."""
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def epilogue_store(acc, d_ptr, pre_ptr, bias_ptr, rm, rn, M, N, stride_dm, alpha, beta,
                   HAS_BETA: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
                   OUT_BF16: tl.constexpr, BIAS_BF16: tl.constexpr):
    """fp32 epilogue of an (BM, BN) fp32 accumulator tile at rows ``rm``, columns ``rn``:
    pre = alpha*acc + beta*D_prior + bias; D = gelu(pre) or pre; each output rounded once.

    D (and the pre-activation) have unit stride along N.  bf16 tensors travel as int16 bits
    (_io.py: RNE stores and exact loads, also in the interpreter).
    """
    mask_n = rn < N
    mask = (rm[:, None] < M) & mask_n[None, :]
    offs = rm[:, None] * stride_dm + rn[None, :]
    pre = acc * alpha
    if HAS_BETA:
        pre += beta * load_f32(d_ptr, offs, mask, OUT_BF16)
    if HAS_BIAS:
        pre += load_f32(bias_ptr, rn, mask_n, BIAS_BF16)[None, :]
    if GELU:
        store_f32(pre_ptr, offs, pre, mask, OUT_BF16)
        store_f32(d_ptr, offs, gelu_erf_f32(pre), mask, OUT_BF16)
    else:
        store_f32(d_ptr, offs, pre, mask, OUT_BF16)


@triton.jit
def tile_pointers(x_ptr, y_ptr, xm, yn, rk, stride_x, stride_y, X_K_CONTIG: tl.constexpr,
                  Y_K_CONTIG: tl.constexpr, BLOCK_K: tl.constexpr):
    """(x_ptrs, x_step, y_ptrs, y_step) of the tile at X rows ``xm`` and Y columns ``yn``, each
    in its storage orientation (contiguous dim last; tile_k_loop transposes in registers)."""
    if X_K_CONTIG:
        x_ptrs = x_ptr + xm[:, None] * stride_x + rk[None, :]  # (BLOCK_M, BLOCK_K)
        x_step = BLOCK_K
    else:
        x_ptrs = x_ptr + xm[None, :] + rk[:, None] * stride_x  # (BLOCK_K, BLOCK_M)
        x_step = BLOCK_K * stride_x
    if Y_K_CONTIG:
        y_ptrs = y_ptr + rk[None, :] + yn[:, None] * stride_y  # (BLOCK_N, BLOCK_K)
        y_step = BLOCK_K
    else:
        y_ptrs = y_ptr + rk[:, None] * stride_y + yn[None, :]  # (BLOCK_K, BLOCK_N)
        y_step = BLOCK_K * stride_y
    return x_ptrs, x_step, y_ptrs, y_step


@triton.jit
def tile_k_loop(x_ptrs, y_ptrs, x_step, y_step, rk, K, X_K_CONTIG: tl.constexpr,
                Y_K_CONTIG: tl.constexpr, BF16_BITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """The fp32 accumulator of one (BLOCK_M, BLOCK_N) tile: K walked in BLOCK_K steps from the
    tile pointers ``x_ptrs`` / ``y_ptrs`` (storage orientation, see _gemm_kernel), one
    ``tl.dot`` per step.  Shared by the dense kernel and the grouped one (grouped_gemm.py), so
    a grouped tile sums its products in exactly the dense kernel's order."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs)
            y = tl.load(y_ptrs)
        else:
            k_left = K - kb * BLOCK_K
            if X_K_CONTIG:
                x = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0)
            else:
                x = tl.load(x_ptrs, mask=rk[:, None] < k_left, other=0)
            if Y_K_CONTIG:
                y = tl.load(y_ptrs, mask=rk[None, :] < k_left, other=0)
            else:
                y = tl.load(y_ptrs, mask=rk[:, None] < k_left, other=0)
        if not X_K_CONTIG:
            x = tl.trans(x)
        if Y_K_CONTIG:
            y = tl.trans(y)
        if BF16_BITS:
            # Interpreter only: its bf16 tl.dot multiplies raw bit patterns, so bf16 arrives as
            # int16 bits and is widened exactly to fp32 (products stay exact, see module doc).
            x = (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
            y = (y.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        acc = tl.dot(x, y, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
        x_ptrs += x_step
        y_ptrs += y_step
    return acc
