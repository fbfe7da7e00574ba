"""Shared types of the training utilities (issue 17; bottom floor: plain data).

Multi-tensor ops, the bulk delayed-scaling update, dropout and transpose: each family keeps its
small shared types (typed option objects, flags) in a section of its own below, so that both
its front-end (tealite/ops/) and its backends may import them.
"""
from __future__ import annotations


# ---- bulk delayed-scaling update (issue 17 part 2) ------------------------------------------

from typing import NamedTuple  # noqa: E402  (this section is self-contained)

#: The longest amax history one Triton program holds (TE's recipes use 1..1024).
BULK_SCALING_MAX_HISTORY = 1024


class BulkScalingUpdate(NamedTuple):
    """``delayed_scaling_update_bulk``'s result: tensor i's new (H_i,) float32 history and
    new (1,) float32 scale, in the order the tensors were given."""

    amax_histories: list
    scales: list
