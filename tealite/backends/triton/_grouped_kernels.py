"""The grouped GEMM kernels (see grouped_gemm.py for the design and the numerics).

Every kernel is persistent: ``programs`` programs walk the flat list of every
group's output tiles, program p taking tiles p, p + programs, ...  Group g owns the tiles
``[tiles[g], tiles[g + 1])`` of the device-side table ``tiles`` (the exclusive prefix sum of
cdiv(m_g, BLOCK_M) * cdiv(N, BLOCK_N), an empty group owning none) and the token rows
``[offs[g], offs[g + 1])``.  A program's tiles increase, so its group index only moves
forward: found by a short scan that resumes where the previous tile's left off.  A tile
never crosses a group boundary: its rows past the group's end wrap onto the group's own
rows for the (unmasked) loads, and the store masks them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._tiles import epilogue_store, grouped_pid, tile_k_loop, tile_pointers
from tealite.backends.triton._qgemm_tiles import _blockwise_loop, _epilogue, _mx_tile


@triton.jit
def _find_group(tiles_ptr, tile, g):
    """The group owning ``tile``, scanning forward from group ``g`` (tiles only increase)."""
    while tl.load(tiles_ptr + g + 1) <= tile:
        g += 1
    return g


@triton.jit
def _group_tile(offs_ptr, tiles_ptr, tile, g, N, I64: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(rows, wrapped rows, row end, columns, wrapped columns, first column) of ``tile``
    inside group g."""
    row0 = tl.load(offs_ptr + g)
    m_g = tl.load(offs_ptr + g + 1) - row0
    pid_m, pid_n = grouped_pid(tile - tl.load(tiles_ptr + g), m_g, N, BLOCK_M, BLOCK_N, GROUP_M)
    local = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if I64:
        row0 = row0.to(tl.int64)
        local = local.to(tl.int64)
    return row0 + local, row0 + local % m_g, row0 + m_g, rn, rn % N, pid_n * BLOCK_N


@triton.jit
def grouped_m_kernel(x_ptr, y_ptr, d_ptr, bias_ptr, offs_ptr, tiles_ptr, N, K, stride_x,
                     stride_y, stride_yg, stride_dm, stride_bg, num_tiles, programs,
                     X_K_CONTIG: tl.constexpr, Y_K_CONTIG: tl.constexpr,
                     BF16_BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, I64: tl.constexpr,
                     HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr,
                     BIAS_BF16: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """TN / NN: D[rows_g] = X[rows_g] (m_g, K) @ Y_g (K, N) (+ D[rows_g] when ACCUMULATE)
    (+ bias[g]), the dense epilogue's order.  X is the token
    operand (B or B.t()), Y_g the weight view of group g at ``y_ptr + g * stride_yg`` (stride 0:
    one weight for all groups)."""
    rk = tl.arange(0, BLOCK_K)
    g = 0
    for tile in range(tl.program_id(0), num_tiles, programs):
        g = _find_group(tiles_ptr, tile, g)
        rm, xm, m_end, rn, yn, _ = _group_tile(offs_ptr, tiles_ptr, tile, g, N, I64,
                                               BLOCK_M, BLOCK_N, GROUP_M)
        gy = g.to(tl.int64) if I64 else g
        x_ptrs, x_step, y_ptrs, y_step = tile_pointers(
            x_ptr, y_ptr + gy * stride_yg, xm, yn, rk, stride_x, stride_y, X_K_CONTIG,
            Y_K_CONTIG, BLOCK_K)
        acc = tile_k_loop(x_ptrs, y_ptrs, x_step, y_step, rk, K, X_K_CONTIG, Y_K_CONTIG,
                          BF16_BITS, DOT_PRECISION, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        epilogue_store(acc, d_ptr, d_ptr, bias_ptr + g * stride_bg, rm, rn, m_end, N, stride_dm,
                       1.0, 1.0, ACCUMULATE, HAS_BIAS, False, OUT_BF16, BIAS_BF16)


@triton.jit
def grouped_k_kernel(x_ptr, y_ptr, d_ptr, offs_ptr, M, N, stride_x, stride_y, stride_dg,
                     stride_dm, num_tiles, tiles_per_group, programs,
                     BF16_BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, I64: tl.constexpr,
                     ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, EVEN_K: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """NT (wgrad): D[g] (M, N) = X_g (M, k_g) @ Y_g (k_g, N) with X = B.t() (B: (K_total, M),
    unit stride along M) and Y = A (K_total, N), unit stride along N, both cut at the token
    rows of group g.  Every group has the same tiles, so group = tile // tiles_per_group.
    ACCUMULATE adds into D's prior contents (beta = 1); an empty group's tiles then store
    nothing (D[g] + 0 would turn a -0 into +0), and without it store exact zeros."""
    rk = tl.arange(0, BLOCK_K)
    for tile in range(tl.program_id(0), num_tiles, programs):
        g = tile // tiles_per_group
        row0 = tl.load(offs_ptr + g)
        k_g = tl.load(offs_ptr + g + 1) - row0
        pid_m, pid_n = grouped_pid(tile % tiles_per_group, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        xm = rm % M
        yn = rn % N
        if I64:
            row0 = row0.to(tl.int64)
            xm = xm.to(tl.int64)
            yn = yn.to(tl.int64)
            rm = rm.to(tl.int64)
            g = g.to(tl.int64)
        x_ptrs, x_step, y_ptrs, y_step = tile_pointers(
            x_ptr + row0 * stride_x, y_ptr + row0 * stride_y, xm, yn, rk, stride_x, stride_y,
            False, False, BLOCK_K)
        acc = tile_k_loop(x_ptrs, y_ptrs, x_step, y_step, rk, k_g, False, False, BF16_BITS,
                          DOT_PRECISION, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        d_g = d_ptr + g * stride_dg
        if ACCUMULATE:
            if k_g > 0:
                epilogue_store(acc, d_g, d_ptr, d_ptr, rm, rn, M, N, stride_dm, 1.0, 1.0, True,
                               False, False, OUT_BF16, False)
        else:
            epilogue_store(acc, d_g, d_ptr, d_ptr, rm, rn, M, N, stride_dm, 1.0, 0.0, False,
                           False, False, OUT_BF16, False)


@triton.jit
def grouped_q_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, offs_ptr, tiles_ptr, N, K,
                     KS, num_tiles, stride_ag, stride_a, stride_b, stride_sag, stride_sa_row,
                     stride_sa_k, stride_sbg, stride_sb_row, stride_sb_k, stride_bg, stride_om,
                     programs,
                     KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                     E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr,
                     DOT_FP8: tl.constexpr, F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr,
                     A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr,
                     A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr,
                     A_PACKED: tl.constexpr, A_MAG: tl.constexpr, A_LO: tl.constexpr,
                     A_HI: tl.constexpr, B_TYPED: tl.constexpr, B_EBITS: tl.constexpr,
                     B_MBITS: tl.constexpr, B_BIAS: tl.constexpr, B_SPECIALS: tl.constexpr,
                     B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr, B_MAG: tl.constexpr,
                     B_LO: tl.constexpr, B_HI: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
                     I64: tl.constexpr, EVEN_K: tl.constexpr, EVEN_SCALE_K: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """Quantized split-M (TN): out[rows_g] = B[rows_g] (m_g, K) @ A_g (N, K)^T with scales,
    K-last codes; each tile is the dense quantized kernel's tile (qgemm.py: the FP8 / block K
    loop and epilogue, or MX's ``_mx_tile``, fast path or exact fallback) on group g's weight
    codes and scales (``stride_ag`` / ``stride_sag``) and its B scales (``stride_sbg``: one
    per-tensor scale per group, or 0 for row / block / MX scales, which follow B's rows)."""
    g = 0
    for tile in range(tl.program_id(0), num_tiles, programs):
        g = _find_group(tiles_ptr, tile, g)
        rm, bm, m_end, rn, an, n0 = _group_tile(offs_ptr, tiles_ptr, tile, g, N, I64, BLOCK_M,
                                                BLOCK_N, GROUP_M)
        gg = g.to(tl.int64) if I64 else g
        a_g = a_ptr + gg * stride_ag
        sa_g = sa_ptr + gg * stride_sag
        sb_g = sb_ptr + gg * stride_sbg
        if KIND == 2:
            _mx_tile(a_g, b_ptr, sa_g, sb_g, bias_ptr + gg * stride_bg, out_ptr, rm, rn, bm, an,
                     n0, m_end, N, K, KS, stride_a, stride_b, stride_sa_row, stride_sa_k,
                     stride_sb_row, stride_sb_k, stride_om, SCALE_K, E8M0_BIAS, EVEN_LOW,
                     F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL,
                     A_PACKED, A_MAG, A_LO, A_HI, B_TYPED, B_EBITS, B_MBITS, B_BIAS, B_SPECIALS,
                     B_MIN_NORMAL, B_PACKED, B_MAG, B_LO, B_HI, HAS_BIAS, BIAS_BF16, OUT_BF16,
                     I64, EVEN_K, EVEN_SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = _blockwise_loop(a_g, b_ptr, sa_g, sb_g, an, bm, K, stride_a, stride_b,
                                  stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                                  KIND, SCALE_K, SA_ROWS, E8M0_BIAS, EVEN_LOW, DOT_FP8,
                                  F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS,
                                  A_MIN_NORMAL, A_PACKED, B_TYPED, B_EBITS, B_MBITS, B_BIAS,
                                  B_SPECIALS, B_MIN_NORMAL, B_PACKED, EVEN_K, BLOCK_M, BLOCK_N,
                                  BLOCK_K)
            _epilogue(acc, sa_g, sb_g, bias_ptr + gg * stride_bg, out_ptr, rm, rn, bm, an,
                      m_end, N, stride_sa_row, stride_sb_row, stride_om, KIND, HAS_BIAS,
                      BIAS_BF16, OUT_BF16)


def tile_table(splits, block_m: int, n_tiles: int) -> list[int]:
    """The exclusive prefix sum of each group's tile count (G + 1 long, host ints)."""
    out = [0]
    for s in splits:
        out.append(out[-1] + triton.cdiv(s, block_m) * n_tiles)
    return out
