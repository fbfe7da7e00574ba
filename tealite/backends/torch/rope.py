"""RoPE forward / backward in fp32 torch math (semantics: tealite/ops/rope.py).

Every format is brought to packed tokens (n, h, d) in sequence order, each token's position
comes from :func:`tealite.types.rope_positions`, and the rotation is written out:
``x * cos + rotate(x) * sin`` with cos / sin of the float32 freqs taken in float32 (torch's
``cos`` / ``sin``), each product and the sum rounded to fp32 (no FMA), the result rounded once
to the input dtype.  Backward applies the transposed rotation.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.types import Op, TensorFormat, rope_positions

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}


def local_lens(t: torch.Tensor, tensor_format: TensorFormat, cu_seqlens, cp_size: int):
    """Each sequence's local token count (the front-end validated them)."""
    if tensor_format == TensorFormat.THD:
        cu = [int(v) for v in cu_seqlens.tolist()]
        return [(cu[i + 1] - cu[i]) // cp_size for i in range(len(cu) - 1)]
    s, b = (t.shape[0], t.shape[1]) if tensor_format == TensorFormat.SBHD else t.shape[1::-1]
    return [s] * b


def to_tokens(t: torch.Tensor, tensor_format: TensorFormat) -> torch.Tensor:
    """(n, h, d) with the tokens of sequence 0 first, then sequence 1, ..."""
    if tensor_format == TensorFormat.SBHD:
        return t.transpose(0, 1).reshape(-1, *t.shape[2:])
    if tensor_format == TensorFormat.BSHD:
        return t.reshape(-1, *t.shape[2:])
    return t


def from_tokens(y: torch.Tensor, like: torch.Tensor, tensor_format: TensorFormat):
    if tensor_format == TensorFormat.SBHD:
        s, b = like.shape[:2]
        return y.reshape(b, s, *like.shape[2:]).transpose(0, 1).contiguous()
    return y.reshape(like.shape).contiguous()


def _rotate(x: torch.Tensor, interleaved: bool, *, transpose: bool) -> torch.Tensor:
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        pair = (odd, -even) if transpose else (-odd, even)
        return torch.stack(pair, dim=-1).reshape(x.shape)
    lo, hi = x.chunk(2, dim=-1)
    return torch.cat((hi, -lo) if transpose else (-hi, lo), dim=-1)


def _apply(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
           start_positions, *, backward: bool):
    tokens = to_tokens(t, tensor_format)
    starts = start_positions.tolist() if start_positions is not None else None
    pos = rope_positions(local_lens(t, tensor_format, cu_seqlens, cp_size), cp_size=cp_size,
                         cp_rank=cp_rank, starts=starts, device=t.device)
    d2 = freqs.shape[-1]
    f = freqs.reshape(freqs.shape[0], d2)[pos][:, None, :]  # (n, 1, d2) float32
    cos, sin = torch.cos(f), torch.sin(f)
    x = tokens[..., :d2].float()
    if backward:
        y = x * cos + _rotate(x * sin, interleaved, transpose=True)
    else:
        y = x * cos + _rotate(x, interleaved, transpose=False) * sin
    out = torch.cat((y.to(t.dtype), tokens[..., d2:]), dim=-1)
    return from_tokens(out, t, tensor_format)


@BACKEND.implements(Op.ROPE_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def rope_fwd(t, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _apply(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                  start_positions, backward=False)


@BACKEND.implements(Op.ROPE_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def rope_bwd(dy, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _apply(dy, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                  start_positions, backward=True)
