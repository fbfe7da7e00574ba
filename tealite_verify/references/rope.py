"""RoPE references, float64, from the math (semantics: tealite/ops/rope.py, TE's fused RoPE).

A head's first ``d2`` elements are rotated element by element: element ``k`` is paired with
``q = partner(k)`` and

    y[k] = x[k] cos f[k] + sign[k] x[q] sin f[k],     y[d2:] = x[d2:]

with ``partner(k) = k + h`` (sign -1) for ``k < h = d2 / 2`` and ``k - h`` (sign +1) after, or
interleaved ``partner(k) = k xor 1`` (sign -1 for even ``k``).  The map is linear in x; its
transpose (the backward) gathers the same terms the other way round:

    dx[k] = dy[k] cos f[k] + sign[q] dy[q] sin f[q],  q = partner(k)

``f`` is the float32 freqs row at the token's position, widened exactly to float64; cos and
sin are taken in float64, so the reference is cos of the *same* float32 argument the kernels
see (the argument's own rounding is the caller's, not the kernel's).  Positions follow the
op's definition, written here from the chunk picture: local index ``i`` of a sequence of
``2c`` tokens on rank ``r`` lies in local chunk ``i // c``, which is global chunk ``r`` or
``2 cp - 1 - r``, so ``p = chunk * c + i % c``; without cp ``p = i + start``.
Inputs are numpy float64 arrays (ints for cu_seqlens / start_positions); imports no tealite.
"""
from __future__ import annotations

import numpy as np


def positions(lens, *, cp_size: int = 1, cp_rank: int = 0, starts=None) -> np.ndarray:
    """Every token's position, sequence after sequence."""
    out = []
    for b, n in enumerate(lens):
        i = np.arange(n)
        if cp_size > 1:
            c = n // 2
            chunk = np.where(i // max(c, 1) == 0, cp_rank, 2 * cp_size - 1 - cp_rank)
            out.append(chunk * c + i % max(c, 1))
        else:
            out.append(i + (0 if starts is None else int(starts[b])))
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def pairing(d2: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """(partner, sign) of every rotated element."""
    k = np.arange(d2)
    if interleaved:
        return k ^ 1, np.where(k % 2 == 0, -1.0, 1.0)
    h = d2 // 2
    return np.where(k < h, k + h, k - h), np.where(k < h, -1.0, 1.0)


def sequence_lengths(shape, tensor_format: str, cu_seqlens, cp_size: int) -> list[int]:
    if tensor_format == "thd":
        cu = [int(v) for v in cu_seqlens]
        return [(cu[i + 1] - cu[i]) // cp_size for i in range(len(cu) - 1)]
    s, b = (shape[0], shape[1]) if tensor_format == "sbhd" else (shape[1], shape[0])
    return [s] * b


def tokens(x: np.ndarray, tensor_format: str) -> np.ndarray:
    """(n, h, d) in sequence order."""
    if tensor_format == "sbhd":
        return np.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])
    return x.reshape(-1, *x.shape[2:]) if tensor_format == "bshd" else x


def untokens(y: np.ndarray, shape, tensor_format: str) -> np.ndarray:
    if tensor_format == "sbhd":
        return np.swapaxes(y.reshape(shape[1], shape[0], *shape[2:]), 0, 1)
    return y.reshape(shape)


def token_freqs(x_shape, freqs, *, tensor_format, cu_seqlens=None, cp_size=1, cp_rank=0,
                start_positions=None) -> np.ndarray:
    """(n, 1, d2) float64: each token's freqs row."""
    lens = sequence_lengths(x_shape, tensor_format, cu_seqlens, cp_size)
    pos = positions(lens, cp_size=cp_size, cp_rank=cp_rank, starts=start_positions)
    f = np.asarray(freqs, dtype=np.float64)
    return f.reshape(f.shape[0], f.shape[-1])[pos][:, None, :]


def _rope(x, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
          start_positions, backward: bool):
    x = np.asarray(x, dtype=np.float64)
    f = token_freqs(x.shape, freqs, tensor_format=tensor_format, cu_seqlens=cu_seqlens,
                    cp_size=cp_size, cp_rank=cp_rank, start_positions=start_positions)
    d2 = f.shape[-1]
    xt = tokens(x, tensor_format)
    partner, sign = pairing(d2, interleaved)
    r = xt[..., :d2]
    if backward:
        rot = r[..., partner] * (sign[partner] * np.sin(f[..., partner]))
    else:
        rot = r[..., partner] * (sign * np.sin(f))
    y = xt.copy()
    y[..., :d2] = r * np.cos(f) + rot
    return untokens(y, x.shape, tensor_format)


def rope_fwd(x, freqs, *, tensor_format="sbhd", interleaved=False, cu_seqlens=None,
             cp_size=1, cp_rank=0, start_positions=None) -> np.ndarray:
    return _rope(x, freqs, tensor_format=tensor_format, interleaved=interleaved,
                 cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank,
                 start_positions=start_positions, backward=False)


def rope_bwd(dy, freqs, *, tensor_format="sbhd", interleaved=False, cu_seqlens=None,
             cp_size=1, cp_rank=0, start_positions=None) -> np.ndarray:
    return _rope(dy, freqs, tensor_format=tensor_format, interleaved=interleaved,
                 cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank,
                 start_positions=start_positions, backward=True)


def magnitude(x, freqs, **kw) -> tuple[np.ndarray, np.ndarray]:
    """(|x| |cos f| + |x_partner| |sin f|, |x| + |x_partner|) per element, in x's layout (the
    tail: |x| and 0): the condition magnitude of the rotation and the weight of an absolute
    error in cos / sin.  ``kw``: the op's options (``backward`` pairs as the transpose)."""
    backward = kw.pop("backward", False)
    interleaved = kw.pop("interleaved", False)
    x = np.abs(np.asarray(x, dtype=np.float64))
    f = token_freqs(x.shape, freqs, **kw)
    fmt = kw.get("tensor_format", "sbhd")
    d2 = f.shape[-1]
    partner, _ = pairing(d2, interleaved)
    xt = tokens(x, fmt)
    r = xt[..., :d2]
    s = np.abs(np.sin(f[..., partner] if backward else f))
    mag, weight = xt.copy(), np.zeros_like(xt)
    mag[..., :d2] = r * np.abs(np.cos(f)) + r[..., partner] * s
    weight[..., :d2] = r + r[..., partner]
    return untokens(mag, x.shape, fmt), untokens(weight, x.shape, fmt)
