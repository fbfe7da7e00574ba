"""Grouped quantization (+ dbias) in plain torch: a loop of this backend's own ``quantize`` over
the groups, which is the split path by construction (tealite/ops/grouped_quantize.py).

The per-group quantizer is looked up as ``torch_quantize.quantize`` at call time, so a mutant
that swaps one of the quantize module's building blocks reaches the grouped path too, and the
grouped-only mutants (tealite_verify/mutate/operators_grouped_quant.py) swap the module-level
names here: :func:`group_rows` (which rows a group quantizes) and :func:`group_dbias`.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch import quantize as torch_quantize
from tealite.moe_types import GroupedQuantized, split_offsets
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def group_rows(x: torch.Tensor, offsets, g: int) -> torch.Tensor:
    """Group g's rows of x (a view)."""
    return x[offsets[g]:offsets[g + 1]]


def group_dbias(x: torch.Tensor, offsets) -> torch.Tensor:
    """(G, K) column sums per group: fp32 accumulation, one rounding to x's dtype (TE's
    quantize_dbias).  An empty group sums nothing: exact zeros."""
    groups = len(offsets) - 1
    out = torch.zeros(groups, x.shape[1], dtype=torch.float32, device=x.device)
    for g in range(groups):
        out[g] = group_rows(x, offsets, g).float().sum(dim=0)
    return out.to(x.dtype)


def _why_not(params) -> str | None:
    return torch_quantize.recipe_reason(params["recipe"])


@BACKEND.implements(Op.GROUPED_QUANTIZE, dtypes=_FLOATS, check=_why_not)
def grouped_quantize(x, m_splits, recipe, *, rowwise, columnwise, dbias, scale):
    offsets = split_offsets(m_splits)
    tensors = []
    for g in range(len(m_splits)):
        given = scale[g:g + 1] if scale is not None else None
        tensors.append(torch_quantize.quantize(
            group_rows(x, offsets, g).contiguous(), recipe, rowwise=rowwise,
            columnwise=columnwise, scale=given))
    return GroupedQuantized(tuple(tensors), group_dbias(x, offsets) if dbias else None)
