"""Argument checks shared by the op front-ends.

Every message names the argument and the constraint it broke, so a caller never has to guess
which of several tensors was wrong.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Iterable, Sequence

import torch

from tealite.errors import TealiteArgumentError

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE, _DEVICE = attrgetter("dtype"), attrgetter("device")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise TealiteArgumentError(message)


def check_tensor(name: str, t, *, ndim: int | None = None, min_ndim: int | None = None,
                 dtypes: Sequence[torch.dtype] | None = FLOAT_DTYPES) -> None:
    # Every op runs this on every tensor argument: each message is built only when its check
    # fails (building them eagerly was about half of the 2 us per call).
    if not isinstance(t, torch.Tensor):
        raise TealiteArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise TealiteArgumentError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise TealiteArgumentError(
            f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise TealiteArgumentError(
            f"{name} dtype must be one of ({allowed}), got {dtype_name(t.dtype)}")


def check_shape(name: str, t: torch.Tensor, expected: Iterable[int], why: str) -> None:
    expected = tuple(expected)
    if t.shape != expected:
        raise TealiteArgumentError(
            f"{name} must have shape {expected} ({why}), got {tuple(t.shape)}")


# The checks below run on every op call: each builds its message only when it fails.

def check_same_device(**tensors) -> torch.device:
    devices = {k: v.device for k, v in tensors.items() if v is not None}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        raise TealiteArgumentError("all tensors must be on one device; got "
                                   + ", ".join(f"{k} on {d}" for k, d in devices.items()))
    return first


def check_dtype_in(name: str, dtype, allowed: Sequence[torch.dtype]) -> None:
    if dtype in allowed:
        return
    allowed_s = ", ".join(dtype_name(d) for d in allowed)
    got = dtype_name(dtype) if isinstance(dtype, torch.dtype) else \
        f"{dtype!r} ({type(dtype).__name__}, not a torch.dtype)"
    raise TealiteArgumentError(f"{name} must be one of ({allowed_s}), got {got}")


def check_choice(name: str, value, choices: Sequence) -> None:
    if value not in choices:
        raise TealiteArgumentError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_finite_number(name: str, value, *, positive: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TealiteArgumentError(f"{name} must be a Python float, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise TealiteArgumentError(f"{name} must be finite, got an int too large for a float")
    if not (value == value and abs(value) != float("inf")):
        raise TealiteArgumentError(f"{name} must be finite, got {value}")
    if positive and not value > 0:
        raise TealiteArgumentError(f"{name} must be > 0, got {value}")
    return value


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s device stream is being captured into a CUDA graph: a check that reads
    tensor values back to the host (a device sync) is illegal there, so value checks are
    skipped while capturing (the eager call before a capture has run them)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


# torch's foreach optimizers' grouping (ATen's _group_tensors_by_first_tensors_device_and_dtype,
# generic, so CUDA, ROCm and CPU builds alike; bound as torch._C._group_tensors_by_device_and_dtype
# in torch 2.11 and 2.13): it reads every tensor's device and dtype in C++.
_GROUP_BY_DEVICE_AND_DTYPE = getattr(torch._C, "_group_tensors_by_device_and_dtype", None)


def one_device_and_dtype(tensors) -> tuple[torch.device, torch.dtype] | None:
    """The (device, dtype) every entry of the non-empty sequence ``tensors`` shares, else None
    (also for a non-tensor or None entry).  One C++ pass over one list: ~0.115 us per tensor on
    a 2-core CPU box where a Python set of dtypes and a set of devices cost 0.065 + 0.11 us
    (the devices are built as Python objects).  One list per call on purpose: over several
    lists the grouping keys on the first list and lets a CPU float32 tensor of a later list
    through (its exception for optimizer step counters).  Callers build their per-entry error
    messages only when this fails."""
    if _GROUP_BY_DEVICE_AND_DTYPE is None:
        return _one_device_and_dtype_in_python(tensors)
    try:
        groups = _GROUP_BY_DEVICE_AND_DTYPE([tensors], False)
    except (TypeError, RuntimeError):  # an entry that is not a tensor (TypeError) or is None
        return None
    return next(iter(groups)) if len(groups) == 1 else None


def _one_device_and_dtype_in_python(tensors) -> tuple[torch.device, torch.dtype] | None:
    """:func:`one_device_and_dtype` for a torch without the C++ grouping: a pass over the
    types, then one set of dtypes and one of devices."""
    if not all(issubclass(k, torch.Tensor) for k in set(map(type, tensors))):
        return None
    dtypes, devices = set(map(_DTYPE, tensors)), set(map(_DEVICE, tensors))
    if len(dtypes) != 1 or len(devices) != 1:
        return None
    return next(iter(devices)), next(iter(dtypes))


def one_dtype_and_device(tensors) -> torch.dtype | None:
    """The tensors' common dtype when they all share it and one device, else None (including
    an empty sequence): :func:`one_device_and_dtype`'s dtype."""
    key = one_device_and_dtype(tensors)
    return None if key is None else key[1]
