"""Shared types of the training utilities (issue 17; bottom floor: plain data).

Multi-tensor ops, the bulk delayed-scaling update, dropout and transpose: each family keeps its
small shared types (typed option objects, flags) in a section of its own below, so that both
its front-end (tealite/ops/) and its backends may import them.
"""
from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# Multi-tensor apply (tealite/ops/multi_tensor.py): the optimizer options and TE's chunk size.
# ---------------------------------------------------------------------------------------------
from dataclasses import dataclass  # noqa: E402  (this section is self-contained)

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
