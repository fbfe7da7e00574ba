"""AITER layout references as explicit coordinate maps (numpy fancy indexing), written from
the definitions in tealite.ops.layouts rather than with view/permute."""
from __future__ import annotations

import numpy as np


def weight_shuffle_index(n: int, k: int, bn: int, bk: int, kv: int) -> np.ndarray:
    """Flat destination offset of every source element (i, j) of an (n, k) weight."""
    i, j = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    nb, ni = i // bn, i % bn
    kb, kv_i, kj = j // bk, (j % bk) // kv, j % kv
    return ((((nb * (k // bk) + kb) * (bk // kv) + kv_i) * bn + ni) * kv + kj)


def shuffle_weight(w: np.ndarray, bn: int, bk: int, kv: int) -> np.ndarray:
    n, k = w.shape
    out = np.empty(n * k, dtype=w.dtype)
    out[weight_shuffle_index(n, k, bn, bk, kv).ravel()] = w.ravel()
    return out.reshape(n, k)


def unshuffle_weight(w: np.ndarray, bn: int, bk: int, kv: int) -> np.ndarray:
    n, k = w.shape
    return w.ravel()[weight_shuffle_index(n, k, bn, bk, kv)]


def scale_shuffle_index(sm: int, sn: int) -> np.ndarray:
    """Flat destination offset of every element (i, j) of a padded (sm, sn) scale array."""
    i, j = np.meshgrid(np.arange(sm), np.arange(sn), indexing="ij")
    a, b, c = i // 32, (i // 16) % 2, i % 16
    d, e, f = j // 8, (j // 4) % 2, j % 4
    return ((((a * (sn // 8) + d) * 4 + f) * 16 + c) * 2 + e) * 2 + b


def padded_shape(m: int, s: int) -> tuple[int, int]:
    return -(-m // 256) * 256, -(-s // 8) * 8


def unshuffle_e8m0(shuffled: np.ndarray, m: int, s: int) -> np.ndarray:
    sm, sn = shuffled.shape
    return shuffled.ravel()[scale_shuffle_index(sm, sn)][:m, :s]


def shuffle_e8m0(scales: np.ndarray, pad_value: int = 0) -> np.ndarray:
    m, s = scales.shape
    sm, sn = padded_shape(m, s)
    padded = np.full((sm, sn), pad_value, dtype=np.uint8)
    padded[:m, :s] = scales
    out = np.empty(sm * sn, np.uint8)
    out[scale_shuffle_index(sm, sn).ravel()] = padded.ravel()
    return out.reshape(sm, sn)


def padding_mask(m: int, s: int) -> np.ndarray:
    """True at the positions of the *shuffled* array that hold padding."""
    sm, sn = padded_shape(m, s)
    is_pad = np.ones((sm, sn), bool)
    is_pad[:m, :s] = False
    out = np.empty(sm * sn, bool)
    out[scale_shuffle_index(sm, sn).ravel()] = is_pad.ravel()
    return out.reshape(sm, sn)
