"""Triton ``grouped_quantize`` (+ dbias): every group in one launch for FP8 per-tensor scaling
(current and delayed) and Float8BlockScaling (1x128, 128x128); the other recipes the Triton
quantizer takes (per-row current scaling, MX) run as one launch of ``quantize`` per group,
which is the split path itself (declared here; the parity tier holds both to it).

Tiles never cross a group boundary: the host cuts every group's rows into tiles of BM rows
starting at the group's first row (:func:`group_tiles`; an empty group still gets one tile,
whose rows are all masked, so that it writes its scale and its zero dbias partial), and a
program handles one (tile, column block) pair.  So a 1x128 / 128x128 block starts at a
group-local multiple of 128, exactly as ``quantize`` on the group alone would place it.

* Per tensor, current scaling: pass 1 takes each tile's max |x| (the integer max of the
  magnitude bits: exact and NaN-propagating, as ``quantize``'s amax) and ``atomic_max``es it
  into its group's slot; an order-independent max, so the result is deterministic.  Pass 2
  reads the group's amax, applies TE's scale rule (``_codecs._te_scale``, the same code as
  ``quantize``) and casts.  Delayed scaling reads group g's given scale instead and reports
  pass 1's amax.
* Block scaling: one pass, the block's amax and scale inside the tile, as ``quantize_block``.
* dbias: the cast pass (or, for the per-group recipes, a pass of its own) writes each tile's
  fp32 column sums to a workspace (tiles, K); :func:`_reduce_dbias_kernel` adds one group's
  tiles in tile order in fp32 and rounds once to x's dtype (TE's quantize_dbias: partial sums
  per row tile, then a reduction kernel).  Deterministic: no float atomics.

Outputs are views of one buffer per field: group g's rowwise codes are rows [off_g, off_g +
m_g) of an (M, K) buffer, its columnwise codes a contiguous (K, m_g) slice of a flat buffer,
its block scales a contiguous slice laid out as ``quantize_block`` lays out a group alone.
"""
from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tealite.backends._host_tables import device_table
from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton import quantize as triton_quantize
from tealite.backends.triton._codecs import (_encode_fp8_sat, _fmt_constants, _mag_max,
                                             _overflow_constants, _te_scale, hw_fp8)
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.formats import Saturation, get_format
from tealite.moe_types import GroupedQuantized, split_offsets
from tealite.recipes import Granularity
from tealite.types import Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
BLOCK = 128
# (BM, BN, num_warps) per path; BM is also the tile height the host cuts groups into.  Block
# recipes with a columnwise output need BM == 128 (a block's rows are one tile's), rowwise
# 1x128 needs BN == 128; read at every launch.
CONFIGS = {
    "tensor": dict(BM=32, BN=128, num_warps=4),
    "block_row": dict(BM=32, BN=128, num_warps=4),
    "block_col": dict(BM=128, BN=128, num_warps=8),
    "reduce": dict(BN=128, num_warps=4),
}
# Kernel variants, read at every launch like CONFIGS (the same bits either way,
# tests/test_grouped_quantize_variants.py).  "ct" of the cast kernels: "plain" as written;
# "aligned" tells the compiler (tl.multiple_of) that every group's offset and size are
# multiples of ALIGN, the largest power of two <= 16 dividing every split (MoE pads experts
# to 16 / 128 rows for the FP8 GEMMs).  The group size is the row stride of a group's x.T
# codes and is loaded at run time, so without the hint every columnwise code leaves as its
# own 1-byte store (sm_90a, cross-compiled: 32 / 64 per thread; with ALIGN 16: 4 / 8 16-byte
# stores, and the block kernel's 255 registers with spills drop to 171 without).  Splits
# with an odd member give ALIGN 1: the plain code.  Measured on an H100 (fifth session,
# benchmarks/grouped_quantize_sweep.py, kernels alone, % of copy, even / skewed splits):
# per-tensor ct + dbias 34.0 -> 48.4 (skewed), delayed-scale ct + dbias 35.8 / 34.0 ->
# 51.7 / 48.3, block 1x128 ct + dbias 28.6 / 27.5 -> 32.0 / 30.9, every configuration's
# bits equal to "plain": the default.  The environment variable
# TEALITE_GROUPED_QUANTIZE_CT sets it at import, so that fuzz workers (processes of their
# own) run the variant too.
CT_VARIANTS = ("plain", "aligned")
VARIANTS = {"ct": os.environ.get("TEALITE_GROUPED_QUANTIZE_CT", "aligned")}
_MAX_ALIGN = 16


@triton.jit
def _tile(pid, tiles_n, tile_group, tile_row, group_off, BM: tl.constexpr, BN: tl.constexpr,
          ALIGN: tl.constexpr = 1):
    """(group, its first row, its row count, local rows, cols, tile index) of program pid.
    ALIGN > 1 (``VARIANTS["ct"] == "aligned"``): every split is a multiple of ALIGN (host),
    so the group offsets and sizes are, and a tile's first row is a multiple of BM
    (group_tiles): the hints let the compiler store x.T's codes as vectors, not bytes."""
    t = pid // tiles_n
    pid_n = pid % tiles_n
    g = tl.load(tile_group + t)
    r0 = tl.load(tile_row + t)
    off = tl.load(group_off + g)
    mg = tl.load(group_off + g + 1) - off
    if ALIGN > 1:
        r0 = tl.multiple_of(r0, BM)
        off = tl.multiple_of(off, ALIGN)
        mg = tl.multiple_of(mg, ALIGN)
    rows = r0 + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    return g, off, mg, r0, rows, cols, t, pid_n


@triton.jit
def _dbias_partial(part_ptr, t, x, cols, K):
    """This tile's fp32 column sums (masked elements were loaded as 0)."""
    tl.store(part_ptr + t.to(tl.int64) * K + cols, tl.sum(x, axis=0), mask=cols < K)


@triton.jit
def _grouped_pass_kernel(x_ptr, amax_bits_ptr, part_ptr, tile_group, tile_row, group_off, K,
                         tiles_n, AMAX: tl.constexpr, DBIAS: tl.constexpr,
                         X_BF16: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Per-group amax (AMAX) and / or dbias partials (DBIAS) of one tile."""
    g, off, mg, r0, rows, cols, t, pid_n = _tile(tl.program_id(0), tiles_n, tile_group,
                                                 tile_row, group_off, BM, BN)
    mask = (rows < mg)[:, None] & (cols < K)[None, :]
    x = load_f32(x_ptr, (off + rows).to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
    if AMAX:
        # amax >= 0, so its fp32 bits order as integers (NaN above Inf): an integer max.
        tl.atomic_max(amax_bits_ptr + g, _mag_max(_mag_max(x, 1), 0).to(tl.int32, bitcast=True))
    if DBIAS:
        _dbias_partial(part_ptr, t, x, cols, K)


@triton.jit
def _grouped_tensor_cast_kernel(x_ptr, q_ptr, qt_ptr, amax_bits_ptr, scale_ptr, sinv_ptr,
                                part_ptr, tile_group, tile_row, group_off, K, tiles_n, fmax,
                                eps, ROW: tl.constexpr, COL: tl.constexpr,
                                GIVEN: tl.constexpr, POW2: tl.constexpr, DBIAS: tl.constexpr,
                                SATURATE: tl.constexpr, MBITS: tl.constexpr,
                                EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                                NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                                OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                                OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                                HW_FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                ALIGN: tl.constexpr = 1):
    """Per-tensor cast of one tile under its group's scale: rowwise into rows off+rows of
    (M, K), columnwise into the group's (K, m_g) slice at off * K."""
    g, off, mg, r0, rows, cols, t, pid_n = _tile(tl.program_id(0), tiles_n, tile_group,
                                                 tile_row, group_off, BM, BN, ALIGN)
    if GIVEN:
        scale = tl.load(scale_ptr + g)
    else:
        scale = _te_scale(tl.load(amax_bits_ptr + g).to(tl.float32, bitcast=True), fmax, eps,
                          POW2)
    tl.store(sinv_ptr + g, tl.math.div_rn(1.0, scale), mask=(r0 == 0) & (pid_n == 0))
    rmask = rows < mg
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    x = load_f32(x_ptr, (off + rows).to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
    codes = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                            SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
    if ROW:
        tl.store(q_ptr + (off + rows).to(tl.int64)[:, None] * K + cols[None, :], codes,
                 mask=mask)
    if COL:
        tl.store(qt_ptr + off.to(tl.int64) * K + cols.to(tl.int64)[:, None] * mg
                 + rows[None, :], tl.trans(codes), mask=cmask[:, None] & rmask[None, :])
    if DBIAS:
        _dbias_partial(part_ptr, t, x, cols, K)


@triton.jit
def _grouped_block_cast_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, s_off, st_off, part_ptr,
                               tile_group, tile_row, group_off, K, nbk, tiles_n, fmax, eps,
                               ROW: tl.constexpr, COL: tl.constexpr, SQUARE: tl.constexpr,
                               POW2: tl.constexpr, DBIAS: tl.constexpr,
                               SATURATE: tl.constexpr, MBITS: tl.constexpr,
                               EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                               NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                               OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                               OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                               HW_FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                               ALIGN: tl.constexpr = 1):
    """Block-scaled cast of one tile, blocks anchored at the group's first row.  Group g's
    rowwise scales start at s_off[g], laid out (m_g or ceil(m_g/128), nbk); its columnwise
    scales at st_off[g], laid out (K or nbk, ceil(m_g/128)), as quantize_block's."""
    g, off, mg, r0, rows, cols, t, pid_n = _tile(tl.program_id(0), tiles_n, tile_group,
                                                 tile_row, group_off, BM, BN, ALIGN)
    rmask = rows < mg
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    x = load_f32(x_ptr, (off + rows).to(tl.int64)[:, None] * K + cols[None, :], mask, X_BF16)
    row_offs = (off + rows).to(tl.int64)[:, None] * K + cols[None, :]
    col_offs = off.to(tl.int64) * K + cols.to(tl.int64)[:, None] * mg + rows[None, :]
    tmask = cmask[:, None] & rmask[None, :]
    so = tl.load(s_off + g)
    sto = tl.load(st_off + g)
    nbm = tl.cdiv(mg, 128)
    # An empty group's tile writes no scale (its slot is the next group's first).  With
    # K == 0 every scale slice is empty and the stores land in the unused 1-element buffer.
    live = r0 < mg
    # The same per column, built as a vector: triton 3.9's interpreter rejects a store mask
    # that broadcasts a 0-d boolean against a vector ("mask has unsupported dtype").
    live_cols = (cols * 0 + r0) < mg
    if SQUARE:
        scale = _te_scale(_mag_max(_mag_max(x, 1), 0), fmax, eps, POW2)
        codes = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        sinv = tl.math.div_rn(1.0, scale)
        if ROW:
            tl.store(q_ptr + row_offs, codes, mask=mask)
            tl.store(s_ptr + so + (r0 // 128) * nbk + pid_n, sinv, mask=live)
        if COL:
            tl.store(qt_ptr + col_offs, tl.trans(codes), mask=tmask)
            tl.store(st_ptr + sto + pid_n * nbm + r0 // 128, sinv, mask=live)
    else:
        if ROW:  # BN == 128: one block per row of the tile
            scale = _te_scale(_mag_max(x, 1), fmax, eps, POW2)
            codes = _encode_fp8_sat(x * scale[:, None], fmax, SATURATE, MBITS, EMIN, BIAS,
                                    FNUZ, NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE,
                                    HW_FP8)
            tl.store(q_ptr + row_offs, codes, mask=mask)
            tl.store(s_ptr + so + rows.to(tl.int64) * nbk + pid_n, tl.math.div_rn(1.0, scale),
                     mask=rmask)  # rows < m_g: none in an empty group's tile
        if COL:  # BM == 128: one block per column of the tile
            scale = _te_scale(_mag_max(x, 0), fmax, eps, POW2)
            codes = _encode_fp8_sat(x * scale[None, :], fmax, SATURATE, MBITS, EMIN, BIAS,
                                    FNUZ, NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE,
                                    HW_FP8)
            tl.store(qt_ptr + col_offs, tl.trans(codes), mask=tmask)
            tl.store(st_ptr + sto + cols.to(tl.int64) * nbm + r0 // 128,
                     tl.math.div_rn(1.0, scale), mask=cmask & live_cols)
    if DBIAS:
        _dbias_partial(part_ptr, t, x, cols, K)


@triton.jit
def _reduce_dbias_kernel(part_ptr, out_ptr, tile_start, K, OUT_BF16: tl.constexpr,
                         BN: tl.constexpr):
    """dbias[g, cols] = the fp32 sum of group g's tile partials, in tile order, rounded once."""
    g = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN,), dtype=tl.float32)
    first = tl.load(tile_start + g)
    row = part_ptr + first.to(tl.int64) * K + cols
    for _ in range(first, tl.load(tile_start + g + 1)):
        acc += tl.load(row, mask=cols < K, other=0.0)
        row += K
    store_f32(out_ptr, g.to(tl.int64) * K + cols, acc, cols < K, OUT_BF16)


# ---- host side ---------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    """Host ceil-division in plain ints (triton.cdiv is a constexpr function costing
    microseconds a call on the host, and a call took ~18 of them)."""
    return -(-a // b)


def split_alignment(splits) -> int:
    """The largest power of two <= 16 that divides every split (16 when all are 0): what
    the "aligned" variant may promise the compiler about group offsets and sizes."""
    g = math.gcd(*splits) if splits else 0
    return _MAX_ALIGN if g == 0 else min(_MAX_ALIGN, g & -g)


def group_tiles(splits, bm: int) -> tuple[list[int], list[int], list[int]]:
    """(tile_group, tile_row, tile_start): every group's rows cut into tiles of ``bm`` rows from
    its first row (an empty group: one tile), and group g's tiles [tile_start[g],
    tile_start[g + 1])."""
    tile_group, tile_row, tile_start = [], [], [0]
    for g, m in enumerate(splits):
        n = max(1, _cdiv(m, bm))
        tile_group += [g] * n
        tile_row += [i * bm for i in range(n)]
        tile_start.append(tile_start[-1] + n)
    return tile_group, tile_row, tile_start


class _Launch:
    """The device-side tile table of one (splits, tile, K, device), and the kernels' common
    arguments; read-only, so one per key serves every call (:func:`_launch`)."""

    def __init__(self, splits: tuple[int, ...], bm: int, bn: int, k: int, device: str):
        tg, tr, ts = group_tiles(splits, bm)
        self.k = k
        self.tiles_n = max(1, _cdiv(k, bn))
        self.grid = (len(tg) * self.tiles_n,)
        self.table = (device_table(tg, torch.int32, device),
                      device_table(tr, torch.int32, device),
                      device_table(split_offsets(splits), torch.int64, device))
        self.tile_start = device_table(ts, torch.int32, device)
        self.tiles = len(tg)
        self.tile = dict(BM=bm, BN=bn)
        self.align = split_alignment(splits)

    def cast_tile(self) -> dict:
        """The cast kernels' tile constexprs, ALIGN per ``VARIANTS["ct"]``."""
        ct = VARIANTS["ct"]
        if ct not in CT_VARIANTS:
            raise ValueError(f"grouped_quantize VARIANTS['ct'] (TEALITE_GROUPED_QUANTIZE_CT) "
                             f"must be one of {', '.join(CT_VARIANTS)}, got {ct!r}")
        return dict(self.tile, ALIGN=self.align if ct == "aligned" else 1)


@functools.lru_cache(maxsize=256)
def _cached_launch(splits: tuple[int, ...], bm: int, bn: int, k: int, device: str) -> _Launch:
    return _Launch(splits, bm, bn, k, device)


def _launch(x, splits, cfg: dict) -> _Launch:
    """The call's tile plan, built once per (splits, tile, K, device): rebuilding the tile
    lists and hashing them into device_table's cache was a third of the host time a call
    (the device tables themselves were cached already, for CUDA graphs)."""
    return _cached_launch(tuple(splits), cfg["BM"], cfg["BN"], x.shape[1], str(x.device))


def _dbias(x, launch: _Launch, part, groups: int) -> torch.Tensor:
    out = torch.empty((groups, launch.k), dtype=x.dtype, device=x.device)
    if launch.k:
        bn = CONFIGS["reduce"]["BN"]
        _reduce_dbias_kernel[(groups, _cdiv(launch.k, bn))](
            part, as_kernel_arg(out), launch.tile_start, launch.k,
            OUT_BF16=x.dtype == torch.bfloat16, **CONFIGS["reduce"])
    return out


def _consts(x, recipe) -> dict:
    fmt = get_format(recipe.fmt)
    return dict(_fmt_constants(fmt), **_overflow_constants(fmt),
                SATURATE=recipe.saturation is Saturation.SATURATE,
                X_BF16=x.dtype == torch.bfloat16, HW_FP8=hw_fp8(x.device))


def _views(fmt, splits, k, q, qt):
    """Group g's (rowwise (m_g, K), columnwise (K, m_g)) code views of the shared buffers (one
    split call per buffer, not a slice and a view per group)."""
    splits = list(splits)
    rows = q.view(fmt.torch_dtype).split(splits) if q is not None else [None] * len(splits)
    cols = [c.view(k, m) for c, m in zip(
        qt.view(fmt.torch_dtype).split([m * k for m in splits]), splits)] \
        if qt is not None else [None] * len(splits)
    return list(zip(rows, cols))


def _buffers(x, rowwise: bool, columnwise: bool):
    m, k = x.shape
    dev = x.device
    q = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None
    qt = torch.empty(m * k, dtype=torch.uint8, device=dev) if columnwise else None
    dummy = torch.empty(1, dtype=torch.uint8, device=dev)
    return q, qt, dummy


def _per_tensor(x, splits, recipe, rowwise, columnwise, dbias, scale):
    """Current or delayed per-tensor scaling of every group: an amax pass, a cast pass."""
    fmt, dev, groups = get_format(recipe.fmt), x.device, len(splits)
    cfg = CONFIGS["tensor"]
    launch = _launch(x, splits, cfg)
    given = recipe.scale_given
    xk = as_kernel_arg(x)
    amax_bits = torch.zeros(groups, dtype=torch.int32, device=dev)
    part = torch.empty((launch.tiles, launch.k), dtype=torch.float32, device=dev) if dbias \
        else torch.empty(1, dtype=torch.float32, device=dev)
    _grouped_pass_kernel[launch.grid](xk, amax_bits, part, *launch.table, launch.k,
                                      launch.tiles_n, AMAX=True, DBIAS=False,
                                      X_BF16=x.dtype == torch.bfloat16, **launch.tile,
                                      num_warps=cfg["num_warps"])
    q, qt, dummy = _buffers(x, rowwise, columnwise)
    sinv = torch.empty(groups, dtype=torch.float32, device=dev)
    # A given scale is used as it is: no scale rule (pow2, epsilon) applies to it.
    _grouped_tensor_cast_kernel[launch.grid](
        xk, dummy if q is None else q, dummy if qt is None else qt, amax_bits,
        scale if given else sinv, sinv, part, *launch.table, launch.k, launch.tiles_n,
        fmt.max, 0.0 if given else recipe.amax_epsilon, ROW=rowwise, COL=columnwise,
        GIVEN=given, POW2=False if given else recipe.force_pow2_scales, DBIAS=dbias,
        **launch.cast_tile(), num_warps=cfg["num_warps"], **_consts(x, recipe))
    # Each group's (1,) scale and amax as views; the columnwise scales one copy of all of
    # them (one launch, not one clone per group): a tensor's rowwise and columnwise scales
    # never share storage, as before.
    row_s, amaxes = sinv.split(1), amax_bits.view(torch.float32).split(1)
    col_s = sinv.clone().split(1) if columnwise else [None] * groups
    tensors = []
    for g, (rv, cv) in enumerate(_views(fmt, splits, x.shape[1], q, qt)):
        tensors.append(QuantizedTensor(
            recipe=recipe, shape=(splits[g], x.shape[1]), data=rv,
            scale_inv=row_s[g] if rowwise else None, columnwise_data=cv,
            columnwise_scale_inv=col_s[g],
            amax=None if recipe.amax_granularity is None else amaxes[g]))
    return tensors, _dbias(x, launch, part, groups) if dbias else None


class _BlockLayout(NamedTuple):
    """Per group, quantize_block's scale shapes -- rowwise (m_g or ceil(m_g/128), nbk),
    columnwise (K or nbk, ceil(m_g/128)) -- and where each group's scales start in the
    shared buffers (device tables for the kernel, host offsets for the views)."""

    nbk: int
    row_shapes: tuple
    col_shapes: tuple
    s_off: torch.Tensor
    s_ends: tuple
    st_off: torch.Tensor
    st_ends: tuple


def _scale_offsets(shapes, device: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    offs = split_offsets([a * b for a, b in shapes])
    return device_table(offs[:-1] or [0], torch.int64, device), offs


@functools.lru_cache(maxsize=256)
def _block_layout(splits: tuple[int, ...], k: int, square: bool, device: str) -> _BlockLayout:
    """Built once per (splits, K, block shape, device), as the tile plan (:func:`_launch`)."""
    nbk = _cdiv(k, BLOCK)
    rows = tuple((_cdiv(m, BLOCK) if square else m, nbk) for m in splits)
    cols = tuple((nbk if square else k, _cdiv(m, BLOCK)) for m in splits)
    return _BlockLayout(nbk, rows, cols, *_scale_offsets(rows, device),
                        *_scale_offsets(cols, device))


def _scale_views(buf: torch.Tensor, ends, shapes) -> list[torch.Tensor]:
    """Group g's scales: elements [ends[g], ends[g + 1]) of ``buf`` shaped ``shapes[g]`` (buf
    has one spare element when every group's scales are empty)."""
    parts = buf.narrow(0, 0, ends[-1]).split([b - a for a, b in zip(ends, ends[1:])])
    return [p.view(shape) for p, shape in zip(parts, shapes)]


def _per_block(x, splits, recipe, rowwise, columnwise, dbias):
    """Float8BlockScaling of every group in one pass, blocks anchored at each group's row 0."""
    fmt, dev, groups = get_format(recipe.fmt), x.device, len(splits)
    k = x.shape[1]
    square = recipe.block[0] == BLOCK
    cfg = CONFIGS["block_col" if columnwise or square else "block_row"]
    launch = _launch(x, splits, cfg)
    lay = _block_layout(tuple(splits), k, square, str(dev))
    s = torch.empty(lay.s_ends[-1] or 1, dtype=torch.float32, device=dev)
    st = torch.empty(lay.st_ends[-1] or 1, dtype=torch.float32, device=dev)
    q, qt, dummy = _buffers(x, rowwise, columnwise)
    part = torch.empty((launch.tiles, k), dtype=torch.float32, device=dev) if dbias \
        else torch.empty(1, dtype=torch.float32, device=dev)
    _grouped_block_cast_kernel[launch.grid](
        as_kernel_arg(x), dummy if q is None else q, s, dummy if qt is None else qt, st,
        lay.s_off, lay.st_off, part, *launch.table, k, lay.nbk, launch.tiles_n, fmt.max,
        recipe.amax_epsilon, ROW=rowwise, COL=columnwise, SQUARE=square,
        POW2=recipe.force_pow2_scales, DBIAS=dbias, **launch.cast_tile(),
        num_warps=cfg["num_warps"], **_consts(x, recipe))
    row_s = _scale_views(s, lay.s_ends, lay.row_shapes) if rowwise else [None] * groups
    col_s = _scale_views(st, lay.st_ends, lay.col_shapes) if columnwise else [None] * groups
    tensors = [QuantizedTensor(recipe=recipe, shape=(splits[g], k), data=rv,
                               scale_inv=row_s[g], columnwise_data=cv,
                               columnwise_scale_inv=col_s[g])
               for g, (rv, cv) in enumerate(_views(fmt, splits, k, q, qt))]
    return tensors, _dbias(x, launch, part, groups) if dbias else None


def _per_group(x, splits, recipe, rowwise, columnwise, dbias, scale):
    """Per-row current scaling and MX: the Triton quantize launched once per group (the split
    path itself), and dbias in a pass of its own."""
    offs = split_offsets(splits)
    tensors = [triton_quantize.quantize(
        x[offs[g]:offs[g + 1]], recipe, rowwise=rowwise, columnwise=columnwise,
        scale=None if scale is None else scale[g:g + 1]) for g in range(len(splits))]
    if not dbias:
        return tensors, None
    cfg = CONFIGS["tensor"]
    launch = _launch(x, splits, cfg)
    part = torch.empty((launch.tiles, launch.k), dtype=torch.float32, device=x.device)
    _grouped_pass_kernel[launch.grid](as_kernel_arg(x), part, part, *launch.table, launch.k,
                                      launch.tiles_n, AMAX=False, DBIAS=True,
                                      X_BF16=x.dtype == torch.bfloat16, **launch.tile,
                                      num_warps=cfg["num_warps"])
    return tensors, _dbias(x, launch, part, len(splits))


def _why_not(params) -> str | None:
    return triton_quantize.recipe_reason(params["recipe"])


@BACKEND.implements(Op.GROUPED_QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not)
def grouped_quantize(x, m_splits, recipe, *, rowwise, columnwise, dbias, scale):
    x = x.contiguous()
    gran = recipe.scale_granularity
    if gran is Granularity.TENSOR:
        tensors, db = _per_tensor(x, m_splits, recipe, rowwise, columnwise, dbias, scale)
    elif gran is Granularity.BLOCK:
        tensors, db = _per_block(x, m_splits, recipe, rowwise, columnwise, dbias)
    else:  # per row, MX: the check admits no other layout
        tensors, db = _per_group(x, m_splits, recipe, rowwise, columnwise, dbias, scale)
    return GroupedQuantized(tuple(tensors), db)
