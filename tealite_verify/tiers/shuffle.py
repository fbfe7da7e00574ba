"""The ``shuffle`` tier (AITER's weight shuffle and E8M0 scale shuffle): the backend's shuffled
output is un-shuffled with the reference inverse and compared bit-exactly with the input in
plain layout; the padding of a shuffled scale array is reported (how much, whether it was
zero-filled), never compared as data.

Pair rule: the weights bit-exact against each other (the exact tier); shuffled scales agree on
the data positions, their padding may differ (:func:`pair_scales`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from tealite_verify.references import layouts as ref
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier


def bits(t: torch.Tensor) -> np.ndarray:
    """The bit patterns of a 1- or 2-byte tensor (NaN payloads kept)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy()


def check_weight(shuffled: torch.Tensor, plain_bits, bn: int, bk: int, kv: int) -> Metrics:
    """A shuffled weight, un-shuffled, bit-exact against the plain one's bits."""
    m = compare_exact(ref.unshuffle_weight(bits(shuffled), bn, bk, kv), plain_bits)
    return dataclasses.replace(m, tier=Tier.SHUFFLE)


def check_scales(shuffled: torch.Tensor, plain, m: int, s: int) -> Metrics:
    """Shuffled (m, s) E8M0 scales, un-shuffled, bit-exact against ``plain``; the padding's
    contents go in the note."""
    got = bits(shuffled)
    if got.shape != ref.padded_shape(m, s):
        return compare_exact(got, ref.shuffle_e8m0(plain))  # reports the shape
    metrics = compare_exact(ref.unshuffle_e8m0(got, m, s), plain)
    pad = got[ref.padding_mask(m, s)]
    note = f"padding: {pad.size} bytes, {int((pad != 0).sum())} non-zero, not compared"
    return dataclasses.replace(metrics, tier=Tier.SHUFFLE, note=note)


def pair_scales(x: torch.Tensor, y: torch.Tensor, m: int, s: int) -> Metrics:
    """Two backends agree on the data positions; their padding may differ."""
    bx, by = bits(x), bits(y)
    if bx.shape != by.shape:
        return compare_exact(bx, by)
    return compare_exact(ref.unshuffle_e8m0(bx, m, s), ref.unshuffle_e8m0(by, m, s))
