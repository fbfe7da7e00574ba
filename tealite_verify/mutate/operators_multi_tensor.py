"""Mutation operators for the multi-tensor ops: the bugs a fused optimizer kernel is known for.

* Adam's bias corrections dropped (``1 - beta^step`` taken as 1);
* AdamW's decoupled decay applied as L2 regularisation, and the reverse (TE's ``adam_w_mode``
  read the wrong way round);
* the L2 norm skipping the element at a chunk edge (the last element of a tensor's first
  65536-element chunk: an off-by-one in a chunk's bound);
* scale's overflow flag set on NaN only, not on +-Inf.

Each swaps one public building block of the torch backend (tealite/backends/torch/multi_tensor.py).
"""
from __future__ import annotations

import dataclasses

import torch

from tealite.backends.torch import multi_tensor as torch_mt
from tealite.training_types import MTA_CHUNK_ELEMENTS
from tealite_verify.mutate.base import Mutation, register, with_patches


def _no_bias_correction(original):
    return lambda options: (1.0, 1.0)


def _decay_mode_swapped(original):
    def direction(g, p, m, v, o, bc1, bc2):
        return original(g, p, m, v, dataclasses.replace(o, adam_w_mode=not o.adam_w_mode),
                        bc1, bc2)
    return direction


def _chunk_edge_skipped(original):
    def sumsq(x32):
        edge = min(x32.numel(), MTA_CHUNK_ELEMENTS) - 1
        if edge < 0:
            return original(x32)
        return original(torch.cat([x32[:edge], x32[edge + 1:]]))
    return sumsq


def _flag_on_nan_only(original):
    return lambda x: bool(torch.isnan(x).any()) if x.numel() else False


for _m in (
    Mutation("multi_tensor_adam.bias_correction_dropped", "multi_tensor_adam", "formula",
             "Adam's bias corrections 1 - beta^step taken as 1",
             with_patches((torch_mt, "bias_corrections", _no_bias_correction))),
    Mutation("multi_tensor_adam.adamw_decay_mode_swapped", "multi_tensor_adam", "formula",
             "AdamW's decoupled weight decay applied as L2 (g += wd p) and the reverse",
             with_patches((torch_mt, "adam_direction", _decay_mode_swapped))),
    Mutation("multi_tensor_l2norm.chunk_edge_element_skipped", "multi_tensor_l2norm", "tail",
             "the element at the end of each tensor's first 65536-element chunk left out of "
             "the sum of squares", with_patches((torch_mt, "sumsq", _chunk_edge_skipped))),
    Mutation("multi_tensor_scale.flag_not_set_on_inf", "multi_tensor_scale", "epilogue",
             "the overflow (noop) flag set on NaN inputs only, not on +-Inf",
             with_patches((torch_mt, "any_nonfinite", _flag_on_nan_only))),
):
    register(_m)
