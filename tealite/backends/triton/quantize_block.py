"""Float8BlockScaling (TE): FP8 codes with one fp32 scale per 1x128 or 128x128 block;
rowwise, columnwise, and both in one cast-transpose pass.

The scale rule is TE's (``_te_scale``: amax_epsilon floor, fp32 IEEE division, inf -> fp32
max, zero/NaN/Inf amax -> 1, optional power-of-two rounding down); scale_inv = 1/scale (IEEE
``div_rn``).  Columnwise is the rowwise quantization of x.T stored (K, M):

* 1x128: rowwise blocks are 128 consecutive elements of a row of x, columnwise blocks 128
  consecutive elements of a column of x; scale_inv (M, ceil(K/128)) and (K, ceil(M/128)).
* 128x128: the same blocks both ways, so the columnwise codes are the transposed rowwise
  codes; scale_inv (ceil(M/128), ceil(K/128)) and its transpose.

One program reads one tile (BM, BN) of x once: BN = 128 for rowwise 1x128 (a whole block
along K), BM = 128 for columnwise 1x128, 128 x 128 for 128x128 blocks.  Partial edge blocks
are masked (amax over the real elements, TE's rule).  Block amax is the integer max of the
magnitude bits (exact, NaN-propagating).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton._codecs import (_encode_fp8_sat, _fmt_constants, _into_word,
                                             _mag_max, _overflow_constants, _te_scale,
                                             _tile_ids, hw_fp8)
from tealite.backends.triton._io import as_kernel_arg, load_f32
from tealite.backends.triton.quantize_mx import _load_sub_tile
from tealite.formats import Saturation, get_format

BLOCK = 128
# (BM, BN, num_warps) by (block rows, rowwise, columnwise), read at every launch
# (benchmarks/quantize_tiles.py overrides them for a sweep); an optional 4th entry is GROUP_M,
# the tile order (_codecs._tile_ids; default 1, row-major).  A 128 x 128 tile with 8 warps is
# 64 fp32 values per thread on NVIDIA (32 per lane on AMD's 64-wide wavefronts); 1x128 needs
# BN == 128 rowwise and BM == 128 columnwise.  Columnwise codes are stored along BM: 128 keeps
# each run of the (K, M) output 128 bytes.
_TILES = {
    # Measured on an H100 (quantize_tiles.py, bf16 16384x8192): rowwise 32x128/4 94 % of
    # copy; cast-transpose 128x128/4 46 % (8 warps: 39 %).
    (1, True, False): (32, 128, 4),
    (1, False, True): (128, 128, 4),
    (1, True, True): (128, 128, 4),
    (128, True, False): (128, 128, 8),
    (128, False, True): (128, 128, 8),
    (128, True, True): (128, 128, 8),
}
# Kernel variants, read at every launch like _TILES (benchmarks/quantize_tiles.py --variant
# sets them; every variant gives the same bits, tests/test_triton_ct_variants.py).  "ct" of the
# 1x128 cast-transpose: "trans" (tl.trans of the byte codes of a whole 128 x 128 tile, 128
# values per thread at 4 warps: 255 registers and spills, cross-compiled) or "packed": the tile
# as 4 interleaved row sub-tiles (rows 4i + j), read twice (column amaxes, then codes), the 4
# codes of a column consecutive in x.T packed into a 32-bit word so the transpose moves words
# (cross-compiled at 4 warps: 232 registers, no spill; 8 warps: 116).  Needs M % 4 == 0;
# 128x128 blocks keep "trans".
# "packed" measured faster on an H100 (docs/benchmarks.md, fifth session): FP8 per-tensor
# cast-transpose 61.4 -> 64.2 % (current) / 84.6 -> 91.5 % (delayed), block 1x128 46.1 -> 49.0 %.
VARIANTS = {"ct": "packed"}
# Tiles of "packed" (BM = 128: one column block; BN = 128: one row block), per (rowwise,
# columnwise) with columnwise; PACKED_SWEEP is what quantize_tiles.py tries (not yet measured).
_PACKED_TILES = {(1, False, True): (128, 128, 4), (1, True, True): (128, 128, 4)}
PACKED_SWEEP = [(128, 128, 4), (128, 128, 8), (128, 128, 2), (128, 128, 4, 8)]


@triton.jit
def _block_cast_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, s_stride, st_stride, fmax,
                       eps, ROW: tl.constexpr, COL: tl.constexpr, SQUARE: tl.constexpr,
                       POW2: tl.constexpr, SATURATE: tl.constexpr, MBITS: tl.constexpr,
                       EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                       NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                       OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                       OVF_CODE: tl.constexpr, X_BF16: tl.constexpr, HW_FP8: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr = 1):
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rmask = rows < M
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
    row_offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    col_offs = cols.to(tl.int64)[:, None] * M + rows[None, :]
    tmask = cmask[:, None] & rmask[None, :]
    if SQUARE:
        # One 128x128 block: the same scale and codes both ways.
        scale = _te_scale(_mag_max(_mag_max(x, 1), 0), fmax, eps, POW2)
        codes = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                           SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        sinv = tl.math.div_rn(1.0, scale)
        if ROW:
            tl.store(q_ptr + row_offs, codes, mask=mask)
            tl.store(s_ptr + pid_m * s_stride + pid_n, sinv)
        if COL:
            tl.store(qt_ptr + col_offs, tl.trans(codes), mask=tmask)
            tl.store(st_ptr + pid_n * st_stride + pid_m, sinv)
    else:
        if ROW:  # BN == 128: one block per row of the tile
            scale = _te_scale(_mag_max(x, 1), fmax, eps, POW2)  # (BM,)
            codes = _encode_fp8_sat(x * scale[:, None], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                               NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
            tl.store(q_ptr + row_offs, codes, mask=mask)
            tl.store(s_ptr + rows.to(tl.int64) * s_stride + pid_n,
                     tl.math.div_rn(1.0, scale), mask=rmask)
        if COL:  # BM == 128: one block per column of the tile
            scale = _te_scale(_mag_max(x, 0), fmax, eps, POW2)  # (BN,)
            codes = _encode_fp8_sat(x * scale[None, :], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                               NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
            tl.store(qt_ptr + col_offs, tl.trans(codes), mask=tmask)
            tl.store(st_ptr + cols.to(tl.int64) * st_stride + pid_m,
                     tl.math.div_rn(1.0, scale), mask=cmask)


@triton.jit
def _block_ct_packed_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, s_stride, st_stride,
                            qt_words, fmax, eps, ROW: tl.constexpr, POW2: tl.constexpr,
                            SATURATE: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                            BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                            SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr,
                            OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr,
                            X_BF16: tl.constexpr, HW_FP8: tl.constexpr, BM: tl.constexpr,
                            BN: tl.constexpr, GROUP_M: tl.constexpr = 1,
                            EVEN: tl.constexpr = False):
    """1x128 blocks, columnwise (and rowwise with ROW), ``VARIANTS["ct"] == "packed"``: the
    bits of _block_cast_kernel.  BM = BN = 128; ``qt_ptr`` is x.T's codes as int32 words
    (``qt_words`` per row); M % 4 == 0 (host); EVEN: whole tiles, unmasked loads."""
    S: tl.constexpr = BM // 4
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    sub = tl.arange(0, S)
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = (cols < K)[None, :]
    # Pass 1: rowwise blocks (one per sub-tile row), column magnitudes over the sub-tiles.
    cmag = tl.zeros((S, BN), dtype=tl.int32)
    for j in tl.static_range(4):
        rows = pid_m * BM + sub * 4 + j
        mask = (rows < M)[:, None] & cmask
        x = _load_sub_tile(x_ptr, rows, cols, M, K, EVEN, X_BF16)
        cmag = tl.maximum(cmag, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        if ROW:
            scale = _te_scale(_mag_max(x, 1), fmax, eps, POW2)  # (S,)
            codes = _encode_fp8_sat(x * scale[:, None], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                                    NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
            tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], codes, mask=mask)
            tl.store(s_ptr + rows.to(tl.int64) * s_stride + pid_n, tl.math.div_rn(1.0, scale),
                     mask=rows < M)
    # The column block's amax: the integer max of the magnitude bits, as _mag_max.
    scale = _te_scale(tl.max(cmag, 0).to(tl.float32, bitcast=True), fmax, eps, POW2)  # (BN,)
    tl.store(st_ptr + cols.to(tl.int64) * st_stride + pid_m, tl.math.div_rn(1.0, scale),
             mask=cols < K)
    # Pass 2: the sub-tiles again (cache hits), codes shifted into byte j of the words.
    word = tl.zeros((S, BN), dtype=tl.int32)
    for j in tl.static_range(4):
        rows = pid_m * BM + sub * 4 + j
        x = _load_sub_tile(x_ptr, rows, cols, M, K, EVEN, X_BF16)
        codes = _encode_fp8_sat(x * scale[None, :], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                                NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        word = _into_word(word, codes, j, 8)
    words = pid_m * S + sub
    tl.store(qt_ptr + cols.to(tl.int64)[:, None] * qt_words + words[None, :], tl.trans(word),
             mask=tl.trans(cmask) & (words < qt_words)[None, :])


def _scale_shape(rows: int, cols: int, block: tuple[int, int]) -> tuple[int, int]:
    """scale_inv shape of a rowwise block quantization of a (rows, cols) matrix."""
    bm, bn = block
    return -(-rows // bm), -(-cols // bn)


def quantize_block(x: torch.Tensor, recipe, *, rowwise: bool, columnwise: bool):
    """(data, scale_inv, columnwise_data, columnwise_scale_inv) of a Float8BlockScaling
    recipe; the directions not asked for are None."""
    fmt = get_format(recipe.fmt)
    x = x.contiguous()
    m, k = x.shape
    dev = x.device
    block = tuple(recipe.block)
    q = s = qt = st = None
    if rowwise:
        q = torch.empty((m, k), dtype=torch.uint8, device=dev)
        s = torch.empty(_scale_shape(m, k, block), dtype=torch.float32, device=dev)
    if columnwise:
        qt = torch.empty((k, m), dtype=torch.uint8, device=dev)
        st = torch.empty(_scale_shape(k, m, block), dtype=torch.float32, device=dev)
    if m and k:
        consts = dict(_fmt_constants(fmt), **_overflow_constants(fmt),
                      POW2=recipe.force_pow2_scales,
                      SATURATE=recipe.saturation is Saturation.SATURATE,
                      X_BF16=x.dtype == torch.bfloat16, HW_FP8=hw_fp8(x.device))
        dummy_q = torch.empty(1, dtype=torch.uint8, device=dev)
        dummy_s = torch.empty(1, dtype=torch.float32, device=dev)
        if columnwise and block[0] == 1 and VARIANTS["ct"] == "packed" and m % 4 == 0:
            bm, bn, warps, *group = _PACKED_TILES[(1, rowwise, columnwise)]
            words = qt.view(torch.int32)
            _block_ct_packed_kernel[(triton.cdiv(m, bm) * triton.cdiv(k, bn),)](
                as_kernel_arg(x), q if rowwise else dummy_q, s if rowwise else dummy_s, words,
                st, m, k, s.shape[1] if rowwise else 0, st.shape[1], words.stride(0), fmt.max,
                recipe.amax_epsilon, ROW=rowwise, BM=bm, BN=bn,
                GROUP_M=group[0] if group else 1, num_warps=warps,
                EVEN=m % bm == 0 and k % bn == 0, **consts)
        else:
            bm, bn, warps, *group = _TILES[(block[0], rowwise, columnwise)]
            _block_cast_kernel[(triton.cdiv(m, bm) * triton.cdiv(k, bn),)](
                as_kernel_arg(x), q if rowwise else dummy_q, s if rowwise else dummy_s,
                qt if columnwise else dummy_q, st if columnwise else dummy_s, m, k,
                s.shape[1] if rowwise else 0, st.shape[1] if columnwise else 0, fmt.max,
                recipe.amax_epsilon, ROW=rowwise, COL=columnwise, SQUARE=block[0] == BLOCK,
                BM=bm, BN=bn, GROUP_M=group[0] if group else 1, num_warps=warps, **consts)
    view = lambda t: None if t is None else t.view(fmt.torch_dtype)  # noqa: E731
    return view(q), s, view(qt), st
