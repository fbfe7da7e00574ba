"""Triton ``quantize`` / ``amax``: FP8 per-tensor / per-row current scaling and delayed scaling
here; Float8BlockScaling (``quantize_block``) and MX (``quantize_mx``) are routed from the
single registered ``quantize`` (the registry holds one implementation per backend and op).

Codes come from the encoders in ``_codecs``: the integer encoder everywhere, or on NVIDIA sm_89+
(``hw_fp8``) the hardware conversion for OCP formats, with the same bits.  Launch parameters
are in ``CONFIGS`` (swept by benchmarks/quantize_tiles.py).

Per-tensor current scaling: one amax pass (partial maxima, reduced on the device: no host
synchronisation), then one cast pass.  Delayed scaling: one cast pass with the given scale
that also writes the partial maxima of the amax it reports.  With ``columnwise`` the cast pass
is a cast-transpose: each (BM, BN) tile of x is read once and written rowwise (M, K) and
columnwise (K, M), transposed in registers so both stores are coalesced.  Per-row scaling,
rowwise only, keeps a row in registers (one pass, rows up to 65536); with ``columnwise`` (whose
scales are per column of x) or longer rows it takes two tiled passes: row and column amaxes,
then one cast-transpose.

Every recipe is supported (saturating and non-saturating casts) except current scaling with
AITER's scale rule (``FP8ScaleRule.AMAX_OVER_FMAX``), which ``check`` rejects: these kernels
compute TE's scale = fmax / amax.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, PLATFORM
from tealite.backends.triton._codecs import (_encode_fp8_sat, _fmt_constants, _into_word,
                                             _mag_max, _overflow_constants, _te_scale,
                                             _tile_ids, hw_fp8)
from tealite.backends.triton._io import as_kernel_arg, load_f32
from tealite.backends.triton.quantize_block import quantize_block
from tealite.backends.triton.quantize_mx import MX_BLOCK, _load_sub_tile, quantize_mx
from tealite.formats import FP8_FORMATS, FP8ScaleRule, Saturation, get_format
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# Launch parameters, one dict per kernel, read at every launch (benchmarks/quantize_tiles.py
# overrides them for a sweep; defaults chosen for an H100, and valid on AMD's 64-wide
# wavefronts: every block is a multiple of 64 x num_warps elements).
CONFIGS = {
    # Pure read: 32 elements per thread (64 bytes of bf16), one partial max per program,
    # reduced by a second tiny pass (no atomics, no host synchronisation).
    "amax": dict(BLOCK=8192, num_warps=8),
    # Flat per-tensor cast: 16 elements per thread, a 16-byte code store.
    "cast": dict(BLOCK=4096, num_warps=8),
    # Cast-transpose tile: 128 x 128 with 8 warps is 64 values per thread; both code stores
    # (rowwise along BN, columnwise along BM, 1 byte each) are 128-byte runs.
    # Measured on an H100 (benchmarks/quantize_tiles.py, bf16 16384x8192): 64x128 / 4 warps
    # 62 % of copy, 128x128 / 8 warps 58 %.
    # GROUP_M: tile order (_codecs._tile_ids); 1 = row-major.
    "cast_transpose": dict(BM=64, BN=128, num_warps=4, GROUP_M=1),
    # Per-row scaling, a row in registers: warps = block / (32 * elems_per_thread), within
    # [4, max_warps] (a 8192-wide row: 16 warps, 16 values per thread).
    # (H100: 32 per thread 101 % of copy, 16 per thread 92 %.)
    "row": dict(elems_per_thread=32, max_warps=16),
    # Per-row scaling's two tiled passes (row/column amax, cast-transpose): one shared tile.
    # (H100: 128x64 / 4 warps 53 % of copy, 128x128 / 8 warps 40 %.)
    "per_row_tiles": dict(BM=128, BN=64, num_warps=4, GROUP_M=1),
}
# Kernel variants, read at every launch like CONFIGS (benchmarks/quantize_tiles.py --variant
# sets them; every variant gives the same bits, tests/test_triton_ct_variants.py).  "ct" of the
# per-tensor cast-transpose: "trans" transposes the byte codes with tl.trans (shared memory one
# byte at a time); "packed" reads the tile as 4 interleaved row sub-tiles (rows 4i + j) and
# packs the 4 codes of a column that are consecutive in x.T into a 32-bit word, so the
# transpose moves words (tile: CONFIGS["cast_transpose_packed"]).  Needs M % 4 == 0.
# "packed" measured faster on an H100 (docs/benchmarks.md, fifth session): FP8 per-tensor
# cast-transpose 61.4 -> 64.2 % (current) / 84.6 -> 91.5 % (delayed), block 1x128 46.1 -> 49.0 %.
VARIANTS = {"ct": "packed"}
CONFIGS["cast_transpose_packed"] = dict(BM=64, BN=128, num_warps=4, GROUP_M=1)  # not yet swept


@triton.jit
def _partial_amax_kernel(x_ptr, out_ptr, n, X_BF16: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if X_BF16:
        # The magnitude bits of a bf16 are its int16 bits without the sign: no widening to
        # fp32 before the reduction (the max commutes with the exact bf16 -> fp32 shift).
        bits = tl.load(x_ptr + offs, mask=offs < n, other=0).to(tl.int32) & 0x7FFF
        tl.store(out_ptr + pid, (tl.max(bits, axis=0) << 16).to(tl.float32, bitcast=True))
    else:
        tl.store(out_ptr + pid, _mag_max(load_f32(x_ptr, offs, offs < n, X_BF16), 0))


@triton.jit
def _tensor_scale(scale_ptr, amax_ptr, fmax, eps, GIVEN: tl.constexpr, POW2: tl.constexpr):
    if GIVEN:
        scale = tl.load(scale_ptr)
    else:
        scale = _te_scale(tl.load(amax_ptr), fmax, eps, POW2)
    return scale


@triton.jit
def _quantize_tensor_kernel(x_ptr, q_ptr, scale_ptr, amax_ptr, sinv_ptr, pamax_ptr, n, fmax,
                            eps, GIVEN: tl.constexpr, POW2: tl.constexpr,
                            SATURATE: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                            BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                            SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr,
                            OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr,
                            X_BF16: tl.constexpr, HW_FP8: tl.constexpr, BLOCK: tl.constexpr):
    """Rowwise per-tensor cast of the flat x; with GIVEN (delayed scaling) each program also
    writes the max |x| of its block (NaN-propagating) for the reported amax."""
    pid = tl.program_id(0)
    scale = _tensor_scale(scale_ptr, amax_ptr, fmax, eps, GIVEN, POW2)
    if pid == 0:
        tl.store(sinv_ptr, tl.math.div_rn(1.0, scale))
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = load_f32(x_ptr, offs, mask, X_BF16)
    if GIVEN:
        tl.store(pamax_ptr + pid, _mag_max(x, 0))
    code = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE,
                      OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
    tl.store(q_ptr + offs, code, mask=mask)


@triton.jit
def _cast_transpose_tensor_kernel(x_ptr, q_ptr, qt_ptr, scale_ptr, amax_ptr, sinv_ptr,
                                  sinvt_ptr, pamax_ptr, M, K, tiles_n, fmax, eps,
                                  ROW: tl.constexpr,
                                  GIVEN: tl.constexpr, POW2: tl.constexpr,
                                  SATURATE: tl.constexpr, MBITS: tl.constexpr,
                                  EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                                  NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                                  OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                                  OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                                  HW_FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                  GROUP_M: tl.constexpr = 1):
    """Per-tensor cast of one (BM, BN) tile, written columnwise (K, M) and, with ROW, also
    rowwise (M, K): one read of x for both.  ``tiles_n`` = max(1, cdiv(K, BN)): an empty x
    still runs one program, which writes scale_inv.  GROUP_M: tile order (``_tile_ids``)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tiles_n, GROUP_M)
    scale = _tensor_scale(scale_ptr, amax_ptr, fmax, eps, GIVEN, POW2)
    if pid == 0:
        sinv = tl.math.div_rn(1.0, scale)
        tl.store(sinvt_ptr, sinv)
        if ROW:
            tl.store(sinv_ptr, sinv)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rmask = rows < M
    cmask = cols < K
    x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :],
                 rmask[:, None] & cmask[None, :], X_BF16)
    if GIVEN:
        tl.store(pamax_ptr + pid, _mag_max(_mag_max(x, 1), 0))
    codes = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE,
                       OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
    if ROW:
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], codes,
                 mask=rmask[:, None] & cmask[None, :])
    tl.store(qt_ptr + cols.to(tl.int64)[:, None] * M + rows[None, :], tl.trans(codes),
             mask=cmask[:, None] & rmask[None, :])


@triton.jit
def _cast_transpose_tensor_packed_kernel(x_ptr, q_ptr, qt_ptr, scale_ptr, amax_ptr, sinv_ptr,
                                         sinvt_ptr, pamax_ptr, M, K, qt_words, tiles_n, fmax,
                                         eps, ROW: tl.constexpr, GIVEN: tl.constexpr,
                                         POW2: tl.constexpr, SATURATE: tl.constexpr,
                                         MBITS: tl.constexpr, EMIN: tl.constexpr,
                                         BIAS: tl.constexpr, FNUZ: tl.constexpr,
                                         NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                                         OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                                         OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                                         HW_FP8: tl.constexpr, BM: tl.constexpr,
                                         BN: tl.constexpr, GROUP_M: tl.constexpr = 1,
                                         EVEN: tl.constexpr = False):
    """``_cast_transpose_tensor_kernel``'s bits with ``VARIANTS["ct"] == "packed"``: one
    scale, so each code serves both directions; sub-tile j (rows 4i + j) is read once, its
    codes stored rowwise and shifted into byte j of the words of x.T (``qt_ptr``: int32,
    ``qt_words`` per row).  M % 4 == 0 (host); EVEN: whole tiles, unmasked loads."""
    S: tl.constexpr = BM // 4
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tiles_n, GROUP_M)
    scale = _tensor_scale(scale_ptr, amax_ptr, fmax, eps, GIVEN, POW2)
    if pid == 0:
        sinv = tl.math.div_rn(1.0, scale)
        tl.store(sinvt_ptr, sinv)
        if ROW:
            tl.store(sinv_ptr, sinv)
    sub = tl.arange(0, S)
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = (cols < K)[None, :]
    word = tl.zeros((S, BN), dtype=tl.int32)
    mag = tl.zeros((S, BN), dtype=tl.int32)
    for j in tl.static_range(4):
        rows = pid_m * BM + sub * 4 + j
        mask = (rows < M)[:, None] & cmask
        x = _load_sub_tile(x_ptr, rows, cols, M, K, EVEN, X_BF16)
        if GIVEN:  # the integer max of the magnitude bits, as _mag_max
            mag = tl.maximum(mag, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
        codes = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        if ROW:
            tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], codes, mask=mask)
        word = _into_word(word, codes, j, 8)
    if GIVEN:
        tl.store(pamax_ptr + pid, tl.max(tl.max(mag, 1), 0).to(tl.float32, bitcast=True))
    words = pid_m * S + sub
    tl.store(qt_ptr + cols.to(tl.int64)[:, None] * qt_words + words[None, :], tl.trans(word),
             mask=tl.trans(cmask) & (words < qt_words)[None, :])


@triton.jit
def _quantize_row_kernel(x_ptr, q_ptr, sinv_ptr, amax_ptr, K, fmax, eps, POW2: tl.constexpr,
                         SATURATE: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                         BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                         SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr,
                         OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                         HW_FP8: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    x = load_f32(x_ptr, row * K + cols, mask, X_BF16)
    amax = _mag_max(x, 0)
    scale = _te_scale(amax, fmax, eps, POW2)
    tl.store(amax_ptr + row, amax)
    tl.store(sinv_ptr + row, tl.math.div_rn(1.0, scale))
    code = _encode_fp8_sat(x * scale, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE,
                      OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
    tl.store(q_ptr + row * K + cols, code, mask=mask)


@triton.jit
def _rowcol_amax_kernel(x_ptr, rpart_ptr, cpart_ptr, M, K, X_BF16: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr = 1):
    """Partial max |x| of one tile along its rows (row_part[pid_n, rows]) and along its
    columns (col_part[pid_m, cols]), NaN-propagating (integer max of the magnitude bits)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rmask = rows < M
    cmask = cols < K
    x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :],
                 rmask[:, None] & cmask[None, :], X_BF16)
    tl.store(rpart_ptr + pid_n.to(tl.int64) * M + rows, _mag_max(x, 1), mask=rmask)
    tl.store(cpart_ptr + pid_m.to(tl.int64) * K + cols, _mag_max(x, 0), mask=cmask)


@triton.jit
def _cast_transpose_rowcol_kernel(x_ptr, q_ptr, qt_ptr, ramax_ptr, camax_ptr, sinv_ptr,
                                  sinvt_ptr, M, K, fmax, eps, ROW: tl.constexpr,
                                  COL: tl.constexpr, POW2: tl.constexpr,
                                  SATURATE: tl.constexpr, MBITS: tl.constexpr,
                                  EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                                  NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                                  OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                                  OVF_CODE: tl.constexpr, X_BF16: tl.constexpr,
                                  HW_FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                  GROUP_M: tl.constexpr = 1):
    """Per-row current scaling of one tile: rowwise with the scales of x's rows, columnwise
    (rows of x.T) with the scales of x's columns, from the row / column amaxes of the first
    pass.  Programs of the first tile column (row) write the rowwise (columnwise) scale_inv."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_ids(pid, tl.cdiv(M, BM), tl.cdiv(K, BN), GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rmask = rows < M
    cmask = cols < K
    x = load_f32(x_ptr, rows.to(tl.int64)[:, None] * K + cols[None, :],
                 rmask[:, None] & cmask[None, :], X_BF16)
    if ROW:
        scale = _te_scale(tl.load(ramax_ptr + rows, mask=rmask, other=0.0), fmax, eps, POW2)
        if pid_n == 0:
            tl.store(sinv_ptr + rows, tl.math.div_rn(1.0, scale), mask=rmask)
        codes = _encode_fp8_sat(x * scale[:, None], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                                NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], codes,
                 mask=rmask[:, None] & cmask[None, :])
    if COL:
        scale = _te_scale(tl.load(camax_ptr + cols, mask=cmask, other=0.0), fmax, eps, POW2)
        if pid_m == 0:
            tl.store(sinvt_ptr + cols, tl.math.div_rn(1.0, scale), mask=cmask)
        codes = _encode_fp8_sat(x * scale[None, :], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                                NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, HW_FP8)
        tl.store(qt_ptr + cols.to(tl.int64)[:, None] * M + rows[None, :], tl.trans(codes),
                 mask=cmask[:, None] & rmask[None, :])


def _amax(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    if n == 0:
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    cfg = CONFIGS["amax"]
    grid = triton.cdiv(n, cfg["BLOCK"])
    partial = torch.empty(grid, dtype=torch.float32, device=x.device)
    _partial_amax_kernel[(grid,)](as_kernel_arg(x.contiguous().reshape(-1)), partial, n,
                                  X_BF16=x.dtype == torch.bfloat16, **cfg)
    return partial.amax().reshape(1)  # NaN-propagating, and no host synchronisation


def _consts(x: torch.Tensor, recipe) -> dict:
    fmt = get_format(recipe.fmt)
    return dict(_fmt_constants(fmt), **_overflow_constants(fmt),
                SATURATE=recipe.saturation is Saturation.SATURATE,
                X_BF16=x.dtype == torch.bfloat16, HW_FP8=hw_fp8(x.device))


def _row_warps(block: int) -> int:
    cfg = CONFIGS["row"]
    return min(cfg["max_warps"], max(4, block // (32 * cfg["elems_per_thread"])))


def _per_row(x: torch.Tensor, recipe):
    """(codes, scale_inv (M,), row amax (M,)) of per-row current scaling."""
    fmt = get_format(recipe.fmt)
    m, k = x.shape
    x = x.contiguous()
    codes = torch.empty((m, k), dtype=torch.uint8, device=x.device)
    sinv = torch.empty(m, dtype=torch.float32, device=x.device)
    row_amax = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:  # K == 0 still needs the scale rule (amax 0, or amax_epsilon)
        block = max(1, triton.next_power_of_2(k))
        _quantize_row_kernel[(m,)](as_kernel_arg(x), codes, sinv, row_amax, k, fmt.max,
                                   recipe.amax_epsilon, POW2=recipe.force_pow2_scales,
                                   BLOCK=block, num_warps=_row_warps(block),
                                   **_consts(x, recipe))
    return codes.view(fmt.torch_dtype), sinv, row_amax


def _per_tensor(x: torch.Tensor, recipe, scale, rowwise: bool, columnwise: bool):
    """(data, scale_inv, columnwise_data, columnwise_scale_inv, amax) of per-tensor current
    or delayed scaling, rowwise and/or columnwise in one cast pass."""
    fmt = get_format(recipe.fmt)
    x = x.contiguous()
    m, k = x.shape
    dev = x.device
    given = recipe.scale_given
    # A given scale is used as it is: no scale rule (pow2, epsilon) applies to it.
    pow2 = False if given else recipe.force_pow2_scales
    eps = 0.0 if given else recipe.amax_epsilon
    amax = None if given else _amax(x)
    sinv = torch.empty(1, dtype=torch.float32, device=dev)
    q = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None
    qt = sinvt = None
    xk = as_kernel_arg(x)
    if columnwise:
        packed = VARIANTS["ct"] == "packed" and m > 0 and m % 4 == 0
        cfg = CONFIGS["cast_transpose_packed" if packed else "cast_transpose"]
        qt = torch.empty((k, m), dtype=torch.uint8, device=dev)
        sinvt = torch.empty(1, dtype=torch.float32, device=dev)
        tiles_n = max(1, triton.cdiv(k, cfg["BN"]))
        grid = max(1, triton.cdiv(m, cfg["BM"]) * triton.cdiv(k, cfg["BN"]))
        pamax = torch.empty(grid, dtype=torch.float32, device=dev)
        args = (xk, q if rowwise else qt, qt, scale if given else sinv,
                amax if amax is not None else sinv, sinv, sinvt, pamax, m, k)
        extra = {}
        if packed:
            words = qt.view(torch.int32)
            args = (*args[:2], words, *args[3:], words.stride(0))
            extra = dict(EVEN=m % cfg["BM"] == 0 and k % cfg["BN"] == 0)
        kernel = _cast_transpose_tensor_packed_kernel if packed else _cast_transpose_tensor_kernel
        kernel[(grid,)](*args, tiles_n, fmt.max, eps, ROW=rowwise, GIVEN=given, POW2=pow2,
                        **cfg, **extra, **_consts(x, recipe))
    else:
        cfg = CONFIGS["cast"]
        grid = max(1, triton.cdiv(x.numel(), cfg["BLOCK"]))
        pamax = torch.empty(grid, dtype=torch.float32, device=dev)
        _quantize_tensor_kernel[(grid,)](
            xk.reshape(-1), q.reshape(-1), scale if given else sinv,
            amax if amax is not None else sinv, sinv, pamax, x.numel(), fmt.max, eps,
            GIVEN=given, POW2=pow2, **cfg, **_consts(x, recipe))
    if given:
        # The partial maxima of the cast pass (an empty x leaves one 0 partial: amax 0).
        amax = pamax.amax().reshape(1)
    view = lambda t: None if t is None else t.view(fmt.torch_dtype)  # noqa: E731
    return view(q), sinv if rowwise else None, view(qt), sinvt, amax


def _per_row_tiles(x: torch.Tensor, recipe, rowwise: bool, columnwise: bool):
    """Per-row current scaling in two tiled passes (row and column amaxes, then one
    cast-transpose): (data, scale_inv, columnwise_data, columnwise_scale_inv, row amax).
    For columnwise output or rows too long for registers; x must be non-empty."""
    fmt = get_format(recipe.fmt)
    x = x.contiguous()
    m, k = x.shape
    dev = x.device
    cfg = CONFIGS["per_row_tiles"]
    tiles_m, tiles_n = triton.cdiv(m, cfg["BM"]), triton.cdiv(k, cfg["BN"])
    rpart = torch.empty((tiles_n, m), dtype=torch.float32, device=dev)
    cpart = torch.empty((tiles_m, k), dtype=torch.float32, device=dev)
    xk = as_kernel_arg(x)
    grid = (tiles_m * tiles_n,)
    _rowcol_amax_kernel[grid](xk, rpart, cpart, m, k, X_BF16=x.dtype == torch.bfloat16, **cfg)
    row_amax, col_amax = rpart.amax(0), cpart.amax(0)  # NaN-propagating, on the device
    q = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None
    sinv = torch.empty(m, dtype=torch.float32, device=dev) if rowwise else None
    qt = torch.empty((k, m), dtype=torch.uint8, device=dev) if columnwise else None
    sinvt = torch.empty(k, dtype=torch.float32, device=dev) if columnwise else None
    dummy_q = torch.empty(1, dtype=torch.uint8, device=dev)
    dummy_s = torch.empty(1, dtype=torch.float32, device=dev)
    _cast_transpose_rowcol_kernel[grid](
        xk, dummy_q if q is None else q, dummy_q if qt is None else qt, row_amax, col_amax,
        dummy_s if sinv is None else sinv, dummy_s if sinvt is None else sinvt, m, k, fmt.max,
        recipe.amax_epsilon, ROW=rowwise, COL=columnwise, POW2=recipe.force_pow2_scales,
        **cfg, **_consts(x, recipe))
    view = lambda t: None if t is None else t.view(fmt.torch_dtype)  # noqa: E731
    return view(q), sinv, view(qt), sinvt, row_amax


def _quantize_per_row(out: QuantizedTensor, x: torch.Tensor, recipe, rowwise: bool,
                      columnwise: bool) -> None:
    m, k = x.shape
    if m and k and (columnwise or k > PLATFORM.get().max_row_in_registers):
        out.data, out.scale_inv, out.columnwise_data, out.columnwise_scale_inv, out.amax = \
            _per_row_tiles(x, recipe, rowwise, columnwise)
        return
    # One pass, a row in registers; an empty x only needs the scale rule per (empty) row.
    if rowwise:
        out.data, out.scale_inv, out.amax = _per_row(x, recipe)
    if columnwise:
        out.columnwise_data, out.columnwise_scale_inv, _ = _per_row(x.t().contiguous(), recipe)
        if not rowwise:
            out.amax = _per_row(x, recipe)[2]


_BLOCKS = ((1, 128), (128, 128))  # the blocks quantize_block is written for


def shared_reason(recipe, *, fused: bool = False) -> tuple[bool, str | None]:
    """What every tealite Triton quantizer (plain and fused) requires of a recipe, from its
    facts: ``(decided, reason)``.  ``decided`` is True when ``reason`` is the answer (a
    refusal, or an MX or given-scale recipe the kernels take, reason None); False leaves an
    FP8 recipe's own scale layout to the caller."""
    k = "fused " if fused else ""
    why = outside(recipe, f"triton {k}quantize", family=(Family.FP8, Family.MX))
    if why or recipe.family is Family.MX:
        # The MX kernels: every scale and element rounding, FP8 and e2m1 elements.
        return True, why or outside(recipe, f"triton {k}MX quantize",
                                    scale_granularity=(Granularity.MX_BLOCK,),
                                    block=(MX_BLOCK,))
    why = outside(recipe, f"triton {k}FP8 quantize", fmt=FP8_FORMATS,
                  scale_given=(False, True), scale_rule=tuple(FP8ScaleRule))
    if why:
        return True, why
    if recipe.scale_rule is not FP8ScaleRule.FMAX_OVER_AMAX:
        return True, (f"scale_rule {recipe.scale_rule.value} (AITER's) is not implemented: "
                      "these kernels compute TE's scale = fmax / amax")
    # The amax a kernel computes is the tensor's (given or per tensor) or the rows' (per
    # row); a recipe that reports none gets none.
    if recipe.scale_given:
        return True, outside(recipe, f"triton {k}quantize with a given scale",
                             scale_granularity=(Granularity.TENSOR,),
                             amax_granularity=(Granularity.TENSOR, None))
    return False, None


def recipe_reason(recipe) -> str | None:
    """Why these kernels do not quantize ``recipe`` (None: they do), from its facts."""
    decided, why = shared_reason(recipe)
    if decided:
        return why
    gran = recipe.scale_granularity
    if gran is Granularity.BLOCK:
        return outside(recipe, "triton block quantize", block=_BLOCKS, amax_granularity=(None,))
    return outside(recipe, "triton quantize",
                   scale_granularity=(Granularity.TENSOR, Granularity.ROW),
                   amax_granularity=(gran, None))


def _why_not(params) -> str | None:
    return recipe_reason(params["recipe"])


@BACKEND.implements(Op.QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not)
def quantize(x, recipe, *, rowwise, columnwise, scale):
    out = QuantizedTensor(recipe=recipe, shape=tuple(x.shape))
    gran = recipe.scale_granularity
    if recipe.family is Family.MX:
        out.data, out.scale_inv, out.columnwise_data, out.columnwise_scale_inv = quantize_mx(
            x, recipe, rowwise=rowwise, columnwise=columnwise)
    elif gran is Granularity.BLOCK:
        out.data, out.scale_inv, out.columnwise_data, out.columnwise_scale_inv = \
            quantize_block(x, recipe, rowwise=rowwise, columnwise=columnwise)
    elif gran is Granularity.ROW:
        _quantize_per_row(out, x, recipe, rowwise, columnwise)
    else:  # per tensor, given or current: the check admits no other layout
        out.data, out.scale_inv, out.columnwise_data, out.columnwise_scale_inv, out.amax = \
            _per_tensor(x, recipe, scale, rowwise, columnwise)
    if recipe.amax_granularity is None:
        out.amax = None
    return out


@BACKEND.implements(Op.AMAX, dtypes=_FLOATS, devices=DEVICES)
def amax(x):
    return _amax(x)
