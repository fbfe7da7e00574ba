"""Dropout with torch's own generator.

The mask's uniforms are ``torch.rand`` (float32, multiples of 2^-24) from a
``torch.Generator`` on x's device seeded with ``splitmix64(seed, offset)``: Philox on CUDA /
ROCm, MT19937 on the CPU.  The two words are mixed through splitmix64's finalizer (not added)
so that neighbouring (seed, offset) pairs seed unrelated streams.  Same (seed, offset) and
device: the same mask.  Kept: ``u >= p``; ``y = where(kept, fl32(x) * scale, 0)`` rounded once
to x's dtype (``torch.where``, not a multiply by the mask, so a dropped NaN gives 0).
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}
_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def generator_seed(seed: int, offset: int) -> int:
    """The torch generator's seed for (seed, offset): a 63-bit mix of both words."""
    return _splitmix64(_splitmix64(seed) ^ offset) >> 1


def keep_mask(shape, device, p: float, seed: int, offset: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(generator_seed(seed, offset))
    u = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
    return u >= p


def apply_mask(t: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """where(keep, fl32(t) * scale, +0) rounded once to t's dtype."""
    scaled = t.float() * scale
    return torch.where(keep, scaled, torch.zeros((), dtype=torch.float32,
                                                 device=t.device)).to(t.dtype)


@BACKEND.implements(Op.DROPOUT_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def dropout_fwd(x, *, p, scale, seed, offset):
    keep = keep_mask(x.shape, x.device, p, seed, offset)
    return apply_mask(x, keep, scale), keep


@BACKEND.implements(Op.DROPOUT_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def dropout_bwd(dy, mask, *, p, scale):
    return apply_mask(dy, mask, scale)
