"""The MoE router (TE's fused router, transformer_engine/pytorch/router.py): top-k over experts
with softmax or sigmoid scores, the scores for the auxiliary load-balancing loss, and the aux
loss itself, forward and backward.

``logits`` is (T, E): T tokens (0 allowed) by E experts, float32 / bfloat16 / float16.  The
forward, for one token, in float32 (:class:`tealite.moe_types.RouterConfig` names the options):

1. routing scores ``r``: the logits themselves (softmax, ``use_pre_softmax=False``: the softmax
   comes after the top-k), ``softmax(logits)`` over all E (``use_pre_softmax=True``), or
   ``sigmoid(logits)`` (+ ``expert_bias``, float (E,), sigmoid only: the bias moves the
   selection, never the weights: TE's aux-loss-free balancing);
2. group-limited top-k (``num_groups`` and ``group_topk``): the E experts are cut into
   ``num_groups`` consecutive groups; a group's score is the sum of its ``topk // group_topk``
   largest ``r``; only the ``group_topk`` best groups' experts stay eligible;
3. top-k: the ``topk`` largest eligible ``r``.  Which of several *equal* scores is taken is
   the backend's declared tie rule (``numerics.topk_ties``), unspecified when undeclared;
4. weights of the chosen experts: ``softmax`` of their logits (post-softmax), their
   pre-softmax score, or their sigmoid ``s`` (without the bias), divided by
   ``sum(s) + 1e-20`` when ``topk > 1``; times ``scaling_factor`` (None: 1).

``probs`` (T, E) in logits' dtype holds the weights at the chosen experts and exact zeros
elsewhere; ``routing_map`` (T, E) bool marks the chosen experts (exactly ``topk`` per row).

Backward: ``router_bwd(grad_probs, logits, routing_map, topk, ...)`` -> grad_logits (logits'
dtype), the exact gradient of step 4 (and of step 1's softmax / sigmoid) at the given
routing map.  TE saves the float32 scores (``intermediate_output``) and the map; here the
contract takes the logits and the map instead: the scores are a function of the two, and a
typed input the harness can draw beats a buffer whose contents depend on the forward kernel.
The selection itself has no gradient; grouping and the expert bias only move the selection,
so backward does not take them.

Aux loss (TE's ``fused_compute_score_for_moe_aux_loss`` / ``fused_moe_aux_loss``):

* ``router_aux_scores_fwd(logits, topk, score_function)`` -> (scores float32 (T, E),
  routing_map bool (T, E)): softmax over all experts, or sigmoid divided by its sum over all
  experts (+ 1e-20) when ``topk > 1``; the map is the top-k of the scores (no groups, no bias).
  TE returns the two the other way round; here probabilities come first, as in ``router_fwd``.
* ``router_aux_scores_bwd(grad_scores, logits, topk, score_function)`` -> grad_logits.
* ``moe_aux_loss_fwd(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff)``
  -> 0-d, probs' dtype: ``C * sum_e tokens_per_expert[e] * sum_t probs[t, e]`` with
  ``C = num_experts * coeff / (topk * total_num_tokens^2)`` (float32 math);
* ``moe_aux_loss_bwd(grad_aux_loss, probs, tokens_per_expert, ...)`` -> grad_probs (probs'
  shape and dtype): ``C * tokens_per_expert[e] * grad_aux_loss``.
"""
from __future__ import annotations

import functools

import torch

import tealite.registry as registry
from tealite._checks import (check_choice, check_finite_number, check_same_device,
                             check_tensor, require)
from tealite.moe_types import RouterConfig, ScoreFunction
from tealite.router_checks import COUNTS_THE_MAP, check_map_counts, vouched
from tealite.types import Op

_COUNTS = (torch.int32, torch.int64)


def _positive_int(name: str, value) -> int:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            f"{name} must be an int >= 1, got {value!r}")
    return value


def _score_function(score_function) -> ScoreFunction:
    check_choice("score_function", score_function, tuple(s.value for s in ScoreFunction))
    return ScoreFunction(score_function)


def _check_logits(name: str, logits) -> tuple[int, int]:
    check_tensor(name, logits, ndim=2)
    return logits.shape[0], logits.shape[1]


def _check_topk(topk, experts: int) -> int:
    _positive_int("topk", topk)
    require(topk <= experts, f"topk must be <= the number of experts {experts} (logits' "
                             f"last dim), got {topk}")
    return topk


def router_config(topk, experts: int, *, score_function="softmax", use_pre_softmax=False,
                  num_groups=None, group_topk=None, scaling_factor=None) -> RouterConfig:
    """The validated :class:`RouterConfig` of a router call over ``experts`` experts.

    Remembered per distinct arguments (``typed``: True is not 1; a refusal is not
    remembered): the checks and their messages cost ~10 us of Python per call, as much as
    the kernel launch at TE's 16384 x 256."""
    args = (topk, experts, score_function, use_pre_softmax, num_groups, group_topk,
            scaling_factor)
    try:
        return _remembered_config(*args)
    except TypeError:  # an unhashable argument: checked (and refused) without the cache
        return _router_config(*args)


def _router_config(topk, experts, score_function, use_pre_softmax, num_groups, group_topk,
                   scaling_factor) -> RouterConfig:
    _check_topk(topk, experts)
    fn = _score_function(score_function)
    require(isinstance(use_pre_softmax, bool),
            f"use_pre_softmax must be a bool, got {use_pre_softmax!r}")
    require(not use_pre_softmax or fn == ScoreFunction.SOFTMAX,
            "use_pre_softmax applies to score_function='softmax' only")
    require((num_groups is None) == (group_topk is None),
            f"num_groups and group_topk go together (group-limited top-k), got "
            f"num_groups={num_groups!r}, group_topk={group_topk!r}")
    if num_groups is not None:
        _positive_int("num_groups", num_groups)
        _positive_int("group_topk", group_topk)
        require(experts % num_groups == 0, f"the number of experts {experts} must be "
                                           f"divisible by num_groups {num_groups}")
        require(group_topk <= num_groups,
                f"group_topk must be <= num_groups {num_groups}, got {group_topk}")
        require(topk % group_topk == 0,
                f"topk {topk} must be a multiple of group_topk {group_topk} (each group's "
                f"score sums its topk // group_topk best experts)")
        size = experts // num_groups
        require(topk // group_topk <= size, f"topk // group_topk = {topk // group_topk} must "
                                            f"be <= the group size {size}")
        require(topk <= group_topk * size, f"topk {topk} must be <= group_topk * group size "
                                           f"= {group_topk * size} (the eligible experts)")
    if scaling_factor is not None:
        scaling_factor = check_finite_number("scaling_factor", scaling_factor)
    return RouterConfig(topk, fn, use_pre_softmax, num_groups, group_topk, scaling_factor)


_remembered_config = functools.lru_cache(maxsize=1024, typed=True)(_router_config)


def _params(logits, config: RouterConfig, *, expert_bias: bool, device) -> dict:
    return dict(dtype=logits.dtype, tokens=logits.shape[0], experts=logits.shape[1],
                topk=config.topk, score_function=config.score_function.value,
                use_pre_softmax=config.use_pre_softmax, num_groups=config.num_groups,
                group_topk=config.group_topk, scaling_factor=config.scaling_factor,
                expert_bias=expert_bias, device=registry.device_kind(device))


def router_fwd(logits, topk: int, *, score_function: str = "softmax",
               use_pre_softmax: bool = False, num_groups: int | None = None,
               group_topk: int | None = None, scaling_factor: float | None = None,
               expert_bias=None, backend: str | None = None):
    """(probs, routing_map) of TE's fused top-k router (see the module docstring)."""
    _, experts = _check_logits("logits", logits)
    config = router_config(topk, experts, score_function=score_function,
                           use_pre_softmax=use_pre_softmax, num_groups=num_groups,
                           group_topk=group_topk, scaling_factor=scaling_factor)
    if expert_bias is not None:
        require(config.score_function == ScoreFunction.SIGMOID,
                "expert_bias applies to score_function='sigmoid' only (as TE)")
        check_tensor("expert_bias", expert_bias, ndim=1)
        require(expert_bias.shape[0] == experts, f"expert_bias must have shape ({experts},) "
                                                 f"(one per expert), got "
                                                 f"{tuple(expert_bias.shape)}")
    device = check_same_device(logits=logits, expert_bias=expert_bias)
    params = _params(logits, config, expert_bias=expert_bias is not None, device=device)
    impl = registry.dispatch(Op.ROUTER_FWD, params, backend)
    return impl.fn(logits, config, expert_bias=expert_bias)


def _check_routing_map(routing_map, tokens: int, experts: int) -> None:
    check_tensor("routing_map", routing_map, ndim=2, dtypes=(torch.bool,))
    require(tuple(routing_map.shape) == (tokens, experts),
            f"routing_map must have logits' shape {(tokens, experts)}, got "
            f"{tuple(routing_map.shape)}")


def _check_grad(name: str, grad, like, dtype=None) -> None:
    check_tensor(name, grad, ndim=2, dtypes=None if dtype is None else (dtype,))
    if dtype is None:
        require(grad.dtype == like.dtype, f"{name} must have logits' dtype {like.dtype}, got "
                                          f"{grad.dtype}")
    require(grad.shape == like.shape, f"{name} must have logits' shape "
                                      f"{tuple(like.shape)}, got {tuple(grad.shape)}")


def router_bwd(grad_probs, logits, routing_map, topk: int, *, score_function: str = "softmax",
               use_pre_softmax: bool = False, scaling_factor: float | None = None,
               check_values: bool = True, backend: str | None = None):
    """grad_logits of ``router_fwd`` at the given routing map (see the module docstring).

    ``check_values=False`` skips the check that the map marks exactly ``topk`` experts per
    row (a read back to the host: a device sync); the caller vouches for it, as TE's fused
    router backward assumes (the map of ``router_fwd``).  Another map's gradient is then
    the formula's at that map."""
    require(isinstance(check_values, bool), f"check_values must be a bool, got {check_values!r}")
    tokens, experts = _check_logits("logits", logits)
    config = router_config(topk, experts, score_function=score_function,
                           use_pre_softmax=use_pre_softmax, scaling_factor=scaling_factor)
    _check_grad("grad_probs", grad_probs, logits)
    _check_routing_map(routing_map, tokens, experts)
    device = check_same_device(grad_probs=grad_probs, logits=logits, routing_map=routing_map)
    params = _params(logits, config, expert_bias=False, device=device)
    impl = registry.dispatch(Op.ROUTER_BWD, params, backend)
    if not check_values:
        with vouched():
            return impl.fn(grad_probs, logits, routing_map, config)
    if impl.fn not in COUNTS_THE_MAP:
        check_map_counts(routing_map, topk)
    return impl.fn(grad_probs, logits, routing_map, config)


def router_aux_scores_fwd(logits, topk: int, *, score_function: str = "softmax",
                          backend: str | None = None):
    """(scores float32, routing_map) for the aux loss (see the module docstring)."""
    _, experts = _check_logits("logits", logits)
    config = router_config(topk, experts, score_function=score_function)
    params = _params(logits, config, expert_bias=False, device=logits.device)
    impl = registry.dispatch(Op.ROUTER_AUX_SCORES_FWD, params, backend)
    return impl.fn(logits, config)


def router_aux_scores_bwd(grad_scores, logits, topk: int, *, score_function: str = "softmax",
                          backend: str | None = None):
    """grad_logits of ``router_aux_scores_fwd``'s scores."""
    _, experts = _check_logits("logits", logits)
    config = router_config(topk, experts, score_function=score_function)
    _check_grad("grad_scores", grad_scores, logits, torch.float32)
    device = check_same_device(grad_scores=grad_scores, logits=logits)
    params = _params(logits, config, expert_bias=False, device=device)
    impl = registry.dispatch(Op.ROUTER_AUX_SCORES_BWD, params, backend)
    return impl.fn(grad_scores, logits, config)


def _aux_params(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff) -> dict:
    check_tensor("probs", probs, ndim=2)
    _positive_int("num_experts", num_experts)
    require(probs.shape[1] == num_experts, f"probs' last dim {probs.shape[1]} must equal "
                                           f"num_experts {num_experts}")
    check_tensor("tokens_per_expert", tokens_per_expert, ndim=1, dtypes=_COUNTS)
    require(tokens_per_expert.shape[0] == num_experts,
            f"tokens_per_expert must have shape ({num_experts},), got "
            f"{tuple(tokens_per_expert.shape)}")
    _positive_int("total_num_tokens", total_num_tokens)
    _check_topk(topk, num_experts)
    coeff = check_finite_number("coeff", coeff)
    device = check_same_device(probs=probs, tokens_per_expert=tokens_per_expert)
    return dict(dtype=probs.dtype, tokens=probs.shape[0], experts=num_experts, topk=topk,
                total_num_tokens=total_num_tokens, coeff=coeff,
                device=registry.device_kind(device))


def moe_aux_loss_fwd(probs, tokens_per_expert, total_num_tokens: int, num_experts: int,
                     topk: int, coeff: float, *, backend: str | None = None):
    """TE's MoE aux loss, a 0-d tensor in probs' dtype (see the module docstring)."""
    params = _aux_params(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff)
    impl = registry.dispatch(Op.MOE_AUX_LOSS_FWD, params, backend)
    return impl.fn(probs, tokens_per_expert, total_num_tokens=total_num_tokens, topk=topk,
                   coeff=params["coeff"])


def moe_aux_loss_bwd(grad_aux_loss, probs, tokens_per_expert, total_num_tokens: int,
                     num_experts: int, topk: int, coeff: float, *, backend: str | None = None):
    """grad_probs of ``moe_aux_loss_fwd`` (probs' shape and dtype; probs gives only those)."""
    params = _aux_params(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff)
    check_tensor("grad_aux_loss", grad_aux_loss, ndim=0)
    check_same_device(grad_aux_loss=grad_aux_loss, probs=probs)
    impl = registry.dispatch(Op.MOE_AUX_LOSS_BWD, params, backend)
    return impl.fn(grad_aux_loss, probs, tokens_per_expert, total_num_tokens=total_num_tokens,
                   topk=topk, coeff=params["coeff"])


__all__ = ["router_fwd", "router_bwd", "router_aux_scores_fwd", "router_aux_scores_bwd",
           "moe_aux_loss_fwd", "moe_aux_loss_bwd", "router_config"]
