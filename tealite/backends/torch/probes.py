"""Numerics of torch's own kernels that depend on the machine, probed once per process.

torch's CPU bf16 / fp16 matmul goes through oneDNN, which picks its kernel by instruction set
and size.  On CPUs with AVX512-BF16 / AMX the bf16 kernels treat subnormal inputs as zero: a
64x64x64 product of bf16 values 1e-39 (subnormal) by 2 comes out 0.0 where the exact result,
1.3e-37, is a normal number (measured on this project's machines; with
``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` or ``AVX2`` the same product keeps its subnormals).  Which
CPU CI lands on is not ours to choose, so the torch backend asks the machine instead of
assuming either behaviour, and declares what it found (``subnormal_inputs``).
"""
from __future__ import annotations

import functools

import torch

# Big enough for oneDNN's blocked (AMX / AVX512-BF16) kernels: a 16x16x16 product took the
# reference path and kept its subnormals on the same machine.
_PROBE_SIZE = 64


PROBED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.lru_cache(maxsize=None)
def matmul_flushes_subnormal_inputs(dtype: torch.dtype, device: str = "cpu") -> bool:
    """True when ``torch.matmul`` in ``dtype`` on ``device`` treated subnormal inputs as zero
    in a probe product whose exact result is a normal number of that dtype."""
    tiny = torch.finfo(dtype).tiny  # the smallest normal: tiny / 4 is subnormal
    a = torch.full((_PROBE_SIZE, _PROBE_SIZE), tiny / 4, dtype=dtype, device=device)
    b = torch.full((_PROBE_SIZE, _PROBE_SIZE), 2.0, dtype=dtype, device=device)
    got = torch.matmul(a, b).float()
    # Exact: 64 * (tiny / 4) * 2 = 32 tiny, a normal number in every float dtype.
    return bool((got == 0).any())


def describe(devices: tuple[str, ...] = ("cpu",)) -> list[tuple[str, str, str]]:
    """(what, device, finding) rows for ``python -m tealite_verify list``."""
    rows = []
    for device in devices:
        for dtype in PROBED_DTYPES:
            flush = matmul_flushes_subnormal_inputs(dtype, device)
            rows.append((f"torch.matmul {str(dtype).removeprefix('torch.')}", device,
                         "subnormal inputs treated as zero (declared subnormal_inputs="
                         "may_flush)" if flush else "subnormal inputs kept"))
    return rows
