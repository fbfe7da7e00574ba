"""The MoE router: the front-end's argument checks, the float64 reference against an
independent formulation (TE's pure-PyTorch router of tests/pytorch/test_fused_router.py,
rewritten here: torch.topk, masked_fill, autograd for the backward), and the router tier
(tiers/router.py) catching deliberately wrong routers while passing correct ones that round,
or break ties, differently.

The variants are plug-in backends built from one parametrized implementation
(:func:`_fwd_variant`), each differing from a correct router in exactly one thing.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tealite
from tealite.backends.torch import router as T
from tealite.moe_types import SIGMOID_NORM_EPS, TieRule
from tealite.numerics import Numerics
from tealite_verify.references import router as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.tiers import router as tier

F32, F64 = torch.float32, torch.float64


# ---- the reference against TE's PyTorch formulation ---------------------------------------

def _te_router(logits, topk, *, use_pre_softmax=False, num_groups=None, group_topk=None,
               scaling_factor=None, score_function="softmax", expert_bias=None):
    """TE's unfused router (test_fused_router.py's topk_softmax_sigmoid_pytorch), float64."""
    t, e = logits.shape

    def top(scores):
        if group_topk:
            gs = scores.view(t, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(-1)
            idx = torch.topk(gs, k=group_topk, dim=-1, sorted=False)[1]
            gmask = torch.zeros_like(gs).scatter(1, idx, 1)
            smask = gmask.unsqueeze(-1).expand(t, num_groups, e // num_groups).reshape(t, -1)
            return torch.topk(scores.masked_fill(~smask.bool(), float("-inf")), k=topk, dim=-1)
        return torch.topk(scores, k=topk, dim=1)

    if score_function == "softmax":
        if use_pre_softmax:
            probs, idx = top(torch.softmax(logits, dim=-1))
        else:
            vals, idx = top(logits)
            probs = torch.softmax(vals, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        if expert_bias is not None:
            _, idx = top(scores + expert_bias)
            scores = torch.gather(scores, 1, idx)
        else:
            scores, idx = top(scores)
        probs = scores / (scores.sum(-1, keepdim=True) + SIGMOID_NORM_EPS) if topk > 1 else scores
    if scaling_factor:
        probs = probs * scaling_factor
    dense = torch.zeros_like(logits).scatter(1, idx, probs)
    return dense, torch.zeros_like(logits, dtype=torch.bool).scatter(1, idx, True)


TE_CONFIGS = [
    dict(score_function="softmax"),
    dict(score_function="softmax", use_pre_softmax=True, scaling_factor=1.2),
    dict(score_function="softmax", num_groups=8, group_topk=4),
    dict(score_function="softmax", use_pre_softmax=True, num_groups=4, group_topk=2),
    dict(score_function="sigmoid"),
    dict(score_function="sigmoid", bias=True, num_groups=8, group_topk=4, scaling_factor=2.5),
]


# (config, topk) pairs the front-end accepts: topk a multiple of group_topk.
TE_CASES = [(c, k) for c in TE_CONFIGS for k in (1, 4, 8) if k % c.get("group_topk", 1) == 0]


@pytest.mark.parametrize("cfg,topk", TE_CASES, ids=[
    f"top{k}-" + "-".join(f"{n}={v}" for n, v in c.items()) for c, k in TE_CASES])
def test_reference_matches_te_pytorch_router(cfg, topk):
    cfg = dict(cfg)
    g = torch.Generator().manual_seed(topk)
    x = torch.randn(61, 32, generator=g, dtype=F64)
    bias = torch.randn(32, generator=g, dtype=F64) * 0.1 if cfg.pop("bias", False) else None
    x.requires_grad_(True)
    probs, mask = _te_router(x, topk, expert_bias=bias, **cfg)
    want_p, want_m = ref.router_fwd(x.detach().numpy(), topk=topk, expert_bias=None if bias is
                                    None else bias.numpy(), **cfg)
    assert np.array_equal(mask.numpy(), want_m)
    np.testing.assert_allclose(probs.detach().numpy(), want_p, rtol=1e-12, atol=1e-15)
    grad = torch.randn(61, 32, generator=g, dtype=F64)
    probs.backward(grad)
    bwd = {k: cfg.get(k) for k in ("score_function", "use_pre_softmax", "scaling_factor")}
    want_g = ref.router_bwd(grad.numpy(), x.detach().numpy(), want_m, topk=topk,
                            **{k: v for k, v in bwd.items() if v is not None})
    np.testing.assert_allclose(x.grad.numpy(), want_g, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("fn", ["softmax", "sigmoid"])
def test_reference_aux_scores_and_loss_match_autograd(fn):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(23, 16, generator=g, dtype=F64, requires_grad=True)
    s = torch.softmax(x, -1) if fn == "softmax" else torch.sigmoid(x)
    if fn == "sigmoid":
        s = s / (s.sum(-1, keepdim=True) + SIGMOID_NORM_EPS)
    want_s, want_m = ref.aux_scores_fwd(x.detach().numpy(), topk=3, score_function=fn)
    np.testing.assert_allclose(s.detach().numpy(), want_s, rtol=1e-13)
    assert np.array_equal(torch.zeros_like(s, dtype=torch.bool).scatter(
        1, s.topk(3, -1)[1], True).numpy(), want_m)
    gs = torch.randn(23, 16, generator=g, dtype=F64)
    s.backward(gs)
    np.testing.assert_allclose(x.grad.numpy(), ref.aux_scores_bwd(
        gs.numpy(), x.detach().numpy(), topk=3, score_function=fn), rtol=1e-10, atol=1e-15)
    # The aux loss (TE's aux_loss_pytorch) and its gradient.
    p = torch.rand(23, 16, generator=g, dtype=F64, requires_grad=True)
    n = torch.randint(0, 100, (16,), generator=g)
    loss = (p.sum(0) * n).sum() * (16 * 0.01 / (3 * 40 * 40))
    assert np.isclose(float(loss.detach()), float(ref.aux_loss_fwd(p.detach().numpy(), n.numpy(),
                      total_num_tokens=40, topk=3, coeff=0.01)), rtol=1e-13)
    loss.backward(torch.tensor(0.7, dtype=F64))
    np.testing.assert_allclose(p.grad.numpy(), ref.aux_loss_bwd(
        0.7, (23, 16), n.numpy(), total_num_tokens=40, topk=3, coeff=0.01), rtol=1e-13)


def test_reference_breaks_ties_by_lowest_index():
    x = np.array([[1.0, 2.0, 2.0, 2.0, 0.0]])
    assert ref.topk_mask(x, 2).tolist() == [[False, True, True, False, False]]
    # grouped: groups (2, 2) and (2, 0) tie on their best score: the first group wins
    chosen = ref.select(np.array([[2.0, 2.0, 2.0, 0.0]]), topk=1, num_groups=2, group_topk=1)
    assert chosen.tolist() == [[True, False, False, False]]


# ---- bad input ------------------------------------------------------------------------------

X = torch.zeros(4, 8)
BAD = [
    (dict(topk=9), "topk must be <= the number of experts 8"),
    (dict(topk=0), "topk must be an int >= 1"),
    (dict(topk=2, num_groups=3, group_topk=1), "divisible by num_groups 3"),
    (dict(topk=2, num_groups=4, group_topk=5), "group_topk must be <= num_groups 4"),
    (dict(topk=3, num_groups=4, group_topk=2), "topk 3 must be a multiple of group_topk 2"),
    (dict(topk=2, num_groups=4), "num_groups and group_topk go together"),
    (dict(topk=2, score_function="tanh"), "score_function must be one of"),
    (dict(topk=2, score_function="sigmoid", use_pre_softmax=True),
     "use_pre_softmax applies to score_function='softmax' only"),
    (dict(topk=2, expert_bias=torch.zeros(8)), "expert_bias applies to score_function='sigmoid'"),
    (dict(topk=2, score_function="sigmoid", expert_bias=torch.zeros(7)),
     "expert_bias must have shape (8,)"),
    (dict(topk=2, scaling_factor=float("nan")), "scaling_factor must be finite"),
]


@pytest.mark.parametrize("kw,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_names_the_argument(kw, message):
    kw = dict(kw)
    with pytest.raises(tealite.TealiteArgumentError, match=re.escape(message)):
        tealite.router_fwd(X, kw.pop("topk"), **kw)


def test_bad_backward_and_aux_input_names_the_argument():
    m = torch.zeros(4, 8, dtype=torch.bool)
    m[:, :2] = True
    with pytest.raises(tealite.TealiteArgumentError, match="routing_map must mark exactly"):
        tealite.router_bwd(X, X, m, 3)
    with pytest.raises(tealite.TealiteArgumentError, match=re.escape("routing_map must have")):
        tealite.router_bwd(X, X, m[:, :4], 2)
    with pytest.raises(tealite.TealiteArgumentError, match="grad_probs must have logits' shape"):
        tealite.router_bwd(X[:, :4], X, m, 2)
    with pytest.raises(tealite.TealiteArgumentError, match="grad_scores dtype must be"):
        tealite.router_aux_scores_bwd(X.half(), X, 2)
    n = torch.ones(8, dtype=torch.int32)
    with pytest.raises(tealite.TealiteArgumentError, match="num_experts 7"):
        tealite.moe_aux_loss_fwd(X, n, 4, 7, 2, 0.01)
    with pytest.raises(tealite.TealiteArgumentError, match="tokens_per_expert dtype"):
        tealite.moe_aux_loss_fwd(X, n.float(), 4, 8, 2, 0.01)
    with pytest.raises(tealite.TealiteArgumentError, match="total_num_tokens must be an int"):
        tealite.moe_aux_loss_fwd(X, n, 0, 8, 2, 0.01)


# ---- the tier: wrong routers are caught, correct ones that differ legitimately are not -------

def _fwd_variant(*, shift=False, softmax_all=False, no_norm=False, bias_in_weights=False,
                 no_scale=False, highest_ties=False, torch_topk=False, f64=False,
                 bf16_scores=False, groups_ignored=False):
    def impl(logits, config, *, expert_bias):
        x = logits.to(F64 if f64 else F32)
        if bf16_scores:
            x = x.to(torch.bfloat16).float()
        route = T.routing_scores(x, config, expert_bias)
        if bf16_scores:
            route = route.to(torch.bfloat16).float()
        if groups_ignored:
            config = type(config)(config.topk, config.score_function, config.use_pre_softmax,
                                  None, None, config.scaling_factor)
        elig = T.eligible(route, config)
        e = route.shape[1]
        if highest_ties:  # the top-k of the reversed row: equal scores by highest index
            idx = e - 1 - T.topk_lowest_index(elig.flip(-1), config.topk)
        elif torch_topk:
            idx = torch.topk(elig, config.topk, dim=-1).indices
        elif shift:  # the 2nd..(k+1)-th best: one expert off
            idx = T.topk_lowest_index(elig, min(config.topk + 1, e))[:, -config.topk:]
        else:
            idx = T.topk_lowest_index(elig, config.topk)
        chosen = torch.zeros_like(route, dtype=torch.bool).scatter_(1, idx, True)
        if softmax_all:
            config = type(config)(config.topk, config.score_function, True, config.num_groups,
                                  config.group_topk, config.scaling_factor)
        if no_norm:
            config = type(config)(1, config.score_function, config.use_pre_softmax)
        w = T.weights(x, chosen, config)
        if bias_in_weights and expert_bias is not None:
            w = torch.where(chosen, w + expert_bias.float(), w)
        if no_scale and config.scaling_factor is not None:
            w = w / config.scale
        return w.to(logits.dtype), chosen
    return impl


def _register(make_backend, impl, numerics=None, op="router_fwd"):
    b = make_backend("router_variant")
    if numerics is None:
        b.implements(op, like="torch")(impl)
    else:
        b.implements(op, numerics=numerics)(impl)
    return b.name


def _case(shape=(17, 16), topk=4, kind="softmax", dtype="float32", **kw):
    c = {"shape": list(shape), "topk": topk, "kind": kind, "dtype": dtype, "groups": None,
         "scaling_factor": None, "bias": False,
         "dist": {"kind": "normal", "scale": 1.0, "sample_dtype": "float32"}, "seed": 11}
    c.update(kw)
    return c


TIES = {"kind": "integers", "hi": 1}
WRONG = [
    ("one expert off", dict(shift=True), _case(), None),
    ("post-softmax over all experts", dict(softmax_all=True), _case(), None),
    ("sigmoid weights not normalised", dict(no_norm=True), _case(kind="sigmoid"), None),
    ("bias in the weights", dict(bias_in_weights=True), _case(kind="sigmoid", bias=True), None),
    ("scaling factor dropped", dict(no_scale=True), _case(scaling_factor=1.2,
                                                          dtype="bfloat16"), None),
    ("groups ignored", dict(groups_ignored=True), _case(shape=(31, 32), topk=4, groups=[8, 2],
                                                        kind="softmax_pre"), None),
    ("groups ignored (16 groups: S completed greedily)", dict(groups_ignored=True),
     _case(shape=(31, 32), topk=8, groups=[16, 4]), None),
    ("declared lowest-index ties broken high", dict(highest_ties=True), _case(dist=TIES),
     {"compute_dtype": F32, "topk_ties": TieRule.LOWEST_INDEX}),
    ("declared lowest-index ties broken high (in groups)", dict(highest_ties=True),
     _case(shape=(23, 16), topk=4, groups=[4, 2], kind="softmax_pre", dist=TIES),
     {"compute_dtype": F32, "topk_ties": TieRule.LOWEST_INDEX}),
    ("bf16 scores declared fp32", dict(bf16_scores=True),
     _case(kind="sigmoid", dist={"kind": "normal", "scale": 0.01, "sample_dtype": "float32"}),
     {"compute_dtype": F32}),
]
RIGHT = [
    ("ties broken high, undeclared", dict(highest_ties=True), {"compute_dtype": F32}),
    ("torch.topk, ties undeclared", dict(torch_topk=True), {"compute_dtype": F32}),
    ("float64 math", dict(f64=True), None),
    ("bf16 scores declared", dict(bf16_scores=True), {"compute_dtype": torch.bfloat16}),
]
RIGHT_CASES = [_case(kind=k, dtype=dt, dist=d, **kw)
               for k in ("softmax", "softmax_pre", "sigmoid")
               for dt, d in (("float32", TIES), ("bfloat16", {"kind": "normal", "scale": 0.01,
                                                              "sample_dtype": "float32"}))
               for kw in ({}, {"groups": [4, 2], "scaling_factor": 1.2})] + [
    _case(kind="sigmoid", bias=True, bias_ties=True, dist=TIES, groups=[8, 4], topk=8),
    _case(shape=(0, 8), topk=2), _case(shape=(19, 32), topk=8, groups=[16, 4], dist=TIES)]


@pytest.mark.parametrize("what,knob,case,numerics", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_router_is_caught(make_backend, what, knob, case, numerics):
    name = _register(make_backend, _fwd_variant(**knob), numerics)
    report = run_case(get_spec("router_fwd"), case, backends=["torch", name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    assert [c for c in report.failures if c.lhs == name and c.rhs == "reference"], what


@pytest.mark.parametrize("what,knob,numerics", RIGHT, ids=[r[0] for r in RIGHT])
def test_a_correct_router_differing_legitimately_passes(make_backend, what, knob, numerics):
    name = _register(make_backend, _fwd_variant(**knob), numerics)
    for case in RIGHT_CASES:
        report = run_case(get_spec("router_fwd"), case, backends=["torch", name])
        assert report.verdict == "pass", (what, report.describe())


def test_near_ties_within_the_score_error_are_tolerated_and_beyond_are_not():
    """Two sigmoid scores 1e-7 apart (fp32 may flip them) vs 1e-3 apart (it may not)."""
    x = np.array([[0.5, 0.5 + 1e-7, -1.0], [0.5, 0.5 + 1e-3, -1.0]])
    flipped = torch.tensor([[True, False, False], [True, False, False]])
    m = tier.check_selection(flipped, x, topk=1, score_function="sigmoid",
                             numerics=Numerics(compute_dtype=F32))
    assert m.mismatches == 1 and m.worst_index == (1,), m.summary()


def _bwd_variant(*, no_sum=False, no_scale=False, f64=False):
    def impl(grad_probs, logits, routing_map, config):
        if no_scale:
            config = type(config)(config.topk, config.score_function, config.use_pre_softmax)
        if no_sum:  # softmax backward without the - sum(g y) term
            y = torch.softmax(logits.float().masked_fill(~routing_map, float("-inf")), -1)
            return (y * grad_probs.float() * routing_map * config.scale).to(logits.dtype)
        if f64:
            return T.router_bwd(grad_probs.double(), logits.double(), routing_map,
                                config).to(logits.dtype)
        return T.router_bwd(grad_probs, logits, routing_map, config)
    return impl


@pytest.mark.parametrize("knob,case,caught", [
    (dict(no_sum=True), _case(), True),
    (dict(no_scale=True), _case(kind="sigmoid", scaling_factor=2.5), True),
    (dict(f64=True), _case(kind="sigmoid", scaling_factor=2.5, dtype="bfloat16"), False),
    (dict(f64=True), _case(kind="softmax_pre", dtype="float32"), False),
    (dict(f64=True), _case(dtype="float16", dist={"kind": "normal", "scale": 4096.0,
                                                  "sample_dtype": "float32"}), False),
])
def test_router_backward_bound(make_backend, knob, case, caught):
    name = _register(make_backend, _bwd_variant(**knob), op="router_bwd")
    report = run_case(get_spec("router_bwd"), case, backends=[name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert bool(report.failures) == caught, report.describe()


def test_aux_loss_with_the_wrong_constant_is_caught(make_backend):
    b = make_backend("aux_variant")

    @b.implements("moe_aux_loss_fwd", like="torch")
    def wrong(probs, tokens_per_expert, *, total_num_tokens, topk, coeff):
        # T instead of T^2 in the constant (per-rank instead of global normalisation)
        return T.moe_aux_loss_fwd(probs, tokens_per_expert, total_num_tokens=total_num_tokens,
                                  topk=topk, coeff=coeff * total_num_tokens)

    case = {"shape": [13, 8], "topk": 2, "total_num_tokens": 26, "coeff": 0.01,
            "max_count": 1000, "dtype": "float32", "seed": 2,
            "dist": {"kind": "uniform", "lo": 0.0, "hi": 1.0}}
    report = run_case(get_spec("moe_aux_loss_fwd"), case, backends=["torch", b.name])
    assert [c for c in report.failures if c.lhs == b.name and c.rhs == "reference"]
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]


def test_aux_scores_normalised_over_the_chosen_only_is_caught(make_backend):
    b = make_backend("aux_scores_variant")

    @b.implements("router_aux_scores_fwd", like="torch")
    def wrong(logits, config):
        s = torch.sigmoid(logits.float())
        chosen = T.topk_lowest_index(s, config.topk)
        m = torch.zeros_like(s, dtype=torch.bool).scatter_(1, chosen, True)
        return s / ((s * m).sum(-1, keepdim=True) + SIGMOID_NORM_EPS), m

    case = _case(kind="sigmoid")
    report = run_case(get_spec("router_aux_scores_fwd"), case, backends=[b.name])
    assert [c for c in report.failures if c.output == "scores"], report.describe()


# ---- tealite's Triton kernels (interpreter in CI) -------------------------------------------

@pytest.mark.parametrize("op", ["router_fwd", "router_bwd", "router_aux_scores_fwd",
                                "router_aux_scores_bwd", "moe_aux_loss_fwd",
                                "moe_aux_loss_bwd"])
def test_triton_router_on_the_smoke_cases(triton_device, op):
    spec = get_spec(op)
    for case in spec.smoke_cases:
        report = run_case(spec, case, backends=["torch", "triton"], device=triton_device)
        assert report.outcomes["triton"].status == "ok", report.describe()
        assert report.verdict == "pass", report.describe()


@pytest.mark.parametrize("kw", [dict(score_function="softmax"),
                                dict(score_function="sigmoid", num_groups=4, group_topk=2)])
def test_triton_router_takes_the_lowest_index_among_ties(triton_device, kw):
    x = torch.zeros(5, 16, device=triton_device)
    x[:, 9:] = 1.0  # seven equal best experts: 9, 10, ... and groups 2 and 3 tie
    probs, routing_map = tealite.router_fwd(x, 4, backend="triton", **kw)
    assert routing_map.cpu()[:, 9:13].all() and int(routing_map.sum()) == 20


# ---- AITER's Triton moe_routing top-k (aiter_triton) -----------------------------------------

@pytest.mark.parametrize("case", [
    _case(shape=(29, 32), topk=4, dtype="float32"),
    _case(shape=(3, 160), topk=2, dtype="float16"),
    _case(shape=(17, 7), topk=2, dtype="float32", dist=TIES),
    _case(shape=(0, 8), topk=1, dtype="float32")], ids=["fp32", "fp16-two-blocks", "ties", "empty"])
def test_aiter_triton_moe_routing_topk_maps_post_softmax(triton_device, case):
    report = run_case(get_spec("router_fwd"), case, backends=["torch", "aiter_triton"],
                      device=triton_device)
    out = report.outcomes["aiter_triton"]
    if out.status == "unavailable":
        pytest.skip(out.reason)
    assert out.status == "ok", report.describe()
    assert out.numerics.entry_point == "topk" and out.numerics.topk_ties == TieRule.LOWEST_INDEX
    assert report.verdict == "pass", report.describe()


@pytest.mark.parametrize("kw,reason", [
    (dict(kind="softmax_pre"), "only score_function='softmax' after the top-k"),
    (dict(kind="sigmoid"), "only score_function='softmax' after the top-k"),
    (dict(groups=[4, 2]), "no group-limited top-k"),
    (dict(scaling_factor=1.2), "no scaling factor"),
    (dict(topk=3), "topk a power of two")])
def test_aiter_triton_refuses_what_does_not_map(triton_device, kw, reason):
    report = run_case(get_spec("router_fwd"), _case(**kw), backends=["aiter_triton"],
                      device=triton_device)
    out = report.outcomes["aiter_triton"]
    if out.status == "unavailable":
        pytest.skip(out.reason)
    assert out.status == "unsupported" and reason in out.reason, out


def _sigmoid_exp2_fp32(x32: np.ndarray) -> np.ndarray:
    """sigmoid as a GPU Triton kernel computes it: exp(-x) = 2^(fl32(-x log2 e)) (the argument
    rounded to fp32 once, then an exp2 accurate to fp32), 1 / (1 + e) in fp32."""
    arg = (-x32.astype(np.float32) * np.float32(np.log2(np.e))).astype(np.float32)
    e = np.exp2(arg.astype(np.float64)).astype(np.float32)
    return (np.float32(1) / (np.float32(1) + e)).astype(np.float32)


def test_sigmoid_bound_covers_an_exp2_based_exp_and_catches_an_ulp_bias():
    """Measured on an H100 (fuzz, router_aux_scores_fwd, logits * 512): Triton's ``tl.exp``
    rounds -x log2 e to fp32 before its exp2, a relative error u |x| in exp(-x) that the old
    constant (n_e + 3) u bound missed at x = -30.  The bound now carries 2 (1 - s) u |x|
    (log2 e and the product each rounded to fp32)."""
    x = np.linspace(-80.0, 80.0, 4001).astype(np.float32)
    got = _sigmoid_exp2_fp32(x).astype(np.float64)
    want = ref.sigmoid(x.astype(np.float64))
    num = Numerics(compute_dtype=torch.float32, exp_ulps=2)
    tol = want * tier.sigmoid_rel_error(x, num) + 2.0 ** -126
    assert np.all(np.abs(got - want) <= tol)
    old = want * 5 * 2.0 ** -24 * (1 + 5 * 2.0 ** -24) + 2.0 ** -126
    assert np.any(np.abs(got - want) > old)  # the term is needed, not decoration
    biased = got * (1 + 2.0 ** -15)  # a kernel off by 2^9 ulps everywhere is still caught
    assert np.any(np.abs(biased - want) > tol)


@pytest.mark.parametrize("experts,groups", [(15, (5, 2)), (24, (4, 2)), (13, None)],
                         ids=["group-size-3", "group-size-6", "prime"])
@pytest.mark.parametrize("score_function,dtype", [("softmax", torch.float32),
                                                  ("softmax", torch.bfloat16),
                                                  ("sigmoid", torch.float16)])
def test_triton_router_ties_pick_the_torch_backends_experts(triton_device, experts, groups,
                                                            score_function, dtype):
    """Small-integer logits, -0 among the zeros (ties within rows and between groups'
    scores): the Triton map is the torch backend's (stable sort: lowest index first, declared
    by both), for float scores and for 16-bit logits' packed keys (softmax after the top-k),
    also for group sizes that are not a power of two (groups gathered into padded slots)."""
    g = torch.Generator().manual_seed(experts)
    x = torch.randint(-2, 1, (11, experts), generator=g).float()  # the top-4 end among zeros
    x[(x == 0) & (torch.rand(x.shape, generator=g) < 0.5)] = -0.0
    x = x.to(dtype)
    kw = dict(score_function=score_function)
    if groups:
        kw.update(num_groups=groups[0], group_topk=groups[1])
    _, want = tealite.router_fwd(x, 4, backend="torch", **kw)
    _, got = tealite.router_fwd(x.to(triton_device), 4, backend="triton", **kw)
    assert torch.equal(got.cpu(), want)


def test_triton_router_tiles_change_the_program_shape_not_the_bits(triton_device):
    from tealite.backends.triton.router import TILES, Tile
    g = torch.Generator().manual_seed(3)
    x = torch.randn(13, 32, generator=g).to(torch.bfloat16).to(triton_device)
    kw = dict(score_function="sigmoid", num_groups=4, group_topk=2, scaling_factor=2.5)
    want = tealite.router_fwd(x, 4, backend="triton", **kw)
    with TILES.override(fwd=Tile(elements=64, rows=2, warps=1)):
        got = tealite.router_fwd(x, 4, backend="triton", **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
