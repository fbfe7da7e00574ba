"""MoE token permutation in torch (semantics: tealite/ops/permute.py, tealite/moe_types.py).

Every data-movement op is one row gather by a source-row vector (-1: a fill row), done on the
bit patterns (a same-width integer view) so FP8 codes, packed FP4 bytes and E8M0 scales move
unchanged; so is a quantized unpermute (one kept row per token).  The merging sum of
unpermute runs in fp32 over the slots in slot order (fp32 products, no FMA), rounded once;
the probs gradient is torch's fp32 row sum.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.moe_types import (RowIdMap, chunk_source_rows, make_row_id_map, pad_source_rows,
                               unpad_source_rows)
from tealite.types import Op

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# What moves by rows unchanged: values, FP8 codes, packed e2m1 bytes.
MOVABLE = FLOATS + (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                    torch.float8_e5m2fnuz, torch.uint8)
_NUMERICS = {"compute_dtype": torch.float32}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


def _fill_bits(dtype: torch.dtype, fill: float) -> int:
    """The bit pattern of ``fill`` in ``dtype`` (uint8 scales: the byte itself)."""
    if dtype == torch.uint8:
        return int(fill)
    return int(_bits(torch.tensor([fill], dtype=dtype))[0])


def gather_rows(x: torch.Tensor | None, src, fill: float = 0.0) -> torch.Tensor | None:
    """``out[i] = x[src[i]]``, or a row of ``fill`` where ``src[i] == -1``; bit-exact."""
    if x is None:
        return None
    src = torch.as_tensor(src, dtype=torch.int64, device=x.device).reshape(-1)
    bits = _bits(x)
    out = bits[src.clamp(min=0)] if x.shape[0] else \
        bits.new_zeros((src.numel(),) + tuple(x.shape[1:]))
    pad = src < 0
    if bool(pad.any()):
        out[pad] = _fill_bits(x.dtype, fill)
    return out.view(x.dtype)


def token_of_row(row_map: RowIdMap) -> torch.Tensor:
    """int64 (num_out_tokens,): the token each permuted row came from."""
    flat = row_map.rows.reshape(-1).to(torch.int64)
    keep = flat >= 0
    tokens = torch.arange(row_map.num_tokens, device=flat.device) \
        .repeat_interleave(row_map.slots)
    src = torch.empty(row_map.num_out_tokens, dtype=torch.int64, device=flat.device)
    src[flat[keep]] = tokens[keep]
    return src


def permuted_probs(probs, row_map: RowIdMap):
    if probs is None:
        return None
    flat = row_map.rows.reshape(-1).to(torch.int64)
    keep = flat >= 0
    out = torch.empty(row_map.num_out_tokens, dtype=probs.dtype, device=probs.device)
    out[flat[keep]] = probs.reshape(-1)[keep]
    return out


@BACKEND.implements(Op.MOE_PERMUTE, dtypes=MOVABLE, numerics=_NUMERICS)
def moe_permute(x, routing, *, map_type, num_experts, num_out_tokens, probs, scale_inv):
    row_map = make_row_id_map(routing, map_type, num_experts, num_out_tokens)
    src = token_of_row(row_map)
    return (gather_rows(x, src), row_map, permuted_probs(probs, row_map),
            gather_rows(scale_inv, src))


def _slot_rows(row_map: RowIdMap, s: int):
    r = row_map.rows[:, s].to(torch.int64)
    return r, r >= 0


def token_rows(row_map: RowIdMap) -> torch.Tensor:
    """int64 (num_tokens,): each token's kept row, -1 where it has none (the front end allows
    a quantized unpermute only where no token has two, so the largest is the one)."""
    if row_map.slots == 0:
        return torch.full((row_map.num_tokens,), -1, dtype=torch.int64,
                          device=row_map.rows.device)
    return row_map.rows.to(torch.int64).amax(dim=1)


@BACKEND.implements(Op.MOE_UNPERMUTE, dtypes=MOVABLE, numerics=_NUMERICS)
def moe_unpermute(permuted, row_id_map, *, merging_probs, scale_inv, scale_fill):
    if permuted.dtype not in FLOATS:  # codes (with row scales): moved, never summed
        src = token_rows(row_id_map)
        return gather_rows(permuted, src), gather_rows(scale_inv, src, scale_fill)
    n, h = row_id_map.num_tokens, permuted.shape[1]
    acc = torch.zeros((n, h), dtype=torch.float32, device=permuted.device)
    for s in range(row_id_map.slots):
        r, kept = _slot_rows(row_id_map, s)
        if not bool(kept.any()):
            continue
        term = permuted[r[kept]].float()
        if merging_probs is not None:
            term = term * merging_probs[kept, s:s + 1].float()
        acc[kept] += term
    return acc.to(permuted.dtype), None


@BACKEND.implements(Op.MOE_UNPERMUTE_BWD, dtypes=FLOATS, numerics=_NUMERICS)
def moe_unpermute_bwd(grad_out, row_id_map, *, permuted, merging_probs):
    grad_permuted = torch.empty((row_id_map.num_out_tokens, grad_out.shape[1]),
                                dtype=grad_out.dtype, device=grad_out.device)
    grad_probs = None if merging_probs is None else torch.zeros_like(merging_probs)
    for s in range(row_id_map.slots):
        r, kept = _slot_rows(row_id_map, s)
        if not bool(kept.any()):
            continue
        dy = grad_out[kept]
        if merging_probs is None:
            grad_permuted[r[kept]] = dy
            continue
        grad_permuted[r[kept]] = (dy.float() * merging_probs[kept, s:s + 1].float()) \
            .to(grad_out.dtype)
        dot = (dy.float() * permuted[r[kept]].float()).sum(dim=-1)
        grad_probs[kept, s] = dot.to(merging_probs.dtype)
    return grad_permuted, grad_probs


@BACKEND.implements(Op.MOE_SORT_CHUNKS, dtypes=MOVABLE, numerics=_NUMERICS)
def moe_sort_chunks(x, *, split_sizes, sorted_index, probs, scale_inv):
    src = chunk_source_rows(split_sizes, sorted_index)
    probs_out = None if probs is None else gather_rows(probs.reshape(-1, 1), src).reshape(-1)
    return gather_rows(x, src), probs_out, gather_rows(scale_inv, src)


@BACKEND.implements(Op.MOE_PAD_ROWS, dtypes=MOVABLE, numerics=_NUMERICS)
def moe_pad_rows(x, *, splits, align, scale_inv, scale_fill):
    src = pad_source_rows(splits, align)
    return gather_rows(x, src), gather_rows(scale_inv, src, scale_fill)


@BACKEND.implements(Op.MOE_UNPAD_ROWS, dtypes=MOVABLE, numerics=_NUMERICS)
def moe_unpad_rows(x, *, splits, align, scale_inv):
    src = unpad_source_rows(splits, align)
    return gather_rows(x, src), gather_rows(scale_inv, src)
