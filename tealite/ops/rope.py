"""Rotary position embedding (RoPE), forward and backward: TransformerEngine's fused RoPE.

``t`` holds heads of dim ``d`` in one of three formats (:class:`tealite.types.TensorFormat`):
``sbhd`` (s, b, h, d), ``bshd`` (b, s, h, d), or ``thd`` (t, h, d) with ``cu_seqlens``
(int32, b + 1 entries) bounding the packed sequences.  ``freqs`` is float32 (s2, 1, 1, d2),
given by the caller (TE's ``RotaryPositionEmbedding`` output); ``d2`` is even and at most
``d``: partial rotary, the tail ``d2 <= i < d`` passes through unchanged.

The position ``p`` of a token is its index in its sequence, shifted:

* ``cp_size == 1``: ``p = i + start_positions[b]`` (``start_positions``, int32 (b,), default 0:
  TE's per-sequence offsets for inference);
* context parallelism, ``cp_size > 1`` (TE's two-chunk layout): the full sequence of length
  ``2 c cp_size`` is cut into ``2 cp_size`` chunks of ``c`` tokens and rank ``r`` holds chunks
  ``r`` and ``2 cp_size - 1 - r``: its local sequence has ``2 c`` tokens and local index
  ``i`` has ``p = r c + i`` for ``i < c`` and ``p = (2 cp_size - 1 - r) c + (i - c)`` after.
  For ``thd``, ``cu_seqlens`` are the full sequences' (padded) offsets and the local tensor
  holds ``cu_seqlens / cp_size`` of each; ``start_positions`` is refused with cp (as TE).

With ``f = freqs[p, 0, 0, :]`` (float32) and x the first ``d2`` elements of a head:

    y = x * cos(f) + rotate(x) * sin(f),    y[d2:] = t[d2:]
    rotate(x) = (-x[h:], x[:h])                       not interleaved, h = d2 / 2
    rotate(x)[2k], rotate(x)[2k+1] = -x[2k+1], x[2k]  interleaved

computed in float32 (cos and sin of the float32 ``f``), the output rounded once into t's
dtype.  Backward is the transposed rotation at the same positions:
``dx = dy * cos(f) + rotate^T(dy * sin(f))`` with ``rotate^T(z) = (z[h:], -z[:h])`` (not
interleaved), ``(z[2k+1], -z[2k])`` interleaved; the tail of dy passes through.  (TE's fused
backward ignores ``start_positions``, which it supports for inference only; here backward
is the exact transpose of forward for every option.)

Outputs are contiguous, in t's format, shape and dtype.  Sequence and batch dims may be 0.
"""
from __future__ import annotations

import torch

import tealite.registry as registry
from tealite._checks import check_choice, check_same_device, check_tensor, require
from tealite.types import Op, TensorFormat

_INT32 = (torch.int32,)


def _format(tensor_format) -> TensorFormat:
    check_choice("tensor_format", tensor_format, tuple(f.value for f in TensorFormat))
    return TensorFormat(tensor_format)


def _check_freqs(freqs, d: int) -> int:
    check_tensor("freqs", freqs, ndim=4, dtypes=(torch.float32,))
    require(freqs.shape[1] == 1 and freqs.shape[2] == 1,
            f"freqs must have shape (s2, 1, 1, d2), got {tuple(freqs.shape)}")
    d2 = freqs.shape[3]
    require(d2 >= 2 and d2 % 2 == 0,
            f"freqs' last dim d2 (the rotary dim) must be even and >= 2, got {d2}")
    require(d2 <= d, f"freqs' last dim d2 = {d2} must be <= the head dim d = {d}")
    return d2


def _seqlens(cu_seqlens, total: int, cp_size: int) -> list[int]:
    """Local sequence lengths from the (full, padded) cu_seqlens; read on the host once."""
    check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=_INT32)
    require(cu_seqlens.shape[0] >= 2,
            f"cu_seqlens must have at least 2 entries (one sequence), got {cu_seqlens.shape[0]}")
    cu = [int(v) for v in cu_seqlens.tolist()]
    require(cu[0] == 0, f"cu_seqlens must start at 0, got {cu[0]}")
    bad = [i for i in range(len(cu) - 1) if cu[i + 1] < cu[i]]
    require(not bad, f"cu_seqlens must be non-decreasing, got {cu}")
    split = [i for i, v in enumerate(cu) if v % (2 * cp_size if cp_size > 1 else 1)]
    require(not split, f"cu_seqlens with cp_size={cp_size} must be multiples of 2*cp_size = "
            f"{2 * cp_size} (each sequence cut into 2*cp_size equal chunks), got {cu}")
    require(cu[-1] // cp_size == total,
            f"cu_seqlens[-1] / cp_size = {cu[-1] // cp_size} must equal t's token count "
            f"{total} (dim 0 of the thd tensor)")
    return [(cu[i + 1] - cu[i]) // cp_size for i in range(len(cu) - 1)]


def _max_position(lens: list[int], cp_size: int, starts: list[int]) -> int:
    """The largest position any token reads (-1 when there is no token)."""
    if cp_size > 1:
        return max((n * cp_size - 1 for n in lens if n), default=-1)
    return max((n - 1 + s for n, s in zip(lens, starts) if n), default=-1)


def _params(name, t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
            start_positions) -> dict:
    fmt = _format(tensor_format)
    require(isinstance(interleaved, bool), f"interleaved must be a bool, got {interleaved!r}")
    require(isinstance(cp_size, int) and not isinstance(cp_size, bool) and cp_size >= 1,
            f"cp_size must be an int >= 1, got {cp_size!r}")
    require(isinstance(cp_rank, int) and not isinstance(cp_rank, bool)
            and 0 <= cp_rank < cp_size,
            f"cp_rank must be an int in [0, cp_size = {cp_size}), got {cp_rank!r}")
    check_tensor(name, t, ndim=3 if fmt == TensorFormat.THD else 4)
    d = t.shape[-1]
    require(d >= 2, f"{name}'s head dim d must be >= 2, got shape {tuple(t.shape)}")
    d2 = _check_freqs(freqs, d)
    if fmt == TensorFormat.THD:
        require(cu_seqlens is not None, "tensor_format 'thd' needs cu_seqlens (int32, b + 1)")
        lens = _seqlens(cu_seqlens, t.shape[0], cp_size)
        b, heads = len(lens), t.shape[1]
    else:
        require(cu_seqlens is None,
                f"cu_seqlens is for tensor_format 'thd'; got tensor_format {fmt.value!r}")
        s, b = (t.shape[0], t.shape[1]) if fmt == TensorFormat.SBHD else (t.shape[1], t.shape[0])
        require(cp_size == 1 or s % 2 == 0,
                f"with cp_size={cp_size} the local sequence length must be even (two "
                f"chunks), got {s}")
        lens, heads = [s] * b, t.shape[2]
    starts = [0] * b
    if start_positions is not None:
        require(cp_size == 1, "start_positions is not supported with cp_size > 1 (as TE)")
        check_tensor("start_positions", start_positions, ndim=1, dtypes=_INT32)
        require(start_positions.shape[0] == b,
                f"start_positions must have shape ({b},) (one per sequence), got "
                f"{tuple(start_positions.shape)}")
        starts = [int(v) for v in start_positions.tolist()]
        require(min(starts, default=0) >= 0, f"start_positions must be >= 0, got {starts}")
    top = _max_position(lens, cp_size, starts)
    require(top < freqs.shape[0],
            f"freqs has {freqs.shape[0]} positions (dim 0) but the tokens reach position "
            f"{top}: freqs needs at least {top + 1} rows")
    device = check_same_device(t=t, freqs=freqs, cu_seqlens=cu_seqlens,
                               start_positions=start_positions)
    return dict(dtype=t.dtype, tensor_format=fmt.value, interleaved=interleaved, d=d, d2=d2,
                heads=heads, batch=b, tokens=sum(lens), max_seqlen=max(lens, default=0),
                max_position=top, cp_size=cp_size, cp_rank=cp_rank,
                start_positions=start_positions is not None,
                device=registry.device_kind(device))


def _rope(op: Op, name: str, t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
          start_positions, backend):
    params = _params(name, t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                     start_positions)
    impl = registry.dispatch(op, params, backend)
    return impl.fn(t, freqs, tensor_format=TensorFormat(params["tensor_format"]),
                   interleaved=interleaved, cu_seqlens=cu_seqlens, cp_size=cp_size,
                   cp_rank=cp_rank, start_positions=start_positions)


def rope_fwd(t, freqs, *, tensor_format: str = "sbhd", interleaved: bool = False,
             cu_seqlens=None, cp_size: int = 1, cp_rank: int = 0, start_positions=None,
             backend: str | None = None) -> torch.Tensor:
    """RoPE forward: ``t`` rotated by ``freqs`` (see the module docstring)."""
    return _rope(Op.ROPE_FWD, "t", t, freqs, tensor_format, interleaved, cu_seqlens, cp_size,
                 cp_rank, start_positions, backend)


def rope_bwd(dy, freqs, *, tensor_format: str = "sbhd", interleaved: bool = False,
             cu_seqlens=None, cp_size: int = 1, cp_rank: int = 0, start_positions=None,
             backend: str | None = None) -> torch.Tensor:
    """RoPE backward: the gradient of ``rope_fwd``'s input given its output's ``dy``."""
    return _rope(Op.ROPE_BWD, "dy", dy, freqs, tensor_format, interleaved, cu_seqlens, cp_size,
                 cp_rank, start_positions, backend)


__all__ = ["rope_fwd", "rope_bwd"]
