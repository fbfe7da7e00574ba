"""Mutation operators for RoPE forward and backward: the interleaving flipped, the rotation
reversed (forward applying the transpose, backward the forward), start positions dropped
(TE's fused backward does this), the cp rank off by one, positions off by one, the angles
rounded to bf16, the pass-through tail zeroed.

torch's implementations: ``rope_fwd(t, freqs, *, tensor_format, interleaved, cu_seqlens,
cp_size, cp_rank, start_positions) -> y`` and ``rope_bwd(dy, freqs, *, ...) -> dx``.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import rope as torch_rope
from tealite_verify.mutate.base import (Mutation, on_output, register, with_args,
                                        with_params, with_patches)


def _other(impl):
    """The other direction's torch implementation in place of this one's."""
    def wrap(fn):
        return impl
    return wrap


def _next_rank(kw):
    return dict(kw, cp_rank=(kw["cp_rank"] + 1) % kw["cp_size"])


def _freqs_bf16(args, kw):
    t, freqs = args
    return (t, freqs.to(torch.bfloat16).float()), kw


def _tail_zeroed(y, args, kw):
    d2 = args[1].shape[-1]
    out = y.clone()
    out[..., d2:] = 0
    return out


def _shifted(original):
    def positions(*a, **kw):
        # One earlier (clamped at 0, so the table is never read past its end).
        return (original(*a, **kw) - 1).clamp(min=0)
    return positions


_SHIFT = with_patches((torch_rope, "rope_positions", _shifted))

for _op in ("rope_fwd", "rope_bwd"):
    for _m in (
        Mutation(f"{_op}.interleaved_flipped", _op, "layout",
                 "halves rotated where pairs are asked for, and the other way round",
                 with_params(lambda kw: dict(kw, interleaved=not kw["interleaved"]))),
        Mutation(f"{_op}.start_positions_ignored", _op, "parameter",
                 "start_positions dropped (TE's fused backward ignores them)",
                 with_params(lambda kw: dict(kw, start_positions=None))),
        Mutation(f"{_op}.cp_rank_off_by_one", _op, "axis",
                 "context parallelism: the chunks of the next rank",
                 with_params(_next_rank)),
        Mutation(f"{_op}.positions_shifted", _op, "operand",
                 "positions off by one (every token one earlier, 0 kept)", _SHIFT),
        Mutation(f"{_op}.angles_through_bf16", _op, "precision",
                 "the float32 angles rounded to bf16 before cos / sin", with_args(_freqs_bf16)),
        Mutation(f"{_op}.tail_zeroed", _op, "tail",
                 "partial rotary: the pass-through tail d2..d written as zeros",
                 on_output(_tail_zeroed)),
    ):
        register(_m)

register(Mutation("rope_fwd.rotation_reversed", "rope_fwd", "formula",
                  "forward applies the transposed rotation (backward's)",
                  _other(torch_rope.rope_bwd)))
register(Mutation("rope_bwd.rotation_not_transposed", "rope_bwd", "formula",
                  "backward applies the forward rotation", _other(torch_rope.rope_fwd)))
