"""The router tier (label ``router``; pair rule ``router-pair``): TE's fused top-k router,
its aux-loss scores and the aux loss (semantics: tealite/ops/router.py).

Selection.  A backend computes the routing scores ``r`` (logits, softmax or sigmoid + bias)
with an error of at most ``e_r`` per element (below), so the order of two scores closer
than ``e_r + e_r'`` may legitimately flip.  A routing map C (exactly k per row) is accepted
iff some scores within the bounds make it the exact top-k: ``min_C (r + e_r) >= max_{~C}
(r - e_r)`` (independent perturbations: necessary and sufficient).  With groups, iff some
``group_topk`` groups S are a valid top selection of the group scores ``g`` under their
error ``e_g`` in the same sense, C lies inside S's experts, and C is a valid top-k of those
(every S enumerated up to 256 choices; beyond, C's groups completed by the best group scores,
which is exact when the groups' errors are equal).
Outside near-ties this is the exact reference selection.  Exact ties (equal logits, and
equal bias) give bitwise-equal scores in any backend: where the backend declares
``topk_ties = lowest_index`` its choice among them is checked exactly (within a row, or
within a group with grouping, a chosen expert's lower-index twin must be chosen too); where
undeclared, any of them is accepted.

Score errors (u: the declared compute dtype's unit roundoff, ``n_e`` = ``exp_ulps``,
default 1; first-order terms, each relative error ``d`` then used as ``d (1 + d)``):

* post-softmax routing reads the logits: ``e_r = 0`` (a float32 copy is exact);
* softmax ``y_i = exp(x_i - m) / sum_j exp(x_j - m)``: ``x_i - m`` rounds with relative
  error u, i.e. an argument error ``u |x_i - m|``, which ``exp`` turns into a relative error
  (an exp2-based exp rounds log2 e and the product too: ``3 u |x_i - m|`` in all);
  ``exp`` adds ``n_e u``; the n-term positive sum adds ``gamma_n`` to the weighted mean of
  its terms' errors (``u sum_j y_j |x_j - m| + n_e u``); the division u:
  ``d_y = 3 u |x_i - m| + 3 u sum_j y_j |x_j - m| + 2 n_e u + gamma_n + u``;
* sigmoid ``1 / (1 + exp(-x))``: exp ``n_e u``, the sum ``(n_e + 1) u`` relative, the
  division u, the stored score u: ``(n_e + 3) u``; an exp evaluated as ``2^(-x log2 e)``
  (Triton's ``tl.exp`` on a GPU) rounds log2 e and the product to fp32, an error up to
  ``2 u |x| log2 e`` in the exponent, i.e. ``2 u |x|`` relative in exp(-x) and
  ``2 (1 - s) u |x|`` in s (measured on an H100: 1e-6 relative at x = -30, three times the
  ``(n_e + 3) u`` alone), allowed for every backend as the softmax tier does:
  ``d_s = (n_e + 3) u + 2 (1 - s) u |x|``, plus the compute format's smallest
  normal absolutely (exp overflows to inf below x = -88: s becomes 0); the bias add rounds
  ``u |s + b|``;
* a group score sums its ``p = topk // group_topk`` best scores: ``e_g = p max_group e_r +
  gamma_p sum |top p|`` (a sum of the top p moves by at most p times the largest change).

Weights at the backend's own selection C (so a legitimate near-tie flip is judged at what
the backend chose): post-softmax ``d_y`` over C (n = k), pre-softmax ``d_y`` over all E,
sigmoid ``d_s``, normalised ``d_s + (d_s + gamma_k) + u``, the scaling factor u; then one
rounding into the output dtype (tiers/ulp.py).  Underflow: every value carries the compute
format's smallest normal ``tiny`` absolutely (a flushed exp or sigmoid); a normalised
sigmoid ``w = s / S`` carries ``tiny (1 + n w) / S`` (a row whose scores all underflow is
normalised from zeros), and a backward ``tiny`` times its magnitude ``M``.  Off C the weights are exactly 0.

Backward at the given map, with ``M`` the formula on absolute values:

* softmax ``y_i (g_i - P)``, ``P = sum_j g_j y_j``: ``|err_i| <= M_i (d_y,i + gamma_n + 3u)
  + y_i sum_j |g_j| y_j d_y,j`` with ``M_i = y_i (|g_i| + sum_j |g_j| y_j)``;
* normalised sigmoid ``d_i = g_i / S - P / S^2`` (``S = sum s + eps``): S carries
  ``d_S = d_s + gamma_k``, P ``d_s + gamma_k``, the divisions and the subtraction 4u:
  ``rho_d = 3 d_s + 3 gamma_k + 6u`` on ``M_d = |g_i| / S + sum |g_j| s_j / S^2``;
* then ``d s (1 - s)``: ``(1 - s)`` has the absolute error ``s d_s + u (1 - s)`` (it
  cancels near s = 1), the products 2u: ``|err| <= M_d s (1 - s) (rho_d + d_s + 2u) + M_d s
  (s d_s + u (1 - s))``;

then the output rounding.  Aux loss ``C sum_e n_e sum_t p_te``: column sums ``gamma_T``, the
expert sum ``gamma_E``, the products 2u, C's four float32 steps 4u, on ``M = C sum n_e
sum_t |p_te|``; its backward ``C n_e g``: 6u.  Then the output rounding.
"""
from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np

from tealite.moe_types import TieRule
from tealite.numerics import Numerics

from tealite_verify.references import router as ref
from tealite_verify.tiers.bounded import judge as judge_bounded
from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair, from_mask
from tealite_verify.tiers.primitives import compute_dtype, gamma, underflow_error, unit_roundoff
from tealite_verify.tiers.ulp import with_output_rounding

_ROW_CHUNK = 256  # rows per vectorised selection check (bounds the (rows, combos, E) arrays)


def _u(numerics: Numerics) -> float:
    return unit_roundoff(compute_dtype(numerics))


def _exp_units(numerics: Numerics) -> float:
    return float(numerics.exp_ulps if numerics.exp_ulps is not None else 1)


def _second_order(d):
    return d * (1 + d)


def softmax_rel_error(x, mask, numerics: Numerics):
    """Per-element relative error bound d_y of a float32 softmax over ``mask`` (all: None)."""
    x = np.asarray(x, np.float64)
    mask = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    u, ne = _u(numerics), _exp_units(numerics)
    xm = np.where(mask, x, -np.inf)
    m = np.max(xm, axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
    with np.errstate(invalid="ignore", over="ignore"):
        dist = np.where(mask, np.abs(x - m), 0.0)
        y = np.where(mask, np.exp(-dist), 0.0)
        y = y / np.maximum(np.sum(y, axis=-1, keepdims=True), 1e-300)
    n = np.maximum(np.sum(mask, axis=-1, keepdims=True), 1)
    div = (numerics.fp32_div_ulps or 0) * u  # an approximate division (declared)
    # 3 u |x - m|: the subtraction, then log2 e and the product each rounded once more by an
    # exp evaluated as exp2 (Triton's tl.exp on a GPU; an H100 fuzz case at |x - m| = 40 was
    # 1.14 times the bound without them)
    d = 3 * u * dist + 3 * u * np.sum(y * dist, axis=-1, keepdims=True) + 2 * ne * u \
        + gamma(n, u) + u + div
    return _second_order(d)


def sigmoid_rel_error(logits, numerics: Numerics) -> np.ndarray:
    """d_s per element of ``logits`` (module docstring)."""
    x = np.asarray(logits, np.float64)
    u = _u(numerics)
    return _second_order((_exp_units(numerics) + 3) * u
                         + 2 * (1 - ref.sigmoid(x)) * u * np.abs(x))


def _row_max(d):
    return np.max(d, axis=-1, keepdims=True, initial=0.0)


# ---- the selection ----------------------------------------------------------------------
def normalised_underflow(logits, mask, numerics: Numerics):
    """The absolute error a flushed sigmoid leaves in ``w = s / (sum_mask s + eps)``: each s
    may be off by the compute format's smallest normal, the sum by n of them, so w moves by
    up to ``tiny (1 + n w) / S`` (large where every s of the row underflows)."""
    x = np.asarray(logits, np.float64)
    mask = np.asarray(mask, bool)
    s = np.where(mask, ref.sigmoid(x), 0.0)
    total = np.sum(s, axis=-1, keepdims=True) + 1e-20
    n = np.sum(mask, axis=-1, keepdims=True)
    tiny = underflow_error(compute_dtype(numerics))
    return np.where(mask, tiny * (1 + n * s / total) / total, 0.0)


def routing_score_error(logits, route, *, score_function: str, use_pre_softmax: bool,
                        has_bias: bool, numerics: Numerics, aux_topk: int | None = None):
    """e_r: the absolute error bound of the backend's routing scores (``aux_topk``: the
    aux-loss scores', which normalise the sigmoid over every expert when it is > 1)."""
    x = np.asarray(logits, np.float64)
    tiny = underflow_error(compute_dtype(numerics))
    if score_function == "softmax" and not use_pre_softmax and aux_topk is None:
        return np.zeros(x.shape)
    if score_function == "softmax":
        return np.abs(route) * softmax_rel_error(x, None, numerics) + tiny
    if aux_topk is not None and aux_topk > 1:
        rel = aux_score_rel_error(x, topk=aux_topk, score_function=score_function,
                                  numerics=numerics)
        return np.abs(route) * rel + normalised_underflow(x, np.ones(x.shape, bool), numerics)
    s = ref.sigmoid(x)
    err = s * sigmoid_rel_error(x, numerics) + tiny
    return err + (_u(numerics) * np.abs(route) if has_bias else 0.0)


def _valid_topk(route, err, chosen, elig):
    """(rows, ...) whether ``chosen`` is a valid top-k of ``route`` within ``err`` among
    ``elig`` (broadcast over a leading combination axis)."""
    with np.errstate(invalid="ignore"):
        lo = np.where(chosen, route + err, np.inf).min(axis=-1)
        hi = np.where(elig & ~chosen, route - err, -np.inf).max(axis=-1)
    inside = ~np.any(chosen & ~elig, axis=-1)
    return inside & (lo >= hi)


_MAX_COMBOS = 256  # group choices enumerated per row; beyond, S is completed greedily


def _group_combos(num_groups: int, group_topk: int) -> np.ndarray | None:
    """Every choice of ``group_topk`` groups as (nc, G) bool, or None when there are more
    than _MAX_COMBOS."""
    if comb(num_groups, group_topk) > _MAX_COMBOS:
        return None
    return np.array([np.isin(np.arange(num_groups), c)
                     for c in combinations(range(num_groups), group_topk)], bool)


def _greedy_groups(g, chosen_groups, group_topk: int) -> np.ndarray:
    """(T, 1, G): the chosen experts' groups completed by the best remaining group scores
    (exact when the group errors are equal: a valid S then exists iff this one is valid)."""
    key = np.where(chosen_groups, np.inf, g)
    order = np.argsort(-key, axis=-1, kind="stable")[:, :group_topk]
    s = np.zeros(g.shape, bool)
    np.put_along_axis(s, order, True, axis=-1)
    return s[:, None, :]


def _valid_rows(route, err, chosen, topk, num_groups, group_topk, u: float) -> np.ndarray:
    t, e = route.shape
    if group_topk is None:
        return _valid_topk(route, err, chosen, np.ones_like(chosen))
    size, per = e // num_groups, topk // group_topk
    grouped = route.reshape(t, num_groups, size)
    top = np.sort(grouped, axis=-1)[..., ::-1][..., :per]
    g = np.sum(top, axis=-1)
    e_g = per * np.max(err.reshape(t, num_groups, size), axis=-1) \
        + gamma(per, u) * np.sum(np.abs(top), axis=-1)
    combos = _group_combos(num_groups, group_topk)
    if combos is None:
        combos_rows = _greedy_groups(g, chosen.reshape(t, num_groups, size).any(-1),
                                     group_topk)
    out = np.zeros(t, bool)
    for a in range(0, t, _ROW_CHUNK):
        sl = slice(a, a + _ROW_CHUNK)
        sets = combos[None] if combos is not None else combos_rows[sl]   # (rows|1, nc, G)
        elig = np.repeat(sets, size, axis=-1)                             # (rows|1, nc, E)
        groups_ok = _valid_topk(g[sl, None, :], e_g[sl, None, :], sets, np.ones_like(sets))
        experts_ok = _valid_topk(route[sl, None, :], err[sl, None, :], chosen[sl, None, :],
                                 elig)
        out[sl] = np.any(groups_ok & experts_ok, axis=1)
    return out


def _tie_rule_rows(tie_keys, chosen, group_size: int) -> np.ndarray:
    """Rows where, among experts with equal tie keys (in one group), the chosen ones are the
    lowest-index ones (TieRule.LOWEST_INDEX)."""
    t, e = chosen.shape
    ok = np.ones(t, bool)
    if t == 0 or e < 2:
        return ok
    group = np.broadcast_to(np.arange(e) // group_size, (t, e))
    keys = [np.broadcast_to(k, (t, e)) for k in tie_keys]
    for r in range(t):
        order = np.lexsort((np.arange(e),) + tuple(k[r] for k in keys[::-1]) + (group[r],))
        same = group[r][order][1:] == group[r][order][:-1]
        for k in keys:
            same &= k[r][order][1:] == k[r][order][:-1]
        c = chosen[r][order]
        ok[r] = not np.any(same & c[1:] & ~c[:-1])
    return ok


def check_selection(got_map, logits, *, topk: int, score_function: str,
                    use_pre_softmax: bool = False, num_groups=None, group_topk=None,
                    expert_bias=None, route=None, aux: bool = False,
                    numerics: Numerics) -> Metrics:
    """The routing map under the rule in the module docstring (one verdict per token)."""
    x = np.asarray(logits, np.float64)
    if got_map is None or tuple(got_map.shape) != x.shape or str(got_map.dtype) != "torch.bool":
        what = None if got_map is None else (tuple(got_map.shape), got_map.dtype)
        return Metrics(Tier.ROUTER, 0, 0, np.inf, np.inf,
                       shape_error=f"routing_map must be bool {x.shape}, got {what}")
    chosen = got_map.detach().cpu().numpy().astype(bool)
    if route is None:
        route = ref.routing_scores(x, score_function=score_function,
                                   use_pre_softmax=use_pre_softmax, expert_bias=expert_bias)
    err = routing_score_error(x, route, score_function=score_function,
                              use_pre_softmax=use_pre_softmax,
                              has_bias=expert_bias is not None, numerics=numerics,
                              aux_topk=topk if aux else None)
    counts = chosen.sum(axis=1)
    ok = (counts == topk) & _valid_rows(route, err, chosen, topk, num_groups, group_topk,
                                                _u(numerics))
    if numerics.topk_ties == TieRule.LOWEST_INDEX:
        keys = [x] + ([np.asarray(expert_bias, np.float64)[None, :]]
                      if expert_bias is not None else [])
        size = x.shape[1] // num_groups if group_topk is not None else max(x.shape[1], 1)
        ok &= _tie_rule_rows(keys, chosen, size)
    return from_mask(Tier.ROUTER, ok, counts, np.full(counts.shape, topk))


def selection_or_reference(got_map, want_map: np.ndarray) -> np.ndarray:
    """The backend's selection where it is well formed (exactly as many per row as the
    reference), else the reference's: weights are judged at what the backend chose."""
    if got_map is None or tuple(got_map.shape) != want_map.shape:
        return want_map
    got = got_map.detach().cpu().numpy().astype(bool)
    rows_ok = got.sum(axis=1) == want_map.sum(axis=1)
    return np.where(rows_ok[:, None], got, want_map)


# ---- weights, scores and gradients ------------------------------------------------------
def weight_rel_error(logits, chosen, *, topk: int, score_function: str,
                     use_pre_softmax: bool, scaled: bool, numerics: Numerics):
    u = _u(numerics)
    if score_function == "softmax":
        d = softmax_rel_error(logits, None if use_pre_softmax else chosen, numerics)
    else:
        d_s = sigmoid_rel_error(logits, numerics)
        # normalised: the score's own error plus its row's largest (in the sum)
        d = d_s + _row_max(d_s) + gamma(topk, u) + u if topk > 1 else d_s
    return _second_order(d + (u if scaled else 0.0))


def value_tolerance(ref, rel, out_dtype, numerics: Numerics, absolute=0.0):
    """``|ref| rel`` plus underflow (and ``absolute``), then one rounding into
    ``out_dtype``."""
    e_c = np.abs(ref) * rel + 2 * underflow_error(compute_dtype(numerics)) + absolute
    return with_output_rounding(ref, np.where(ref == 0, 0.0, e_c), out_dtype)


def softmax_bwd_tolerance(g, y, mask, x, n, numerics: Numerics):
    """The compute error of ``y (g - sum g y)`` (module docstring)."""
    u = _u(numerics)
    d_y = softmax_rel_error(x, mask, numerics)
    gy = np.abs(g) * y
    a = np.abs(g) + np.sum(gy, axis=-1, keepdims=True)
    # the sum's error: each term off by its own d_y (weighted, not the row's worst: a
    # far-below-max logit has a large d_y and a negligible y)
    p_err = np.sum(gy * d_y, axis=-1, keepdims=True)
    tiny = underflow_error(compute_dtype(numerics))
    # a y that underflows (subnormal or flushed) is off by up to tiny: times |g - P| <= a
    return y * (a * (d_y + gamma(n, u) + 3 * u) + p_err) + 2 * tiny * a + tiny


def sigmoid_bwd_tolerance(g, logits, mask, normalised: bool, k, numerics: Numerics):
    """The compute error of the (normalised) sigmoid backward (module docstring); d_s is
    taken at its row's largest (the normalised gradient mixes the row's scores)."""
    s = ref.sigmoid(np.asarray(logits, np.float64))
    u, d_s = _u(numerics), _row_max(sigmoid_rel_error(logits, numerics))
    if normalised:
        total = np.sum(s * mask, axis=-1, keepdims=True) + 1e-20
        m_d = (np.abs(g) / total
               + np.sum(np.abs(g) * s * mask, axis=-1, keepdims=True) / total ** 2) * mask
        rho = 3 * d_s + 3 * gamma(k, u) + 6 * u
    else:
        m_d, rho = np.abs(g) * mask, u
    e = m_d * s * (1 - s) * (rho + d_s + 2 * u) + m_d * s * (s * d_s + u * (1 - s))
    tiny = underflow_error(compute_dtype(numerics))
    return e * (1 + rho + d_s) + 3 * tiny * (1 + m_d)


def judge(got, want, tol, out_dtype) -> Metrics:
    return judge_bounded(got, want, tol, out_dtype, Tier.ROUTER)


def pair_of(check):
    """The pair rule: each backend against the reference under its own numerics."""
    def pair(out_x, out_y, num_x, num_y) -> Metrics:
        return combine_pair(check(out_x, num_x), check(out_y, num_y))
    return pair


def unit_error(numerics: Numerics) -> float:
    return _u(numerics)


def output_rounding(ref_value, compute_err, out_dtype):
    return with_output_rounding(ref_value, compute_err, out_dtype)


def missing(name: str) -> Metrics:
    return Metrics(Tier.ROUTER, 0, 0, np.inf, np.inf, shape_error=f"output {name!r} missing")


def aux_score_rel_error(logits, *, topk: int, score_function: str, numerics: Numerics):
    """The aux scores: softmax over all experts, or sigmoid normalised over all of them."""
    u = _u(numerics)
    if score_function == "softmax":
        return softmax_rel_error(logits, None, numerics)
    d_s = sigmoid_rel_error(logits, numerics)
    e = np.shape(logits)[-1]
    return _second_order(d_s + _row_max(d_s) + gamma(max(e, 1), u) + u) if topk > 1 else d_s


def aux_loss_tolerance(want, magnitude, shape, out_dtype, numerics: Numerics):
    """``(gamma_T + gamma_E + 6u) M`` (module docstring), then the output rounding."""
    u = _u(numerics)
    t, e = shape
    rel = gamma(max(t, 1), u) + gamma(max(e, 1), u) + 6 * u
    e_c = _second_order(rel) * np.abs(magnitude) + 2 * underflow_error(compute_dtype(numerics))
    return with_output_rounding(want, e_c, out_dtype)
