"""Dropout forward and backward (TE's ``dropout_fwd`` / ``dropout_bwd``).

* ``dropout_fwd(x, p, *, seed, offset)`` -> ``DropoutFwd(y, mask)``: ``mask`` is a bool tensor
  of x's shape, True where the element is **kept**; ``y = x * scale`` where kept and ``+0``
  where dropped (a dropped NaN / Inf gives 0, as TE writes a literal 0).
* ``dropout_bwd(dy, mask, p)`` -> ``dx``: the same rule with the forward's mask, so forward and
  backward agree by construction (nothing is regenerated).

Scaling: ``scale = fl32(1 / (1 - p))`` (the quotient in float64, rounded once to float32;
0 for p = 1, where nothing is kept and nothing is divided).  A kept element is
``fl_dtype(fl32(fl32(x) * scale))``: one fp32 multiply, then one rounding to x's dtype (none
for float32).  TE's 16-bit kernel multiplies in the 16-bit type with the scale rounded to it
first; tealite keeps the fp32 product (one fewer rounding of the scale).

The mask comes from a counter-based generator keyed by ``seed`` with the stream ``offset``:
the same (seed, offset) gives the same mask on one backend and device; another offset gives
an independent mask.  Each backend owns its generator (torch: torch's generator seeded from
(seed, offset); triton: Philox4x32-10, counter (element // 4, offset)), so masks differ between
backends: the harness compares them statistically (tealite_verify/tiers/statistical.py), never
bit for bit.  An element is kept iff its uniform draw u in [0, 1) satisfies ``u >= p``.

Mask representation: TE returns a bit-packed int16 mask (one bit per element, set = dropped,
numel % 16 == 0, p a multiple of 1/256).  tealite keeps torch's bool "kept" mask of x's shape
(any numel, any p in [0, 1]); packing is a layout question, not a numerics one.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

import tealite.registry as registry
from tealite._checks import check_same_device, check_shape, check_tensor, require
from tealite.types import Op

# Seeds and offsets are non-negative 63-bit integers (torch's generators take a 64-bit seed;
# Philox takes a 64-bit key and the offset fills two 32-bit counter words).
_MAX_SEED = 2 ** 63


class DropoutFwd(NamedTuple):
    y: torch.Tensor
    mask: torch.Tensor


def check_probability(p) -> float:
    """p as a float in [0, 1]; anything else is an error naming ``p``."""
    require(isinstance(p, (int, float)) and not isinstance(p, bool),
            f"p must be a Python float in [0, 1], got {type(p).__name__}")
    p = float(p)
    require(not math.isnan(p), "p must be in [0, 1], got nan")
    require(0.0 <= p <= 1.0, f"p must be in [0, 1], got {p}")
    return p


def scale_fp32(p: float) -> float:
    """The kept elements' factor fl32(1 / (1 - p)) (0.0 for p = 1: nothing is kept)."""
    return 0.0 if p == 1.0 else float(np.float32(1.0 / (1.0 - p)))


def _check_counter(name: str, v) -> int:
    require(isinstance(v, (int, np.integer)) and not isinstance(v, bool),
            f"{name} must be an int, got {type(v).__name__}")
    v = int(v)
    require(0 <= v < _MAX_SEED, f"{name} must be in [0, 2**63), got {v}")
    return v


def _params(t: torch.Tensor, p: float, **tensors) -> dict:
    device = check_same_device(**tensors)
    return dict(dtype=t.dtype, numel=t.numel(), p=p, device=registry.device_kind(device))


def dropout_fwd(x, p, *, seed, offset=0, backend: str | None = None) -> DropoutFwd:
    check_tensor("x", x)
    p = check_probability(p)
    seed = _check_counter("seed", seed)
    offset = _check_counter("offset", offset)
    impl = registry.dispatch(Op.DROPOUT_FWD, _params(x, p, x=x), backend)
    y, mask = impl.fn(x.contiguous(), p=p, scale=scale_fp32(p), seed=seed, offset=offset)
    return DropoutFwd(y, mask)


def dropout_bwd(dy, mask, p, *, backend: str | None = None) -> torch.Tensor:
    check_tensor("dy", dy)
    check_tensor("mask", mask, dtypes=(torch.bool,))
    check_shape("mask", mask, dy.shape, "dy's shape: the forward's kept mask")
    p = check_probability(p)
    impl = registry.dispatch(Op.DROPOUT_BWD, _params(dy, p, dy=dy, mask=mask), backend)
    return impl.fn(dy.contiguous(), mask.contiguous(), p=p, scale=scale_fp32(p))


__all__ = ["dropout_fwd", "dropout_bwd", "DropoutFwd", "scale_fp32", "check_probability"]
