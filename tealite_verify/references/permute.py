"""float64 references of MoE token permutation, from the definitions (numpy; nothing of
tealite).

The definitions (tealite/ops/permute.py, tealite/moe_types.py), restated: a token's *slots*
are its experts (a mask row: slot s is expert s, routed where the mask is nonzero) or its
top-k positions (an index row: slot s is expert ``indices[t, s]``).  The permuted rows are the
routed (token, slot) pairs in (expert, token, slot) order, numbered from 0; a pair numbered
``num_out_tokens`` or later is dropped.  The row-id map holds every pair's number, -1 where the
slot is unrouted or dropped.  Everything else is a gather or scatter by that map; the merging
sums and the probs' gradient are float64 dot products, returned with their magnitudes (the
same sums on absolute values) for the bounds.
"""
from __future__ import annotations

import numpy as np


def slot_experts(routing: np.ndarray, map_type: str) -> np.ndarray:
    """int64 (num_tokens, slots): each slot's expert, -1 where unrouted."""
    routing = np.asarray(routing)
    if map_type == "mask":
        experts = np.broadcast_to(np.arange(routing.shape[1]), routing.shape)
        return np.where(routing != 0, experts, -1).astype(np.int64)
    return routing.astype(np.int64)


def row_id_map(routing: np.ndarray, map_type: str, num_experts: int,
               num_out_tokens: int) -> np.ndarray:
    """The row of every (token, slot), numbered expert by expert (row-major within one)."""
    experts = slot_experts(routing, map_type)
    rows = np.full(experts.shape, -1, dtype=np.int64)
    number = 0
    for e in range(num_experts):
        tokens, slots = np.nonzero(experts == e)  # row-major: token order, then slot order
        numbers = number + np.arange(tokens.size)
        kept = numbers < num_out_tokens
        rows[tokens[kept], slots[kept]] = numbers[kept]
        number += tokens.size
    return rows


def tokens_per_expert(routing: np.ndarray, map_type: str, num_experts: int,
                      rows: np.ndarray) -> np.ndarray:
    experts = slot_experts(routing, map_type)
    return np.array([int(((experts == e) & (rows >= 0)).sum()) for e in range(num_experts)],
                    dtype=np.int64)


def permute(x: np.ndarray, rows: np.ndarray, num_out_tokens: int) -> np.ndarray:
    """out[rows[t, s]] = x[t] for every kept slot."""
    out = np.zeros((num_out_tokens,) + x.shape[1:], dtype=x.dtype)
    for t, s in zip(*np.nonzero(rows >= 0)):
        out[rows[t, s]] = x[t]
    return out


def permute_probs(probs: np.ndarray, rows: np.ndarray, num_out_tokens: int) -> np.ndarray:
    out = np.zeros(num_out_tokens, dtype=probs.dtype)
    kept = rows >= 0
    out[rows[kept]] = probs[kept]
    return out


def unpermute(permuted: np.ndarray, rows: np.ndarray, probs: np.ndarray | None):
    """(value, magnitude, terms): ``value[t] = sum_s p[t, s] permuted[rows[t, s]]`` over the
    kept slots, ``magnitude`` the same sum of absolute values, ``terms`` (num_tokens, 1) the
    number of kept slots (the length of the sum)."""
    n, slots = rows.shape
    h = permuted.shape[1]
    value = np.zeros((n, h))
    magnitude = np.zeros((n, h))
    for s in range(slots):
        kept = rows[:, s] >= 0
        p = np.ones(n) if probs is None else probs[:, s]
        picked = permuted[rows[kept, s]]
        value[kept] += p[kept, None] * picked
        magnitude[kept] += np.abs(p[kept, None]) * np.abs(picked)
    terms = (rows >= 0).sum(axis=1, keepdims=True)
    return value, magnitude, terms


def unpermute_moved(x: np.ndarray, rows: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Unpermute as a move (quantized rows, no merging probs, no token with two kept rows):
    ``out[t] = x[rows[t, s]]`` for token t's kept slot s, a row of ``fill`` where it has
    none; element copies, so codes and scales come out bit for bit."""
    out = np.full((rows.shape[0],) + x.shape[1:], fill, dtype=x.dtype)
    for t, s in zip(*np.nonzero(rows >= 0)):
        out[t] = x[rows[t, s]]
    return out


def unpermute_bwd(grad_out: np.ndarray, rows: np.ndarray, num_out_tokens: int,
                  permuted: np.ndarray | None, probs: np.ndarray | None):
    """(grad_permuted, grad_probs, grad_probs_magnitude): the transposed scatter, scaled by
    each slot's prob, and each kept slot's dot product of grad_out with its permuted row
    (0 where the slot has no row); grad_probs are None without probs."""
    h = grad_out.shape[1]
    grad_permuted = np.zeros((num_out_tokens, h))
    grad_probs = None if probs is None else np.zeros(rows.shape)
    magnitude = None if probs is None else np.zeros(rows.shape)
    for s in range(rows.shape[1]):
        kept = rows[:, s] >= 0
        r = rows[kept, s]
        if probs is None:
            grad_permuted[r] = grad_out[kept]
            continue
        grad_permuted[r] = probs[kept, s, None] * grad_out[kept]
        grad_probs[kept, s] = (grad_out[kept] * permuted[r]).sum(axis=1)
        magnitude[kept, s] = (np.abs(grad_out[kept]) * np.abs(permuted[r])).sum(axis=1)
    return grad_permuted, grad_probs, magnitude


def sort_chunks(x: np.ndarray, split_sizes, sorted_index) -> np.ndarray:
    """The chunks of ``split_sizes`` consecutive rows, concatenated in ``sorted_index`` order."""
    bounds = np.concatenate(([0], np.cumsum(split_sizes))).astype(np.int64)
    parts = [x[bounds[c]:bounds[c + 1]] for c in sorted_index]
    return np.concatenate(parts) if parts else x[:0]


def pad_rows(x: np.ndarray, splits, align: int, fill: float = 0.0) -> np.ndarray:
    """Each group followed by ``fill`` rows up to a multiple of ``align``."""
    bounds = np.concatenate(([0], np.cumsum(splits))).astype(np.int64)
    parts = []
    for g, size in enumerate(splits):
        parts.append(x[bounds[g]:bounds[g + 1]])
        extra = (-size) % align
        parts.append(np.full((extra,) + x.shape[1:], fill, dtype=x.dtype))
    return np.concatenate(parts) if parts else x[:0]


def unpad_rows(x: np.ndarray, splits, align: int) -> np.ndarray:
    """The first ``splits[g]`` rows of every padded group."""
    start, parts = 0, []
    for size in splits:
        parts.append(x[start:start + size])
        start += size + (-size) % align
    return np.concatenate(parts) if parts else x[:0]
