"""Mutation operators for the MoE router: the expert bias ignored (or kept in the weights),
the scaling factor dropped, pre- and post-softmax swapped, the sigmoid left unnormalised,
ties broken by the highest index (the torch backend declares the lowest), the logits rounded
to bf16 before the scores, the softmax backward's sum dropped, the aux scores normalised
over the chosen experts only, and the aux loss's 1 / T^2 taken as 1 / T.

torch's implementations (tealite/backends/torch/router.py): ``router_fwd(logits, config, *,
expert_bias)``, ``router_bwd(grad_probs, logits, routing_map, config)``,
``router_aux_scores_fwd(logits, config)``, ``moe_aux_loss_fwd(probs, tokens_per_expert, *,
total_num_tokens, topk, coeff)``.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tealite.backends.torch import router as torch_router
from tealite.moe_types import ScoreFunction
from tealite_verify.mutate.base import (Mutation, register, with_args, with_params,
                                        with_patches)


def _config(change):
    """A bug in the router config (the positional argument after the tensors)."""
    def edit(args, kw):
        *tensors, config = args
        return (*tensors, change(config)), kw
    return with_args(edit)


def _flip_pre(config):
    if config.score_function != ScoreFunction.SOFTMAX:
        return config
    return replace(config, use_pre_softmax=not config.use_pre_softmax)


def _highest_index(original):
    def topk(scores, k):
        return scores.shape[-1] - 1 - original(scores.flip(-1), k)
    return topk


def _unnormalised(original):
    def weights(x, chosen, config):
        if config.score_function == ScoreFunction.SIGMOID:
            config = replace(config, topk=1)
        return original(x, chosen, config)
    return weights


def _sum_dropped(original):
    def softmax_bwd(g, y):
        return y * g
    return softmax_bwd


def _logits_bf16(args, kw):
    logits, *rest = args
    return (logits.to(torch.bfloat16).to(logits.dtype), *rest), kw


def _aux_over_chosen(original):
    def aux_scores(x, config):
        if config.score_function != ScoreFunction.SIGMOID or config.topk == 1:
            return original(x, config)
        s = torch.sigmoid(x)
        keep = torch.zeros_like(s, dtype=torch.bool).scatter_(
            1, torch_router.topk_lowest_index(s, config.topk), True)
        return s / ((s * keep).sum(-1, keepdim=True) + 1e-20)
    return aux_scores


for _m in (
    Mutation("router_fwd.expert_bias_ignored", "router_fwd", "parameter",
             "the expert bias dropped: selection by the plain sigmoid",
             with_params(lambda kw: dict(kw, expert_bias=None))),
    Mutation("router_fwd.scaling_factor_dropped", "router_fwd", "parameter",
             "the weights not multiplied by scaling_factor",
             _config(lambda c: replace(c, scaling_factor=None))),
    Mutation("router_fwd.pre_post_softmax_swapped", "router_fwd", "formula",
             "softmax before the top-k where after is asked for, and the other way round",
             _config(_flip_pre)),
    Mutation("router_fwd.sigmoid_unnormalised", "router_fwd", "reduction",
             "topk > 1 sigmoid weights not divided by their sum",
             with_patches((torch_router, "weights", _unnormalised))),
    Mutation("router_fwd.ties_by_highest_index", "router_fwd", "rounding-mode",
             "equal scores taken highest index first while lowest_index is declared",
             with_patches((torch_router, "topk_lowest_index", _highest_index))),
    Mutation("router_fwd.logits_through_bf16", "router_fwd", "precision",
             "the logits rounded to bf16 before the scores", with_args(_logits_bf16),
             must_kill=False,
             why_not="a no-op on bf16 inputs; on fp32 / fp16 it moves the weights by ~2^-9 "
                     "relative, caught only where a case's weights are not dominated by one "
                     "expert"),
    Mutation("router_bwd.softmax_sum_dropped", "router_bwd", "formula",
             "softmax backward without the - sum(g y) term",
             with_patches((torch_router, "softmax_bwd", _sum_dropped))),
    Mutation("router_aux_scores_fwd.normalised_over_chosen", "router_aux_scores_fwd",
             "reduction", "sigmoid aux scores divided by the chosen experts' sum, not all",
             with_patches((torch_router, "aux_scores", _aux_over_chosen))),
    Mutation("moe_aux_loss_fwd.one_over_t", "moe_aux_loss_fwd", "parameter",
             "the aux loss constant with 1 / T instead of 1 / T^2",
             with_params(lambda kw: dict(kw, coeff=kw["coeff"] * kw["total_num_tokens"]))),
):
    register(_m)
