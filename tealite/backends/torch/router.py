"""The router in float32 torch math (semantics: tealite/ops/router.py).

Scores are computed and kept in float32 (TE: "scores is always in FP32"); the top-k is a
stable descending sort, so among equal scores the lowest expert index comes first (declared:
``topk_ties = lowest_index``).  A group's score sums its best scores in descending order.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.moe_types import SIGMOID_NORM_EPS, RouterConfig, ScoreFunction, TieRule
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32, "topk_ties": TieRule.LOWEST_INDEX}


def topk_lowest_index(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (T, k) of the k largest scores per row, equal scores by lowest index first."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def routing_scores(x: torch.Tensor, config: RouterConfig, expert_bias) -> torch.Tensor:
    """What the selection compares (float32): logits, pre-softmax scores, sigmoid (+ bias)."""
    if config.selects_on_logits:
        return x
    if config.score_function == ScoreFunction.SOFTMAX:
        return torch.softmax(x, dim=-1)
    s = torch.sigmoid(x)
    return s + expert_bias.float() if expert_bias is not None else s


def eligible(route: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """``route`` with the experts outside the best ``group_topk`` groups set to -inf."""
    if not config.grouped:
        return route
    t, e = route.shape
    groups = route.reshape(t, config.num_groups, e // config.num_groups)
    best = torch.sort(groups, dim=-1, descending=True, stable=True).values
    group_scores = best[..., :config.per_group].sum(dim=-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, topk_lowest_index(group_scores, config.group_topk), True)
    mask = keep.unsqueeze(-1).expand_as(groups).reshape(t, e)
    return route.masked_fill(~mask, float("-inf"))


def select(route: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """The routing map (T, E) bool of the top-k eligible experts."""
    chosen = topk_lowest_index(eligible(route, config), config.topk)
    return torch.zeros_like(route, dtype=torch.bool).scatter_(1, chosen, True)


def weights(x: torch.Tensor, chosen: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    """float32 (T, E): the chosen experts' weights (step 4), 0 elsewhere."""
    if config.score_function == ScoreFunction.SOFTMAX:
        if config.use_pre_softmax:
            w = torch.softmax(x, dim=-1)
        else:
            w = torch.softmax(x.masked_fill(~chosen, float("-inf")), dim=-1)
    else:
        w = torch.sigmoid(x)
        if config.normalises:
            w = w / ((w * chosen).sum(dim=-1, keepdim=True) + SIGMOID_NORM_EPS)
    w = torch.where(chosen, w, torch.zeros_like(w))
    return w * config.scale if config.scaling_factor is not None else w


@BACKEND.implements(Op.ROUTER_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def router_fwd(logits, config: RouterConfig, *, expert_bias):
    x = logits.float()
    chosen = select(routing_scores(x, config, expert_bias), config)
    return weights(x, chosen, config).to(logits.dtype), chosen


def softmax_bwd(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y * (g - (g * y).sum(dim=-1, keepdim=True))


def sigmoid_norm_bwd(g: torch.Tensor, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Gradient through ``s / (sum_mask s + eps)`` (0 outside ``mask``)."""
    g, s = g * mask, s * mask
    total = s.sum(dim=-1, keepdim=True) + SIGMOID_NORM_EPS
    return (g / total - (g * s).sum(dim=-1, keepdim=True) / (total * total)) * mask


@BACKEND.implements(Op.ROUTER_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def router_bwd(grad_probs, logits, routing_map, config: RouterConfig):
    x, g = logits.float(), grad_probs.float() * config.scale
    g = g * routing_map
    if config.score_function == ScoreFunction.SIGMOID:
        s = torch.sigmoid(x)
        d = sigmoid_norm_bwd(g, s, routing_map) if config.normalises else g
        out = d * s * (1 - s)
    elif config.use_pre_softmax:
        out = softmax_bwd(g, torch.softmax(x, dim=-1))
    else:
        y = torch.softmax(x.masked_fill(~routing_map, float("-inf")), dim=-1)
        out = softmax_bwd(g, torch.where(routing_map, y, torch.zeros_like(y)))
    return out.to(logits.dtype)


def aux_scores(x: torch.Tensor, config: RouterConfig) -> torch.Tensor:
    if config.score_function == ScoreFunction.SOFTMAX:
        return torch.softmax(x, dim=-1)
    s = torch.sigmoid(x)
    return s / (s.sum(dim=-1, keepdim=True) + SIGMOID_NORM_EPS) if config.normalises else s


@BACKEND.implements(Op.ROUTER_AUX_SCORES_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def router_aux_scores_fwd(logits, config: RouterConfig):
    scores = aux_scores(logits.float(), config)
    chosen = topk_lowest_index(scores, config.topk)
    return scores, torch.zeros_like(scores, dtype=torch.bool).scatter_(1, chosen, True)


@BACKEND.implements(Op.ROUTER_AUX_SCORES_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def router_aux_scores_bwd(grad_scores, logits, config: RouterConfig):
    x, g = logits.float(), grad_scores.float()
    if config.score_function == ScoreFunction.SOFTMAX:
        return softmax_bwd(g, torch.softmax(x, dim=-1)).to(logits.dtype)
    s = torch.sigmoid(x)
    if config.normalises:
        g = sigmoid_norm_bwd(g, s, torch.ones_like(s, dtype=torch.bool))
    return (g * s * (1 - s)).to(logits.dtype)


def aux_loss_coeff(experts: int, total_num_tokens: int, topk: int, coeff: float) -> torch.Tensor:
    """TE's C = E * coeff / topk / T / T, each step in float32."""
    c = torch.tensor(experts * coeff, dtype=torch.float32)
    for divisor in (topk, total_num_tokens, total_num_tokens):
        c = c / torch.tensor(float(divisor), dtype=torch.float32)
    return c


@BACKEND.implements(Op.MOE_AUX_LOSS_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def moe_aux_loss_fwd(probs, tokens_per_expert, *, total_num_tokens, topk, coeff):
    c = aux_loss_coeff(probs.shape[1], total_num_tokens, topk, coeff).to(probs.device)
    per_expert = probs.float().sum(dim=0)
    return ((per_expert * tokens_per_expert.float()).sum() * c).to(probs.dtype)


@BACKEND.implements(Op.MOE_AUX_LOSS_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def moe_aux_loss_bwd(grad_aux_loss, probs, tokens_per_expert, *, total_num_tokens, topk,
                     coeff):
    c = aux_loss_coeff(probs.shape[1], total_num_tokens, topk, coeff).to(probs.device)
    row = tokens_per_expert.float() * c * grad_aux_loss.float()
    return row.expand(probs.shape).to(probs.dtype).contiguous()
