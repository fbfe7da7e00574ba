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


# ---- transpose (issue 17 part 4) ------------------------------------------------------------

import torch  # noqa: E402  (this section is self-contained)

from tealite.formats import FP8_FORMATS, get_format  # noqa: E402

#: What ``transpose`` copies bit for bit: the working float dtypes, FP8 codes, and uint8
#: (packed FP4 codes, E8M0 scales).
TRANSPOSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8) + tuple(
    get_format(f).torch_dtype for f in FP8_FORMATS)
