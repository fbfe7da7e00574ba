"""Triton ``transpose``: a tiled copy, every element moved as raw bits.

The tensor is viewed as the unsigned integer type of its width (FP8 codes and bf16 as bytes /
16-bit words: the interpreter mishandles FP8 and bf16 arithmetic, and a copy needs none), a
(BM, BN) tile is loaded with x's strides (any layout), transposed in registers and stored
into the contiguous (N, M) output.  Offsets are int64 (tensors past 2^31 elements).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.training_types import TRANSPOSE_DTYPES
from tealite.types import Op

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
TILE = 32


@triton.jit
def _transpose_kernel(x, y, M, N, sxm, sxn, BM: tl.constexpr, BN: tl.constexpr):
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    tile = tl.load(x + rm[:, None] * sxm + rn[None, :] * sxn,
                   mask=(rm[:, None] < M) & (rn[None, :] < N))
    tl.store(y + rn[:, None] * M + rm[None, :], tl.trans(tile),
             mask=(rn[:, None] < N) & (rm[None, :] < M))


@BACKEND.implements(Op.TRANSPOSE, dtypes=TRANSPOSE_DTYPES, devices=DEVICES)
def transpose(x):
    m, n = x.shape
    y = torch.empty((n, m), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    bits = _BITS[x.element_size()]
    grid = (triton.cdiv(m, TILE), triton.cdiv(n, TILE))
    _transpose_kernel[grid](x.view(bits), y.view(bits), m, n, x.stride(0), x.stride(1),
                            BM=TILE, BN=TILE)
    return y
