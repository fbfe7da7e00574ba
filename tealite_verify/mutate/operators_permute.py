"""Mutation operators for MoE token permutation: a row off by one, the probs of another slot,
scales left in place while their codes move (permute) or taken from the next token
(unpermute), the dropped-token rule reversed (the first rows dropped instead of the last), a
bf16 merging accumulator, a bf16 probs gradient, the chunk order reversed, the alignment
doubled.

torch's implementations (tealite/backends/torch/permute.py): ``moe_permute(x, routing, *,
map_type, num_experts, num_out_tokens, probs, scale_inv) -> (out, RowIdMap, probs, scales)``,
``moe_unpermute(permuted, row_id_map, *, merging_probs, scale_inv, scale_fill) -> (out,
scales)`` (scales None unless quantized rows moved), ``moe_unpermute_bwd(grad_out,
row_id_map, *, permuted, merging_probs) -> (grad_permuted, grad_probs)``,
``moe_sort_chunks(x, *, split_sizes, sorted_index, probs, scale_inv)``, ``moe_pad_rows(x, *,
splits, align, scale_inv, scale_fill)``, ``moe_unpad_rows(x, *, splits, align, scale_inv)``.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import permute as torch_permute
from tealite.moe_types import RowIdMap
from tealite_verify.mutate.base import (Mutation, on_output, register, with_params,
                                        with_patches)


def _rolled(t, args, kw):
    return t if t is None or t.shape[0] < 2 else torch.roll(t, 1, dims=0)


def _probs_rolled(name):
    def change(kw):
        p = kw.get(name)
        return dict(kw, **{name: None if p is None else torch.roll(p, 1, dims=1)})
    return change


def _scales_in_place(scales, args, kw):
    """The codes moved, their scales not: output row i keeps input row i's scales."""
    src = kw.get("scale_inv")
    if scales is None or src is None or src.shape[0] == 0:
        return scales
    idx = torch.arange(scales.shape[0]) % src.shape[0]
    return src[idx]


def _drop_first(original):
    def make(routing, map_type, num_experts, num_out_tokens):
        full = original(routing, map_type, num_experts, routing.numel() + 1)
        routed = int((full.rows >= 0).sum())
        drop = routed - num_out_tokens
        rows = torch.where(full.rows >= drop, full.rows - drop, -1).to(torch.int32)
        experts = torch.arange(num_experts).expand(rows.shape) if map_type == "mask" \
            else routing.long()
        counts = torch.bincount(experts[rows >= 0].reshape(-1), minlength=num_experts)
        return RowIdMap(rows, map_type, num_experts, num_out_tokens,
                        tuple(int(c) for c in counts.tolist()))
    return make


def _bf16_unpermute(fn):
    def mutated(permuted, row_id_map, *, merging_probs, scale_inv, scale_fill):
        if permuted.dtype not in torch_permute.FLOATS:  # codes move: no accumulator to degrade
            return fn(permuted, row_id_map, merging_probs=merging_probs, scale_inv=scale_inv,
                      scale_fill=scale_fill)
        acc = torch.zeros((row_id_map.num_tokens, permuted.shape[1]), dtype=torch.bfloat16)
        for s in range(row_id_map.slots):
            r = row_id_map.rows[:, s].long()
            kept = r >= 0
            term = permuted[r[kept]].float()
            if merging_probs is not None:
                term = term * merging_probs[kept, s:s + 1].float()
            acc[kept] = (acc[kept].float() + term).to(torch.bfloat16)
        return acc.to(permuted.dtype), None
    return mutated


def _bf16(t, args, kw):
    return t if t is None else t.to(torch.bfloat16).to(t.dtype)


for _m in (
    Mutation("moe_permute.row_off_by_one", "moe_permute", "operand",
             "every permuted row one place down (the last wraps to the front)",
             on_output(_rolled, 0)),
    Mutation("moe_permute.probs_of_wrong_slot", "moe_permute", "operand",
             "each token's probs taken from the next slot (another expert's)",
             with_params(_probs_rolled("probs"))),
    Mutation("moe_permute.scales_not_moved", "moe_permute", "layout",
             "quantized rows: the codes move, their per-row scales stay in place",
             on_output(_scales_in_place, 3)),
    Mutation("moe_permute.dropped_first_rows", "moe_permute", "parameter",
             "dropped tokens: the first rows of the order dropped instead of the last",
             with_patches((torch_permute, "make_row_id_map", _drop_first))),
    Mutation("moe_unpermute.probs_of_wrong_slot", "moe_unpermute", "operand",
             "each slot weighted by the next slot's merging prob",
             with_params(_probs_rolled("merging_probs"))),
    Mutation("moe_unpermute.bf16_accumulator", "moe_unpermute", "precision",
             "the merging sum accumulated in bf16", _bf16_unpermute),
    Mutation("moe_unpermute.scales_of_next_token", "moe_unpermute", "layout",
             "quantized rows: each token's codes right, its scales the next token's",
             on_output(_rolled, 1)),
    Mutation("moe_unpermute_bwd.probs_of_wrong_slot", "moe_unpermute_bwd", "operand",
             "the gradient scaled by the next slot's prob",
             with_params(_probs_rolled("merging_probs"))),
    Mutation("moe_unpermute_bwd.grad_probs_through_bf16", "moe_unpermute_bwd", "precision",
             "the probs gradient rounded through bf16", on_output(_bf16, 1)),
    Mutation("moe_sort_chunks.order_reversed", "moe_sort_chunks", "axis",
             "chunks written in the reverse of sorted_index",
             with_params(lambda kw: dict(kw, sorted_index=tuple(reversed(kw["sorted_index"]))))),
    Mutation("moe_pad_rows.align_doubled", "moe_pad_rows", "parameter",
             "groups padded to twice the alignment",
             with_params(lambda kw: dict(kw, align=2 * kw["align"]))),
    Mutation("moe_unpad_rows.row_off_by_one", "moe_unpad_rows", "operand",
             "every unpadded row one place down", on_output(_rolled, 0)),
):
    register(_m)
