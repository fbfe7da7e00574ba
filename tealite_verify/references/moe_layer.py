"""The composed MoE layer in float64 (issue 16 part 5): router -> permute -> grouped GEMM (fc1)
-> gated activation -> grouped GEMM (fc2) -> unpermute merging the probabilities, forward and
backward, every intermediate returned (the bound propagation reads them).

Semantics (TE's, as tealite/moe_types.py states them):

* router: TE's ``fused_topk_with_score_function`` with ``score_function="softmax"`` and
  ``use_pre_softmax=False``: the top k logits of each token (ties: the lower expert index
  first), then a softmax over those k; ``probs`` (T, E) is zero off the routing map.  The
  layer is judged *given* the backend's routing map (a discrete decision: a near-tie is
  the router spec's business, not the layer's), so :func:`router_probs` takes the map.
* permute by routing map: output rows grouped by expert, tokens in ascending order within an
  expert; ``m_splits[e]`` = tokens routed to e.
* fc1: ``h1 = xp @ w1[e].T`` per group (TN, w1 (E, 2F, H)); act: ``act_fwd(h1, kind)``
  (gated: first half activated); fc2: ``h2 = a @ w2[e].T`` (w2 (E, H, F)).
* unpermute with merging probs: ``y[t] = sum_e probs[t, e] * h2[row(t, e)]``.

Backward from ``dy``: ``dh2[row(t,e)] = probs[t,e] dy[t]``, ``dprobs[t,e] = <dy[t],
h2[row(t,e)]>``; fc2 dgrad (NN) and wgrad (NT); activation backward; fc1 dgrad and wgrad;
``dx[t] = sum_e dxp[row(t,e)]``; the router's softmax backward over the selected logits.

Only numpy and the activation reference: no tealite code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tealite_verify.references.activations import act_bwd, act_fwd


@dataclass(frozen=True)
class Routing:
    """Where each (token, expert) pair of the map went: ``rows[t, e]`` its permuted row
    (-1 off the map), ``tokens[r]`` the token of permuted row r, ``splits`` per expert."""

    rows: np.ndarray
    tokens: np.ndarray
    experts: np.ndarray
    splits: tuple[int, ...]


def topk_map(logits: np.ndarray, k: int) -> np.ndarray:
    """The routing map of the top ``k`` logits per token (ties: lower expert index first)."""
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    out = np.zeros(logits.shape, bool)
    np.put_along_axis(out, order, True, axis=1)
    return out


def router_probs(logits: np.ndarray, routing_map: np.ndarray) -> np.ndarray:
    """Softmax over each token's selected logits; zero elsewhere."""
    masked = np.where(routing_map, logits, -np.inf)
    top = masked.max(axis=1, keepdims=True)
    e = np.where(routing_map, np.exp(masked - top), 0.0)
    return e / e.sum(axis=1, keepdims=True)


def routing(routing_map: np.ndarray) -> Routing:
    t_count, e_count = routing_map.shape
    rows = -np.ones((t_count, e_count), np.int64)
    tokens, experts = [], []
    for e in range(e_count):
        for t in np.nonzero(routing_map[:, e])[0]:
            rows[t, e] = len(tokens)
            tokens.append(int(t))
            experts.append(e)
    splits = tuple(int(s) for s in routing_map.sum(axis=0))
    return Routing(rows, np.asarray(tokens, np.int64), np.asarray(experts, np.int64), splits)


def grouped_tn(a: np.ndarray, w: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Row r of ``a`` times ``w[experts[r]].T``."""
    return np.einsum("rk,rnk->rn", a, w[experts]) if len(a) else \
        np.zeros((0, w.shape[1]))


def grouped_nn(d: np.ndarray, w: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Row r of ``d`` times ``w[experts[r]]`` (dgrad)."""
    return np.einsum("rn,rnk->rk", d, w[experts]) if len(d) else np.zeros((0, w.shape[2]))


def grouped_nt(d: np.ndarray, a: np.ndarray, experts: np.ndarray, groups: int) -> np.ndarray:
    """wgrad: out[e] = d[rows of e].T @ a[rows of e]; an empty group gives zeros."""
    out = np.zeros((groups, d.shape[1], a.shape[1]))
    for e in range(groups):
        sel = experts == e
        out[e] = d[sel].T @ a[sel]
    return out


def unpermute(h: np.ndarray, r: Routing, probs: np.ndarray | None, tokens: int) -> np.ndarray:
    """Each token's rows summed, weighted by its probabilities when given."""
    y = np.zeros((tokens, h.shape[1]))
    weights = np.ones(len(r.tokens)) if probs is None else probs[r.tokens, r.experts]
    np.add.at(y, r.tokens, weights[:, None] * h)
    return y


def layer(x, logits, w1, w2, dy, routing_map, kind: str = "swiglu", probs=None) -> dict:
    """Forward and backward of the layer given the routing map; every intermediate.  With
    ``probs`` (T, E) given (the expert FFN op: the weights are an input) the router is not
    evaluated and ``logits`` may be None."""
    r = routing(routing_map)
    probs = router_probs(logits, routing_map) if probs is None else probs
    xp = x[r.tokens]
    h1 = grouped_tn(xp, w1, r.experts)
    a = act_fwd(h1, kind)
    h2 = grouped_tn(a, w2, r.experts)
    y = unpermute(h2, r, probs, len(x))
    p_rows = probs[r.tokens, r.experts]
    dh2 = p_rows[:, None] * dy[r.tokens]
    dprobs = np.zeros_like(probs)
    dprobs[r.tokens, r.experts] = np.einsum("rh,rh->r", dy[r.tokens], h2)
    da = grouped_nn(dh2, w2, r.experts)
    dw2 = grouped_nt(dh2, a, r.experts, w2.shape[0])
    dh1 = act_bwd(da, h1, kind)
    dxp = grouped_nn(dh1, w1, r.experts)
    dw1 = grouped_nt(dh1, xp, r.experts, w1.shape[0])
    dx = unpermute(dxp, r, None, len(x))
    inner = (probs * dprobs).sum(axis=1, keepdims=True)
    dlogits = np.where(routing_map, probs * (dprobs - inner), 0.0)
    return {"routing": r, "probs": probs, "xp": xp, "h1": h1, "a": a, "h2": h2, "y": y,
            "dh2": dh2, "dprobs": dprobs, "da": da, "dw2": dw2, "dh1": dh1, "dxp": dxp,
            "dw1": dw1, "dx": dx, "dlogits": dlogits}
