"""``delayed_scaling_update_bulk``: DelayedScaling's amax-history roll and scale update for
many tensors in one call (TE's bulk ``amax_and_scale_update`` in recipe/delayed_scaling.cu).

TE's fp8 autocast updates every FP8 tensor's history and scale at the end of a step; done one
tensor at a time that is several tiny launches per tensor (hundreds of thousands per
iteration in a large model).  The bulk op does the same arithmetic as the per-tensor
:func:`tealite.delayed_scaling_update`, tensor by tensor, and a backend may do it in one
launch.  Its contract is **bit equality** with the per-tensor op for every tensor (history and
scale): tealite_verify's parity tier holds each backend to it.

Tensor i has its own recipe (format, margin, algorithm, history length): TE groups a bulk call
by recipe and direction (e4m3 forward, e5m2 backward under HYBRID); tealite accepts a mixed
list, so one call may cover both.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

import tealite.recipes as R
import tealite.registry as registry
from tealite._checks import check_shape, check_tensor, one_dtype_and_device, require
from tealite.training_types import BulkScalingUpdate
from tealite.types import Op


def _recipe_list(recipes, n: int) -> tuple:
    """One DelayedScaling for every tensor, or one per tensor."""
    if isinstance(recipes, R.DelayedScaling):
        return (recipes,) * n
    require(isinstance(recipes, Sequence) and not isinstance(recipes, str),
            f"recipes must be a DelayedScaling or a sequence of them, got "
            f"{type(recipes).__name__}")
    require(len(recipes) == n, f"recipes must have one recipe per tensor ({n}), got "
                               f"{len(recipes)}")
    for i, r in enumerate(recipes):
        require(isinstance(r, R.DelayedScaling),
                f"recipes[{i}] must be DelayedScaling, got {type(r).__name__}")
    return tuple(recipes)


def delayed_scaling_update_bulk(amax_histories: Sequence[torch.Tensor],
                                scales: Sequence[torch.Tensor], recipes, *,
                                backend: str | None = None) -> BulkScalingUpdate:
    """:func:`tealite.delayed_scaling_update` for every tensor i of the lists.

    ``amax_histories[i]`` (H_i,) float32 with the newest amax in slot 0, H_i ==
    ``recipes[i].amax_history_len`` >= 1; ``scales[i]`` (1,) float32; ``recipes`` one
    ``DelayedScaling`` for all or one per tensor.  All tensors on one device.  Returns
    :class:`tealite.training_types.BulkScalingUpdate` (new histories, new scales), each
    tensor's exactly as the per-tensor op computes it; the inputs are not modified.
    """
    require(isinstance(amax_histories, Sequence) and isinstance(scales, Sequence),
            "amax_histories and scales must be sequences (lists) of tensors")
    n = len(amax_histories)
    require(len(scales) == n, f"scales must have one tensor per amax history ({n}), got "
                              f"{len(scales)}")
    recipes = _recipe_list(recipes, n)
    if n == 0:
        return BulkScalingUpdate([], [])
    if not _all_valid(amax_histories, scales, recipes):
        device = amax_histories[0].device if isinstance(amax_histories[0], torch.Tensor) \
            else None
        for i, (h, s, r) in enumerate(zip(amax_histories, scales, recipes)):
            device = _check_entry(i, h, s, r, device)
    device = amax_histories[0].device
    params = dict(dtype=torch.float32, fmts=tuple(sorted({r.fmt for r in recipes})),
                  count=n, max_history_len=max(r.amax_history_len for r in recipes),
                  device=registry.device_kind(device))
    impl = registry.dispatch(Op.DELAYED_SCALING_UPDATE_BULK, params, backend)
    return impl.fn(list(amax_histories), list(scales), recipes)


def _all_valid(histories, scales, recipes) -> bool:
    """One cheap pass over every entry (the messages are built only when it fails: building
    them for 2000 tensors cost ~25 ms per call, 1000 times the kernel)."""
    if not all(isinstance(t, torch.Tensor) for t in (*histories, *scales)):
        return False
    return one_dtype_and_device((*histories, *scales)) == torch.float32 and all(
        h.dim() == 1 and h.shape[0] == r.amax_history_len >= 1 and s.shape == (1,)
        for h, s, r in zip(histories, scales, recipes))


def _check_entry(i: int, h, s, r, device):
    """Entry i's checks with their messages; returns the call's device (entry 0's)."""
    check_tensor(f"amax_histories[{i}]", h, ndim=1, dtypes=(torch.float32,))
    require(h.numel() >= 1, f"amax_histories[{i}] must hold at least one amax "
                            "(history length 0)")
    check_shape(f"amax_histories[{i}]", h, (r.amax_history_len,),
                f"recipes[{i}].amax_history_len")
    check_tensor(f"scales[{i}]", s, dtypes=(torch.float32,))
    check_shape(f"scales[{i}]", s, (1,), "one per-tensor scale")
    device = h.device if device is None else device
    require(h.device == device and s.device == device,
            f"all tensors must be on one device: amax_histories[0] is on {device}, "
            f"amax_histories[{i}] on {h.device}, scales[{i}] on {s.device}")
    return device
