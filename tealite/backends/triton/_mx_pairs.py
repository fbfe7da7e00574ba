"""MXFP4 (e2m1, RNE, the arithmetic encoder) kernels that read bf16 x as 32-bit words of two
elements: quantize_mx's ``VARIANTS["row"] == "pairs"`` (rowwise) and ``VARIANTS["ct"] ==
"pairs"`` (cast-transpose, columnwise with or without rowwise).  Same bits as quantize_mx's
default kernels (tests/test_triton_mx_variants.py); quantize_mx dispatches to them.

Word w of a row holds elements 2w (low half) and 2w + 1 (high half).  Widening bf16 is a
shift (low half) or a mask (high half), and the two codes of a word are the low and high
nibble of code byte w, so the word tile and the rowwise byte tile have one shape: Triton's
coalescing then gives the load, the block reductions and the store one layout (with the
tiles below a thread owns whole 32-element blocks: no shuffles, no shared-memory round trip).

Codes come from magnitudes: |x| * 2^-s rounds as |x * 2^-s| does; a block with the NaN scale
(255) has magnitudes and signs cleared first, so its codes are 0, as quantize_mx's
``_mx_descale`` gives +0.0 there.  Block amax is the integer max of magnitude bits (exact,
NaN-propagating), as ``_codecs._mag_max``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tealite.backends.triton._codecs import _e8m0_scale, _fp4_arith_magnitude, _tile_ids


@triton.jit
def _pair_bits(w):
    """(low, high, |low|, |high|) fp32 bit patterns (int32) of the bf16 pairs ``w``."""
    lo = w << 16
    hi = w & -65536  # 0xFFFF0000
    return lo, hi, lo & 0x7FFFFFFF, hi & 0x7FFFFFFF


@triton.jit
def _block_parts(byte):
    """Per block of scale ``byte`` (int32): (magnitude mask, 2^-s as fp32, sign mask); the
    NaN scale clears both masks (its codes are +0.0's)."""
    keep = tl.where(byte == 255, 0, -1)
    field = 254 - byte
    mult = tl.where(field > 0, field << 23, 0x00400000).to(tl.float32, bitcast=True)
    return keep, mult, keep & 8


@triton.jit
def _fp4_half_code(mag, bits, keep, mult, sgn):
    """E2M1 codes (sign included) of elements with magnitude / fp32 bits ``mag`` / ``bits``,
    each block's ``_block_parts`` broadcast against them."""
    y = (mag & keep).to(tl.float32, bitcast=True) * mult
    return _fp4_arith_magnitude(y.to(tl.int32, bitcast=True)) | ((bits >> 28) & sgn)


@triton.jit
def _fp4_rows(w, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
              FMAX: tl.constexpr, R: tl.constexpr, BN: tl.constexpr):
    """(code bytes (R, BN // 2) uint8, scale bytes (R, BN // 32) int32) of the rowwise
    quantization of the (R, BN // 2) word tile ``w``: 16 words per block."""
    lo, hi, mlo, mhi = _pair_bits(w)
    amax = tl.max(tl.reshape(tl.maximum(mlo, mhi), (R, BN // 32, 16)), axis=2)
    byte = _e8m0_scale(amax.to(tl.float32, bitcast=True), MODE, EMAX, MBITS, FMAX)
    keep, mult, sgn = _block_parts(byte)
    keep, mult, sgn = keep[:, :, None], mult[:, :, None], sgn[:, :, None]
    shape: tl.constexpr = (R, BN // 32, 16)
    pair = (_fp4_half_code(tl.reshape(mlo, shape), tl.reshape(lo, shape), keep, mult, sgn)
            | (_fp4_half_code(tl.reshape(mhi, shape), tl.reshape(hi, shape), keep, mult, sgn)
               << 4))
    return tl.reshape(pair, (R, BN // 2)).to(tl.uint8), byte


@triton.jit
def _store_rows(w, rows, words, M, KW, pid_n, q_ptr, s_ptr, q_row_bytes, s_stride,
                MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                FMAX: tl.constexpr, R: tl.constexpr, BN: tl.constexpr):
    """Rowwise codes and scales of the word tile ``w`` at x rows ``rows``, words ``words``."""
    codes, byte = _fp4_rows(w, MODE, EMAX, MBITS, FMAX, R, BN)
    mask = (rows < M)[:, None] & (words < KW)[None, :]
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * q_row_bytes + words[None, :], codes,
             mask=mask)
    kb = pid_n * (BN // 32) + tl.arange(0, BN // 32)
    smask = (rows < M)[:, None] & (kb < tl.cdiv(KW, 16))[None, :]
    tl.store(s_ptr + rows.to(tl.int64)[:, None] * s_stride + kb[None, :], byte.to(tl.uint8),
             mask=smask)


@triton.jit
def _load_words(x_ptr, rows, words, M, KW):
    mask = (rows < M)[:, None] & (words < KW)[None, :]
    return tl.load(x_ptr + rows.to(tl.int64)[:, None] * KW + words[None, :], mask=mask, other=0)


@triton.jit
def _mx_fp4_pairs_kernel(x_ptr, q_ptr, s_ptr, M, KW, q_row_bytes, s_stride,
                         MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                         FMAX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         GROUP_M: tl.constexpr = 1):
    """Rowwise: one (BM, BN) tile of x (BN // 2 words per row; ``KW`` = K // 2 words)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(KW, BN // 2), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    words = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    w = _load_words(x_ptr, rows, words, M, KW)
    _store_rows(w, rows, words, M, KW, pid_n, q_ptr, s_ptr, q_row_bytes, s_stride, MODE, EMAX,
                MBITS, FMAX, BM, BN)


@triton.jit
def _col_codes(even, odd, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
               FMAX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Columnwise quantization of one half (the low or the high elements) of the even-row and
    odd-row word tiles: ``even`` / ``odd`` = (bits, magnitudes) each (BM // 2, BN // 2).
    Returns (code bytes (BM // 2, BN // 2): byte i of a column holds rows 2i (low nibble) and
    2i + 1, as x.T packs them; scale bytes (BM // 32, BN // 2))."""
    shape: tl.constexpr = (BM // 32, 16, BN // 2)  # a 32-row block: 16 even + 16 odd rows
    be, me = tl.reshape(even[0], shape), tl.reshape(even[1], shape)
    bo, mo = tl.reshape(odd[0], shape), tl.reshape(odd[1], shape)
    amax = tl.max(tl.maximum(me, mo), axis=1)
    byte = _e8m0_scale(amax.to(tl.float32, bitcast=True), MODE, EMAX, MBITS, FMAX)
    keep, mult, sgn = _block_parts(byte)
    keep, mult, sgn = keep[:, None, :], mult[:, None, :], sgn[:, None, :]
    pair = (_fp4_half_code(me, be, keep, mult, sgn)
            | (_fp4_half_code(mo, bo, keep, mult, sgn) << 4))
    return tl.reshape(pair, (BM // 2, BN // 2)).to(tl.uint8), byte


@triton.jit
def _store_cols(codes, byte, n, pid_m, M, K, qt_ptr, st_ptr, qt_row_bytes, st_stride,
                BM: tl.constexpr):
    """Store the column code bytes (BM // 2, BN // 2) and scales (BM // 32, BN // 2) of the x
    columns ``n`` (one per word) at tile row ``pid_m``: x.T rows ``n``."""
    b = pid_m * (BM // 2) + tl.arange(0, BM // 2)
    nmask = (n < K)[:, None]
    tl.store(qt_ptr + n.to(tl.int64)[:, None] * qt_row_bytes + b[None, :], tl.trans(codes),
             mask=nmask & (b < qt_row_bytes)[None, :])
    mb = pid_m * (BM // 32) + tl.arange(0, BM // 32)
    tl.store(st_ptr + n.to(tl.int64)[:, None] * st_stride + mb[None, :],
             tl.trans(byte).to(tl.uint8), mask=nmask & (mb < tl.cdiv(M, 32))[None, :])


@triton.jit
def _mx_fp4_pairs_ct_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, KW, q_row_bytes,
                            qt_row_bytes, s_stride, st_stride, ROW: tl.constexpr,
                            MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                            FMAX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                            GROUP_M: tl.constexpr = 1):
    """Cast-transpose (columnwise; rowwise too with ROW) of one (BM, BN) tile of x, M even.
    The tile is read as two word sub-tiles, the even and the odd rows, so the two codes of
    an x.T byte (rows 2i and 2i + 1 of one column) meet in one thread without a transpose;
    only the packed bytes are transposed (half the bytes the default kernel moves)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(KW, BN // 2), GROUP_M)
    even_rows = pid_m * BM + 2 * tl.arange(0, BM // 2)
    words = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    we = _load_words(x_ptr, even_rows, words, M, KW)
    wo = _load_words(x_ptr, even_rows + 1, words, M, KW)
    if ROW:
        _store_rows(we, even_rows, words, M, KW, pid_n, q_ptr, s_ptr, q_row_bytes, s_stride,
                    MODE, EMAX, MBITS, FMAX, BM // 2, BN)
        _store_rows(wo, even_rows + 1, words, M, KW, pid_n, q_ptr, s_ptr, q_row_bytes,
                    s_stride, MODE, EMAX, MBITS, FMAX, BM // 2, BN)
    lo_e, hi_e, mlo_e, mhi_e = _pair_bits(we)
    lo_o, hi_o, mlo_o, mhi_o = _pair_bits(wo)
    K = 2 * KW
    codes, byte = _col_codes((lo_e, mlo_e), (lo_o, mlo_o), MODE, EMAX, MBITS, FMAX, BM, BN)
    _store_cols(codes, byte, 2 * words, pid_m, M, K, qt_ptr, st_ptr, qt_row_bytes, st_stride,
                BM)
    codes, byte = _col_codes((hi_e, mhi_e), (hi_o, mhi_o), MODE, EMAX, MBITS, FMAX, BM, BN)
    _store_cols(codes, byte, 2 * words + 1, pid_m, M, K, qt_ptr, st_ptr, qt_row_bytes,
                st_stride, BM)


@triton.jit
def _load_row_words(x_ptr, row, words, M, KW):
    """Words ``words`` of x row ``row`` (a scalar), 0 past the ends."""
    rows = tl.zeros_like(words) + row  # a vector mask (the interpreter rejects scalar & vector)
    return tl.load(x_ptr + rows.to(tl.int64) * KW + words, mask=(words < KW) & (rows < M),
                   other=0)


@triton.jit
def _col_pass_words(x_ptr, pid_m, words, M, KW, j, keep, mult, sgn):
    """Codes (int32, low 4 bits) of the low and high elements of words ``words`` of x row
    pid_m * 32 + j (rows past M read 0), one column block's parts per column."""
    row = pid_m * 32 + j
    w = _load_row_words(x_ptr, row, words, M, KW)
    lo, hi, mlo, mhi = _pair_bits(w)
    return (_fp4_half_code(mlo, lo, keep[0], mult[0], sgn[0]),
            _fp4_half_code(mhi, hi, keep[1], mult[1], sgn[1]))


@triton.jit
def _store_col_words(qt_ptr, n, w0, K, qt_words, a0, a1, a2, a3):
    """x.T rows ``n``: words w0 .. w0 + 3 (16 code bytes) are a0 .. a3, joined into one
    (len(n), 4) tile so that each row's 16 bytes leave as one vector store (quantize_mx's
    MXFP8 "cols" kernel stores two such per 32-row block)."""
    quad = tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), (n.shape[0], 4))  # a0..a3
    w = w0 + tl.arange(0, 4)
    tl.store(qt_ptr + n.to(tl.int64)[:, None] * qt_words + w[None, :], quad,
             mask=(n < K)[:, None] & (w < qt_words)[None, :])


@triton.jit
def _mx_fp4_cols_ct_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, KW, q_row_bytes, qt_words,
                           s_stride, st_stride, ROW: tl.constexpr, MODE: tl.constexpr,
                           EMAX: tl.constexpr, MBITS: tl.constexpr, FMAX: tl.constexpr,
                           BN: tl.constexpr, GROUP_M: tl.constexpr = 1):
    """Cast-transpose of a (32, BN) tile of x (M % 8 == 0; ``qt_ptr`` the x.T codes as int32
    words, ``qt_words`` per row): ``VARIANTS["ct"] == "cols"``.  The columnwise side reads
    the tile row by row as 1-D word vectors, so a thread holds every row of its columns: the
    32-row block amax and scale are in-thread (computed once per column, not per lane), and
    each column's 32 codes are built as 4 words in registers and stored to x.T without a
    transpose.  The rows are read twice (amaxes, then codes; the second time from cache).
    With ROW, the rowwise side is the pairs kernel's on the same tile read as one 2-D tile
    (a third read, from cache)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, 32), tl.cdiv(KW, BN // 2), GROUP_M)
    if ROW:
        rows = pid_m * 32 + tl.arange(0, 32)
        words2 = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        _store_rows(_load_words(x_ptr, rows, words2, M, KW), rows, words2, M, KW, pid_n,
                    q_ptr, s_ptr, q_row_bytes, s_stride, MODE, EMAX, MBITS, FMAX, 32, BN)
    words = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    alo = tl.zeros((BN // 2,), dtype=tl.int32)
    ahi = tl.zeros((BN // 2,), dtype=tl.int32)
    for j in tl.static_range(32):
        row = pid_m * 32 + j
        w = _load_row_words(x_ptr, row, words, M, KW)
        lo, hi, mlo, mhi = _pair_bits(w)
        alo = tl.maximum(alo, mlo)
        ahi = tl.maximum(ahi, mhi)
    blo = _e8m0_scale(alo.to(tl.float32, bitcast=True), MODE, EMAX, MBITS, FMAX)
    bhi = _e8m0_scale(ahi.to(tl.float32, bitcast=True), MODE, EMAX, MBITS, FMAX)
    klo, mlo_, slo = _block_parts(blo)
    khi, mhi_, shi = _block_parts(bhi)
    keep, mult, sgn = (klo, khi), (mlo_, mhi_), (slo, shi)
    # x.T row n = 2 * word (low elements) / 2 * word + 1 (high): nibble j of its 32 codes
    # (byte j // 2) is row j; word t holds rows 8t .. 8t + 7.
    l0 = tl.zeros((BN // 2,), dtype=tl.int32)
    l1 = tl.zeros((BN // 2,), dtype=tl.int32)
    l2 = tl.zeros((BN // 2,), dtype=tl.int32)
    l3 = tl.zeros((BN // 2,), dtype=tl.int32)
    h0 = tl.zeros((BN // 2,), dtype=tl.int32)
    h1 = tl.zeros((BN // 2,), dtype=tl.int32)
    h2 = tl.zeros((BN // 2,), dtype=tl.int32)
    h3 = tl.zeros((BN // 2,), dtype=tl.int32)
    for j in tl.static_range(32):
        clo, chi = _col_pass_words(x_ptr, pid_m, words, M, KW, j, keep, mult, sgn)
        sh = 4 * (j % 8)
        if j // 8 == 0:
            l0 |= clo << sh
            h0 |= chi << sh
        elif j // 8 == 1:
            l1 |= clo << sh
            h1 |= chi << sh
        elif j // 8 == 2:
            l2 |= clo << sh
            h2 |= chi << sh
        else:
            l3 |= clo << sh
            h3 |= chi << sh
    K = 2 * KW
    _store_col_words(qt_ptr, 2 * words, pid_m * 4, K, qt_words, l0, l1, l2, l3)
    _store_col_words(qt_ptr, 2 * words + 1, pid_m * 4, K, qt_words, h0, h1, h2, h3)
    smask = tl.zeros_like(words) + pid_m < tl.cdiv(M, 32)
    tl.store(st_ptr + (2 * words).to(tl.int64) * st_stride + pid_m, blo.to(tl.uint8),
             mask=(2 * words < K) & smask)
    tl.store(st_ptr + (2 * words + 1).to(tl.int64) * st_stride + pid_m, bhi.to(tl.uint8),
             mask=(2 * words + 1 < K) & smask)
