"""Dropout in Triton, the mask generated in the kernel and fused with the scaling.

Generator: Philox4x32-10 (``tl.philox``) keyed by the 64-bit seed, with the counter
(q low word, q high word, offset low word, offset high word) for q = element // 4; its four
outputs serve the four elements 4 q .. 4 q + 3 (one Philox evaluation per four elements: the
ten rounds are the kernel's arithmetic, and a bandwidth-bound kernel cannot afford one per
element), each becoming a uniform in [0, 1) through ``tl.uint_to_uniform_float`` (a 31-bit
integer times an fp32 scale, rounded).  Putting the offset in counter words of its own
(rather than adding it to the element index, as ``tl.rand(seed, offset + idx)`` would) makes
another offset an independent stream instead of the same stream shifted by a few elements.

Forward: one program per BLOCK elements (a (BLOCK / 4, 4) tile) loads x, draws, writes
y = where(u >= p, fl32(x) * scale, 0) in x's dtype and the kept mask as bytes (the host views
them as bool).  Backward reads the mask, never regenerates it.  bf16 travels as int16 bits
through ``_io`` (the interpreter's bf16 conversions are wrong), so the bits are the same on
every target.  No add follows the multiply, so FP fusion cannot contract it into an FMA.
The kernels cross-compile for sm_90 and gfx942 with triton 3.9 but have not yet run on a GPU
(no device time in this change): benchmarks/test_bench_dropout.py has its 80 %-of-copy
target to meet there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.types import Op

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}
# Large blocks in the interpreter, whose cost is per program; 1024 elements (8 per thread) on
# a GPU.
_BLOCK = 8192 if INTERPRET else 1024
_M32 = (1 << 32) - 1


@triton.jit
def _tile(pid, BLOCK: tl.constexpr):
    """The program's Philox counters (BLOCK // 4,) and its elements (BLOCK // 4, 4): element
    4 q + j takes output j of counter q."""
    q = pid.to(tl.int64) * (BLOCK // 4) + tl.arange(0, BLOCK // 4)
    return q, q[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _kept(q, p, seed, off_lo, off_hi):
    c0 = (q & 0xFFFFFFFF).to(tl.uint32)
    c1 = (q >> 32).to(tl.uint32)
    zero = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero + off_lo.to(tl.uint32),
                               zero + off_hi.to(tl.uint32))
    j = tl.arange(0, 4)[None, :]
    r = tl.where(j == 0, r0[:, None], tl.where(j == 1, r1[:, None],
                                               tl.where(j == 2, r2[:, None], r3[:, None])))
    return tl.uint_to_uniform_float(r) >= p


# Compiled Triton turns an int argument equal to 1 into a constant (a Python int, which has no
# ``.to``): an offset of 2**32 + k has off_hi == 1.  The seed and offset words are data, never
# specialised.
@triton.jit(do_not_specialize=["seed", "off_lo", "off_hi"])
def _fwd_kernel(x_ptr, y_ptr, keep_ptr, n, p, scale, seed, off_lo, off_hi,
                IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
    q, idx = _tile(tl.program_id(0), BLOCK)
    inb = idx < n
    keep = _kept(q, p, seed, off_lo, off_hi)
    x = load_f32(x_ptr, idx, inb, IS_BF16)
    store_f32(y_ptr, idx, tl.where(keep, x * scale, 0.0), inb, IS_BF16)
    tl.store(keep_ptr + idx, keep.to(tl.uint8), mask=inb)


@triton.jit
def _bwd_kernel(dy_ptr, keep_ptr, dx_ptr, n, scale, IS_BF16: tl.constexpr,
                BLOCK: tl.constexpr):
    _, idx = _tile(tl.program_id(0), BLOCK)
    inb = idx < n
    keep = tl.load(keep_ptr + idx, mask=inb, other=0) != 0
    dy = load_f32(dy_ptr, idx, inb, IS_BF16)
    store_f32(dx_ptr, idx, tl.where(keep, dy * scale, 0.0), inb, IS_BF16)


def _grid(n: int):
    return (triton.cdiv(max(n, 1), _BLOCK),)


@BACKEND.implements(Op.DROPOUT_FWD, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS)
def dropout_fwd(x, *, p, scale, seed, offset):
    y = torch.empty_like(x)
    keep = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    if x.numel():
        _fwd_kernel[_grid(x.numel())](as_kernel_arg(x), as_kernel_arg(y), keep, x.numel(), p,
                                      scale, seed, offset & _M32, offset >> 32,
                                      IS_BF16=x.dtype == torch.bfloat16, BLOCK=_BLOCK)
    return y, keep.view(torch.bool)


@BACKEND.implements(Op.DROPOUT_BWD, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS)
def dropout_bwd(dy, mask, *, p, scale):
    dx = torch.empty_like(dy)
    if dy.numel():
        _bwd_kernel[_grid(dy.numel())](as_kernel_arg(dy), mask.view(torch.uint8),
                                       as_kernel_arg(dx), dy.numel(), scale,
                                       IS_BF16=dy.dtype == torch.bfloat16, BLOCK=_BLOCK)
    return dx
