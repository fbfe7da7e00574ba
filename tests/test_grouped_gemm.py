"""Grouped GEMM (issue 16): the front-ends' argument checks, the torch backend's empty-group
contract, the per-group bound, and the parity oracle (tiers/parity.py) catching grouped paths
that drop the last group, use a neighbour's weight or reuse a workspace, while passing a
correct grouped path that accumulates in another (declared) order.

The variants are plug-in backends (``make_backend``) that implement ``gemm`` as torch does
(the split path runs it) and ``grouped_gemm`` each with one thing changed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.torch import grouped_gemm as torch_grouped
from tealite.errors import TealiteArgumentError
from tealite.moe_types import GROUPED_LAYOUTS, split_offsets
from tealite.types import Op
from tealite_verify.fuzz.worker import classify
from tealite_verify.mutate.base import get_mutation
from tealite_verify.references import grouped_gemm as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.grouped_gemm import make_case
from tealite_verify.tiers import grouped_gemm as grouped_tier
from tealite_verify.tiers.metrics import Tier

BF16, F32 = torch.bfloat16, torch.float32
SPEC = get_spec("grouped_gemm")
# Cases where every bug below shows: empty groups between and after full ones, per-group
# weights, NT with an empty group after a full one, accumulate, float32 (order-sensitive).
CASES = [make_case("TN", "bfloat16", [3, 0, 5, 4], 24, 40, bias=True),
         make_case("NN", "float32", [6, 2, 0, 9], 17, 64),
         make_case("NT", "float32", [5, 0, 11, 0], 17, 1, m=9, accumulate=True),
         make_case("NT", "bfloat16", [7, 0, 13], 12, 1, m=6)]


# ---- bad input ----------------------------------------------------------------------------

def _x(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


BAD = [
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [1, 2]), "m_splits must sum to"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [-1, 6]),
     "m_splits must be non-negative"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [1.0, 4.0]),
     "m_splits must be a sequence of ints"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), torch.ones(1, 2, dtype=torch.int64)),
     "m_splits must be a 1-D integer tensor"),
    (lambda: tealite.grouped_gemm(_x(3, 8, 16), _x(5, 16), [2, 3]),
     "a must stack one weight per group"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 12), _x(5, 16), [2, 3]), "contraction dims differ"),
    (lambda: tealite.grouped_gemm(_x(8, 16), _x(5, 16), [2, 3], layout="TT"),
     "layout must be one of"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16, dtype=F32), [2, 3]),
     "a and b must share a dtype"),
    (lambda: tealite.grouped_gemm(_x(5, 8), _x(5, 4), [2, 3], layout="NT", bias=_x(2, 8)),
     "bias is not taken under layout NT"),
    (lambda: tealite.grouped_gemm(_x(5, 8), _x(6, 4), [2, 3], layout="NT"),
     "must share K_total"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [2, 3], bias=_x(2, 9)),
     r"bias must have shape \(2, 8\)"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [2, 3], accumulate=True),
     "accumulate=True needs out="),
    (lambda: tealite.grouped_gemm(_x(5, 8), _x(5, 4), [2, 3], layout="NT", out=_x(2, 4, 9)),
     r"out must have shape \(2, 4, 8\)"),
    (lambda: tealite.grouped_gemm(_x(2, 8, 16), _x(5, 16), [2, 3], out=_x(5, 8, dtype=F32)),
     "out dtype must be one of"),
]


@pytest.mark.parametrize("call,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_naming_the_argument(call, message):
    with pytest.raises(TealiteArgumentError, match=message):
        call()


def _q(rows, k, recipe=None, columnwise=False):
    recipe = recipe or R.Float8CurrentScaling()
    return tealite.quantize(torch.randn(rows, k), recipe, rowwise=not columnwise,
                            columnwise=columnwise, backend="torch")


BAD_Q = [
    (lambda: tealite.grouped_qgemm(_q(8, 32), _q(5, 32), [5]),
     "b must be a sequence of QuantizedTensors"),
    (lambda: tealite.grouped_qgemm([_q(8, 32)] * 3, [_q(2, 32), _q(3, 32)], [2, 3]),
     r"a must hold one QuantizedTensor per group \(len\(m_splits\) = 2\), got 3"),
    (lambda: tealite.grouped_qgemm(_q(8, 32), [_q(2, 32), _q(3, 32)], [3, 2]),
     r"m_splits\[0\] = 3 but b\[0\] holds 2 rows"),
    (lambda: tealite.grouped_qgemm(_q(8, 32), [_q(2, 32), _q(3, 32, R.MXFP8BlockScaling())],
                                   [2, 3]), "every group of b must share one recipe"),
    (lambda: tealite.grouped_qgemm(
        _q(8, 128, R.Float8BlockScaling(block=(128, 128))),
        [_q(2, 128, R.Float8BlockScaling(block=(128, 128)))], [2]),
     r"b\[0\] \(activations\) must use 1x128 block scaling"),
    (lambda: tealite.grouped_qgemm(_q(4, 8, columnwise=True), [_q(4, 5, columnwise=True)], [4],
                                   layout="NT"), "a must be a sequence of QuantizedTensors"),
    (lambda: tealite.grouped_qgemm([_q(8, 32), _q(9, 32)], [_q(2, 32), _q(3, 32)], [2, 3]),
     "every group's N must agree"),
    (lambda: tealite.grouped_qgemm(_q(32, 8), [_q(2, 32)], [2], layout="NN"),
     "quantize it with columnwise=True"),
]


@pytest.mark.parametrize("call,message", BAD_Q, ids=[m for _, m in BAD_Q])
def test_bad_quantized_input_is_refused_naming_the_argument(call, message):
    with pytest.raises(TealiteArgumentError, match=message):
        call()


# ---- the float64 reference against an independent formulation ---------------------------

def _membership(splits) -> np.ndarray:
    """(G, total) one-hot: row r belongs to group g."""
    return np.repeat(np.eye(len(splits)), splits, axis=1)


def test_reference_matches_a_one_hot_einsum():
    rng = np.random.default_rng(16)
    splits = [3, 0, 5, 1]
    g, n, k, m = len(splits), 6, 7, 4
    hot = _membership(splits)
    b = rng.standard_normal((sum(splits), k))
    w_t, w_n = rng.standard_normal((g, n, k)), rng.standard_normal((g, k, n))
    bias, prior = rng.standard_normal((g, n)), rng.standard_normal((sum(splits), n))
    want_tn = np.einsum("gr,rk,gnk->rn", hot, b, w_t) + hot.T @ bias + prior
    got = ref.grouped_gemm(w_t, b, splits, layout="TN", bias=bias, prior=prior)
    assert np.allclose(got, want_tn, rtol=1e-13, atol=1e-13)
    got = ref.grouped_gemm(w_n, b, splits, layout="NN")
    assert np.allclose(got, np.einsum("gr,rk,gkn->rn", hot, b, w_n), rtol=1e-13, atol=1e-13)
    a_nt, b_nt = rng.standard_normal((sum(splits), n)), rng.standard_normal((sum(splits), m))
    got = ref.grouped_gemm(a_nt, b_nt, splits, layout="NT")
    want = np.einsum("gr,rm,rn->gmn", hot, b_nt, a_nt)
    assert np.allclose(got, want, rtol=1e-13, atol=1e-13) and not got[1].any()


# ---- the torch backend: the contract's edges ----------------------------------------------

def test_empty_nt_groups_are_exact_zeros_or_untouched():
    a, b = _x(9, 8, dtype=F32), _x(9, 4, dtype=F32)
    prior = torch.randn(3, 4, 8)
    prior[1, 0, 0], prior[1, 0, 1] = -0.0, float("nan")
    got = tealite.grouped_gemm(a, b, [0, 0, 9], layout="NT", out=prior.clone(), accumulate=True,
                               backend="torch")
    assert torch.equal(got[:2].view(torch.int32), prior[:2].view(torch.int32))  # bit for bit
    got = tealite.grouped_gemm(a, b, [4, 0, 5], layout="NT", out=prior.clone(), backend="torch")
    assert torch.equal(got[1], torch.zeros(4, 8))


@pytest.mark.parametrize("layout", ("TN", "NN"))
def test_shared_weight_is_every_group_s_weight(layout):
    w = _x(8, 16) if layout == "TN" else _x(16, 8)
    b = _x(7, 16)
    shared = tealite.grouped_gemm(w, b, [2, 0, 5], layout=layout, backend="torch")
    stacked = tealite.grouped_gemm(w.expand(3, *w.shape).contiguous(), b, [2, 0, 5],
                                   layout=layout, backend="torch")
    assert torch.equal(shared, stacked)


def test_the_empty_group_rule_is_bitwise():
    """A kernel that adds 0 to an empty group's prior output turns -0 into +0: the value
    check alone accepts it, the empty-group rule does not."""
    prior = torch.tensor([[[-0.0, 1.0]], [[2.0, 3.0]]])
    value = prior.double().numpy()
    tol = np.zeros(value.shape)
    ok = grouped_tier.judge(prior.clone(), value, tol, F32, [0, 3], "NT", prior)
    assert ok.passed and ok.tier is Tier.GEMM
    flipped = grouped_tier.judge(prior + 0.0, value, tol, F32, [0, 3], "NT", prior)
    assert not flipped.passed and flipped.tier is Tier.EXACT and "empty group 0" in flipped.note


# ---- the grouped bound and the parity oracle ----------------------------------------------

def _grouped_backend(make_backend, prefix, fn, numerics):
    b = make_backend(prefix)
    b.implements(Op.GEMM, like="torch")(tealite.get_backend("torch").impls["gemm"].fn)
    b.implements(Op.GROUPED_GEMM, dtypes=(F32, BF16, torch.float16), layouts=GROUPED_LAYOUTS,
                 numerics=numerics)(fn)
    return b.name


def _verdicts(name, cases=CASES) -> list[dict[str, bool]]:
    out = []
    for case in cases:
        rep = run_case(SPEC, case, backends=[name], pairwise=False)
        assert rep.outcomes[name].status == "ok", rep.describe()
        out.append({c.output: c.metrics.passed for c in rep.comparisons})
    return out


@pytest.mark.parametrize("bug", ("last_group_dropped", "weights_rolled", "stale_workspace"))
def test_parity_catches_a_broken_grouped_path(make_backend, bug):
    """Each bug is in the grouped path only (the backend's gemm is correct): parity fails on
    a case where it shows, and never on one where it does not change the output."""
    fn = get_mutation(f"grouped_gemm.{bug}").wrap(torch_grouped.grouped_gemm)
    name = _grouped_backend(make_backend, bug, fn, torch_grouped._numerics)
    verdicts = _verdicts(name)
    assert any(not v["parity"] for v in verdicts), verdicts
    for case, v in zip(CASES, verdicts):  # a failing parity means a wrong output
        assert v["parity"] or not v["out"], (case, v)


def _reordered(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    """A correct grouped GEMM that sums each group's K products in reverse order, in fp32,
    with one fused rounding at the end (a persistent kernel's order, not torch's)."""
    off = split_offsets(splits)
    n = a.shape[1] if layout == "NT" else (a.shape[-2] if layout[0] == "T" else a.shape[-1])
    shape = (len(splits), b.shape[1], n) if layout == "NT" else (b.shape[0], n)
    result = out if out is not None else torch.zeros(shape, dtype=out_dtype)
    for g, rows in enumerate(splits):
        lo, hi = off[g], off[g + 1]
        if rows == 0:
            if layout == "NT" and not accumulate:
                result[g].zero_()
            continue
        if layout == "NT":
            op_b, op_a, target = b[lo:hi].t(), a[lo:hi], result[g]
        else:
            w = a[g] if a.dim() == 3 else a
            op_b, op_a, target = b[lo:hi], (w.t() if layout[0] == "T" else w), result[lo:hi]
        acc = op_b.float().flip(1) @ op_a.float().flip(0)
        if bias is not None:
            acc = acc + bias[g].float()
        if accumulate:
            acc = acc + target.float()
        target.copy_(acc.to(out_dtype))
    return result


def test_parity_accepts_a_declared_different_accumulation_order(make_backend):
    name = _grouped_backend(make_backend, "reordered", _reordered,
                            {"compute_dtype": F32})
    assert all(all(v.values()) for v in _verdicts(name))


def test_parity_holds_a_matching_declaration_to_bit_equality(make_backend):
    """The same correct kernel declaring ``grouped_matches_split`` is held to its promise."""
    name = _grouped_backend(make_backend, "reordered_claims_split", _reordered,
                            {"compute_dtype": F32, "grouped_matches_split": True})
    verdicts = _verdicts(name)
    assert all(v["out"] for v in verdicts)
    assert any(not v["parity"] for v in verdicts)


def _summed_across_groups(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    """NT: out[g] contracts every row up to the end of group g (a wrong group start)."""
    off = split_offsets(splits)
    result = torch.zeros(len(splits), b.shape[1], a.shape[1], dtype=out_dtype)
    for g in range(len(splits)):
        result[g] = (b[:off[g + 1]].t().float() @ a[:off[g + 1]].float()).to(out_dtype)
    return result


def test_per_group_bound_catches_a_contraction_across_groups(make_backend):
    name = _grouped_backend(make_backend, "across", _summed_across_groups,
                            {"compute_dtype": F32})
    case = make_case("NT", "float32", [5, 11, 3], 17, 1, m=9)
    assert not _verdicts(name, [case])[0]["out"]


def test_a_parity_failure_is_a_finding_of_its_own_kind(make_backend):
    fn = get_mutation("grouped_gemm.stale_workspace").wrap(torch_grouped.grouped_gemm)
    name = _grouped_backend(make_backend, "stale", fn, torch_grouped._numerics)
    rep = run_case(SPEC, CASES[2], backends=[name], pairwise=False)
    kinds = {f.kind: f for f in classify(rep, "cpu", {}, 0)}
    assert "parity" in kinds and kinds["parity"].output == "parity", rep.describe()
    assert "its split path" in kinds["parity"].detail


# ---- grouped_qgemm: the same oracle on quantized operands ---------------------------------

Q_SPEC = get_spec("grouped_qgemm")
Q_CASES = list(Q_SPEC.smoke_cases[:4])


def _qgemm_f64(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, k, layout, out_dtype, bias,
               out, accumulate):
    """A correct grouped qgemm that multiplies the fp32-dequantized operands in float64 and
    rounds once (another accumulation than torch's fp32 matmul)."""
    from tealite.backends.torch.qgemm import _dequantize_k_last
    off = split_offsets(splits)
    by_k = layout == "NT"
    result = out if out is not None else torch.zeros((len(splits), m, n) if by_k else (m, n),
                                                     dtype=out_dtype)
    for g, rows in enumerate(splits):
        if rows == 0:
            if by_k and not accumulate:
                result[g].zero_()
            continue
        a_g, b_g = a_ops[g if len(a_ops) > 1 else 0], b_ops[g]
        k_g = rows if by_k else k
        a = _dequantize_k_last(recipe_a, a_g.codes, a_g.scales, n, k_g).double()
        b = _dequantize_k_last(recipe_b, b_g.codes, b_g.scales, m if by_k else rows, k_g).double()
        acc = b @ a.t()
        if bias is not None:
            acc = acc + bias[g].double()
        target = result[g] if by_k else result[off[g]:off[g + 1]]
        if accumulate:
            acc = acc + target.double()
        target.copy_(acc.to(out_dtype))
    return result


def _grouped_q_backend(make_backend, prefix, fn, numerics):
    b = make_backend(prefix)
    b.implements(Op.QGEMM, like="torch")(tealite.get_backend("torch").impls["qgemm"].fn)
    b.implements(Op.GROUPED_QGEMM, dtypes=(F32, BF16, torch.float16), layouts=GROUPED_LAYOUTS,
                 numerics=numerics)(fn)
    return b.name


def _q_verdicts(name) -> list[dict[str, bool]]:
    out = []
    for case in Q_CASES:
        rep = run_case(Q_SPEC, case, backends=[name], pairwise=False)
        assert rep.outcomes[name].status == "ok", rep.describe()
        out.append({c.output: c.metrics.passed for c in rep.comparisons})
    return out


def test_quantized_parity_catches_a_dropped_group_and_accepts_float64_accumulation(
        make_backend):
    numerics = {"compute_dtype": F32, "operands_dequantized_to": F32}
    good = _grouped_q_backend(make_backend, "q_f64", _qgemm_f64, numerics)
    assert all(all(v.values()) for v in _q_verdicts(good))
    dropped = get_mutation("grouped_qgemm.last_group_dropped").wrap(_qgemm_f64)
    bad = _grouped_q_backend(make_backend, "q_dropped", dropped, numerics)
    assert all(not v["parity"] for v in _q_verdicts(bad))
