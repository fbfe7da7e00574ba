"""Mutation operators for TE's fused softmax, forward and backward: the scale ignored, TE's
-10000 fill replaced by -inf (fully masked rows turn NaN), the causal diagonal one key off,
the scaled logits rounded to the input dtype, a stale last row, and backward's dot product
taken without y.

torch's implementations: ``softmax_fwd(x, kind, *, scale, mask) -> y`` and
``softmax_bwd(dy, y, kind, *, scale) -> dx`` (tealite/backends/torch/softmax.py).  The
formula mutants are written out here in fp32, as torch's implementation computes the op.
"""
from __future__ import annotations

import torch

from tealite.types import SOFTMAX_MASK_FILL, softmax_visible
from tealite_verify.mutate.base import (Mutation, on_output, register, stale_last_row,
                                        with_params)


def _fwd(*, fill: float = SOFTMAX_MASK_FILL, diagonal: int = 0, round_logits: bool = False):
    """torch's forward with one thing changed: the masked fill, the causal diagonal's offset,
    or the scaled logits rounded to the input dtype."""
    def wrap(fn):
        def mutated(x, kind, *, scale, mask):
            if x.numel() == 0:
                return fn(x, kind, scale=scale, mask=mask)
            s = x.float() * scale
            if round_logits:
                s = s.to(x.dtype).float()
            keep = None
            if kind == "scaled_masked":
                s = s.masked_fill(mask, fill)
            elif kind != "scaled":
                sq, sk = s.shape[-2:]
                i = torch.arange(sq, device=s.device)[:, None]
                keep = torch.arange(sk, device=s.device)[None, :] <= i + (sk - sq) + diagonal
                s = s.masked_fill(~keep, float("-inf") if kind == "scaled_upper_triang"
                                  else SOFTMAX_MASK_FILL)
            m = s.amax(-1, keepdim=True)
            e = torch.exp(s - m)
            y = e / e.sum(-1, keepdim=True)
            if kind == "scaled_masked":
                y = torch.where(m == SOFTMAX_MASK_FILL, 0.0, y)
            if keep is not None:
                y = torch.where(keep, y, 0.0)
            return y.to(x.dtype)
        return mutated
    return wrap


def _bwd_sum_without_y(fn):
    # c = sum(dy) instead of sum(dy * y): the softmax Jacobian's rank-one term dropped its y.
    def mutated(dy, y, kind, *, scale):
        y32, dy32 = y.float(), dy.float()
        keep = softmax_visible(kind, y.shape[-2], y.shape[-1], y.device)
        if keep is not None:
            y32, dy32 = torch.where(keep, y32, 0.0), torch.where(keep, dy32, 0.0)
        dx = scale * (dy32 * y32 - y32 * dy32.sum(-1, keepdim=True))
        return dx.to(dy.dtype)
    return mutated


for _m in (
    Mutation("softmax_fwd.scale_ignored", "softmax_fwd", "parameter",
             "the softmax scale ignored (logits taken as given)",
             with_params(lambda kw: dict(kw, scale=1.0))),
    Mutation("softmax_fwd.fill_minus_inf", "softmax_fwd", "formula",
             "masked logits filled with -inf instead of TE's -10000: a fully masked row is "
             "NaN instead of zeros", _fwd(fill=float("-inf"))),
    Mutation("softmax_fwd.causal_diagonal_plus_one", "softmax_fwd", "axis",
             "the causal kinds keep one key too many (j <= i + sk - sq + 1)", _fwd(diagonal=1)),
    Mutation("softmax_fwd.logits_in_input_dtype", "softmax_fwd", "precision",
             "scale * x rounded to the input dtype before the max and exp",
             _fwd(round_logits=True)),
    Mutation("softmax_fwd.last_row_stale", "softmax_fwd", "tail",
             "y's last row keeps the first row's values",
             on_output(lambda t, a, kw: stale_last_row(t))),
    Mutation("softmax_bwd.scale_ignored", "softmax_bwd", "parameter",
             "the scale left out of dx", with_params(lambda kw: dict(kw, scale=1.0))),
    Mutation("softmax_bwd.sum_without_y", "softmax_bwd", "formula",
             "dx = scale y (dy - sum(dy)) instead of scale y (dy - sum(dy y))",
             _bwd_sum_without_y),
):
    register(_m)
