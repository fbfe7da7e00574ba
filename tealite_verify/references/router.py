"""Float64 references of the MoE router (semantics: tealite/ops/router.py), from the math.

numpy, float64 throughout; nothing of tealite is imported.  The selection takes the top-k of
the float64 routing scores with the lowest expert index first among equal scores (a stable
descending sort); the router tier (tiers/router.py) decides which other selections a backend
may legitimately make, and then judges its weights and gradients against
:func:`weights` / :func:`router_bwd` evaluated at the backend's own selection.
"""
from __future__ import annotations

import numpy as np

SIGMOID_NORM_EPS = 1e-20


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def softmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Row softmax; with ``mask`` over the masked-in entries only (0 elsewhere)."""
    x = _f64(x)
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    if x.shape[-1] == 0 or x.shape[0] == 0:
        return np.zeros_like(x)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = _f64(x)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def routing_scores(logits, *, score_function: str, use_pre_softmax: bool = False,
                   expert_bias=None) -> np.ndarray:
    """What the selection compares: logits (post-softmax), softmax, or sigmoid + bias."""
    x = _f64(logits)
    if score_function == "softmax":
        return softmax(x) if use_pre_softmax else x
    s = sigmoid(x)
    return s + _f64(expert_bias) if expert_bias is not None else s


def group_scores(route: np.ndarray, num_groups: int, per_group: int) -> np.ndarray:
    """(T, G): the sum of each group's ``per_group`` largest routing scores."""
    t, e = route.shape
    groups = np.sort(route.reshape(t, num_groups, e // num_groups), axis=-1)[..., ::-1]
    return np.sum(groups[..., :per_group], axis=-1)


def topk_mask(scores: np.ndarray, k: int) -> np.ndarray:
    """Bool mask of the k largest per row, the lowest index first among equal scores."""
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    out = np.zeros(scores.shape, bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out


def eligible_mask(route: np.ndarray, *, topk: int, num_groups=None, group_topk=None
                  ) -> np.ndarray:
    """The experts of the best ``group_topk`` groups (all experts without grouping)."""
    if group_topk is None:
        return np.ones(route.shape, bool)
    t, e = route.shape
    keep = topk_mask(group_scores(route, num_groups, topk // group_topk), group_topk)
    return np.repeat(keep, e // num_groups, axis=1)


def select(route: np.ndarray, *, topk: int, num_groups=None, group_topk=None) -> np.ndarray:
    elig = eligible_mask(route, topk=topk, num_groups=num_groups, group_topk=group_topk)
    return topk_mask(np.where(elig, route, -np.inf), topk)


def weights(logits, chosen, *, topk: int, score_function: str, use_pre_softmax: bool = False,
            scaling_factor=None) -> np.ndarray:
    """The chosen experts' weights (0 elsewhere), for any selection ``chosen``."""
    x, chosen = _f64(logits), np.asarray(chosen, bool)
    if score_function == "softmax":
        w = softmax(x) if use_pre_softmax else softmax(x, chosen)
    else:
        w = sigmoid(x)
        if topk > 1:
            w = w / (np.sum(w * chosen, axis=-1, keepdims=True) + SIGMOID_NORM_EPS)
    w = np.where(chosen, w, 0.0)
    return w * (1.0 if scaling_factor is None else float(scaling_factor))


def router_fwd(logits, *, topk: int, score_function: str = "softmax",
               use_pre_softmax: bool = False, num_groups=None, group_topk=None,
               scaling_factor=None, expert_bias=None) -> tuple[np.ndarray, np.ndarray]:
    route = routing_scores(logits, score_function=score_function,
                           use_pre_softmax=use_pre_softmax, expert_bias=expert_bias)
    chosen = select(route, topk=topk, num_groups=num_groups, group_topk=group_topk)
    return weights(logits, chosen, topk=topk, score_function=score_function,
                   use_pre_softmax=use_pre_softmax, scaling_factor=scaling_factor), chosen


def _softmax_bwd(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y * (g - np.sum(g * y, axis=-1, keepdims=True))


def _sigmoid_norm_bwd(g: np.ndarray, s: np.ndarray, mask: np.ndarray) -> np.ndarray:
    g, s = g * mask, s * mask
    total = np.sum(s, axis=-1, keepdims=True) + SIGMOID_NORM_EPS
    return (g / total - np.sum(g * s, axis=-1, keepdims=True) / total ** 2) * mask


def router_bwd(grad_probs, logits, routing_map, *, topk: int, score_function: str = "softmax",
               use_pre_softmax: bool = False, scaling_factor=None) -> np.ndarray:
    x, m = _f64(logits), np.asarray(routing_map, bool)
    g = _f64(grad_probs) * (1.0 if scaling_factor is None else float(scaling_factor)) * m
    if score_function == "sigmoid":
        s = sigmoid(x)
        d = _sigmoid_norm_bwd(g, s, m) if topk > 1 else g
        return d * s * (1.0 - s)
    if use_pre_softmax:
        return _softmax_bwd(g, softmax(x))
    return _softmax_bwd(g, softmax(x, m))


def aux_scores_fwd(logits, *, topk: int, score_function: str = "softmax"
                   ) -> tuple[np.ndarray, np.ndarray]:
    x = _f64(logits)
    if score_function == "softmax":
        scores = softmax(x)
    else:
        scores = sigmoid(x)
        if topk > 1:
            scores = scores / (np.sum(scores, axis=-1, keepdims=True) + SIGMOID_NORM_EPS)
    return scores, topk_mask(scores, topk)


def aux_scores_bwd(grad_scores, logits, *, topk: int, score_function: str = "softmax"
                   ) -> np.ndarray:
    x, g = _f64(logits), _f64(grad_scores)
    if score_function == "softmax":
        return _softmax_bwd(g, softmax(x))
    s = sigmoid(x)
    if topk > 1:
        g = _sigmoid_norm_bwd(g, s, np.ones(s.shape, bool))
    return g * s * (1.0 - s)


def aux_loss_coeff(experts: int, total_num_tokens: int, topk: int, coeff: float) -> float:
    return experts * coeff / (topk * float(total_num_tokens) ** 2)


def aux_loss_fwd(probs, tokens_per_expert, *, total_num_tokens: int, topk: int,
                 coeff: float) -> np.ndarray:
    p, n = _f64(probs), _f64(tokens_per_expert)
    c = aux_loss_coeff(p.shape[1], total_num_tokens, topk, coeff)
    return np.asarray(c * np.sum(np.sum(p, axis=0) * n))


def aux_loss_bwd(grad_aux_loss, probs_shape, tokens_per_expert, *, total_num_tokens: int,
                 topk: int, coeff: float) -> np.ndarray:
    n = _f64(tokens_per_expert)
    c = aux_loss_coeff(probs_shape[1], total_num_tokens, topk, coeff)
    return np.broadcast_to(c * n * float(_f64(grad_aux_loss)), probs_shape).copy()
