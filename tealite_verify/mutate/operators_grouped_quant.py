"""Mutation operators for grouped quantization (+ dbias), the bugs TE PR 3171 is about: a scale
taken over the whole tensor instead of the group, blocks crossing a group boundary, power-of-two
scales dropped in the grouped path only, dbias summed over the wrong rows.

torch's implementation: ``grouped_quantize(x, m_splits, recipe, *, rowwise, columnwise, dbias,
scale) -> GroupedQuantized``.  The mutant backend's ``quantize`` stays torch's own, so a bug
in the grouped path alone is what the parity tier sees (and the per-group references too).
"""
from __future__ import annotations

import dataclasses

from tealite.backends.torch import grouped_quantize as torch_grouped
from tealite.backends.torch import quantize as torch_quantize
from tealite.moe_types import GroupedQuantized, split_offsets
from tealite.recipes import Granularity
from tealite.types import QuantizedTensor
from tealite_verify.mutate.base import Mutation, register, with_args, with_patches

OP = "grouped_quantize"


def _block_rows(recipe) -> int:
    """Rows one scale covers in the rowwise layout (1: per row / 1xN blocks)."""
    if recipe.scale_granularity is Granularity.BLOCK:
        return recipe.block[0]
    return 1


def _slice_of_whole(q: QuantizedTensor, recipe, lo: int, hi: int) -> QuantizedTensor:
    """Group rows [lo, hi) cut out of the whole tensor's quantization: the codes of those
    rows, and the scales of the blocks they fall in (blocks placed from the tensor's row 0,
    so they straddle the group's boundaries)."""
    def rows_of(s, step, axis):
        if s is None or recipe.scale_granularity is Granularity.TENSOR:
            return s
        first = min(lo // step, s.shape[axis])
        count = min(-(-(hi - lo) // step), s.shape[axis] - first)
        return s.narrow(axis, first, count)

    gran = recipe.scale_granularity
    col_step = recipe.block if gran is Granularity.MX_BLOCK else \
        recipe.block[1] if gran is Granularity.BLOCK else 1
    return QuantizedTensor(
        recipe=recipe, shape=(hi - lo, q.shape[1]),
        data=None if q.data is None else q.data[lo:hi],
        scale_inv=rows_of(q.scale_inv, _block_rows(recipe), 0),
        columnwise_data=None if q.columnwise_data is None else q.columnwise_data[:, lo:hi],
        columnwise_scale_inv=rows_of(q.columnwise_scale_inv, col_step, 1),
        amax=q.amax)


def _whole_then_split(applies):
    """For the recipes ``applies`` selects: quantize all of x once and cut the groups out of
    it; the others run correctly."""
    def wrap(fn):
        def mutated(x, m_splits, recipe, **kw):
            if not applies(recipe):
                return fn(x, m_splits, recipe, **kw)
            right = fn(x, m_splits, recipe, **kw)  # for dbias, which this bug leaves alone
            whole = torch_quantize.quantize(x, recipe, rowwise=kw["rowwise"],
                                            columnwise=kw["columnwise"], scale=None)
            offs = split_offsets(m_splits)
            return GroupedQuantized(tuple(_slice_of_whole(whole, recipe, offs[g], offs[g + 1])
                                          for g in range(len(m_splits))), right.dbias)
        return mutated
    return wrap


def _per_tensor_current(recipe) -> bool:
    return recipe.scale_granularity is Granularity.TENSOR and not recipe.scale_given


def _blocked(recipe) -> bool:
    return recipe.scale_granularity in (Granularity.BLOCK, Granularity.MX_BLOCK)


def _pow2_dropped(args, kw):
    x, m_splits, recipe = args
    if getattr(recipe, "force_pow2_scales", False):
        recipe = dataclasses.replace(recipe, force_pow2_scales=False)
    return (x, m_splits, recipe), kw


def _rows_one_late(original):
    def dbias(x, offsets):
        # Every group's window one row later: its first row dropped, the next group's first
        # row (or nothing, at the end) taken in.
        shifted = [min(o + 1, x.shape[0]) for o in offsets[:-1]] + [offsets[-1]]
        return original(x, shifted)
    return dbias


for _m in (
    Mutation(f"{OP}.scale_over_whole_tensor", OP, "axis",
             "per-tensor current scaling: every group quantized with the whole tensor's amax "
             "and scale instead of its own", _whole_then_split(_per_tensor_current)),
    Mutation(f"{OP}.blocks_cross_groups", OP, "layout",
             "block / MX scaling: blocks placed from the tensor's first row, so they straddle "
             "group boundaries (the groups cut out of one quantization of x)",
             _whole_then_split(_blocked)),
    Mutation(f"{OP}.pow2_dropped", OP, "scale-exponent",
             "force_pow2_scales ignored in the grouped path only (the split path keeps it)",
             with_args(_pow2_dropped)),
    Mutation(f"{OP}.dbias_wrong_rows", OP, "reduction",
             "dbias of each group summed over its rows shifted by one (one boundary row lost "
             "to, or taken from, the neighbour)",
             with_patches((torch_grouped, "group_dbias", _rows_one_late))),
):
    register(_m)
