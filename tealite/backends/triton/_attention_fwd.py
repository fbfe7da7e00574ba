"""Flash attention forward kernel (FlashAttention-2 style) and the tile helpers the backward
kernels share.  Host code and the numerics declaration: attention.py.

One program owns BLOCK_M query rows of one (sequence, query head) and walks the key blocks
that can be visible to them, keeping a running max ``m``, running sum ``l`` and an fp32
output accumulator (online softmax).  Scores are taken in base 2: ``log2(e)`` is folded into
the scale once on the host (``qk_scale2 = softmax_scale * log2(e)``), so each score costs one
multiply and ``tl.exp2``; the post-scale bias / ALiBi term is multiplied by ``log2(e)`` too.
P is rounded to the input dtype before the P @ V product (tensor cores take 16-bit operands);
the row sum ``l`` adds the unrounded fp32 P.  The natural-log LSE is ``(m + log2 l) * ln 2``.

Layouts: every tensor is addressed as ``base + b * stride_b + (row_offset[b] + i) * stride_s +
h * stride_h + d``: bshd and sbhd differ only in strides (the host reads them), thd has
``stride_b = 0`` and per-sequence row offsets (cu_seqlens, or the padded offsets).  The
per-sequence lengths (``q_len``/``kv_len``) carry the padding mask.

Visibility (tealite/attention_types.py): ``i < len_q``, ``j < len_kv``, and with a bounded
window side ``i + off - left <= j <= i + off + right`` (causal masks arrive as right = 0).
Only key blocks that can hold a visible key are visited (causal and window skip the rest),
and only the edge blocks (window / causal edges, the partial last block) are masked: blocks
every row of the program sees whole run without predicates (``full_key_range``; the
backward's ``full_query_range``), with the head dim unmasked too when it is a power of two
(``EVEN_D``).
A row with no visible key keeps ``l = 0``: its output is 0 and its LSE -inf; the running max
is replaced by 0 while it is -inf so that ``exp2(-inf - -inf)`` (NaN) never happens.

Interpreter: with ``BITS`` (bf16 under TRITON_INTERPRET=1) bf16 tensors arrive as int16 bits
and are widened exactly to fp32 before ``tl.dot`` (the interpreter's bf16 dot multiplies raw
bit patterns, NUMERICS.md), and "rounded to the input dtype" is an integer RNE to bf16 kept in
fp32: the same values the GPU's bf16 tensor-core path sees.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._io import load_f32, store_f32

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def load_tile(ptr, offs, mask, BITS: tl.constexpr):
    """A tile in the input dtype, or (BITS: bf16 as int16 bits) widened exactly to fp32."""
    if BITS:
        bits = tl.load(ptr + offs, mask=mask, other=0).to(tl.int32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def load_unmasked(ptr, offs, BITS: tl.constexpr):
    """``load_tile`` of a tile known to lie wholly inside the tensor (no predicate: vector
    loads)."""
    if BITS:
        bits = tl.load(ptr + offs).to(tl.int32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offs)


@triton.jit
def load_part(ptr, offs, rows_in, d_in, ROWS: tl.constexpr, D: tl.constexpr,
              BITS: tl.constexpr):
    """``load_tile`` predicated only on what can be out of range: the rows (``rows_in``, when
    ROWS) and the padded head dim (``d_in``, when D); both broadcast to the tile."""
    if ROWS and D:
        return load_tile(ptr, offs, rows_in & d_in, BITS)
    elif ROWS:
        return load_tile(ptr, offs, rows_in, BITS)
    elif D:
        return load_tile(ptr, offs, d_in, BITS)
    else:
        return load_unmasked(ptr, offs, BITS)


@triton.jit
def to_input(x, like, BITS: tl.constexpr):
    """fp32 ``x`` rounded (RNE) to the input dtype: the dtype of ``like`` (a loaded tile), or
    with BITS bf16 kept in fp32 (the tile is fp32 then).  Finite inputs only (P, dS)."""
    if BITS:
        bits = x.to(tl.int32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(like.dtype)


@triton.jit
def visible(rows, cols, len_q, len_kv, off, left, right,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """(rows x cols) visibility mask of query ``rows`` and key ``cols`` of one sequence."""
    vis = (rows[:, None] < len_q) & (cols[None, :] < len_kv)
    if HAS_LEFT:
        vis = vis & (cols[None, :] >= rows[:, None] + off - left)
    if HAS_RIGHT:
        vis = vis & (cols[None, :] <= rows[:, None] + off + right)
    return vis


@triton.jit
def key_range(m0, len_q, len_kv, off, left, right, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[start, end) of the key blocks visible to query rows [m0, m0 + BLOCK_M); start is a
    multiple of BLOCK_N, the range is empty when no row of the block is a real query."""
    lo = 0
    hi = len_kv
    if HAS_LEFT:
        lo = tl.maximum(m0 + off - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(hi, m0 + BLOCK_M + off + right)
    hi = tl.where(m0 < len_q, hi, 0)
    return (lo // BLOCK_N) * BLOCK_N, hi


@triton.jit
def query_range(n0, len_q, len_kv, off, left, right, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[start, end) of the query blocks that can see a key of [n0, n0 + BLOCK_N)."""
    lo = 0
    hi = len_q
    if HAS_RIGHT:  # j <= i + off + right  <=>  i >= j - off - right
        lo = tl.maximum(n0 - off - right, 0)
    if HAS_LEFT:  # j >= i + off - left  <=>  i <= j - off + left
        hi = tl.minimum(hi, n0 + BLOCK_N - off + left)
    hi = tl.where(n0 < len_kv, hi, 0)
    return (lo // BLOCK_M) * BLOCK_M, hi


@triton.jit
def full_key_range(start, end, m0, len_kv, off, left, right, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[lo, hi) inside the visited [start, end): the key blocks that every query row of
    [m0, m0 + BLOCK_M) sees whole (every key < len_kv and inside the window), so they need no
    mask.  Blocks below lo and from hi on are the masked edges; lo and hi are multiples of
    BLOCK_N or equal to end.  Query rows past len_q do not narrow it (they are zeroed at the
    store)."""
    hi = len_kv
    if HAS_RIGHT:  # key n0 + BLOCK_N - 1 <= m0 + off + right: the first row sees the block
        hi = tl.minimum(hi, m0 + off + right + 1)
    hi = (tl.maximum(hi, 0) // BLOCK_N) * BLOCK_N
    lo = start
    if HAS_LEFT:  # key n0 >= (m0 + BLOCK_M - 1) + off - left: the last row sees the block
        first = tl.maximum(m0 + BLOCK_M - 1 + off - left, 0)
        lo = tl.maximum(lo, ((first + BLOCK_N - 1) // BLOCK_N) * BLOCK_N)
    lo = tl.minimum(lo, end)
    return lo, tl.minimum(tl.maximum(hi, lo), end)


@triton.jit
def full_query_range(start, end, n0, len_q, len_kv, off, left, right, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """As ``full_key_range`` for the backward's key-block programs: the query blocks inside
    [start, end) whose rows are all real (< len_q) and see every key of [n0, n0 + BLOCK_N),
    which itself must lie below len_kv."""
    hi = len_q
    if HAS_LEFT:  # key n0 >= (m0 + BLOCK_M - 1) + off - left
        hi = tl.minimum(hi, n0 - off + left + 1)
    hi = (tl.maximum(hi, 0) // BLOCK_M) * BLOCK_M
    hi = tl.where(n0 + BLOCK_N <= len_kv, hi, 0)
    lo = start
    if HAS_RIGHT:  # key n0 + BLOCK_N - 1 <= m0 + off + right
        first = tl.maximum(n0 + BLOCK_N - 1 - off - right, 0)
        lo = tl.maximum(lo, ((first + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
    lo = tl.minimum(lo, end)
    return lo, tl.minimum(tl.maximum(hi, lo), end)


@triton.jit
def bias2(bias_ptr, slopes_ptr, b, h, rows, cols, len_q, len_kv, s_bb, s_bh, s_bq, s_bk,
          s_ab, s_ah, BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr):
    """The post-scale bias of a (rows x cols) tile times log2(e): the given tensor
    (BIAS_KIND 1, broadcast through zero strides) or ALiBi (2): -slope * |i + len_kv - len_q - j|."""
    if BIAS_KIND == 1:
        offs = (b * s_bb + h * s_bh + rows[:, None].to(tl.int64) * s_bq
                + cols[None, :].to(tl.int64) * s_bk)
        m = (rows[:, None] < len_q) & (cols[None, :] < len_kv)
        return load_f32(bias_ptr, offs, m, BIAS_BF16) * 1.4426950408889634
    else:
        slope = tl.load(slopes_ptr + b * s_ab + h * s_ah)
        dist = tl.abs(rows[:, None] + (len_kv - len_q) - cols[None, :]).to(tl.float32)
        return -(slope * 1.4426950408889634) * dist


@triton.jit
def seq_info(pid_bh, H, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr, BOTTOM_RIGHT: tl.constexpr):
    """(b, h, q row offset, q length, kv row offset, kv length, diagonal offset)."""
    b = pid_bh // H
    h = pid_bh % H
    q_off = tl.load(q_off_ptr + b)
    len_q = tl.load(q_len_ptr + b)
    kv_off = tl.load(kv_off_ptr + b)
    len_kv = tl.load(kv_len_ptr + b)
    if BOTTOM_RIGHT:
        off = len_kv - len_q
    else:
        off = len_kv * 0
    return b, h, q_off, len_q, kv_off, len_kv, off


@triton.jit
def _fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, lo, hi, rows, ar_n, d_qk, d_v,
                    kv_off, len_q, len_kv, off, left, right, s_ks, s_vs, D_QK, D_V, qk_scale2,
                    bias_ptr, slopes_ptr, b64, h, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                    MASKED: tl.constexpr, EVEN_D: tl.constexpr, HAS_LEFT: tl.constexpr,
                    HAS_RIGHT: tl.constexpr, BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr,
                    BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax over key blocks [lo, hi).  MASKED: the edge blocks (keys past
    len_kv, window or causal edges: the visibility mask); otherwise blocks every row sees whole
    (full_key_range), loaded and scored without any predicate."""
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + ar_n
        kv_rows = (kv_off + cols).to(tl.int64)
        kv_in = cols < len_kv
        kt = load_part(k_base, kv_rows[None, :] * s_ks + d_qk[:, None], kv_in[None, :],
                       d_qk[:, None] < D_QK, MASKED, not EVEN_D, BITS)
        qk = tl.dot(q, kt, input_precision=DOT_PRECISION, out_dtype=tl.float32)
        if MASKED or BIAS_KIND != 0:
            s = qk * qk_scale2
            if BIAS_KIND != 0:
                s += bias2(bias_ptr, slopes_ptr, b64, h, rows, cols, len_q, len_kv,
                           s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, BIAS_KIND, BIAS_BF16)
            if MASKED:
                vis = visible(rows, cols, len_q, len_kv, off, left, right, HAS_LEFT, HAS_RIGHT)
                s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
        else:
            # The scale is positive (front end) and rounding monotone: max(qk) * scale is
            # max(qk * scale) exactly, so the scores need no multiply of their own -- the one
            # below fuses into exp2's argument (an FMA on the GPU; the same two roundings in
            # the interpreter).  A multiply per score less in the loop the time is spent in.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale2)
        # -inf only for a row that has seen no key yet (or a -inf bias): exp2(-inf - -inf)
        # would be NaN.  One select per row, not per score.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        if MASKED or BIAS_KIND != 0:
            p = tl.exp2(s - m_safe[:, None])
        else:
            p = tl.exp2(qk * qk_scale2 - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_part(v_base, kv_rows[:, None] * s_vs + d_v[None, :], kv_in[:, None],
                      d_v[None, :] < D_V, MASKED, not EVEN_D, BITS)
        acc = acc * alpha[:, None]
        acc = tl.dot(to_input(p, v, BITS), v, acc, input_precision=DOT_PRECISION,
                     out_dtype=tl.float32)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, bias_ptr, slopes_ptr,
                    q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr,
                    s_qb, s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ob, s_os, s_oh,
                    s_lb, s_lh, s_ls, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah,
                    H, GROUP, D_QK, D_V, S_Q_STORE, qk_scale2, left, right,
                    THD: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_LEFT: tl.constexpr,
                    HAS_RIGHT: tl.constexpr, BIAS_KIND: tl.constexpr, BIAS_BF16: tl.constexpr,
                    BITS: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    b, h, q_off, len_q, kv_off, len_kv, off = seq_info(
        tl.program_id(1), H, q_off_ptr, q_len_ptr, kv_off_ptr, kv_len_ptr, BOTTOM_RIGHT)
    hk = h // GROUP
    rows = m0 + tl.arange(0, BLOCK_M)
    d_qk = tl.arange(0, BLOCK_DQK)
    d_v = tl.arange(0, BLOCK_DV)
    ar_n = tl.arange(0, BLOCK_N)
    b64 = b.to(tl.int64)
    q_rows = (q_off + rows).to(tl.int64)
    row_in = rows < len_q
    q = load_tile(q_ptr, b64 * s_qb + h * s_qh + q_rows[:, None] * s_qs + d_qk[None, :],
                  row_in[:, None] & (d_qk[None, :] < D_QK), BITS)
    k_base = k_ptr + b64 * s_kb + hk * s_kh
    v_base = v_ptr + b64 * s_vb + hk * s_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    start, end = key_range(m0, len_q, len_kv, off, left, right, BLOCK_M, BLOCK_N,
                           HAS_LEFT, HAS_RIGHT)
    full_lo, full_hi = full_key_range(start, end, m0, len_kv, off, left, right, BLOCK_M,
                                      BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # Three stretches, in key order: the window's left edge, the blocks every row sees whole
    # (unmasked: about a tenth fewer instructions per score), the causal / window right edge
    # and the partial last block.  Same summation order as one masked loop.
    if HAS_LEFT:
        acc, l_i, m_i = _fwd_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, start, full_lo, rows, ar_n, d_qk, d_v, kv_off,
            len_q, len_kv, off, left, right, s_ks, s_vs, D_QK, D_V, qk_scale2, bias_ptr,
            slopes_ptr, b64, h, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT,
            HAS_RIGHT, BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)
    acc, l_i, m_i = _fwd_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, full_lo, full_hi, rows, ar_n, d_qk, d_v, kv_off,
        len_q, len_kv, off, left, right, s_ks, s_vs, D_QK, D_V, qk_scale2, bias_ptr,
        slopes_ptr, b64, h, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, False, EVEN_D, HAS_LEFT,
        HAS_RIGHT, BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)
    acc, l_i, m_i = _fwd_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, full_hi, end, rows, ar_n, d_qk, d_v, kv_off,
        len_q, len_kv, off, left, right, s_ks, s_vs, D_QK, D_V, qk_scale2, bias_ptr,
        slopes_ptr, b64, h, s_bb, s_bh, s_bq, s_bk, s_ab, s_ah, True, EVEN_D, HAS_LEFT,
        HAS_RIGHT, BIAS_KIND, BIAS_BF16, BITS, DOT_PRECISION, BLOCK_N)

    # Rows past len_q ran through the unmasked blocks on zero queries: zeroed here.
    seen = (l_i > 0.0) & row_in
    inv_l = tl.where(seen, tl.math.div_rn(1.0, tl.where(seen, l_i, 1.0)), 0.0)
    out = tl.where(seen[:, None], acc * inv_l[:, None], 0.0)
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    # Rows stored: every row of the padded bshd/sbhd sequence (padding rows get 0 / -inf),
    # only the sequence's own rows for thd (gap rows were zero-filled by the host).
    if THD:
        n_store = len_q
    else:
        n_store = S_Q_STORE
    in_store = rows < n_store
    store_f32(o_ptr, b64 * s_ob + h * s_oh + q_rows[:, None] * s_os + d_v[None, :], out,
              in_store[:, None] & (d_v[None, :] < D_V), BITS)
    tl.store(lse_ptr + b64 * s_lb + h * s_lh + q_rows * s_ls, lse, mask=in_store)
