"""Flash attention backward kernels (FlashAttention-2 style, no atomics).  Host: attention.py.

Three launches:

1. ``attn_bwd_delta_kernel``: ``D_i = sum_d dout[i, d] * out[i, d]`` in fp32 (the rowsum that
   replaces ``rowsum(P * dP)`` in dS = P * (dP - D)).
2. ``attn_bwd_dkdv_kernel``: one program per (key block, sequence, K/V head) walks the query
   blocks that can see its keys, for every query head of its group (GQA / MQA: dK and dV sum
   over the group in registers, so no atomics and a fixed summation order), recomputing
   ``P^T = exp2(qk_scale2 * K Q^T + bias2 - lse * log2 e)`` from the forward's LSE:
   ``dV += P^T dout``, ``dP^T = V dout^T``, ``dS^T = P^T * (dP^T - D)``, ``dK += dS^T Q``.
3. ``attn_bwd_dq_kernel``: one program per (query block, sequence, query head) walks its
   visible key blocks: ``dQ += dS K``.

P is rounded to the input dtype before the dV product and dS before the dK / dQ products (the
tensor cores take 16-bit operands); everything else is fp32.  ``softmax_scale`` multiplies dK
and dQ once at the end.  Rows whose LSE is -inf (no visible key) get P = 0, so dQ = 0 there;
keys no query sees keep dK = dV = 0.  Tile helpers, the visibility rule and the bias terms are
the forward's (_attention_fwd.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._attention_fwd import (bias2, full_key_range, full_query_range,
                                                    key_range, load_part, load_tile,
                                                    query_range, seq_info, to_input, visible)
from tealite.backends.triton._io import load_f32, store_f32


@triton.jit
def attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, q_off_ptr, q_len_ptr,
                          s_ob, s_os, s_oh, s_lb, s_lh, s_ls, H, D_V,
                          BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """delta[b, h, i] = sum(dout * out) over the row, for the sequence's own rows (0 beyond)."""
    m0 = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    q_off = tl.load(q_off_ptr + b)
    len_q = tl.load(q_len_ptr + b)
    rows = m0 + tl.arange(0, BLOCK_M)
    d_v = tl.arange(0, BLOCK_DV)
    q_rows = (q_off + rows).to(tl.int64)
    offs = b.to(tl.int64) * s_ob + h * s_oh + q_rows[:, None] * s_os + d_v[None, :]
    m = (rows[:, None] < len_q) & (d_v[None, :] < D_V)
    o = load_f32(o_ptr, offs, m, BITS)
    do = load_f32(do_ptr, offs, m, BITS)
    tl.store(delta_ptr + b.to(tl.int64) * s_lb + h * s_lh + q_rows * s_ls, tl.sum(o * do, 1),
             mask=rows < len_q)


@triton.jit
def _lse2(lse_ptr, lse_offs, row_in):
    """The rows' LSE in base 2; -inf (a row with no visible key, whose P is masked to 0
    anyway) read as 0 so that exp2(-inf - -inf) = NaN never happens."""
    lse2 = tl.load(lse_ptr + lse_offs, mask=row_in, other=0.0) * 1.4426950408889634
    lse2 = tl.where(lse2 == float("-inf"), 0.0, lse2)
    return lse2


@triton.jit
def _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse_ptr, delta_ptr, l_base, lo, hi, cols,
                       ar_m, d_qk, d_v, q_off, len_q, len_kv, off, left, right, s_qs, s_os,
                       s_ls, D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h,
                       s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                       MASKED: tl.constexpr, EVEN_D: tl.constexpr, HAS_LEFT: tl.constexpr,
                       HAS_RIGHT: tl.constexpr, BIAS_KIND: tl.constexpr,
                       BIAS_BF16: tl.constexpr, BITS: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """dK / dV of one key block over query blocks [lo, hi) of one query head.  Unmasked
    (not MASKED): blocks of real rows that see every key of the block (full_query_range)."""
    for m0 in range(lo, hi, BLOCK_M):
        rows = m0 + ar_m
        q_rows = (q_off + rows).to(tl.int64)
        row_in = rows < len_q
        qt = load_part(q_base, q_rows[None, :] * s_qs + d_qk[:, None], row_in[None, :],
                       d_qk[:, None] < D_QK, MASKED, not EVEN_D, BITS)
        st = tl.dot(k, qt, input_precision=DOT_PRECISION, out_dtype=tl.float32) * qk_scale2
        if BIAS_KIND != 0:
            st += tl.trans(bias2(bias_ptr, slopes_ptr, b64, h, rows, cols, len_q, len_kv,
                                 s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, BIAS_KIND, BIAS_BF16))
        lse2 = _lse2(lse_ptr, l_base + q_rows * s_ls, row_in)
        if MASKED:
            vis_t = tl.trans(visible(rows, cols, len_q, len_kv, off, left, right,
                                     HAS_LEFT, HAS_RIGHT))
            pt = tl.exp2(tl.where(vis_t, st - lse2[None, :], float("-inf")))  # 0 if hidden
        else:
            pt = tl.exp2(st - lse2[None, :])
        do = load_part(do_base, q_rows[:, None] * s_os + d_v[None, :], row_in[:, None],
                       d_v[None, :] < D_V, MASKED, not EVEN_D, BITS)
        dv = tl.dot(to_input(pt, do, BITS), do, dv, input_precision=DOT_PRECISION,
                    out_dtype=tl.float32)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION, out_dtype=tl.float32)
        delta = tl.load(delta_ptr + l_base + q_rows * s_ls, mask=row_in, other=0.0)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(to_input(dst, qt, BITS), tl.trans(qt), dk,
                    input_precision=DOT_PRECISION, out_dtype=tl.float32)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         bias_ptr, slopes_ptr, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr,
                         s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                         s_ob, s_os, s_oh, s_lb, s_lh, s_ls, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                         H_KV, GROUP, D_QK, D_V, S_KV_STORE, qk_scale2, softmax_scale,
                         left, right,
                         THD: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                         HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                         BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr,
                         BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    b, hk, q_off, len_q, kv_off, len_kv, off = seq_info(
        tl.program_id(1), H_KV, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr, BOTTOM_RIGHT)
    b64 = b.to(tl.int64)
    cols = n0 + tl.arange(0, BLOCK_N)
    ar_m = tl.arange(0, BLOCK_M)
    d_qk = tl.arange(0, BLOCK_DQK)
    d_v = tl.arange(0, BLOCK_DV)
    kv_rows = (kv_off + cols).to(tl.int64)
    kv_in = cols < len_kv
    k = load_tile(k_ptr, b64 * s_kb + hk * s_kh + kv_rows[:, None] * s_ks + d_qk[None, :],
                  kv_in[:, None] & (d_qk[None, :] < D_QK), BITS)
    v = load_tile(v_ptr, b64 * s_vb + hk * s_vh + kv_rows[:, None] * s_vs + d_v[None, :],
                  kv_in[:, None] & (d_v[None, :] < D_V), BITS)
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    start, end = query_range(n0, len_q, len_kv, off, left, right, BLOCK_M, BLOCK_N,
                             HAS_LEFT, HAS_RIGHT)
    full_lo, full_hi = full_query_range(start, end, n0, len_q, len_kv, off, left, right,
                                        BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = q_ptr + b64 * s_qb + h * s_qh
        do_base = do_ptr + b64 * s_ob + h * s_oh
        l_base = b64 * s_lb + h * s_lh
        # Query order as one masked loop: the causal edge, the unmasked middle, the window's
        # far edge and the partial last query block.
        if HAS_RIGHT:
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_ptr, delta_ptr, l_base, start, full_lo,
                cols, ar_m, d_qk, d_v, q_off, len_q, len_kv, off, left, right, s_qs, s_os,
                s_ls, D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh, s_bq,
                s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT, HAS_RIGHT, BIAS_KIND, BIAS_BF16,
                BITS, DOT_PRECISION, BLOCK_M)
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_base, do_base, lse_ptr, delta_ptr, l_base, full_lo, full_hi,
            cols, ar_m, d_qk, d_v, q_off, len_q, len_kv, off, left, right, s_qs, s_os,
            s_ls, D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh, s_bq,
            s_bk, s_ab, s_ah, False, EVEN_D, HAS_LEFT, HAS_RIGHT, BIAS_KIND, BIAS_BF16,
            BITS, DOT_PRECISION, BLOCK_M)
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_base, do_base, lse_ptr, delta_ptr, l_base, full_hi, end,
            cols, ar_m, d_qk, d_v, q_off, len_q, len_kv, off, left, right, s_qs, s_os,
            s_ls, D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh, s_bq,
            s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT, HAS_RIGHT, BIAS_KIND, BIAS_BF16,
            BITS, DOT_PRECISION, BLOCK_M)
    if THD:
        n_store = len_kv
    else:
        n_store = S_KV_STORE
    in_store = cols < n_store
    store_f32(dk_ptr, b64 * s_kb + hk * s_kh + kv_rows[:, None] * s_ks + d_qk[None, :],
              dk * softmax_scale, in_store[:, None] & (d_qk[None, :] < D_QK), BITS)
    store_f32(dv_ptr, b64 * s_vb + hk * s_vh + kv_rows[:, None] * s_vs + d_v[None, :],
              dv, in_store[:, None] & (d_v[None, :] < D_V), BITS)


@triton.jit
def _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, lo, hi, rows, ar_n, d_qk, d_v,
                   kv_off, len_q, len_kv, off, left, right, s_ks, s_vs, D_QK, D_V, qk_scale2,
                   bias_ptr, slopes_ptr, b64, h, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                   MASKED: tl.constexpr, EVEN_D: tl.constexpr, HAS_LEFT: tl.constexpr,
                   HAS_RIGHT: tl.constexpr, BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr,
                   BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query block over key blocks [lo, hi); unmasked as the forward's."""
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + ar_n
        kv_rows = (kv_off + cols).to(tl.int64)
        kv_in = cols < len_kv
        kt = load_part(k_base, kv_rows[None, :] * s_ks + d_qk[:, None], kv_in[None, :],
                       d_qk[:, None] < D_QK, MASKED, not EVEN_D, BITS)
        vt = load_part(v_base, kv_rows[None, :] * s_vs + d_v[:, None], kv_in[None, :],
                       d_v[:, None] < D_V, MASKED, not EVEN_D, BITS)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION, out_dtype=tl.float32) * qk_scale2
        if BIAS_KIND != 0:
            s += bias2(bias_ptr, slopes_ptr, b64, h, rows, cols, len_q, len_kv,
                       s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, BIAS_KIND, BIAS_BF16)
        if MASKED:
            vis = visible(rows, cols, len_q, len_kv, off, left, right, HAS_LEFT, HAS_RIGHT)
            p = tl.exp2(tl.where(vis, s - lse2[:, None], float("-inf")))  # 0 where hidden
        else:
            p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION, out_dtype=tl.float32)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(to_input(ds, q, BITS), tl.trans(kt), dq, input_precision=DOT_PRECISION,
                    out_dtype=tl.float32)
    return dq


@triton.jit
def attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                       bias_ptr, slopes_ptr, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr,
                       s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh,
                       s_ob, s_os, s_oh, s_lb, s_lh, s_ls, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                       H, GROUP, D_QK, D_V, S_Q_STORE, qk_scale2, softmax_scale, left, right,
                       THD: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                       HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr,
                       BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    b, h, q_off, len_q, kv_off, len_kv, off = seq_info(
        tl.program_id(1), H, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr, BOTTOM_RIGHT)
    hk = h // GROUP
    b64 = b.to(tl.int64)
    rows = m0 + tl.arange(0, BLOCK_M)
    ar_n = tl.arange(0, BLOCK_N)
    d_qk = tl.arange(0, BLOCK_DQK)
    d_v = tl.arange(0, BLOCK_DV)
    q_rows = (q_off + rows).to(tl.int64)
    row_in = rows < len_q
    q = load_tile(q_ptr, b64 * s_qb + h * s_qh + q_rows[:, None] * s_qs + d_qk[None, :],
                  row_in[:, None] & (d_qk[None, :] < D_QK), BITS)
    do = load_tile(do_ptr, b64 * s_ob + h * s_oh + q_rows[:, None] * s_os + d_v[None, :],
                   row_in[:, None] & (d_v[None, :] < D_V), BITS)
    l_offs = b64 * s_lb + h * s_lh + q_rows * s_ls
    lse2 = _lse2(lse_ptr, l_offs, row_in)
    delta = tl.load(delta_ptr + l_offs, mask=row_in, other=0.0)
    k_base = k_ptr + b64 * s_kb + hk * s_kh
    v_base = v_ptr + b64 * s_vb + hk * s_vh
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], tl.float32)
    start, end = key_range(m0, len_q, len_kv, off, left, right, BLOCK_M, BLOCK_N,
                           HAS_LEFT, HAS_RIGHT)
    full_lo, full_hi = full_key_range(start, end, m0, len_kv, off, left, right, BLOCK_M,
                                      BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if HAS_LEFT:
        dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, start, full_lo, rows, ar_n,
                            d_qk, d_v, kv_off, len_q, len_kv, off, left, right, s_ks, s_vs,
                            D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh,
                            s_bq, s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT, HAS_RIGHT,
                            BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, full_lo, full_hi, rows, ar_n,
                        d_qk, d_v, kv_off, len_q, len_kv, off, left, right, s_ks, s_vs,
                        D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh,
                        s_bq, s_bk, s_ab, s_ah, False, EVEN_D, HAS_LEFT, HAS_RIGHT,
                        BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, full_hi, end, rows, ar_n,
                        d_qk, d_v, kv_off, len_q, len_kv, off, left, right, s_ks, s_vs,
                        D_QK, D_V, qk_scale2, bias_ptr, slopes_ptr, b64, h, s_bb, s_bh,
                        s_bq, s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT, HAS_RIGHT,
                        BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)
    # Rows past len_q ran through the unmasked blocks on zero queries: zeroed here.
    dq = tl.where(row_in[:, None], dq, 0.0)
    if THD:
        n_store = len_q
    else:
        n_store = S_Q_STORE
    in_store = rows < n_store
    store_f32(dq_ptr, b64 * s_qb + h * s_qh + q_rows[:, None] * s_qs + d_qk[None, :],
              dq * softmax_scale, in_store[:, None] & (d_qk[None, :] < D_QK), BITS)
