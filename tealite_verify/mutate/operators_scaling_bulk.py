"""Mutation operators for ``delayed_scaling_update_bulk``: the bugs of a bulk kernel reading
per-tensor tables: a row of the recipe table read off by one, a launch grid one tensor short,
the history left unrolled, a NaN in the history skipped by a non-propagating max.

torch's implementation: ``delayed_scaling_update_bulk(histories, scales, recipes) ->
BulkScalingUpdate``; the per-tensor split path of the spec stays torch's own, so the parity
tier sees each bug as well as the reference does.
"""
from __future__ import annotations

import torch

from tealite.training_types import BulkScalingUpdate
from tealite_verify.mutate.base import Mutation, register, with_args

OP = "delayed_scaling_update_bulk"


def _recipe_row_shifted(args, kw):
    # Tensor i reads tensor i-1's recipe row (tensor 0 its own): only a per-tensor recipe list
    # whose neighbours differ shows it.
    histories, scales, recipes = args
    shifted = (recipes[0],) + tuple(recipes[:-1])
    # The history length is the tensor's own (a shorter row would not fit the tensor).
    fixed = tuple(type(r)(s.fmt, margin=s.margin, amax_history_len=r.amax_history_len,
                          amax_compute_algo=s.amax_compute_algo)
                  for r, s in zip(recipes, shifted))
    return (histories, scales, fixed), kw


def _last_tensor_skipped(fn):
    def mutated(histories, scales, recipes):
        out = fn(histories, scales, recipes)
        return BulkScalingUpdate(out.amax_histories[:-1] + [histories[-1].clone()],
                                 out.scales[:-1] + [scales[-1].clone()])
    return mutated


def _history_not_rolled(fn):
    def mutated(histories, scales, recipes):
        out = fn(histories, scales, recipes)
        return BulkScalingUpdate([h.clone() for h in histories], out.scales)
    return mutated


def _nan_skipped_by_max(fn):
    # max over the history ignores NaN (tl.max's semantics) instead of propagating it.
    def mutated(histories, scales, recipes):
        clean = [torch.where(torch.isnan(h), torch.zeros_like(h), h)
                 if r.amax_compute_algo == "max" else h for h, r in zip(histories, recipes)]
        rolled = fn(histories, scales, recipes).amax_histories  # the roll keeps the NaN
        return BulkScalingUpdate(rolled, fn(clean, scales, recipes).scales)
    return mutated


for _m in (
    Mutation(f"{OP}.recipe_row_shifted", OP, "operand",
             "tensor i updated with tensor i-1's format, margin and algorithm",
             with_args(_recipe_row_shifted)),
    Mutation(f"{OP}.last_tensor_skipped", OP, "layout",
             "the launch grid one tensor short: the last history and scale returned as given",
             _last_tensor_skipped),
    Mutation(f"{OP}.history_not_rolled", OP, "layout",
             "every history returned as it came (not rolled, newest slot not cleared)",
             _history_not_rolled),
    Mutation(f"{OP}.nan_skipped_by_max", OP, "reduction",
             "a NaN in the history ignored by the max reduction (the old scale not kept)",
             _nan_skipped_by_max),
):
    register(_m)
