"""Mutation operators for LayerNorm / RMSNorm forward and backward: parameters ignored, eps
dropped or misplaced, gradients swapped or reduced wrongly, statistics stored in low precision,
tail rows, and a 1-ulp error that the tier accepts by design.

torch's implementations: ``layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma) -> (y,
mean, rsigma)``, ``layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma) -> (dx,
dgamma, dbeta)``, ``rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma) -> (y, rsigma)``,
``rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma) -> (dx, dgamma)``.
"""
from __future__ import annotations

import torch

from tealite_verify.mutate.base import (Mutation, bump_ulps, on_output, register,
                                        stale_last_row, with_args, with_params)


def _zero_centered_ignored(kw):
    return dict(kw, zero_centered_gamma=False)


def _last_row_ulp(k: int):
    """+k ulps at the last row's value of a per-row statistic (mean / rsigma)."""
    def change(t, args, kw):
        return bump_ulps(t, k, t.numel() - 1) if t.numel() else t
    return change


def _rms_eps_outside_sqrt(fn):
    # rsigma = 1 / (sqrt(mean(x^2)) + eps) instead of 1 / sqrt(mean(x^2) + eps); y is then
    # x * rsigma * gamma in fp32 as torch's own implementation computes it.
    def mutated(x, gamma, *, eps, zero_centered_gamma):
        x32 = x.float()
        rsigma = torch.reciprocal(torch.sqrt((x32 * x32).mean(dim=-1)) + eps)
        w = gamma.float() + 1.0 if zero_centered_gamma else gamma.float()
        return (x32 * rsigma.unsqueeze(-1) * w).to(x.dtype), rsigma
    return mutated


def _swap_dgamma_dbeta(fn):
    def mutated(*args, **kw):
        dx, dgamma, dbeta = fn(*args, **kw)
        return dx, dbeta, dgamma
    return mutated


def _rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


def _dgamma_mean_not_sum(fn):
    def mutated(dy, x, rsigma, gamma, **kw):
        dx, dgamma = fn(dy, x, rsigma, gamma, **kw)
        rows = _rows_of(x)
        return dx, (dgamma.float() / max(rows, 1)).to(dgamma.dtype)
    return mutated


def _rsigma_stored_bf16(args, kw):
    """The saved rsigma went through a bf16 buffer (a lowered-precision statistic)."""
    dy, x, rsigma, gamma = args
    return (dy, x, rsigma.to(torch.bfloat16).float(), gamma), kw


for _m in (
    Mutation("layernorm_fwd.zero_centered_gamma_ignored", "layernorm_fwd", "parameter",
             "zero_centered_gamma ignored: y scaled by gamma instead of (1 + gamma)",
             with_params(_zero_centered_ignored)),
    Mutation("layernorm_fwd.eps_dropped", "layernorm_fwd", "parameter",
             "eps left out of rsqrt(var + eps)", with_params(lambda kw: dict(kw, eps=0.0))),
    Mutation("layernorm_fwd.rsigma_1ulp_last_row", "layernorm_fwd", "k-ulp",
             "the last row's rsigma output 1 fp32 ulp off", on_output(_last_row_ulp(1), index=2),
             must_kill=False,
             why_not="inside the declared tolerance by design: rsigma's relative bound is at "
                     "least 2 (1.5 u + 2 u) = 7 u, one ulp is at most 2 u"),
    Mutation("layernorm_fwd.rsigma_4096ulp_last_row", "layernorm_fwd", "k-ulp",
             "the last row's rsigma 4096 fp32 ulps off (relative 2^-11)",
             on_output(_last_row_ulp(4096), index=2)),
    Mutation("layernorm_bwd.dgamma_dbeta_swapped", "layernorm_bwd", "reduction",
             "dgamma and dbeta returned in each other's place", _swap_dgamma_dbeta),
    Mutation("layernorm_bwd.zero_centered_gamma_ignored", "layernorm_bwd", "parameter",
             "zero_centered_gamma ignored in dx", with_params(_zero_centered_ignored)),
    Mutation("rmsnorm_fwd.eps_outside_sqrt", "rmsnorm_fwd", "formula",
             "eps misplaced: 1 / (sqrt(mean(x^2)) + eps)", _rms_eps_outside_sqrt),
    Mutation("rmsnorm_fwd.zero_centered_gamma_ignored", "rmsnorm_fwd", "parameter",
             "zero_centered_gamma ignored", with_params(_zero_centered_ignored)),
    Mutation("rmsnorm_fwd.last_row_stale", "rmsnorm_fwd", "tail",
             "y's last row keeps the first row's values",
             on_output(lambda t, a, kw: stale_last_row(t), index=0)),
    Mutation("rmsnorm_bwd.dgamma_mean_not_sum", "rmsnorm_bwd", "reduction",
             "dgamma averaged over the rows instead of summed", _dgamma_mean_not_sum),
    Mutation("rmsnorm_bwd.rsigma_through_bf16", "rmsnorm_bwd", "precision",
             "the saved rsigma rounded to bf16 before use", with_args(_rsigma_stored_bf16)),
):
    register(_m)
