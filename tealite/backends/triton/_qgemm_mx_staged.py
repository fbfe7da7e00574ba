"""MX GEMM in two passes where the device has no MX tensor cores (Hopper): stage each operand
once as exactly scaled bf16, multiply the staged operands with tealite's bf16 GEMM, then redo
exactly the few output tiles whose rows are not exact in bf16 (qgemm.py ``VARIANTS["mx"]``
"staged"; "auto" picks it for large problems on NVIDIA).

Why: the folded kernel (qgemm.py) converts an A tile once per column tile of the output and a
B tile once per row tile, on the CUDA cores, between its wgmmas: at 8192^3 each operand element
is converted 64 times, and the kernel runs at 22 % of the per-tensor FP8 qgemm on an H100.
Staged, each element is converted once (a memory-bound pass: 1 byte read, 2 written, 2 read
back by the GEMM), and the GEMM runs at the bf16 tensor cores' rate.  The price: (M + N) x K
bf16 of scratch, and for skinny problems more memory traffic than the folded kernel's (hence
the size rule in ``staged_pays``).

Exactness is the folded path's (_qgemm_operands.py): a staged value code x 2^(byte - 127) is
exact in bf16 when the byte lies in the format's fast range, or when it lies below it and the
code is 0.  The stage pass marks every row holding any other element (a byte above the range,
NaN 0xFF included, or a nonzero code under a byte below it) in a per-row int32 flag, and an
any-row word after the rows.  The fixup launch (persistent) reads the two any-row words and,
only when one is set, walks the output tiles: a tile whose A and B rows are all unflagged is
skipped; any other tile is recomputed by the folded kernel's own tile (``_mx_tile``: its tile
check sends it to the exact per-32-block fallback), overwriting what the bf16 GEMM wrote.

Numerics: the same as the folded fast path, one fp32-accumulated bf16 dot chain over all of K
of exact operands (the bf16 GEMM's tensor-core sums, ``gemm._TENSOR_CORE_U``), bias added in
fp32, one rounding to out_dtype; only the summation order (tile shape) differs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import INTERPRET, PLATFORM
from tealite.backends.triton import gemm as bf16_gemm
from tealite.backends.triton._io import as_kernel_arg, store_f32
from tealite.backends.triton._qgemm_mx_acc import VARIANTS
from tealite.backends.triton._qgemm_operands import _load_codes_f32, _per_element
from tealite.backends.triton._qgemm_tiles import _mx_tile, _tile_coords

# Stage pass tile: rows x K elements per program (a multiple of the 32-long scale block).
# Interpreter: small, so CI shapes span several programs along both axes.
_STAGE_CUDA = (32, 256, 4)
_STAGE_INTERPRETER = (8, 64, 1)
# Where "auto" stages (NVIDIA): every side at least _AUTO_MIN_SIDE and m n k at least
# _AUTO_MIN_MNK.  Measured on an H100 (docs/benchmarks.md, seventh session; MXFP8, folded ->
# staged per call): 8192^3 3579 -> 1696 us, 16384 x 4096 x 4096 1855 -> 828 us, 2048 x 8192 x
# 8192 920 -> 929 us, 4096^3 465 -> 413 us (host-bound: the staged path's five launches cost
# ~0.4 ms of host time per call), 1024 x 4096 x 4096 131 -> 368 us.
_AUTO_MIN_SIDE = 2048
_AUTO_MIN_MNK = 2**38


# Constexprs of qgemm's dense kernel that the fixup kernel does not take.
DENSE_ONLY_FLAGS = ("KIND", "SA_ROWS", "DOT_FP8", "MX_ACC")


def staged_runs(kind: str, m: int, n: int, k: int, device) -> bool:
    """Whether dense qgemm takes the staged path: MX operands, and VARIANTS["mx"] "staged",
    or "auto" where ``staged_pays``."""
    if kind != "mx":
        return False
    choice = VARIANTS["mx"]
    return choice == "staged" or (choice == "auto" and staged_pays(m, n, k, device))


def staged_pays(m: int, n: int, k: int, device) -> bool:
    """Whether "auto" takes the staged path: NVIDIA (no MX MMA on sm_90; ROCm is unmeasured and
    keeps the folded kernel), compiled, a problem large enough on every side."""
    if INTERPRET or PLATFORM.get().rocm or torch.device(device).type != "cuda":
        return False
    return min(m, n, k) >= _AUTO_MIN_SIDE and m * n * k >= _AUTO_MIN_MNK


@triton.jit
def _stage_kernel(c_ptr, s_ptr, out_ptr, flag_ptr, R, K, n_scales, stride_c, stride_s_row,
                  stride_s_k, stride_o, TYPED: tl.constexpr, PACKED: tl.constexpr,
                  EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                  SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr, LO: tl.constexpr,
                  HI: tl.constexpr, SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr,
                  EVEN_LOW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """out (R, K) bf16 = codes x 2^(byte - E8M0_BIAS) for one (BLOCK_R, BLOCK_K) tile; rows
    holding a value that is not exact there get flag 1."""
    NS: tl.constexpr = BLOCK_K // SCALE_K
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rr < R
    rw = (rr % R).to(tl.int64)  # rows past the edge re-read valid ones; stores are masked
    k0 = tl.program_id(1) * BLOCK_K
    rk = tl.arange(0, BLOCK_K)
    rkh = tl.arange(0, BLOCK_K // 2)
    if PACKED:
        ptrs = c_ptr + rw[:, None] * stride_c + k0 // 2 + rkh[None, :]
    else:
        ptrs = c_ptr + rw[:, None] * stride_c + k0 + rk[None, :]
    x = _load_codes_f32(ptrs, rk, rkh, K - k0, TYPED, PACKED, EBITS, MBITS, BIAS, SPECIALS,
                        MIN_NORMAL, False, EVEN_LOW)
    cols = tl.program_id(1) * NS + tl.arange(0, NS)
    byte = tl.load(s_ptr + rw[:, None] * stride_s_row + cols[None, :] * stride_s_k,
                   mask=cols[None, :] < n_scales, other=E8M0_BIAS).to(tl.int32)
    byte = _per_element(byte, SCALE_K, BLOCK_K)
    # 2^(byte - bias) from its exponent field, as the folded path builds it; outside the fast
    # range the product is whatever it is: such rows are flagged and their tiles redone.
    v = x * ((byte + (127 - E8M0_BIAS)) << 23).to(tl.float32, bitcast=True)
    store_f32(out_ptr, rw[:, None] * stride_o + k0 + rk[None, :], v,
              row_ok[:, None] & (rk[None, :] < K - k0), True)
    inexact = (byte > HI) | ((byte < LO) & (x != 0.0))  # x != 0 holds for NaN codes too
    row_flag = tl.max(inexact.to(tl.int32), axis=1)
    tl.atomic_max(flag_ptr + rw, row_flag, mask=row_ok & (row_flag > 0))
    # flag[R]: any row flagged (one word the fixup reads before looking at any tile)
    tl.atomic_max(flag_ptr + R, 1, mask=tl.max(row_flag, axis=0) > 0)


@triton.jit
def _fixup_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, fa_ptr, fb_ptr, M, N, K,
                  KS, stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row,
                  stride_sb_k, stride_om, SCALE_K: tl.constexpr, E8M0_BIAS: tl.constexpr,
                  EVEN_LOW: tl.constexpr, F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr,
                  A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr,
                  A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr,
                  A_MAG: tl.constexpr, A_LO: tl.constexpr, A_HI: tl.constexpr,
                  B_TYPED: tl.constexpr, B_EBITS: tl.constexpr, B_MBITS: tl.constexpr,
                  B_BIAS: tl.constexpr, B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr,
                  B_PACKED: tl.constexpr, B_MAG: tl.constexpr, B_LO: tl.constexpr,
                  B_HI: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr,
                  OUT_BF16: tl.constexpr, I64: tl.constexpr, EVEN_K: tl.constexpr,
                  EVEN_SCALE_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Recompute, with the folded kernel's tile, every output tile touching a flagged row.
    Persistent (a few programs per SM), and nothing to do unless some row is flagged: each
    operand's flag array ends in an any-row word.  (One program per tile, each loading its
    rows' flags, took 18 us at 8192^3 on an H100 with no row flagged.)"""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if tl.load(fa_ptr + N) + tl.load(fb_ptr + M) == 0:  # no flagged row at all: the usual case
        tiles = 0
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        rm, rn, bm, an, n0 = _tile_coords(tile, M, N, I64, BLOCK_M, BLOCK_N, GROUP_M)
        flagged = tl.max(tl.load(fb_ptr + bm), axis=0) + tl.max(tl.load(fa_ptr + an), axis=0)
        if flagged > 0:
            _mx_tile(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, n0, M, N,
                     K, KS, stride_a, stride_b, stride_sa_row,
                     stride_sa_k, stride_sb_row, stride_sb_k, stride_om, SCALE_K, E8M0_BIAS,
                     EVEN_LOW, F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS,
                     A_MIN_NORMAL, A_PACKED, A_MAG, A_LO, A_HI, B_TYPED, B_EBITS, B_MBITS,
                     B_BIAS, B_SPECIALS, B_MIN_NORMAL, B_PACKED, B_MAG, B_LO, B_HI, HAS_BIAS,
                     BIAS_BF16, OUT_BF16, I64, EVEN_K, EVEN_SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K)


def fixup_programs(tiles: int, device) -> int:
    """The fixup's grid: a few programs per SM (the interpreter: 3, so CI runs the loop)."""
    if INTERPRET:
        return min(tiles, 3)
    return min(tiles, 4 * torch.cuda.get_device_properties(device).multi_processor_count)


def stage(codes, scales, scale_row, scale_k, rows: int, k: int, consts: dict, *,
          e8m0_bias: int, scale_block: int, even_low: bool, tile=None):
    """(bf16 (rows, k) staged operand, int32 (rows + 1,) row flags whose last word is set when
    any row is) for one operand's codes (as qgemm's launch reads them) and scale bytes;
    ``consts``: its ``_constants``.  ``tile`` = (rows, K elements, warps) overrides the
    default (benchmarks)."""
    block_r, block_k, warps = tile or (_STAGE_INTERPRETER if INTERPRET else _STAGE_CUDA)
    out = torch.empty((rows, k), dtype=torch.bfloat16, device=codes.device)
    flags = torch.zeros(rows + 1, dtype=torch.int32, device=codes.device)
    if rows and k:
        grid = (triton.cdiv(rows, block_r), triton.cdiv(k, block_k))
        _stage_kernel[grid](codes, scales, as_kernel_arg(out), flags, rows, k,
                            triton.cdiv(k, scale_block), codes.stride(0), scale_row, scale_k,
                            out.stride(0), TYPED=codes.dtype != torch.uint8,
                            PACKED=consts["PACKED"], EBITS=consts["EBITS"],
                            MBITS=consts["MBITS"], BIAS=consts["BIAS"],
                            SPECIALS=consts["SPECIALS"], MIN_NORMAL=consts["MIN_NORMAL"],
                            LO=consts["LO"], HI=consts["HI"], SCALE_K=scale_block,
                            E8M0_BIAS=e8m0_bias, EVEN_LOW=even_low, BLOCK_R=block_r,
                            BLOCK_K=block_k, num_warps=warps)
    return out, flags


def multiply_staged(a16, b16, out_dtype, bias):
    """D = B16 @ A16^T (TN) by tealite's bf16 GEMM, fp32 bias in its epilogue."""
    out, _ = bf16_gemm.launch(a16, b16, layout="TN", out_dtype=out_dtype, bias=bias,
                              gelu=False, out=None, alpha=1.0, beta=0.0)
    return out


fixup_kernel = _fixup_kernel
