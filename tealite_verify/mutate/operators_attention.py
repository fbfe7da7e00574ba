"""Mutation operators for dot-product attention forward and backward: the softmax scale
dropped, the causal diagonal aligned at the wrong corner, a window one key wider, lse in the
wrong base, dK / dV averaged instead of summed over a query group, and a 1-ulp output error
that the tier accepts by design.

torch's implementations: ``attention_fwd(q, k, v, config) -> (out, lse)`` and
``attention_bwd(dout, q, k, v, out, lse, config) -> (dq, dk, dv)``; ``config`` is the
frozen ``tealite.attention_types.AttentionConfig`` (changed with ``dataclasses.replace``).
"""
from __future__ import annotations

import dataclasses
import math

from tealite_verify.mutate.base import Mutation, bump_ulps, on_output, register, with_args

# A causal mask moved to the other corner: top-left <-> bottom-right.
_OTHER_CORNER = {"causal": "causal_bottom_right", "causal_bottom_right": "causal",
                 "padding_causal": "padding_causal_bottom_right",
                 "padding_causal_bottom_right": "padding_causal"}


def _config(change):
    """A bug in the config (the last positional argument)."""
    def edit(args, kw):
        return args[:-1] + (change(args[-1]),), kw
    return with_args(edit)


def _no_scale(c):
    return dataclasses.replace(c, softmax_scale=1.0)


def _other_corner(c):
    return dataclasses.replace(c, mask=_OTHER_CORNER.get(c.mask, c.mask))


def _window_wider(c):
    left, right = c.window
    return dataclasses.replace(c, window=(left + 1 if left >= 0 else left, right))


def _lse_log2(t, args, kw):
    return t * (1.0 / math.log(2.0))


def _group_mean(t, args, kw):
    """dK / dV divided by the group size: a mean over the query heads, not their sum."""
    group = args[1].shape[-2] // max(args[2].shape[-2], 1)
    return (t.float() / group).to(t.dtype)


def _out_1ulp(t, args, kw):
    if not t.numel():
        return t
    flat = t.detach().abs().float().reshape(-1)
    return bump_ulps(t, 1, int(flat.argmax()))


for _m in (
    Mutation("attention_fwd.scale_dropped", "attention_fwd", "parameter",
             "softmax_scale ignored: scores q.k unscaled", _config(_no_scale)),
    Mutation("attention_fwd.causal_other_corner", "attention_fwd", "layout",
             "the causal diagonal aligned at the other corner (top-left <-> bottom-right)",
             _config(_other_corner)),
    Mutation("attention_fwd.window_one_wider", "attention_fwd", "parameter",
             "a sliding window's left side one key wider", _config(_window_wider)),
    Mutation("attention_fwd.lse_log2", "attention_fwd", "formula",
             "lse returned in base 2 (log2 sum exp2 of the log2(e)-scaled scores, as an "
             "exp2 kernel keeps it) without the conversion back",
             on_output(_lse_log2, index=1)),
    Mutation("attention_fwd.out_1ulp_largest", "attention_fwd", "k-ulp",
             "the largest output element 1 ulp off", on_output(_out_1ulp, index=0),
             must_kill=False,
             why_not="inside the declared tolerance by design: the output's bound is half an "
                     "ulp of rounding plus the compute error, so one ulp passes where the "
                     "compute error exceeds half an ulp (long rows, fp32 outputs)"),
    Mutation("attention_bwd.scale_dropped", "attention_bwd", "parameter",
             "softmax_scale ignored in backward (scores and dq / dk unscaled)",
             _config(_no_scale)),
    Mutation("attention_bwd.dk_group_mean", "attention_bwd", "reduction",
             "dK averaged over a K/V head's query group instead of summed (GQA / MQA)",
             on_output(_group_mean, index=1)),
    Mutation("attention_bwd.dv_group_mean", "attention_bwd", "reduction",
             "dV averaged over a K/V head's query group instead of summed (GQA / MQA)",
             on_output(_group_mean, index=2)),
):
    register(_m)
