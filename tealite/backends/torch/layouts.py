"""AITER layouts with torch view/permute (see tealite.ops.layouts for the definitions)."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.ops.layouts import padded_scale_shape, weight_tile


@BACKEND.implements("shuffle_weight")
def shuffle_weight(w, layout, *, inverse):
    bn, bk, kv = weight_tile(w.dtype, layout)
    n, k = w.shape
    plain = (n // bn, bn, k // bk, bk // kv, kv)
    tiled = (n // bn, k // bk, bk // kv, bn, kv)
    if inverse:
        return w.reshape(tiled).permute(0, 3, 1, 2, 4).contiguous().reshape(n, k)
    return w.reshape(plain).permute(0, 2, 3, 1, 4).contiguous().reshape(n, k)


@BACKEND.implements("shuffle_e8m0")
def shuffle_e8m0(scales, unshuffle_to):
    if unshuffle_to is None:
        m, s = scales.shape
        sm, sn = padded_scale_shape(m, s)
        padded = torch.zeros(sm, sn, dtype=scales.dtype, device=scales.device)
        padded[:m, :s] = scales
        return padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1) \
            .contiguous().view(sm, sn)
    m, s = unshuffle_to
    sm, sn = scales.shape
    plain = scales.view(sm // 32, sn // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return plain.contiguous().view(sm, sn)[:m, :s].contiguous()
