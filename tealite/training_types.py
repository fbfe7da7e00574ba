"""Shared types of the training utilities (issue 17; bottom floor: plain data).

Multi-tensor ops, the bulk delayed-scaling update, dropout and transpose: each family keeps its
small shared types (typed option objects, flags) in a section of its own below, so that both
its front-end (tealite/ops/) and its backends may import them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from tealite.formats import FP8_FORMATS, get_format

# ---------------------------------------------------------------------------------------------
# Multi-tensor apply (tealite/ops/multi_tensor.py): the optimizer options and TE's chunk size.
# ---------------------------------------------------------------------------------------------

# TE's multi_tensor_apply cuts every tensor into chunks of this many elements (its Python
# optimizers pass 65536 = 2**16): a fused kernel's partial sums are per chunk, which is why
# the strategies draw sizes just across it (65537) and why the L2 norm's bound counts them.
MTA_CHUNK_ELEMENTS = 65536


@dataclass(frozen=True)
class AdamOptions:
    """One Adam / AdamW step (TE's ``multi_tensor_adam``; semantics in tealite/ops/multi_tensor.py).

    ``adam_w_mode``: True = AdamW (decoupled decay: ``update += weight_decay * p``), False =
    L2 (``g += weight_decay * p`` before the moments).  ``step`` is the 1-based step count the
    bias corrections ``1 - beta**step`` use (when ``bias_correction``).
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    step: int = 1
    weight_decay: float = 0.0
    adam_w_mode: bool = True
    bias_correction: bool = True


@dataclass(frozen=True)
class SGDOptions:
    """One SGD step (TE's / apex's ``multi_tensor_sgd``).

    ``first_run``: the momentum buffer is initialised with the gradient (PyTorch's SGD on its
    first step) instead of updated.  ``wd_after_momentum``: weight decay added to the direction
    after the momentum step instead of to the gradient before it.  ``scale``: the incoming
    gradient is multiplied by it first (the unscale of a loss-scaled gradient).
    """

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    first_run: bool = False
    wd_after_momentum: bool = False
    scale: float = 1.0


# ---- bulk delayed-scaling update (issue 17 part 2) ------------------------------------------


#: The longest amax history one Triton program holds (TE's recipes use 1..1024).
BULK_SCALING_MAX_HISTORY = 1024


class BulkScalingUpdate(NamedTuple):
    """``delayed_scaling_update_bulk``'s result: tensor i's new (H_i,) float32 history and
    new (1,) float32 scale, in the order the tensors were given."""

    amax_histories: list
    scales: list


# ---- transpose (issue 17 part 4) ------------------------------------------------------------



#: What ``transpose`` copies bit for bit: the working float dtypes, FP8 codes, and uint8
#: (packed FP4 codes, E8M0 scales).
TRANSPOSE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8) + tuple(
    get_format(f).torch_dtype for f in FP8_FORMATS)
