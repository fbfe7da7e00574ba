"""AITER's Triton ``moe_align_block_size_triton`` (``aiter/ops/triton/moe_align_block_size.py``)
as the row order of tealite's ``moe_permute`` (index maps).

AITER's entry point takes the top-k expert ids (num_tokens, topk) and writes
``sorted_token_ids``: for each expert in turn, the *flattened slot ids* ``t * topk + k`` of the
slots routed to it, in increasing order (its stage 4 walks the ids in order, each program
offset by the counts of the programs before it), each expert's segment padded up to a
multiple of ``block_size`` with whatever the caller pre-filled (vLLM's convention: ``numel``);
``expert_ids`` names the expert of every block and ``num_tokens_post_pad`` the padded total.

That is tealite's permuted order, (expert, token, slot), followed by tealite's
``moe_pad_rows(tokens_per_expert, block_size)``: with ``block_size = 1`` the segment of
expert e holds exactly its rows.  So this adapter calls the kernel with ``block_size = 1`` and
reads the row-id map off ``sorted_token_ids`` (row i holds slot ``sorted_token_ids[i]``);
moving the rows, probs and scales by that order is a gather done here with torch indexing
on bit patterns (AITER has no standalone permute kernel: its fused MoE GEMMs read the
sorted ids directly).  ``tests/test_permute.py`` checks the padded layout (``block_size`` 16)
against ``moe_pad_rows`` of tealite's permute, the contract declared below.

Refused with the reason: routing masks (the kernel takes top-k ids: a fixed count per token),
dropped tokens (no ``num_out_tokens``: every routed slot gets a row), the entry point missing.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, NAME, kernels, why_missing
from tealite.moe_types import MapType, RowIdMap
from tealite.types import Op

ENTRY_POINT = "moe_align_block_size_triton"
MOVABLE = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
           torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.uint8)
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

declare(Contract(backend=NAME, entry_point=ENTRY_POINT, op=Op.MOE_PERMUTE,
                 layouts=("topk_ids:(num_tokens,topk) int32",
                          "sorted_token_ids:flat slot ids t*topk+k, expert-major, "
                          "ascending within an expert",
                          "padding:each expert's segment to a multiple of block_size "
                          "(= moe_pad_rows(tokens_per_expert, block_size))"),
                 notes=("row order only (the data moves by torch indexing); used with "
                        "block_size 1; no dropped-token rule; index maps only"),
                 extra={"order": "(expert, token, slot)", "pad_fill": "caller's (numel)",
                        "dropped_tokens": "none"}))


def _check(params) -> str | None:
    if params["map_type"] != MapType.INDEX.value:
        return ("AITER's moe_align_block_size takes top-k expert ids (num_tokens, topk), a "
                "fixed number of experts per token; a routing mask is not its input")
    if params["num_out_tokens"] != params["routed"]:
        return (f"AITER's moe_align_block_size has no dropped-token rule (every routed slot "
                f"gets a row): num_out_tokens {params['num_out_tokens']} < routed "
                f"{params['routed']}")
    return why_missing(ENTRY_POINT)


def align_block_size(indices: torch.Tensor, num_experts: int, block_size: int):
    """AITER's (sorted_token_ids, expert_ids, num_tokens_post_pad) for top-k ``indices``,
    padding slots pre-filled with ``numel`` (vLLM's sentinel)."""
    numel = indices.numel()
    most = numel + num_experts * (block_size - 1)
    sorted_ids = torch.full((most,), numel, dtype=torch.int32, device=indices.device)
    expert_ids = torch.full((-(-most // block_size),), -1, dtype=torch.int32,
                            device=indices.device)
    post_pad = torch.zeros(1, dtype=torch.int32, device=indices.device)
    kernels().moe_align_block_size_triton(indices.to(torch.int32).contiguous(), num_experts,
                                          block_size, sorted_ids, expert_ids, post_pad)
    return sorted_ids[:int(post_pad.item())], expert_ids, post_pad


def _gather(t: torch.Tensor | None, src: torch.Tensor):
    if t is None:
        return None
    return t.view(_BITS[t.element_size()])[src].view(t.dtype)


@BACKEND.implements(Op.MOE_PERMUTE, dtypes=MOVABLE, devices=DEVICES, check=_check,
                    numerics={"compute_dtype": torch.float32, "entry_point": ENTRY_POINT})
def moe_permute(x, routing, *, map_type, num_experts, num_out_tokens, probs, scale_inv):
    n, topk = routing.shape
    order = align_block_size(routing, num_experts, 1)[0].to(torch.int64)  # row -> slot id
    rows = torch.empty(n * topk, dtype=torch.int32, device=routing.device)
    rows[order] = torch.arange(order.numel(), dtype=torch.int32, device=routing.device)
    counts = torch.bincount(routing.reshape(-1).to(torch.int64), minlength=num_experts)
    row_map = RowIdMap(rows.reshape(n, topk), map_type, num_experts, num_out_tokens,
                       tuple(int(c) for c in counts.tolist()))
    src = order // max(topk, 1)
    probs_out = None if probs is None else _gather(probs.reshape(-1), order)
    return _gather(x, src), row_map, probs_out, _gather(scale_inv, src)
