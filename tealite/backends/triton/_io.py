"""Loads and stores that give the same bits on GPUs and in Triton's CPU interpreter.

Measured with triton 3.9's interpreter (TRITON_INTERPRET=1): a bf16 load of a *subnormal*
value converts it wrongly (7.62e-39 reads as 3.49e-39), and an fp32 -> bf16 store truncates
instead of rounding to nearest-even (0.3923 -> 0.390625, want 0.392578125).  So bf16 tensors
travel as int16 bit patterns (the host passes ``t.view(torch.int16)``) and are converted here
with integer operations: exact widening, and RNE narrowing with NaN kept quiet.

Compiled for a GPU the narrowing is the native conversion instead (``cvt.rn.bf16.f32`` on
CUDA, RNE like the integer form; a NaN becomes the canonical quiet NaN instead of keeping its
payload): the integer form is about nine integer instructions per element, which made
memory-bound kernels instruction-bound on an H100 (softmax, docs/benchmarks.md).  Only NaN
payload bits differ between the two forms.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Read at import as the backend's INTERPRET is (tealite/backends/triton/__init__.py); a
# module-level constexpr so that jit functions may read it.
NATIVE_BF16_STORE = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


def as_kernel_arg(t: torch.Tensor) -> torch.Tensor:
    """What the host passes for a tensor the kernel reads or writes with load_f32/store_f32."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


@triton.jit
def load_f32(ptr, offs, mask, IS_BF16: tl.constexpr, VOLATILE: tl.constexpr = False):
    """``VOLATILE``: a second read of the same values (the compiler may not reuse an earlier
    read's registers, which would keep them live in between)."""
    if IS_BF16:
        bits = tl.load(ptr + offs, mask=mask, other=0, volatile=VOLATILE).to(tl.int32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0, volatile=VOLATILE).to(tl.float32)


@triton.jit
def store_f32(ptr, offs, v, mask, IS_BF16: tl.constexpr):
    if IS_BF16 and NATIVE_BF16_STORE:
        rounded = v.to(tl.bfloat16, fp_downcast_rounding="rtne")
        tl.store(ptr + offs, rounded.to(tl.int16, bitcast=True), mask=mask)
    elif IS_BF16:
        bits = v.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # RNE on the dropped 16 bits
        quiet_nan = (bits >> 16) | 0x40
        out = tl.where(v != v, quiet_nan, rounded)
        tl.store(ptr + offs, out.to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offs, v.to(ptr.dtype.element_ty), mask=mask)
