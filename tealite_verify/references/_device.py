"""Where the float64 reference products run.

A float64 GEMM of the shapes the fuzzer draws costs far more on the CPU than the kernel it
judges on a GPU, so when a case runs on CUDA the runner asks for the reference products on
the same device (an H100 does ~60 TFLOP/s in fp64).  ``torch.matmul`` in float64 is an
oracle here, like numpy's: it is not tealite code, and float64 on either side is ~2^-53
relative per term, far below any tolerance the harness applies.  References still take and
return numpy arrays; only the product moves.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import numpy as np

_DEVICE: ContextVar[str | None] = ContextVar("tealite_verify_reference_device", default=None)


def current() -> str | None:
    """The torch device reference products run on, or None for numpy on the CPU."""
    return _DEVICE.get()


@contextmanager
def reference_device(device: str | None) -> Iterator[None]:
    """Run reference products on torch ``device`` (None: numpy) inside the block."""
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def for_case(device: str) -> str | None:
    """The reference device for a case on ``device``: the GPU itself, else numpy."""
    return device if str(device).startswith("cuda") else None


def matmul_f64(x, y) -> np.ndarray:
    """``x @ y`` in float64, on the current reference device; numpy in, numpy out."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    device = current()
    if device is None:
        return x @ y
    import torch  # local: numpy-only references must not pay for it

    tx = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    ty = torch.from_numpy(np.ascontiguousarray(y)).to(device)
    return (tx @ ty).cpu().numpy()
