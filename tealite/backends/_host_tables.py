"""Host-built tables (group offsets, tile and chunk tables, tensor addresses, scalar kernel
parameters) as device tensors, cached per (values, dtype, device).

Why a cache rather than ``torch.tensor(values, device=...)`` per call: a launch that copies a
fresh host table to the GPU cannot be captured in a CUDA graph (a host-to-device copy from
pageable memory is refused while capturing, and a replay would read a temporary freed after
the capture).  A cached table is copied once, by the first (eager) call, and stays alive and
unchanged for every later call and replay; a repeated split or tensor list also skips the copy.

Entries are read-only: no kernel writes a table.  The cache is bounded (``maxsize``); a graph
captured with a table that is evicted later (after ``maxsize`` distinct newer tables) would
read freed memory, far beyond what one training step or one harness case creates.
"""
from __future__ import annotations

import functools

import numpy as np
import torch


def device_table(values, dtype: torch.dtype, device) -> torch.Tensor:
    """``values`` (host ints or floats) as a read-only 1-D ``dtype`` tensor on ``device``."""
    return _cached(tuple(values), dtype, str(torch.device(device)))


@functools.lru_cache(maxsize=1024)
def _cached(values: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def device_table_of_array(values: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
    """:func:`device_table` for a 1-D numpy array, keyed on its bytes: hashing the 8 KB of
    1000 int64 addresses costs ~2 us where the tuple of 1000 Python ints costs ~25 us to build
    and hash (an optimizer step looks up one table per list).  Same policy: cached, read-only."""
    values = np.ascontiguousarray(values)
    return _cached_array(values.tobytes(), values.dtype.str, dtype, str(torch.device(device)))


@functools.lru_cache(maxsize=1024)
def _cached_array(raw: bytes, np_dtype: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    host = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy())
    return host.to(dtype=dtype, device=device)
