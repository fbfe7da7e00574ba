"""Specs for the MoE router (TE's fused router; semantics in tealite/ops/router.py): top-k
forward / backward, the aux-loss scores forward / backward and the aux loss forward /
backward.  Cases come from strategies/moe.py's router block; every output is judged by the
``router`` tier (tiers/router.py): the routing map within the near-ties the backend's score
rounding can flip (exactly under a declared tie rule), the weights at the backend's own
selection, gradients and the aux loss within their derived bounds.
"""
from __future__ import annotations

import numpy as np
import torch

import tealite
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import router as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.moe import ROUTER_KINDS, aux_loss_cases, router_cases
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import router as tier
from tealite_verify.tiers.metrics import Tier


def options(case) -> dict:
    """The router keyword arguments a case names (shared by the call and the reference)."""
    kind = case["kind"]
    groups = case.get("groups")
    return dict(score_function="sigmoid" if kind == "sigmoid" else "softmax",
                use_pre_softmax=kind == "softmax_pre",
                num_groups=groups[0] if groups else None,
                group_topk=groups[1] if groups else None,
                scaling_factor=case.get("scaling_factor"))


def _bwd_options(case) -> dict:
    o = options(case)
    return {k: o[k] for k in ("score_function", "use_pre_softmax", "scaling_factor")}


def make_logits(case, device) -> torch.Tensor:
    return generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)


def make_bias(case, device) -> torch.Tensor | None:
    if not case.get("bias"):
        return None
    g = torch.Generator().manual_seed(case["seed"] + 5)
    b = torch.randn(case["shape"][1], generator=g) * 0.1
    if case.get("bias_ties"):
        b = torch.round(b * 20) / 20  # repeated values: exact ties after the bias
    return (b + case.get("bias_shift", 0.0)).to(device)


# ---- router_fwd ------------------------------------------------------------------------
def fwd_inputs(case, device) -> dict:
    return {"logits": make_logits(case, device), "expert_bias": make_bias(case, device)}


def fwd_call(inputs, case, backend):
    probs, routing_map = tealite.router_fwd(inputs["logits"], case["topk"], backend=backend,
                                            expert_bias=inputs["expert_bias"], **options(case))
    return {"probs": probs, "routing_map": routing_map}


def fwd_reference(x, case):
    o, topk, out_dt = options(case), case["topk"], dtype_of(case["dtype"])
    bias = x.get("expert_bias")
    probs, chosen = ref.router_fwd(x["logits"], topk=topk, expert_bias=bias, **o)
    sel = dict(topk=topk, score_function=o["score_function"],
               use_pre_softmax=o["use_pre_softmax"], num_groups=o["num_groups"],
               group_topk=o["group_topk"], expert_bias=bias)

    def check_map(outputs, numerics):
        return tier.check_selection(outputs.get("routing_map"), x["logits"], numerics=numerics,
                                    **sel)

    def check_probs(outputs, numerics):
        got = outputs.get("probs")
        at = tier.selection_or_reference(outputs.get("routing_map"), chosen)
        want = ref.weights(x["logits"], at, topk=topk, score_function=o["score_function"],
                           use_pre_softmax=o["use_pre_softmax"],
                           scaling_factor=o["scaling_factor"])
        rel = tier.weight_rel_error(x["logits"], at, topk=topk,
                                    score_function=o["score_function"],
                                    use_pre_softmax=o["use_pre_softmax"],
                                    scaled=o["scaling_factor"] is not None, numerics=numerics)
        if got is None:
            return tier.missing("probs")
        flushed = 0.0
        if o["score_function"] == "sigmoid" and topk > 1:
            scale = 1.0 if o["scaling_factor"] is None else o["scaling_factor"]
            flushed = scale * tier.normalised_underflow(x["logits"], at, numerics)
        tol = tier.value_tolerance(want, rel, out_dt, numerics, absolute=flushed)
        return tier.judge(got, want, tol, out_dt)

    return {"routing_map": Expected(chosen, torch.bool, Tier.ROUTER, check=check_map,
                                    check_pair=tier.pair_of(check_map)),
            "probs": Expected(probs, out_dt, Tier.ROUTER, check=check_probs,
                              check_pair=tier.pair_of(check_probs))}


# ---- router_bwd --------------------------------------------------------------------------
def bwd_inputs(case, device) -> dict:
    logits = make_logits(case, device)
    o = options(case)
    route = ref.routing_scores(logits.double().cpu().numpy(), score_function=o["score_function"],
                               use_pre_softmax=o["use_pre_softmax"])
    chosen = ref.select(route, topk=case["topk"])
    grad = generate({"kind": "normal", "scale": 1.0, "sample_dtype": "float32"}, case["shape"],
                    logits.dtype, case["seed"] + 1, device)
    return {"grad_probs": grad, "logits": logits,
            "routing_map": torch.from_numpy(chosen).to(device)}


def bwd_call(inputs, case, backend):
    return {"grad_logits": tealite.router_bwd(inputs["grad_probs"], inputs["logits"],
                                              inputs["routing_map"], case["topk"],
                                              backend=backend, **_bwd_options(case))}


def _grad_bound(x, g, mask, case, *, aux: bool):
    """(reference grad, bound(numerics)) of a router / aux-score backward."""
    o, topk = _bwd_options(case), case["topk"]
    logits, out_dt = x["logits"], dtype_of(case["dtype"])
    if aux:
        want = ref.aux_scores_bwd(g, logits, topk=topk, score_function=o["score_function"])
        scale = 1.0
    else:
        want = ref.router_bwd(g, logits, mask, topk=topk, **o)
        scale = 1.0 if o["scaling_factor"] is None else float(o["scaling_factor"])
    gs = np.asarray(g, np.float64) * scale
    if not aux:
        gs = gs * mask

    def bound(numerics):
        if o["score_function"] == "sigmoid":
            e = tier.sigmoid_bwd_tolerance(gs, logits, mask, topk > 1, int(mask.sum(-1).max(
                initial=1)), numerics)
        elif o["use_pre_softmax"] or aux:
            y = ref.softmax(logits)
            e = tier.softmax_bwd_tolerance(gs, y, np.ones_like(mask), logits, logits.shape[1],
                                           numerics)
        else:
            y = ref.softmax(logits, mask)
            e = tier.softmax_bwd_tolerance(gs, y, mask, logits, topk, numerics)
        if scale != 1.0:
            e = e + tier.unit_error(numerics) * np.abs(want)
        return tier.output_rounding(want, e, out_dt)

    return want, bound


def bwd_reference(x, case):
    mask = np.asarray(x["routing_map"], bool)
    want, bound = _grad_bound(x, x["grad_probs"], mask, case, aux=False)
    return {"grad_logits": Expected(want, dtype_of(case["dtype"]), Tier.ROUTER, bound)}


# ---- aux scores --------------------------------------------------------------------------
def aux_fwd_inputs(case, device) -> dict:
    return {"logits": make_logits(case, device)}


def aux_fwd_call(inputs, case, backend):
    scores, routing_map = tealite.router_aux_scores_fwd(
        inputs["logits"], case["topk"], score_function=options(case)["score_function"],
        backend=backend)
    return {"scores": scores, "routing_map": routing_map}


def aux_fwd_reference(x, case):
    fn, topk = options(case)["score_function"], case["topk"]
    scores, chosen = ref.aux_scores_fwd(x["logits"], topk=topk, score_function=fn)

    def check_map(outputs, numerics):
        return tier.check_selection(outputs.get("routing_map"), x["logits"], topk=topk,
                                    score_function=fn, route=scores, numerics=numerics,
                                    aux=True)

    def bound(numerics):
        rel = tier.aux_score_rel_error(x["logits"], topk=topk, score_function=fn,
                                       numerics=numerics)
        flushed = tier.normalised_underflow(x["logits"], np.ones(np.shape(x["logits"]), bool),
                                            numerics) if fn == "sigmoid" and topk > 1 else 0.0
        return tier.value_tolerance(scores, rel, torch.float32, numerics, absolute=flushed)

    return {"scores": Expected(scores, torch.float32, Tier.ROUTER, bound),
            "routing_map": Expected(chosen, torch.bool, Tier.ROUTER, check=check_map,
                                    check_pair=tier.pair_of(check_map))}


def aux_bwd_inputs(case, device) -> dict:
    grad = generate({"kind": "normal", "scale": 1.0, "sample_dtype": "float32"}, case["shape"],
                    torch.float32, case["seed"] + 1, device)
    return {"grad_scores": grad, "logits": make_logits(case, device)}


def aux_bwd_call(inputs, case, backend):
    return {"grad_logits": tealite.router_aux_scores_bwd(
        inputs["grad_scores"], inputs["logits"], case["topk"],
        score_function=options(case)["score_function"], backend=backend)}


def aux_bwd_reference(x, case):
    mask = np.ones(np.shape(x["logits"]), bool)
    want, bound = _grad_bound(x, x["grad_scores"], mask, case, aux=True)
    return {"grad_logits": Expected(want, dtype_of(case["dtype"]), Tier.ROUTER, bound)}


# ---- aux loss ----------------------------------------------------------------------------
def _counts(case, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(case["seed"] + 3)
    return torch.randint(0, case["max_count"] + 1, (case["shape"][1],), generator=g,
                         dtype=torch.int32).to(device)


def loss_fwd_inputs(case, device) -> dict:
    probs = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    return {"probs": probs, "tokens_per_expert": _counts(case, device)}


def _loss_args(case) -> dict:
    return dict(total_num_tokens=case["total_num_tokens"], topk=case["topk"],
                coeff=case["coeff"])


def loss_fwd_call(inputs, case, backend):
    return {"aux_loss": tealite.moe_aux_loss_fwd(
        inputs["probs"], inputs["tokens_per_expert"], case["total_num_tokens"],
        case["shape"][1], case["topk"], case["coeff"], backend=backend)}


def loss_fwd_reference(x, case):
    want = ref.aux_loss_fwd(x["probs"], x["tokens_per_expert"], **_loss_args(case))
    mag = ref.aux_loss_fwd(np.abs(x["probs"]), x["tokens_per_expert"], **_loss_args(case))
    out_dt = dtype_of(case["dtype"])
    return {"aux_loss": Expected(want, out_dt, Tier.ROUTER, lambda n: tier.aux_loss_tolerance(
        want, mag, case["shape"], out_dt, n))}


def loss_bwd_inputs(case, device) -> dict:
    x = loss_fwd_inputs(case, device)
    g = torch.Generator().manual_seed(case["seed"] + 4)
    x["grad_aux_loss"] = torch.randn((), generator=g).to(dtype_of(case["dtype"])).to(device)
    return x


def loss_bwd_call(inputs, case, backend):
    return {"grad_probs": tealite.moe_aux_loss_bwd(
        inputs["grad_aux_loss"], inputs["probs"], inputs["tokens_per_expert"],
        case["total_num_tokens"], case["shape"][1], case["topk"], case["coeff"],
        backend=backend)}


def loss_bwd_reference(x, case):
    want = ref.aux_loss_bwd(x["grad_aux_loss"], tuple(case["shape"]), x["tokens_per_expert"],
                            **_loss_args(case))
    out_dt = dtype_of(case["dtype"])
    return {"grad_probs": Expected(want, out_dt, Tier.ROUTER, lambda n: tier.value_tolerance(
        want, 6 * tier.unit_error(n), out_dt, n))}


# ---- registration ------------------------------------------------------------------------
def _smoke(shape, topk, kind, dtype, **kw):
    case = {"shape": shape, "topk": topk, "kind": kind, "dtype": dtype, "groups": None,
            "scaling_factor": None, "bias": False,
            "dist": {"kind": "normal", "scale": 1.0, "sample_dtype": "float32"}, "seed": 3}
    case.update(kw)
    return case


_SMOKE = (
    _smoke([13, 8], 2, "softmax", "float32"),
    _smoke([7, 16], 4, "softmax_pre", "bfloat16", groups=[4, 2], scaling_factor=1.2),
    _smoke([11, 32], 8, "sigmoid", "float16", groups=[8, 4], bias=True, bias_ties=True),
    # every score + bias negative: the sign of the order-preserving keys (triton's fast path)
    _smoke([19, 64], 8, "sigmoid", "bfloat16", groups=[8, 4], bias=True, bias_shift=-2.0),
    _smoke([5, 6], 1, "sigmoid", "float32"),
    _smoke([9, 8], 3, "softmax", "bfloat16", dist={"kind": "integers", "hi": 1}),
    _smoke([0, 4], 2, "softmax", "float32"),
)
_AUX_SMOKE = tuple(c for c in _SMOKE if c["kind"] != "softmax_pre")
_LOSS_SMOKE = tuple({"shape": s, "topk": k, "total_num_tokens": t, "coeff": 0.01,
                     "max_count": 1000, "dtype": dt, "seed": 2,
                     "dist": {"kind": "uniform", "lo": 0.0, "hi": 1.0}}
                    for s, k, t, dt in (([13, 8], 2, 13, "float32"), ([7, 32], 4, 28,
                                                                     "bfloat16"),
                                        ([0, 4], 1, 5, "float16")))

_EDGES = cov.edge_cells((cov.EMPTY, cov.TIES, cov.MISALIGNED))
_COVERAGE = cov.layout_cells("kind", ROUTER_KINDS) + cov.layout_cells("bias", (True, False)) \
    + _EDGES
_AUX_COVERAGE = cov.layout_cells("kind", ("softmax", "sigmoid")) + _EDGES
_LOSS_COVERAGE = cov.edge_cells((cov.EMPTY, cov.MISALIGNED))

_SPECS = (
    (Op.ROUTER_FWD, router_cases, fwd_inputs, fwd_call, fwd_reference, _SMOKE, _COVERAGE),
    (Op.ROUTER_BWD, router_cases, bwd_inputs, bwd_call, bwd_reference, _SMOKE, _COVERAGE),
    (Op.ROUTER_AUX_SCORES_FWD, lambda dtype=None, size="ci": router_cases(dtype, size, aux=True),
     aux_fwd_inputs, aux_fwd_call, aux_fwd_reference, _AUX_SMOKE, _AUX_COVERAGE),
    (Op.ROUTER_AUX_SCORES_BWD, lambda dtype=None, size="ci": router_cases(dtype, size, aux=True),
     aux_bwd_inputs, aux_bwd_call, aux_bwd_reference, _AUX_SMOKE, _AUX_COVERAGE),
    (Op.MOE_AUX_LOSS_FWD, aux_loss_cases, loss_fwd_inputs, loss_fwd_call, loss_fwd_reference,
     _LOSS_SMOKE, _LOSS_COVERAGE),
    (Op.MOE_AUX_LOSS_BWD, aux_loss_cases, loss_bwd_inputs, loss_bwd_call, loss_bwd_reference,
     _LOSS_SMOKE, _LOSS_COVERAGE),
)
for _name, _cases, _make, _call, _ref, _smokes, _cov in _SPECS:
    register(OpSpec(name=_name, family="router", cases=_cases, make_inputs=_make, call=_call,
                    reference=_ref, smoke_cases=_smokes, coverage=_cov))
