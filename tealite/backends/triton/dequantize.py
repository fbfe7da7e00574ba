"""Triton ``dequantize`` for every recipe: codes x scale_inv in fp32, rounded once to the
output dtype (the torch backend's arithmetic, bit for bit).

Codes are decoded from their bits with integer operations (no fp8 -> fp32 casts, which FNUZ
formats lack on NVIDIA and which the interpreter is not trusted with): the fp32 bits of a
normal code are assembled directly, a subnormal code is its mantissa times 2^(emin - mbits)
(exact), and NaN / Inf codes are the format's.  E8M0 scales are 2^(b - 127) built from bits
(b = 0 is the fp32 subnormal 2^-127), 255 is NaN.  One program decodes a (BM, BN) tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, store_f32
from tealite.formats import get_format
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_TILE_M, _TILE_N, _WARPS = 32, 128, 4
# Scale layouts (SCALE_KIND): one per tensor, one per row, one per (BR, BC) block, E8M0 per 32.
_TENSOR, _ROW, _BLOCK, _MX = 0, 1, 2, 3
# Special codes (SPECIALS): none (e2m1), OCP e4m3 (S.1111.111 NaN), OCP e5m2 (IEEE-like
# Inf / NaN), FNUZ (0x80 NaN).
_NO_SPECIALS, _E4M3, _E5M2, _FNUZ = 0, 1, 2, 3


@triton.jit
def _decode_code(c, SIGN_BIT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                 SUB_VALUE: tl.constexpr, SPECIALS: tl.constexpr):
    """fp32 value of int32 FP8 / E2M1 code bits ``c``; SUB_VALUE = 2^(emin - mbits)."""
    neg = (c & SIGN_BIT) != 0
    mag = c & (SIGN_BIT - 1)
    e = mag >> MBITS
    m = mag & ((1 << MBITS) - 1)
    normal = ((e - BIAS + 127) << 23) | (m << (23 - MBITS))
    v = tl.where(e > 0, normal.to(tl.float32, bitcast=True), m.to(tl.float32) * SUB_VALUE)
    if SPECIALS == 1:
        v = tl.where(mag == 0x7F, float("nan"), v)
    elif SPECIALS == 2:
        v = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), v)
    elif SPECIALS == 3:
        v = tl.where(c == 0x80, float("nan"), v)
    # The sign goes in as a bit: Triton lowers ``-v`` to ``0 - v`` on CUDA, which makes the
    # -0 codes +0 (measured on an H100 with triton 3.6).
    bits = v.to(tl.int32, bitcast=True) | (neg.to(tl.int32) << 31)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_value(b):
    """fp32 2^(b - 127) of int32 E8M0 bytes; 255 is NaN."""
    bits = tl.where(b > 0, b << 23, 0x00400000)
    return tl.where(b == 255, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def _dequantize_kernel(q_ptr, s_ptr, y_ptr, R_, C, s_stride, SCALE_KIND: tl.constexpr,
                       BR: tl.constexpr, BC: tl.constexpr, FP4: tl.constexpr,
                       SIGN_BIT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                       SUB_VALUE: tl.constexpr, SPECIALS: tl.constexpr, Y_BF16: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(C, BN)
    rows = (pid // tiles_n) * BM + tl.arange(0, BM)
    cols = (pid % tiles_n) * BN + tl.arange(0, BN)
    rmask = rows < R_
    mask = rmask[:, None] & (cols < C)[None, :]
    rows64 = rows.to(tl.int64)
    if FP4:
        byte = tl.load(q_ptr + rows64[:, None] * ((C + 1) // 2) + (cols // 2)[None, :],
                       mask=mask, other=0).to(tl.int32)
        c = (byte >> ((cols & 1) * 4)[None, :]) & 0xF
    else:
        c = tl.load(q_ptr + rows64[:, None] * C + cols[None, :], mask=mask, other=0).to(tl.int32)
    v = _decode_code(c, SIGN_BIT, MBITS, BIAS, SUB_VALUE, SPECIALS)
    if SCALE_KIND == 0:
        s = tl.load(s_ptr)
    elif SCALE_KIND == 1:
        s = tl.load(s_ptr + rows64, mask=rmask, other=1.0)[:, None]
    elif SCALE_KIND == 2:
        s = tl.load(s_ptr + (rows64 // BR)[:, None] * s_stride + (cols // BC)[None, :],
                    mask=mask, other=1.0)
    else:
        b = tl.load(s_ptr + rows64[:, None] * s_stride + (cols // 32)[None, :], mask=mask,
                    other=127).to(tl.int32)
        s = _e8m0_value(b)
    store_f32(y_ptr, rows64[:, None] * C + cols[None, :], v * s, mask, Y_BF16)


def _code_constants(fmt) -> dict:
    if fmt.packed:
        return dict(SIGN_BIT=0x8, MBITS=1, BIAS=1, SUB_VALUE=0.5, SPECIALS=_NO_SPECIALS)
    bias = {"e4m3fnuz": 8, "e5m2fnuz": 16}.get(fmt.name, (1 << (7 - fmt.mbits - 1)) - 1)
    specials = _FNUZ if fmt.fnuz else (_E5M2 if fmt.name == "e5m2" else _E4M3)
    return dict(SIGN_BIT=0x80, MBITS=fmt.mbits, BIAS=bias,
                SUB_VALUE=float(2.0 ** (1 - bias - fmt.mbits)), SPECIALS=specials)


# The scale layouts the kernel reads (SCALE_KIND), by the recipe's scale granularity.
_SCALE_KINDS = {Granularity.TENSOR: _TENSOR, Granularity.ROW: _ROW, Granularity.BLOCK: _BLOCK,
                Granularity.MX_BLOCK: _MX}


def recipe_reason(recipe) -> str | None:
    """Why the kernel does not dequantize ``recipe`` (None: it does), from its facts."""
    why = outside(recipe, "triton dequantize", family=(Family.FP8, Family.MX))
    if why or recipe.family is Family.MX:  # E8M0 bytes, one per 32 codes
        return why or outside(recipe, "triton MX dequantize",
                              scale_granularity=(Granularity.MX_BLOCK,), block=(32,))
    # float32 scales per tensor, row or (BR, BC) block of any size
    return outside(recipe, "triton FP8 dequantize", scale_granularity=(
        Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK))


def _why_not(params) -> str | None:
    return recipe_reason(params["recipe"])


def _scale_layout(recipe) -> tuple[int, int, int]:
    """(SCALE_KIND, BR, BC) of a recipe's scale_inv."""
    kind = _SCALE_KINDS[recipe.scale_granularity]
    if kind == _MX:
        return _MX, 1, recipe.block
    if kind == _BLOCK:
        return (_BLOCK, *recipe.block)
    return kind, 1, 1


@BACKEND.implements(Op.DEQUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not)
def dequantize(q, *, out_dtype, columnwise):
    data = q.columnwise_data if columnwise else q.data
    s = q.columnwise_scale_inv if columnwise else q.scale_inv
    rows, cols = (q.shape[1], q.shape[0]) if columnwise else (q.shape[0], q.shape[1])
    fmt = get_format(q.recipe.fmt)
    y = torch.empty((rows, cols), dtype=out_dtype, device=data.device)
    if rows and cols:
        kind, br, bc = _scale_layout(q.recipe)
        s = s.contiguous()
        grid = (triton.cdiv(rows, _TILE_M) * triton.cdiv(cols, _TILE_N),)
        _dequantize_kernel[grid](data.contiguous().view(torch.uint8), s, as_kernel_arg(y), rows,
                                 cols, s.shape[-1] if s.dim() == 2 else 1, SCALE_KIND=kind,
                                 BR=br, BC=bc, FP4=fmt.packed,
                                 Y_BF16=out_dtype == torch.bfloat16, BM=_TILE_M, BN=_TILE_N,
                                 num_warps=_WARPS, **_code_constants(fmt))
    return y
