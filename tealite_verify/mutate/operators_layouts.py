"""Mutation operators for AITER's layouts: tile axes swapped, the inverse flag ignored, and
garbage in the E8M0 padding (outside the contract: the shuffle tier reports padding, never
compares it).

torch's implementations: ``shuffle_weight(w, layout, *, inverse)`` and
``shuffle_e8m0(scales, unshuffle_to)`` (None: shuffle; (m, s): unshuffle to that shape).
"""
from __future__ import annotations

import torch

from tealite.ops.layouts import weight_tile
from tealite_verify.mutate.base import Mutation, register


def _weight_tile_axes_swapped(fn):
    # Forward shuffle with the (bk / kv) and bn tile axes exchanged; the inverse is correct,
    # so the round trip breaks too.
    def mutated(w, layout, *, inverse):
        out = fn(w, layout, inverse=inverse)
        if inverse:
            return out
        bn, bk, kv = weight_tile(w.dtype, layout)
        n, k = w.shape
        tiled = out.reshape(n // bn, k // bk, bk // kv, bn, kv)
        return tiled.transpose(2, 3).contiguous().reshape(n, k)
    return mutated


def _inverse_ignored(fn):
    def mutated(w, layout, *, inverse):
        return fn(w, layout, inverse=False)
    return mutated


def _e8m0_inner_axes_swapped(fn):
    def mutated(scales, unshuffle_to):
        out = fn(scales, unshuffle_to)
        if unshuffle_to is not None or out.numel() == 0:
            return out
        sm, sn = out.shape
        tiles = out.view(sm // 32, sn // 8, 4, 16, 2, 2)
        return tiles.transpose(4, 5).contiguous().view(sm, sn)
    return mutated


def _e8m0_padding_garbage(fn):
    def mutated(scales, unshuffle_to):
        out = fn(scales, unshuffle_to)
        if unshuffle_to is not None or out.numel() == 0:
            return out
        # Where the data lands: shuffle a tensor of ones the same (correct) way.
        data_at = fn(torch.ones_like(scales), None) != 0
        return torch.where(data_at, out, torch.full_like(out, 0xFF))
    return mutated


for _m in (
    Mutation("shuffle_weight.tile_axes_swapped", "shuffle_weight", "layout",
             "forward shuffle with the K-vector and N tile axes exchanged",
             _weight_tile_axes_swapped),
    Mutation("shuffle_weight.inverse_ignored", "shuffle_weight", "parameter",
             "unshuffle runs the forward shuffle (inverse flag ignored)", _inverse_ignored),
    Mutation("shuffle_e8m0.inner_axes_swapped", "shuffle_e8m0", "layout",
             "the innermost 2 x 2 axes of the E8M0 shuffle exchanged",
             _e8m0_inner_axes_swapped),
    Mutation("shuffle_e8m0.padding_garbage", "shuffle_e8m0", "tail",
             "padding bytes written as 0xFF instead of 0", _e8m0_padding_garbage,
             must_kill=False,
             why_not="undetectable by design: padding is outside the layout's contract (the "
                     "shuffle tier reports it, never compares it)"),
):
    register(_m)
