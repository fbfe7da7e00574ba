"""``pad_end``: ``torch.nn.functional.pad`` with a constant at the end of the last dims, also for
tensors with a zero-size dim.  torch up to 2.9 refuses those in F.pad (pytorch issue 161014:
measured with ci/install_proof.sh on 2.7.1 / 2.9.0, an empty quantize group and a qgemm with
m = 0 raised), and the project supports ROCm stacks that still ship 2.9."""
from __future__ import annotations

import torch


def pad_end(t: torch.Tensor, pads, value: float = 0.0) -> torch.Tensor:
    """``F.pad(t, pads, value=value)`` for non-negative ``pads`` (F.pad's order: last dim
    first, (before, after) per dim)."""
    if t.numel():
        return torch.nn.functional.pad(t, tuple(pads), value=value)
    shape = list(t.shape)
    for i in range(len(pads) // 2):
        shape[-1 - i] += pads[2 * i] + pads[2 * i + 1]
    return torch.full(shape, value, dtype=t.dtype, device=t.device)
