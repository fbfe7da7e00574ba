"""AITER layouts with torch view/permute (tealite.ops.layouts defines them; the permutations
live in tealite.types, where the AITER backends call them too)."""
from __future__ import annotations

from tealite.backends.torch import BACKEND
from tealite.types import Op, permute_e8m0_scales, permute_weight_tiles


@BACKEND.implements(Op.SHUFFLE_WEIGHT)
def shuffle_weight(w, layout, *, inverse):
    return permute_weight_tiles(w, layout, inverse=inverse)


@BACKEND.implements(Op.SHUFFLE_E8M0)
def shuffle_e8m0(scales, unshuffle_to):
    return permute_e8m0_scales(scales, unshuffle_to)
