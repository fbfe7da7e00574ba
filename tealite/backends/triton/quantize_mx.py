"""MX block-scaled quantization (MXFP8 e4m3 / e5m2 / FNUZ, MXFP4 e2m1): rowwise, columnwise
and both in one cast-transpose pass.

One program reads one (BM, BN) tile of x (coalesced along K) once and writes

* rowwise: E8M0 scales of its 1x32 blocks (blocks along K) and the codes, (M, K) for FP8 or
  (M, ceil(K/2)) packed bytes for e2m1 (low nibble = even element);
* columnwise (the rowwise quantization of x.T, stored (K, M)): scales of its 32x1 blocks and
  the codes, transposed in registers (``tl.trans``) so the (K, M) store is coalesced along M.

A partial last block (``pad=True``) is masked: its amax is over the real elements, missing
elements read as 0 (so an odd e2m1 row gets a zero high nibble).  Block amax is the integer
max of ``bits & 0x7FFFFFFF``: exact and NaN-propagating in one reduction (NaN bit patterns
sort above Inf), so a block with NaN or Inf gets scale byte 255.  Scale, division by the
scale and element rounding are the shared codecs (``_codecs``), the same bits as the
reference on every target.

Tiles (``_TILES``) are chosen for an H100/H200 and for AMD (64-wide wavefronts): the
cast-transpose tile 32 x 64 with 2 warps holds one 32-row block per column, so its column
amax needs no cross-warp reduction; the rowwise-only tile is wide along K so each row
segment read is 128 x 2 bytes.  benchmarks/quantize_tiles.py sweeps them.  OCP FP8 RNE codes use the hardware
conversion where ``_codecs.hw_fp8`` allows it (same bits); E2M1 codes a comparison ladder.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton._codecs import (_e8m0_scale, _encode_fp4, _encode_fp4_arith,
                                             _encode_fp8_rounded, _into_word,
                                             _fmt_constants, _mag_max, _mx_descale,
                                             _mx_scale_constants,
                                             _tile_ids, hw_fp8)
from tealite.backends.triton._io import as_kernel_arg, load_f32
from tealite.backends.triton._mx_pairs import (_mx_fp4_cols_ct_kernel, _mx_fp4_pairs_ct_kernel,
                                               _mx_fp4_pairs_kernel, _store_col_words)
from tealite.formats import ElementRounding, get_format

MX_BLOCK = 32
# (BM, BN, num_warps) per direction set (rowwise, columnwise), read at every launch
# (benchmarks/quantize_tiles.py overrides them for a sweep); BM and BN must be multiples of 32.
# An optional 4th entry is GROUP_M, the tile order (_codecs._tile_ids; default 1, row-major).
# Columnwise codes are stored along BM: 128 makes each run of the (K, M) output 128 bytes
# (FP8; 64 packed e2m1 bytes).
# (rows, cols, warps) per (rowwise, columnwise); measured on an H100 (quantize_tiles.py, bf16
# 16384x8192): rowwise 32x128/4 at 94 % of copy.  Cast-transpose: 32x64 with 2 warps, 48.8 %
# (MXFP8) and 31.3 % (MXFP4), against 36.6 % and 26.9 % for 64x64/4 and 32 % / 18 % for
# 128x64/8 -- a 32-row tile on few warps keeps each column block's amax inside a warp (no
# shared-memory reduction and barrier per tile).  (32x128/2 is 51.9 % for MXFP8 but 28.2 % for
# MXFP4; one warp spills for MXFP4.)  Columnwise-only takes the same tile (not swept apart).
_TILES = {(True, False): (32, 128, 4), (False, True): (32, 64, 2), (True, True): (32, 64, 2),
          # A format's own entry wins (_tile): MXFP8's cast-transpose measured 74.5 % (fifth
          # session) and 73.5 % (sixth, docs/benchmarks/2026-11-27-s6/h100-mx-sweep.txt) of copy
          # on 32x128/2 against 68.4 % on 32x64/2, where MXFP4's loses (41.8 vs 45.7): MXFP8
          # alone moves (same kernel, same bits: the sweep compares every configuration).
          (True, True, "e4m3"): (32, 128, 2)}
# Kernel variants, read at every launch like _TILES (benchmarks/quantize_tiles.py --variant sets
# them; every variant gives the same bits, tests/test_triton_ct_variants.py):
# * "ct": "trans" transposes the (BM, BN) byte codes with tl.trans (the compiler moves them
#   through shared memory one byte at a time); "packed" reads the tile as R interleaved row
#   sub-tiles (rows R*i + j), so a thread holds the R codes of one column that are
#   consecutive in x.T and packs them into a 32-bit word (R = 4 FP8 codes or 8 e2m1 nibbles):
#   the transpose moves words, a quarter of the shared-memory operations, and a column block's
#   amax is first an elementwise max over the sub-tiles.  The sub-tiles are read twice (the
#   second time from L1/L2): amaxes first, then the codes.  Needs M % R == 0 (else "trans").
# * "e2m1": "ladder" (_codecs._encode_fp4) or "arith" (_codecs._encode_fp4_arith, RNE only;
#   ties-away keeps the ladder).
# * "nan": "fix" (the encoders' NaN / Inf handling, dead code here) or "skip": every value
#   reaching an encoder is finite (a block holding NaN or Inf gets scale 255 and _mx_descale
#   gives 0; any other block's descaled values are finite), so the encoders' NaN fix-ups and
#   the hardware FP8 path's clamp are left out (FINITE); "auto": "skip" except for MXFP8
#   rowwise-only, where the H100 measured "skip" slower (94.0 -> 58.0 % of copy).
# Defaults from the H100 sweep (docs/benchmarks.md, 2026-11-27 fifth session; % of copy):
# "arith" + skip took MXFP4 rowwise 54.7 -> 82.6 and cast-transpose 31.2 -> 46.0; skip took
# the MXFP8 cast-transpose 48.6 -> 68.0 (same tile); "packed" helped MX neither way.
# * "row" (MXFP4 rowwise-only): "tile" (_mx_cast_kernel) or "pairs" (_mx_pairs: x read as
#   32-bit words of two bf16, so a word's two codes are one byte; with its tile a thread owns
#   whole 32-element blocks: no shuffles, no shared-memory layout change before the 16-byte
#   code stores).  Needs bf16 x, even K and the arithmetic RNE encoder (else "tile").
#   "ct" also takes "pairs" for MXFP4 (_mx_pairs' cast-transpose: even and odd rows read as
#   two word tiles, so an x.T byte's two codes meet in a thread and only packed bytes are
#   transposed); same conditions and M even (else the "ct" default, "trans").  "cols"
#   (MXFP4, M % 8 == 0): the columnwise side from the tile's rows read one by one, so a
#   thread holds whole columns: in-thread column blocks and scales, codes built as x.T words
#   (no transpose); the rowwise side as "pairs".  MXFP8 "cols" (M % 4 == 0): the same
#   columnwise structure, rowwise as the default kernel (_mx_fp8_cols_ct_kernel).
# H100 sweep, sixth session (docs/benchmarks/2026-11-27-s6/h100-mx-sweep.txt): MXFP4 rowwise
# "pairs" 84.1 % of copy (default 82.1), MXFP4 ct "cols" 50.1 (45.7), "pairs" 42.8; **MXFP8
# "cols" wrote other bits than the default on the H100 at 32x256/4 and 32x128/2** (the
# interpreter's bits agree: a compiled-only difference, not found yet): do not select it for
# MXFP8.  No default moved on these: the gains are small and no compiled fuzz ran with them.
# Seventh session (docs/benchmarks/2026-11-27-s7/h100-mxfp4-row-sweep.txt): "pairs" on wider
# tiles, 16 x 512 on 4 warps 90.7 % of copy (32 x 256 / 4: 89.0; the default tile 81.7), same
# bits as the default kernel on every tile: "pairs" is MXFP4 rowwise's default since.
VARIANTS = {"ct": "trans", "e2m1": "arith", "nan": "auto", "row": "pairs"}
# Tiles of the "packed" cast-transpose, per (rowwise, columnwise) with columnwise (BM a
# multiple of 32, BN of 32): 64 x 64 on 2 warps has the fewest instructions per element of
# those cross-compiled (benchmarks/quantize_ptx.py); not yet timed on a GPU.
_PACKED_TILES = {(False, True): (64, 64, 2), (True, True): (64, 64, 2)}
# Tile of the "pairs" rowwise kernel (rows, x columns, warps[, GROUP_M]): 16 x 512 on 4 warps,
# 32 elements (one block) per thread, fastest of the H100 sweep (above; 32 x 128 / 4: 84.0 %).
_PAIRS_TILES = {(True, False): (16, 512, 4), (False, True): (64, 64, 2), (True, True): (64, 64, 2)}
# Tiles of the "cols" MXFP4 cast-transpose (_mx_pairs; 32 rows always, the first entry is
# ignored): 32 x 256 on 4 warps is one word (2 columns) per thread and row, 38.5 SASS / el
# on sm_90a against 49.0 for the default (2 words per thread, on 2 warps: layout changes
# through shared memory, 21 barriers); not yet timed on a GPU.
_COLS_TILES = {(False, True, True): (32, 256, 4), (True, True, True): (32, 256, 4),
               # MXFP8 (quantize_mx._mx_fp8_cols_ct_kernel): (rowwise, columnwise, FP4 False).
               (False, True, False): (32, 128, 4), (True, True, False): (32, 128, 4)}


@triton.jit
def _mx_encode(y, FP4: tl.constexpr, TIES_AWAY: tl.constexpr, FMAX: tl.constexpr,
               MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
               NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr, HW_FP8: tl.constexpr,
               FP4_ARITH: tl.constexpr = False, FINITE: tl.constexpr = False):
    """uint8 element codes of descaled values (E2M1 nibbles or FP8 bytes); one byte per
    code keeps the shared-memory transpose of the cast-transpose small.  FP4_ARITH: the
    arithmetic E2M1 encoder (same codes, RNE only)."""
    if FP4 and FP4_ARITH and not TIES_AWAY:
        return _encode_fp4_arith(y, FINITE).to(tl.uint8)
    elif FP4:
        return _encode_fp4(y, TIES_AWAY).to(tl.uint8)
    else:
        return _encode_fp8_rounded(y, FMAX, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE,
                                   TIES_AWAY, HW_FP8, FINITE)


@triton.jit
def _pack_nibbles(codes, R: tl.constexpr, C: tl.constexpr):
    """(R, C // 2) bytes of (R, C) uint8 E2M1 codes: low nibble = even element."""
    even, odd = tl.split(tl.reshape(codes, (R, C // 2, 2)))
    return even | (odd << 4)


@triton.jit
def _store_codes(ptr, codes, rows, col0, n_rows, n_cols, row_bytes, FP4: tl.constexpr,
                 R: tl.constexpr, C: tl.constexpr):
    """Store an (R, C) code tile at ``rows`` x [col0, col0 + C) of an (n_rows, n_cols)
    row-major code matrix of ``row_bytes`` bytes per row (FP8: n_cols, one byte per code;
    FP4: ceil(n_cols / 2), C and col0 even).  ``row_bytes`` is a kernel argument, not
    computed here, so Triton sees its divisibility by 16 and vectorizes the stores."""
    cols = col0 + tl.arange(0, C)
    if FP4:
        bcols = col0 // 2 + tl.arange(0, C // 2)
        offs = rows.to(tl.int64)[:, None] * row_bytes + bcols[None, :]
        mask = (rows < n_rows)[:, None] & (bcols < row_bytes)[None, :]
        tl.store(ptr + offs, _pack_nibbles(codes, R, C), mask=mask)
    else:
        offs = rows.to(tl.int64)[:, None] * row_bytes + cols[None, :]
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        tl.store(ptr + offs, codes, mask=mask)


@triton.jit
def _mx_rows(x, rows, pid_n, M, K, q_ptr, s_ptr, q_row_bytes, s_stride, FP4: tl.constexpr,
             TIES_AWAY: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr,
             MBITS: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
             FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
             HW_FP8: tl.constexpr, FP4_ARITH: tl.constexpr, FINITE: tl.constexpr,
             R: tl.constexpr,
             BN: tl.constexpr):
    """Rowwise MX quantization of the fp32 (R, BN) tile ``x`` at x's ``rows`` and tile column
    ``pid_n``: its 1x32 block scales and codes stored."""
    xb = tl.reshape(x, (R, BN // 32, 32))
    byte = _e8m0_scale(_mag_max(xb, 2), MODE, EMAX, MBITS, FMAX)  # (R, BN // 32)
    y = _mx_descale(xb, byte[:, :, None])
    codes = tl.reshape(_mx_encode(y, FP4, TIES_AWAY, FMAX, MBITS, EMIN, BIAS, FNUZ,
                                  NAN_CODE, SUB_SCALE, HW_FP8, FP4_ARITH, FINITE), (R, BN))
    _store_codes(q_ptr, codes, rows, pid_n * BN, M, K, q_row_bytes, FP4, R, BN)
    kb = pid_n * (BN // 32) + tl.arange(0, BN // 32)
    smask = (rows < M)[:, None] & (kb < tl.cdiv(K, 32))[None, :]
    tl.store(s_ptr + rows.to(tl.int64)[:, None] * s_stride + kb[None, :],
             byte.to(tl.uint8), mask=smask)


@triton.jit
def _store_col_scales(st_ptr, byte, cols, pid_m, M, K, st_stride, BM: tl.constexpr):
    """Store the (BM // 32, BN) columnwise scale bytes of tile row ``pid_m`` into the
    (K, ceil(M / 32)) scale matrix."""
    mb = pid_m * (BM // 32) + tl.arange(0, BM // 32)
    smask = (cols < K)[:, None] & (mb < tl.cdiv(M, 32))[None, :]
    tl.store(st_ptr + cols.to(tl.int64)[:, None] * st_stride + mb[None, :],
             tl.trans(byte).to(tl.uint8), mask=smask)


@triton.jit
def _mx_cast_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, q_row_bytes, qt_row_bytes,
                    s_stride, st_stride,
                    ROW: tl.constexpr, COL: tl.constexpr, FP4: tl.constexpr,
                    TIES_AWAY: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr,
                    MBITS: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr,
                    BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                    SUB_SCALE: tl.constexpr, X_BF16: tl.constexpr, HW_FP8: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr = 1,
                    FP4_ARITH: tl.constexpr = False, FINITE: tl.constexpr = False):
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
    if ROW:
        _mx_rows(x, rows, pid_n, M, K, q_ptr, s_ptr, q_row_bytes, s_stride, FP4, TIES_AWAY,
                 MODE, EMAX, MBITS, FMAX, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE, HW_FP8,
                 FP4_ARITH, FINITE, BM, BN)
    if COL:
        xb = tl.reshape(x, (BM // 32, 32, BN))
        byte = _e8m0_scale(_mag_max(xb, 1), MODE, EMAX, MBITS, FMAX)  # (BM // 32, BN)
        y = _mx_descale(xb, byte[:, None, :])
        codes = tl.reshape(_mx_encode(y, FP4, TIES_AWAY, FMAX, MBITS, EMIN, BIAS, FNUZ,
                                      NAN_CODE, SUB_SCALE, HW_FP8, FP4_ARITH, FINITE), (BM, BN))
        _store_codes(qt_ptr, tl.trans(codes), cols, pid_m * BM, K, M, qt_row_bytes, FP4, BN,
                     BM)
        _store_col_scales(st_ptr, byte, cols, pid_m, M, K, st_stride, BM)


@triton.jit
def _load_sub_tile(x_ptr, rows, cols, M, K, EVEN: tl.constexpr, X_BF16: tl.constexpr):
    """fp32 x[rows, cols]; with EVEN every element is inside x, and a constant mask lets the
    compiler drop the per-element predicates and the zero fill."""
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    if EVEN:
        x = load_f32(x_ptr, offs, True, X_BF16)
    else:
        x = load_f32(x_ptr, offs, (rows < M)[:, None] & (cols < K)[None, :], X_BF16)
    return x


@triton.jit
def _mx_ct_packed_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, q_row_bytes, qt_words,
                         s_stride, st_stride,
                         ROW: tl.constexpr, FP4: tl.constexpr,
                         TIES_AWAY: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr,
                         MBITS: tl.constexpr, FMAX: tl.constexpr, EMIN: tl.constexpr,
                         BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                         SUB_SCALE: tl.constexpr, X_BF16: tl.constexpr, HW_FP8: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr = 1,
                         FP4_ARITH: tl.constexpr = False, FINITE: tl.constexpr = False,
                         EVEN: tl.constexpr = False):
    """The cast-transpose of ``VARIANTS["ct"] == "packed"`` (columnwise, and rowwise with ROW):
    the same bits as _mx_cast_kernel.  The (BM, BN) tile is R row sub-tiles, sub-tile j
    holding rows R*i + j; ``qt_ptr`` is the columnwise code matrix as int32 words
    (``qt_words`` per row of x.T), word (n, w) the R codes of column n at rows R*w .. R*w+R-1
    (byte / nibble order = row order, as the byte layout).  M % R == 0 (host); EVEN: whole
    tiles (M % BM == K % BN == 0), the loads need no mask."""
    R: tl.constexpr = 8 if FP4 else 4  # codes per 32-bit word
    BITS: tl.constexpr = 4 if FP4 else 8
    S: tl.constexpr = BM // R  # rows per sub-tile
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    sub = tl.arange(0, S)
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = (cols < K)[None, :]
    # Pass 1: rowwise output, and the column magnitudes reduced over the sub-tiles.
    cmag = tl.zeros((S, BN), dtype=tl.int32)
    for j in tl.static_range(R):
        rows = pid_m * BM + sub * R + j
        x = _load_sub_tile(x_ptr, rows, cols, M, K, EVEN, X_BF16)
        cmag = tl.maximum(cmag, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        if ROW:
            _mx_rows(x, rows, pid_n, M, K, q_ptr, s_ptr, q_row_bytes, s_stride, FP4,
                     TIES_AWAY, MODE, EMAX, MBITS, FMAX, EMIN, BIAS, FNUZ, NAN_CODE,
                     SUB_SCALE, HW_FP8, FP4_ARITH, FINITE, S, BN)
    # A 32-row block is 32 // R consecutive sub-tile rows: the integer max of the magnitude
    # bits, as _mag_max (exact, NaN-propagating).
    amax = tl.max(tl.reshape(cmag, (BM // 32, 32 // R, BN)), axis=1).to(tl.float32,
                                                                         bitcast=True)
    byte = _e8m0_scale(amax, MODE, EMAX, MBITS, FMAX)  # (BM // 32, BN)
    # Pass 2: the sub-tiles again (cache hits), each code shifted into its slot of the word.
    word = tl.zeros((S, BN), dtype=tl.int32)
    for j in tl.static_range(R):
        rows = pid_m * BM + sub * R + j
        x = _load_sub_tile(x_ptr, rows, cols, M, K, EVEN, X_BF16)
        y = _mx_descale(tl.reshape(x, (BM // 32, 32 // R, BN)), byte[:, None, :])
        codes = _mx_encode(y, FP4, TIES_AWAY, FMAX, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                           SUB_SCALE, HW_FP8, FP4_ARITH, FINITE)
        word = _into_word(word, tl.reshape(codes, (S, BN)), j, BITS)
    words = pid_m * S + sub
    tl.store(qt_ptr + cols.to(tl.int64)[:, None] * qt_words + words[None, :], tl.trans(word),
             mask=tl.trans(cmask) & (words < qt_words)[None, :])
    _store_col_scales(st_ptr, byte, cols, pid_m, M, K, st_stride, BM)


@triton.jit
def _load_row(x_ptr, row, cols, M, K, X_BF16: tl.constexpr):
    """fp32 x[row, cols] of one row (a scalar), 0 past the ends."""
    rows = tl.zeros_like(cols) + row  # a vector mask (the interpreter rejects scalar & vector)
    return load_f32(x_ptr, rows.to(tl.int64) * K + cols, (cols < K) & (rows < M), X_BF16)


@triton.jit
def _fp8_col_word(x_ptr, row0, cols, M, K, byte, TIES_AWAY: tl.constexpr, FMAX: tl.constexpr,
                  MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                  FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                  X_BF16: tl.constexpr, HW_FP8: tl.constexpr, FINITE: tl.constexpr):
    """int32 words of the FP8 codes of x rows row0 .. row0 + 3 (byte r = row row0 + r) in
    columns ``cols``, each column's block scale ``byte``: one word of x.T per column."""
    word = tl.zeros_like(cols)
    for r in tl.static_range(4):
        y = _mx_descale(_load_row(x_ptr, row0 + r, cols, M, K, X_BF16), byte)
        code = _mx_encode(y, False, TIES_AWAY, FMAX, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                          SUB_SCALE, HW_FP8, False, FINITE)
        word = word | (code.to(tl.int32) << (8 * r))
    return word


@triton.jit
def _mx_fp8_cols_ct_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, q_row_bytes, qt_words,
                           s_stride, st_stride,
                           ROW: tl.constexpr, TIES_AWAY: tl.constexpr, MODE: tl.constexpr,
                           EMAX: tl.constexpr, MBITS: tl.constexpr, FMAX: tl.constexpr,
                           EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                           NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                           X_BF16: tl.constexpr, HW_FP8: tl.constexpr, BN: tl.constexpr,
                           GROUP_M: tl.constexpr = 1, FINITE: tl.constexpr = False):
    """MXFP8 cast-transpose of ``VARIANTS["ct"] == "cols"`` on a (32, BN) tile (M % 4 == 0;
    ``qt_ptr`` the x.T codes as int32 words, ``qt_words`` per row), as _mx_pairs' MXFP4
    "cols" kernel: the columnwise side reads the tile row by row as 1-D vectors, so a thread
    holds whole columns (in-thread block amax and scale, once per column), and builds each
    column's 32 codes as 8 words of x.T (two 16-byte stores, no transpose).  Rows are read
    twice (amaxes, then codes; the second time from cache).  ROW: the rowwise side is the
    default kernel's (_mx_rows) on the tile read as one 2-D tile."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, 32), tl.cdiv(K, BN), GROUP_M)
    cols = pid_n * BN + tl.arange(0, BN)
    if ROW:
        rows = pid_m * 32 + tl.arange(0, 32)
        mask = (rows < M)[:, None] & (cols < K)[None, :]
        x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
        _mx_rows(x, rows, pid_n, M, K, q_ptr, s_ptr, q_row_bytes, s_stride, False, TIES_AWAY,
                 MODE, EMAX, MBITS, FMAX, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE, HW_FP8, False,
                 FINITE, 32, BN)
    amax = tl.zeros((BN,), dtype=tl.int32)
    for j in tl.static_range(32):
        x = _load_row(x_ptr, pid_m * 32 + j, cols, M, K, X_BF16)
        amax = tl.maximum(amax, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)  # as _mag_max
    byte = _e8m0_scale(amax.to(tl.float32, bitcast=True), MODE, EMAX, MBITS, FMAX)
    for h in tl.static_range(2):  # x.T words pid_m * 8 + 4h ..: rows 16h .. 16h + 15
        row0 = pid_m * 32 + 16 * h
        a0 = _fp8_col_word(x_ptr, row0, cols, M, K, byte, TIES_AWAY, FMAX, MBITS, EMIN, BIAS,
                           FNUZ, NAN_CODE, SUB_SCALE, X_BF16, HW_FP8, FINITE)
        a1 = _fp8_col_word(x_ptr, row0 + 4, cols, M, K, byte, TIES_AWAY, FMAX, MBITS, EMIN,
                           BIAS, FNUZ, NAN_CODE, SUB_SCALE, X_BF16, HW_FP8, FINITE)
        a2 = _fp8_col_word(x_ptr, row0 + 8, cols, M, K, byte, TIES_AWAY, FMAX, MBITS, EMIN,
                           BIAS, FNUZ, NAN_CODE, SUB_SCALE, X_BF16, HW_FP8, FINITE)
        a3 = _fp8_col_word(x_ptr, row0 + 12, cols, M, K, byte, TIES_AWAY, FMAX, MBITS, EMIN,
                           BIAS, FNUZ, NAN_CODE, SUB_SCALE, X_BF16, HW_FP8, FINITE)
        _store_col_words(qt_ptr, cols, pid_m * 8 + 4 * h, K, qt_words, a0, a1, a2, a3)
    smask = (cols < K) & (tl.zeros_like(cols) + pid_m < tl.cdiv(M, 32))
    tl.store(st_ptr + cols.to(tl.int64) * st_stride + pid_m, byte.to(tl.uint8), mask=smask)


def _n_blocks(n: int) -> int:
    """E8M0 scales per row of n elements (the last block may be partial)."""
    return -(-n // MX_BLOCK)


def _row_stride(t: torch.Tensor | None) -> int:
    """Elements between rows of a scale matrix the kernel writes (0 for one not written)."""
    return 0 if t is None else t.stride(0)


def _ties_away(recipe) -> bool:
    return recipe.element_rounding is ElementRounding.TIES_AWAY


def _codes_tensor(rows: int, cols: int, fmt, device) -> torch.Tensor:
    """Codes of a (rows, cols) direction: uint8 bytes, two e2m1 codes per byte."""
    return torch.empty((rows, -(-cols // 2) if fmt.packed else cols), dtype=torch.uint8,
                       device=device)


def _packs(m: int, fmt) -> bool:
    """Whether the "packed" cast-transpose runs: chosen, and each row of x.T is whole 32-bit
    words of codes (4 FP8 codes, 8 e2m1 nibbles)."""
    return VARIANTS["ct"] == "packed" and m % (8 if fmt.packed else 4) == 0


def _tile(fmt, rowwise: bool, columnwise: bool) -> tuple:
    """The _mx_cast_kernel launch entry: the format's own, else the directions' shared one."""
    return _TILES.get((rowwise, columnwise, fmt.name), _TILES[(rowwise, columnwise)])


def _pairs(x: torch.Tensor, fmt, recipe, rowwise: bool, columnwise: bool) -> bool:
    """Whether a bf16-pair MXFP4 kernel (_mx_pairs) runs: chosen (VARIANTS["row"] for
    rowwise only, VARIANTS["ct"] with columnwise, where M must be even), RNE e2m1 with the
    arithmetic encoder, and x readable as 32-bit words of two bf16 (even K, even element
    offset)."""
    chosen = (VARIANTS["ct"] == "pairs" and x.shape[0] % 2 == 0
              or VARIANTS["ct"] == "cols" and x.shape[0] % 8 == 0) if columnwise else \
        VARIANTS["row"] == "pairs"
    return (chosen and fmt.packed and not _ties_away(recipe) and VARIANTS["e2m1"] == "arith"
            and x.dtype == torch.bfloat16 and x.shape[1] % 2 == 0
            and x.storage_offset() % 2 == 0)


def _fp8_cols(m: int, fmt) -> bool:
    """Whether the MXFP8 "cols" cast-transpose runs: chosen, and x.T rows are whole 32-bit
    words (M % 4 == 0)."""
    return VARIANTS["ct"] == "cols" and not fmt.packed and m % 4 == 0


def _finite(fmt, rowwise: bool, columnwise: bool) -> bool:
    """Whether the encoders skip their NaN / Inf handling (VARIANTS["nan"])."""
    mode = VARIANTS["nan"]
    return mode == "skip" or (mode == "auto" and (fmt.packed or columnwise))


def _launch_fp4_pairs(x, q, s, qt, st, consts: dict, rowwise: bool, columnwise: bool, dummy):
    """Launch the _mx_pairs kernel that ``VARIANTS`` picks (``_pairs`` said one runs)."""
    m, k = x.shape
    xw = x.view(torch.int32)
    scale = {n: consts[n] for n in ("MODE", "EMAX", "MBITS", "FMAX")}
    q_arg, s_arg = (q, s) if rowwise else (dummy, dummy)
    if columnwise and VARIANTS["ct"] == "cols":
        _, bn, warps, *group = _COLS_TILES[(rowwise, columnwise, True)]  # 32 rows
        words = qt.view(torch.int32)
        _mx_fp4_cols_ct_kernel[(triton.cdiv(m, 32) * triton.cdiv(k, bn),)](
            xw, q_arg, s_arg, words, st, m, k // 2, _row_stride(q), words.stride(0),
            _row_stride(s), st.stride(0), ROW=rowwise, BN=bn,
            GROUP_M=group[0] if group else 1, num_warps=warps, **scale)
        return
    bm, bn, warps, *group = _PAIRS_TILES[(rowwise, columnwise)]
    grid = (triton.cdiv(m, bm) * triton.cdiv(k, bn),)
    launch = dict(BM=bm, BN=bn, GROUP_M=group[0] if group else 1, num_warps=warps, **scale)
    if columnwise:
        _mx_fp4_pairs_ct_kernel[grid](xw, q_arg, s_arg, qt, st, m, k // 2, _row_stride(q),
                                      qt.stride(0), _row_stride(s), st.stride(0), ROW=rowwise,
                                      **launch)
    else:
        _mx_fp4_pairs_kernel[grid](xw, q, s, m, k // 2, q.stride(0), s.stride(0), **launch)


def quantize_mx(x: torch.Tensor, recipe, *, rowwise: bool, columnwise: bool):
    """(data, scale_inv, columnwise_data, columnwise_scale_inv) of an MX recipe; the
    directions not asked for are None."""
    fmt = get_format(recipe.fmt)
    x = x.contiguous()
    m, k = x.shape
    dev = x.device
    q = s = qt = st = None
    if rowwise:
        q = _codes_tensor(m, k, fmt, dev)
        s = torch.empty((m, _n_blocks(k)), dtype=torch.uint8, device=dev)
    if columnwise:
        qt = _codes_tensor(k, m, fmt, dev)
        st = torch.empty((k, _n_blocks(m)), dtype=torch.uint8, device=dev)
    if m and k:
        consts = dict(_fmt_constants(fmt), **_mx_scale_constants(fmt.name, recipe.scale_rounding),
                      FP4=fmt.packed, TIES_AWAY=_ties_away(recipe), X_BF16=x.dtype == torch.bfloat16,
                      HW_FP8=hw_fp8(x.device), FP4_ARITH=VARIANTS["e2m1"] == "arith",
                      FINITE=_finite(fmt, rowwise, columnwise))
        dummy = torch.empty(1, dtype=torch.uint8, device=dev)
        if columnwise and _fp8_cols(m, fmt):
            _, bn, warps, *group = _COLS_TILES[(rowwise, columnwise, False)]  # 32 rows
            words = qt.view(torch.int32)
            _mx_fp8_cols_ct_kernel[(triton.cdiv(m, 32) * triton.cdiv(k, bn),)](
                as_kernel_arg(x), dummy if q is None else q, dummy if s is None else s, words,
                st, m, k, _row_stride(q), words.stride(0), _row_stride(s), st.stride(0),
                ROW=rowwise, BN=bn, GROUP_M=group[0] if group else 1, num_warps=warps,
                **{n: v for n, v in consts.items() if n not in ("FP4", "FP4_ARITH")})
        elif _pairs(x, fmt, recipe, rowwise, columnwise):
            _launch_fp4_pairs(x, q, s, qt, st, consts, rowwise, columnwise, dummy)
        elif columnwise and _packs(m, fmt):
            bm, bn, warps, *group = _PACKED_TILES[(rowwise, columnwise)]
            words = qt.view(torch.int32)
            _mx_ct_packed_kernel[(triton.cdiv(m, bm) * triton.cdiv(k, bn),)](
                as_kernel_arg(x), dummy if q is None else q, dummy if s is None else s, words,
                st, m, k, _row_stride(q), words.stride(0), _row_stride(s), _row_stride(st),
                ROW=rowwise, BM=bm, BN=bn, GROUP_M=group[0] if group else 1, num_warps=warps,
                EVEN=m % bm == 0 and k % bn == 0, **consts)
        else:
            bm, bn, warps, *group = _tile(fmt, rowwise, columnwise)
            _mx_cast_kernel[(triton.cdiv(m, bm) * triton.cdiv(k, bn),)](
                as_kernel_arg(x), dummy if q is None else q, dummy if s is None else s,
                dummy if qt is None else qt, dummy if st is None else st, m, k,
                _row_stride(q), _row_stride(qt), _row_stride(s),
                _row_stride(st), ROW=rowwise, COL=columnwise, BM=bm, BN=bn,
                GROUP_M=group[0] if group else 1, num_warps=warps, **consts)
    if not fmt.packed:
        q = None if q is None else q.view(fmt.torch_dtype)
        qt = None if qt is None else qt.view(fmt.torch_dtype)
    return q, s, qt, st
