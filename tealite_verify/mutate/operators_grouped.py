"""Mutation operators for the grouped GEMMs: the bugs a fused grouped path has and the split
per-group path cannot (issue 16, TE PR 3171): the last group's rows dropped, a group
multiplied by its neighbour's weight, group boundaries shifted by a row, an empty group
given the previous group's result (a reused workspace), accumulate ignored.

torch's implementations: ``grouped_gemm(a, b, splits, *, layout, out_dtype, bias, out,
accumulate)`` and ``grouped_qgemm(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, k,
layout, out_dtype, bias, out, accumulate)``, both returning the output tensor.
"""
from __future__ import annotations

from tealite.moe_types import split_offsets, splits_k
from tealite_verify.mutate.base import Mutation, on_output, register, with_args, with_params


def _splits_of(args) -> tuple[int, ...]:
    return tuple(args[2] if len(args) == 3 else args[4])


def _last_group_dropped(out, args, kw):
    """The last non-empty group's output zeroed (a grouped kernel's tile loop ending early)."""
    splits = _splits_of(args)
    live = [g for g, s in enumerate(splits) if s]
    if not live:
        return out
    g = live[-1]
    out = out.clone()
    if splits_k(kw["layout"]):
        out[g] = 0
    else:
        off = split_offsets(splits)
        out[off[g]:off[g + 1]] = 0
    return out


def _stale_workspace(out, args, kw):
    """An empty NT group gets the previous group's result instead of zeros / its prior output:
    one workspace reused across groups (the PR 3171 class: the last expert's wgrad corrupted)."""
    splits = _splits_of(args)
    if not splits_k(kw["layout"]):
        return out
    out = out.clone()
    for g in range(1, len(splits)):
        if splits[g] == 0:
            out[g] = out[g - 1]
    return out


def _weights_rolled(args, kw):
    """Group g multiplied by group g+1's weight (split-M layouts with per-group weights)."""
    args = list(args)
    if splits_k(kw["layout"]):
        return tuple(args), kw
    if len(args) == 3:
        a = args[0]
        if a.dim() == 3 and a.shape[0] > 1:
            args[0] = a.roll(1, dims=0)
    elif len(args[1]) > 1:
        args[1] = args[1][1:] + args[1][:1]
    return tuple(args), kw


def _boundary_shifted(args, kw):
    """The first group one row longer and the last non-empty one a row shorter (an offset
    computed from the wrong prefix sum); plain GEMM only, where rows are not pre-split."""
    args = list(args)
    splits = list(args[2])
    live = [g for g, s in enumerate(splits) if s]
    if len(args) == 3 and len(splits) > 1 and live and live[-1] != 0:
        splits[0] += 1
        splits[live[-1]] -= 1
        args[2] = tuple(splits)
    return tuple(args), kw


for _op in ("grouped_gemm", "grouped_qgemm"):
    for _m in (
        Mutation(f"{_op}.last_group_dropped", _op, "tail",
                 "the last non-empty group's output rows written as zeros",
                 on_output(_last_group_dropped)),
        Mutation(f"{_op}.stale_workspace", _op, "operand",
                 "NT: an empty group gets the previous group's result (a reused workspace)",
                 on_output(_stale_workspace)),
        Mutation(f"{_op}.weights_rolled", _op, "operand",
                 "group g multiplied by group g+1's weight", with_args(_weights_rolled)),
        Mutation(f"{_op}.accumulate_ignored", _op, "epilogue",
                 "accumulate=True overwrites out instead of adding into it",
                 with_params(lambda kw: dict(kw, accumulate=False))),
    ):
        register(_m)

register(Mutation("grouped_gemm.boundary_shifted", "grouped_gemm", "axis",
                  "group boundaries off by one row (the first group takes the next one's)",
                  with_args(_boundary_shifted)))
