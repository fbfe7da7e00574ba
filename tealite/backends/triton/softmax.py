"""TE's fused softmax kinds, forward and backward: one row (query) per program, the whole row
in registers (a power-of-two block, so any row length, prime or not, runs with a masked tail).

Forward, per row: s = x * scale in fp32, the kind's fill (-10000 over masked logits and the
aligned-causal kind's hidden keys, -inf over the upper-triangular kind's: the causal kinds
read only the visible prefix of x), max, exp(s - max), a tree sum, then one IEEE reciprocal
of the sum per row (``div_rn``: Triton's ``/`` is approximate on CUDA) and a multiply per
element; rows TE zeroes are zeroed (tealite/ops/softmax.py).  The reciprocal-and-multiply
replaced a ``div_rn`` per element: on an H100 the exact division (a Newton sequence with a
slow-path check) and the bf16 store's integer rounding made the masked and causal kinds
instruction-bound at about 430 instructions per thread (64 / 52 % of copy); without them they
run at 90 / 101 % (docs/benchmarks.md).  The mask of ``scaled_masked`` is read as bytes from
its (b or 1, 1, sq, sk) layout: row r = ((batch * heads) + head) * sq + q reads mask row
(batch or 0) * sq + q.  Backward: c = sum(dy * y) over the kept keys,
dx = scale * (dy * y - y * c).

Numerics: fp32 throughout.  ``tl.exp`` is numpy's exp in the interpreter (1 ulp) and on CUDA
``ex2.approx`` of the argument times log2(e) (2 ulp, and the product's rounding, which the
softmax tier allows for every backend): ``exp_ulps`` 1 / 2.  The division is two correctly
rounded operations, 1/S and e * (1/S): relative error at most 2u (plus u^2), declared as
``fp32_div_ulps`` 1 (the tier reads n ulps as 2nu relative).

Rows wider than 65536 keys are refused (one row per program in registers).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.types import SOFTMAX_KINDS, SOFTMAX_MASK_FILL, Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MAX_KEYS = 65536
# Kind codes the kernels branch on at compile time (constexpr).
_KIND = {k: i for i, k in enumerate(SOFTMAX_KINDS)}
_MASKED, _UPPER, _ALIGNED = (_KIND["scaled_masked"], _KIND["scaled_upper_triang"],
                             _KIND["scaled_aligned_causal"])


def _numerics(params) -> dict:
    return {"compute_dtype": torch.float32, "exp_ulps": 1 if INTERPRET else 2,
            "fp32_div_ulps": 1}


def _too_long(params) -> str | None:
    if params["sk"] > _MAX_KEYS:
        return f"sk = {params['sk']} > {_MAX_KEYS} keys (one row per program in registers)"
    return None


@triton.jit
def _visible(row, sq, sk):
    """How many leading keys a causal kind keeps for the row's query i: i + (sk - sq) + 1
    (<= 0 for the aligned kind's empty rows), as int32: the compare with it is per element."""
    return (row % sq).to(tl.int32) + (sk - sq) + 1


@triton.jit
def _kept(row, cols, sq, sk):
    """Key j kept for the row's query i by a causal kind: j <= i + (sk - sq)."""
    return cols < _visible(row, sq, sk)


@triton.jit
def _softmax_fwd_kernel(x_ptr, mask_ptr, y_ptr, sq, sk, scale, rows_per_batch, MASK_PER_BATCH,
                        KIND: tl.constexpr, IS_BF16: tl.constexpr, FILL: tl.constexpr,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < sk
    if KIND >= 2:
        # The causal kinds replace every hidden logit by the fill whatever x holds there, so
        # only the visible prefix is read.  Its bound rounded up to a multiple of 8 keeps the
        # load vectorized (the compiler sees the mask constant over 8 keys); the up to 7
        # extra keys read are filled like the rest.
        kept = _kept(row, cols, sq, sk)
        ld = inb & (cols < ((_visible(row, sq, sk) + 7) // 8) * 8)
        s = tl.where(kept, load_f32(x_ptr, row * sk + cols, ld, IS_BF16) * scale, FILL)
    else:
        s = load_f32(x_ptr, row * sk + cols, inb, IS_BF16) * scale
    if KIND == 1:  # scaled_masked: the mask row of this query, of this batch or the shared one
        mrow = (row // rows_per_batch) * MASK_PER_BATCH * sq + row % sq
        masked = tl.load(mask_ptr + mrow * sk + cols, mask=inb, other=0) != 0
        s = tl.where(masked, FILL, s)
    s = tl.where(inb, s, float("-inf"))
    m = tl.max(s, axis=0)
    e = tl.where(inb, tl.exp(s - m), 0.0)
    inv_total = tl.math.div_rn(1.0, tl.sum(e, axis=0))  # the sum is >= 1: exp(0) is in it
    if KIND >= 2:
        y = tl.where(kept, e * inv_total, 0.0)  # hidden keys are 0 whatever the fill gave
    else:
        y = e * inv_total
    if KIND == 1:
        y = tl.where(m == FILL, 0.0, y)  # TE zeroes a row whose max is the fill
    store_f32(y_ptr, row * sk + cols, y, inb, IS_BF16)


@triton.jit
def _softmax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, sq, sk, scale, CAUSAL: tl.constexpr,
                        IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < sk
    if CAUSAL:  # read only the kept keys; dx is 0 at the others
        inb_read = inb & _kept(row, cols, sq, sk)
    else:
        inb_read = inb
    dy = load_f32(dy_ptr, row * sk + cols, inb_read, IS_BF16)
    y = load_f32(y_ptr, row * sk + cols, inb_read, IS_BF16)
    p = dy * y
    c = tl.sum(p, axis=0)
    dx = scale * (p - y * c)
    store_f32(dx_ptr, row * sk + cols, dx, inb, IS_BF16)


def _num_warps(block: int) -> int:
    # As the norm kernels: at most 8 warps up to 8192 keys (a thread holds <= 32 fp32 values
    # of a row), 16 beyond.
    return min(8 if block <= 8192 else 16, max(1, block // 256))


def _grid_args(t: torch.Tensor):
    sq, sk = t.shape[-2], t.shape[-1]
    rows = t.numel() // sk if sk else 0
    return rows, sq, sk, triton.next_power_of_2(max(sk, 1))


@BACKEND.implements(Op.SOFTMAX_FWD, dtypes=_FLOATS, devices=DEVICES, check=_too_long,
                    numerics=_numerics)
def softmax_fwd(x, kind, *, scale, mask):
    x2 = x.contiguous()
    y = torch.empty_like(x2)
    rows, sq, sk, block = _grid_args(x2)
    if rows == 0:
        return y
    code = _KIND[kind]
    if code == _MASKED:
        mask_arg = mask.contiguous().view(torch.uint8)
        per_batch = 1 if mask.shape[0] > 1 else 0
        rows_per_batch = x.shape[1] * sq
    else:
        mask_arg, per_batch, rows_per_batch = x2, 0, 1  # unread
    fill = float("-inf") if code == _UPPER else SOFTMAX_MASK_FILL
    _softmax_fwd_kernel[(rows,)](
        as_kernel_arg(x2), mask_arg, as_kernel_arg(y), sq, sk, float(scale), rows_per_batch,
        per_batch, KIND=code, IS_BF16=x.dtype == torch.bfloat16, FILL=fill, BLOCK=block,
        num_warps=_num_warps(block))
    return y


@BACKEND.implements(Op.SOFTMAX_BWD, dtypes=_FLOATS, devices=DEVICES, check=_too_long,
                    numerics=_numerics)
def softmax_bwd(dy, y, kind, *, scale):
    dy2, y2 = dy.contiguous(), y.contiguous()
    dx = torch.empty_like(dy2)
    rows, sq, sk, block = _grid_args(y2)
    if rows == 0:
        return dx
    _softmax_bwd_kernel[(rows,)](
        as_kernel_arg(dy2), as_kernel_arg(y2), as_kernel_arg(dx), sq, sk, float(scale),
        CAUSAL=_KIND[kind] in (_UPPER, _ALIGNED), IS_BF16=y.dtype == torch.bfloat16,
        BLOCK=block, num_warps=_num_warps(block))
    return dx
