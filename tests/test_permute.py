"""MoE token permutation: the reference against TE's documented example and against an
independent formulation (TE's own PyTorch test reference, restated: argsort / masked_select /
scatter_add), the front-end's argument checks, round trips on every backend, quantized rows
moving with their scales, and the bounds (tiers/permute_sum.py) catching wrong
implementations while passing correct ones that round differently.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tealite
import tealite.recipes as R
from tealite import TealiteArgumentError, registry
from tealite.backends.torch import permute as T
from tealite.types import QuantizedTensor
from tealite_verify.references import permute as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

F32 = torch.float32
# TE's make_row_id_map docstring example: 5 tokens, 3 experts.
TE_MASK = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
TE_ROWS = [[0, 3, -1], [1, -1, 5], [-1, -1, 6], [2, 4, -1], [-1, -1, -1]]


# ---- the reference ------------------------------------------------------------------------

def test_reference_row_map_is_tes_example():
    rows = ref.row_id_map(TE_MASK.numpy(), "mask", 3, 7)
    assert rows.tolist() == TE_ROWS
    # Dropping 2 rows drops the last two of the order: expert 2's tokens 1 and 2.
    rows = ref.row_id_map(TE_MASK.numpy(), "mask", 3, 5)
    assert rows.tolist() == [[0, 3, -1], [1, -1, -1], [-1, -1, -1], [2, 4, -1], [-1, -1, -1]]
    assert ref.tokens_per_expert(TE_MASK.numpy(), "mask", 3, rows).tolist() == [3, 2, 0]


def _te_style_permute(x, routing, map_type, num_out):
    """TE's tests/pytorch/test_permutation.py references, restated: index maps by a stable
    argsort of the flattened indices (cut at num_out), mask maps by masked_select of the
    transposed mask."""
    if map_type == "index":
        order = torch.argsort(routing.reshape(-1).long(), stable=True)[:num_out]
        return x[order // routing.shape[1]], order
    tokens = torch.arange(x.shape[0]).unsqueeze(0).expand(routing.shape[1], -1)
    order = tokens.masked_select(routing.T.bool())
    return x[order], order


def _te_style_unpermute_mask(permuted, order, routing, probs, n):
    if probs is not None:
        permuted = permuted * probs.T.masked_select(routing.T.bool()).unsqueeze(-1)
    out = torch.zeros((n, permuted.shape[1]), dtype=permuted.dtype)
    return out.scatter_add_(0, order.unsqueeze(1).expand(-1, permuted.shape[1]), permuted)


@pytest.mark.parametrize("map_type,drop", [("mask", 0), ("index", 0), ("index", 5)])
def test_reference_matches_te_style_formulation(map_type, drop):
    g = torch.Generator().manual_seed(3)
    n, e, k, h = 23, 6, 3, 5
    idx = torch.rand((n, e), generator=g).argsort(dim=1)[:, :k]
    routing = idx if map_type == "index" else torch.zeros((n, e), dtype=torch.bool) \
        .scatter_(1, idx, True)
    x = torch.randn((n, h), generator=g, dtype=torch.float64)
    num_out = n * k - drop
    want, order = _te_style_permute(x, routing, map_type, num_out)
    rows = ref.row_id_map(routing.numpy(), map_type, e, num_out)
    assert np.array_equal(ref.permute(x.numpy(), rows, num_out), want.numpy())
    if map_type == "mask":
        probs = torch.rand((n, e), generator=g, dtype=torch.float64)
        value, _, _ = ref.unpermute(want.numpy(), rows, probs.numpy())
        te = _te_style_unpermute_mask(want, order, routing, probs, n)
        assert np.allclose(value, te.numpy(), rtol=1e-14, atol=1e-14)


def test_reference_unpermute_bwd_is_the_adjoint():
    """<unpermute(P, p), dY> = <P, grad_P> and d/dp <unpermute, dY> = grad_p (linear in both)."""
    g = np.random.default_rng(5)
    rows = ref.row_id_map(TE_MASK.numpy(), "mask", 3, 7)
    permuted, dy, probs = g.normal(size=(7, 4)), g.normal(size=(5, 4)), g.random((5, 3))
    y, _, _ = ref.unpermute(permuted, rows, probs)
    gp, gprobs, _ = ref.unpermute_bwd(dy, rows, 7, permuted, probs)
    assert np.isclose((y * dy).sum(), (permuted * gp).sum())
    eps = np.zeros_like(probs)
    eps[1, 2] = 1.0
    y2, _, _ = ref.unpermute(permuted, rows, probs + eps)
    assert np.isclose(((y2 - y) * dy).sum(), gprobs[1, 2])
    assert gprobs[4].tolist() == [0.0, 0.0, 0.0]  # routed nowhere


# ---- the front-end -------------------------------------------------------------------------

X = torch.randn(5, 8)
BAD = [
    (lambda: tealite.moe_permute(X, TE_MASK[:4]), "routing_map must have one row per token"),
    (lambda: tealite.moe_permute(X, TE_MASK, num_experts=4), r"num_experts \(4\) must equal"),
    (lambda: tealite.moe_permute(X, torch.tensor([[0], [1], [2], [3], [3]]), map_type="index",
                                 num_experts=3), r"indices must lie in \[0, num_experts = 3\)"),
    (lambda: tealite.moe_permute(X, torch.tensor([[0], [1], [-1], [0], [0]]),
                                 map_type="index", num_experts=3), "indices must lie in"),
    (lambda: tealite.moe_permute(X, torch.zeros(5, 1, dtype=torch.int64), map_type="index"),
     "num_experts must be an int >= 1"),
    (lambda: tealite.moe_permute(X, TE_MASK, num_out_tokens=8), r"num_out_tokens \(8\) must be"),
    (lambda: tealite.moe_permute(X, TE_MASK, probs=torch.rand(5, 2)), "probs must have shape"),
    (lambda: tealite.moe_permute(X, TE_MASK, map_type="dense"), "map_type must be one of"),
    (lambda: tealite.moe_permute(X, TE_MASK, check_values=False),
     "num_out_tokens is required with check_values=False"),
    (lambda: tealite.moe_permute(X, TE_MASK, check_values=1), "check_values must be a bool"),
    (lambda: tealite.moe_pad_rows(X, [2, 3], 0), "align must be an int >= 1"),
    (lambda: tealite.moe_pad_rows(X, [2, 2], 16), "splits must sum to the token count 5"),
    (lambda: tealite.moe_pad_rows(X, [6, -1], 16), "splits must be non-negative"),
    (lambda: tealite.moe_unpad_rows(X, [2, 3], 16), "x must have the padded row count 32"),
    (lambda: tealite.moe_sort_chunks(X, [2, 3], [0, 0]), "sorted_index must be a permutation"),
    (lambda: tealite.moe_unpermute(X, "rows"), "row_id_map must be the RowIdMap"),
]


@pytest.mark.parametrize("call,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(TealiteArgumentError, match=message):
        call()


def test_unpermute_checks_against_the_row_map():
    p = tealite.moe_permute(X, TE_MASK)
    with pytest.raises(TealiteArgumentError, match="permuted must have row_id_map.num_out_tokens"):
        tealite.moe_unpermute(torch.randn(6, 8), p.row_id_map)
    with pytest.raises(TealiteArgumentError, match="merging_probs must have shape"):
        tealite.moe_unpermute(p.out, p.row_id_map, merging_probs=torch.rand(5, 2))
    with pytest.raises(TealiteArgumentError, match="permuted .the forward's input. is needed"):
        tealite.moe_unpermute_bwd(X, p.row_id_map, merging_probs=torch.rand(5, 3))


def _quantized(recipe, m=6, k=160, **kw):
    return tealite.quantize(torch.randn(m, k), recipe, **kw)


@pytest.mark.parametrize("recipe,kw,message", [
    (R.Float8CurrentScaling(), {"columnwise": True}, "has columnwise data"),
    (R.Float8BlockScaling(block=(128, 128)), {}, "share one scale across 128 rows"),
    (R.Float8CurrentScaling(), {"rowwise": False, "columnwise": True}, "without rowwise data"),
])
def test_quantized_rows_that_cannot_move_are_refused(recipe, kw, message):
    with pytest.raises(TealiteArgumentError, match=message):
        tealite.moe_permute(_quantized(recipe, **kw), TE_MASK[:, :2].repeat(2, 1)[:6])


# ---- every backend: round trips, quantized rows ---------------------------------------------

def _backends():
    """torch, and triton where it runs on these CPU tensors (the interpreter): skipped with
    the reason.  Compiled on a GPU the permute ops are checked by the differential suite and
    fuzz on CUDA tensors (ci/device_check.sh)."""
    why = registry.get_backend("triton").unavailable_reason()
    if why is None and os.environ.get("TRITON_INTERPRET") != "1":
        why = "these tests build CPU tensors; compiled Triton takes CUDA tensors"
    return ["torch", pytest.param("triton", marks=pytest.mark.skipif(why is not None,
                                                                     reason=str(why)))]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("map_type", ["mask", "index"])
def test_permute_unpermute_round_trip(backend, map_type):
    """Without probs, unpermute(permute(x)) = x times the token's kept-slot count: exactly,
    for integers (the fp32 sum of k equal small integers is exact)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-8, 8, (9, 24), generator=g).to(torch.bfloat16)
    idx = torch.rand((9, 4), generator=g).argsort(dim=1)[:, :2]
    routing = idx if map_type == "index" else torch.zeros((9, 4), dtype=torch.bool) \
        .scatter_(1, idx, True)
    p = tealite.moe_permute(x, routing, map_type=map_type, num_experts=4, num_out_tokens=15,
                            backend=backend)
    kept = (p.row_id_map.rows >= 0).sum(dim=1, keepdim=True)
    y = tealite.moe_unpermute(p.out, p.row_id_map, backend=backend)
    assert torch.equal(y, (x.float() * kept).to(torch.bfloat16))
    assert sum(p.row_id_map.tokens_per_expert) == 15


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("recipe", [R.MXBlockScaling(), R.Float8BlockScaling(),
                                    R.Float8CurrentScaling(granularity="row"),
                                    R.MXBlockScaling(fmt="e2m1")], ids=lambda r: r.describe())
def test_quantized_rows_move_with_their_scales(backend, recipe):
    """Permuting codes with their scales then dequantizing = permuting the dequantized rows;
    padding rows dequantize to 0; pad then unpad gives back the same bits."""
    q = _quantized(recipe, m=6, k=96)
    routing = torch.tensor([[1, 0], [1, 1], [0, 1], [0, 0], [1, 0], [0, 1]], dtype=torch.bool)
    p = tealite.moe_permute(q, routing, backend=backend)
    want = T.gather_rows(tealite.dequantize(q), T.token_of_row(p.row_id_map))
    assert torch.equal(tealite.dequantize(p.out), want)
    padded = tealite.moe_pad_rows(p.out, p.row_id_map.tokens_per_expert, 16, backend=backend)
    deq = tealite.dequantize(padded.out)
    assert padded.splits == (16, 16) and torch.equal(deq[3:16], torch.zeros(13, 96))
    back = tealite.moe_unpad_rows(padded.out, p.row_id_map.tokens_per_expert, 16,
                                  backend=backend)
    assert torch.equal(back.out.data.view(torch.uint8), p.out.data.view(torch.uint8))
    assert torch.equal(back.out.scale_inv, p.out.scale_inv)


# ---- the bounds: wrong implementations are caught, correct ones rounding differently pass -----

def _unpermute_variant(*, wide=F32, reverse=False, wrong_slot=False, acc=F32):
    def impl(permuted, row_id_map, *, merging_probs, scale_inv, scale_fill):
        n, h = row_id_map.num_tokens, permuted.shape[1]
        total = torch.zeros((n, h), dtype=acc)
        slots = range(row_id_map.slots)
        for s in (reversed(slots) if reverse else slots):
            r = row_id_map.rows[:, s].long()
            kept = r >= 0
            term = permuted[r[kept]].to(wide)
            if merging_probs is not None:
                ps = (s + 1) % row_id_map.slots if wrong_slot else s
                term = term * merging_probs[kept, ps:ps + 1].to(wide)
            total[kept] = (total[kept].to(wide) + term).to(acc)
        return total.to(permuted.dtype), None
    return impl


def _bwd_variant(*, wide=F32, probs_dtype=None):
    def impl(grad_out, row_id_map, *, permuted, merging_probs):
        gp, gprobs = T.moe_unpermute_bwd(grad_out, row_id_map, permuted=permuted,
                                         merging_probs=merging_probs)
        if merging_probs is not None:
            for s in range(row_id_map.slots):
                r = row_id_map.rows[:, s].long()
                kept = r >= 0
                dot = (grad_out[kept].to(wide) * permuted[r[kept]].to(wide)).sum(-1)
                gprobs[kept, s] = dot.to(probs_dtype or merging_probs.dtype) \
                    .to(merging_probs.dtype)
        return gp, gprobs
    return impl


def _case(dtype="float32", **kw):
    c = {"map_type": "mask", "shape": [19, 48], "experts": 6, "topk": 3, "nobody": 0.0,
         "drop": 4, "routing_seed": 2, "dtype": dtype,
         "dist": {"kind": "normal", "scale": 1.0}, "seed": 9, "with_probs": True}
    c.update(kw)
    return c


WRONG = [
    ("probs of the next slot", "moe_unpermute", _unpermute_variant(wrong_slot=True), _case()),
    ("bf16 accumulator", "moe_unpermute", _unpermute_variant(acc=torch.bfloat16), _case()),
    ("bf16 products", "moe_unpermute", _unpermute_variant(wide=torch.bfloat16), _case()),
    ("bf16 probs gradient", "moe_unpermute_bwd", _bwd_variant(probs_dtype=torch.bfloat16),
     _case("bfloat16")),
]
RIGHT = [
    ("float64 sum", "moe_unpermute", _unpermute_variant(wide=torch.float64,
                                                        acc=torch.float64)),
    ("reverse slot order", "moe_unpermute", _unpermute_variant(reverse=True)),
    ("float64 probs gradient", "moe_unpermute_bwd", _bwd_variant(wide=torch.float64)),
]
RIGHT_CASES = [_case(dt, **kw) for dt in ("float32", "bfloat16", "float16")
               for kw in ({}, {"map_type": "index", "topk": 6, "drop": 0},
                          {"dist": {"kind": "uniform", "lo": -1.0, "hi": 1.0}, "nobody": 0.25})]


def _register(make_backend, op, impl):
    b = make_backend("permute_variant")
    b.implements(op, like="torch")(impl)
    return b.name


@pytest.mark.parametrize("what,op,impl,case", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_unpermute_is_caught(make_backend, what, op, impl, case):
    name = _register(make_backend, op, impl)
    report = run_case(get_spec(op), case, backends=["torch", name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    assert [c for c in report.failures if c.lhs == name and c.rhs == "reference"], what


@pytest.mark.parametrize("what,op,impl", RIGHT, ids=[r[0] for r in RIGHT])
def test_a_correct_unpermute_rounding_differently_passes(make_backend, what, op, impl):
    name = _register(make_backend, op, impl)
    for case in RIGHT_CASES:
        report = run_case(get_spec(op), case, backends=["torch", name])
        assert report.verdict == "pass", (what, report.describe())


def test_a_row_moved_one_place_fails_the_exact_tier(make_backend):
    def shifted(*args, **kw):
        out, row_map, probs, scales = T.moe_permute(*args, **kw)
        return torch.roll(out, 1, dims=0), row_map, probs, scales
    name = _register(make_backend, "moe_permute", shifted)
    report = run_case(get_spec("moe_permute"), _case(), backends=[name])
    assert [c.output for c in report.failures] == ["out"]


# ---- AITER's moe_align_block_size: the declared padded layout -------------------------------

def test_aiter_align_block_size_is_permute_then_pad():
    """The contract (tealite/backends/aiter_triton/permute.py): AITER's sorted_token_ids at
    block size 16 are tealite's permuted slot order padded per expert as moe_pad_rows pads."""
    why = registry.get_backend("aiter_triton").unavailable_reason()
    if why is not None:
        pytest.skip(why)
    from tealite.backends.aiter_triton import permute as A
    from tealite.moe_types import pad_source_rows
    if A.why_missing(A.ENTRY_POINT):
        pytest.skip(A.why_missing(A.ENTRY_POINT))
    g = torch.Generator().manual_seed(4)
    n, e, k = 21, 5, 2
    idx = torch.rand((n, e), generator=g).argsort(dim=1)[:, :k].to(torch.int32)
    sorted_ids, expert_ids, post_pad = A.align_block_size(idx, e, 16)
    rows = ref.row_id_map(idx.numpy(), "index", e, n * k)
    slot_of_row = np.empty(n * k, dtype=np.int64)
    slot_of_row[rows.reshape(-1)] = np.arange(n * k)
    counts = ref.tokens_per_expert(idx.numpy(), "index", e, rows).tolist()
    want = [n * k if s < 0 else int(slot_of_row[s]) for s in pad_source_rows(counts, 16)]
    assert sorted_ids.tolist() == want and int(post_pad) == len(want)
    blocks = [g_ for g_, c in enumerate(counts) for _ in range(-(-c // 16))]
    assert expert_ids[:len(blocks)].tolist() == blocks


# ---- permute and pad in one ---------------------------------------------------------------

@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("map_type,drop", [("mask", 0), ("index", 3)])
def test_permute_and_pad_points_into_the_padded_rows(backend, map_type, drop):
    g = torch.Generator().manual_seed(8)
    n, e, k = 11, 4, 2
    x = torch.randn((n, 24), generator=g)
    idx = torch.rand((n, e), generator=g).argsort(dim=1)[:, :k]
    routing = idx if map_type == "index" else torch.zeros((n, e), dtype=torch.bool) \
        .scatter_(1, idx, True)
    probs = torch.rand(routing.shape, generator=g)
    kw = dict(map_type=map_type, num_experts=e, num_out_tokens=n * k - drop, probs=probs,
              backend=backend)
    plain = tealite.moe_permute(x, routing, **kw)
    padded = tealite.moe_permute_and_pad(x, routing, 16, **kw)
    splits = plain.row_id_map.tokens_per_expert
    want = tealite.moe_pad_rows(plain.out, splits, 16, backend=backend)
    assert torch.equal(padded.out, want.out)
    assert padded.row_id_map.tokens_per_expert == want.splits
    assert padded.row_id_map.num_out_tokens == sum(want.splits)
    assert torch.equal(padded.probs[padded.row_id_map.rows[padded.row_id_map.rows >= 0].long()],
                       probs[padded.row_id_map.rows >= 0])
    y = tealite.moe_unpermute(padded.out, padded.row_id_map, merging_probs=probs,
                              backend=backend)
    assert torch.equal(y, tealite.moe_unpermute(plain.out, plain.row_id_map,
                                                merging_probs=probs, backend=backend))


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("map_type,n,e,k,drop", [("mask", 1100, 3, 2, 7), ("index", 530, 5, 3, 0),
                                                 ("index", 530, 5, 3, 800)])
def test_row_map_over_several_scan_blocks(monkeypatch, backend, map_type, n, e, k, drop):
    """More slots than one 1024-wide scan block (triton's map programs carry the count
    across blocks; their block is set to 1024 here): the map and the kept counts are the
    reference's."""
    if backend == "triton":
        import tealite.backends.triton.permute as module
        monkeypatch.setattr(module, "_MAP_BLOCK", 1024)
    g = torch.Generator().manual_seed(n)
    idx = torch.rand((n, e), generator=g).argsort(dim=1)[:, :k]
    routing = idx if map_type == "index" else torch.zeros((n, e), dtype=torch.bool) \
        .scatter_(1, idx, True)
    p = tealite.moe_permute(torch.zeros(n, 1), routing, map_type=map_type, num_experts=e,
                            num_out_tokens=n * k - drop, backend=backend)
    rows = ref.row_id_map(routing.numpy(), map_type, e, n * k - drop)
    assert p.row_id_map.rows.tolist() == rows.tolist()
    assert list(p.row_id_map.tokens_per_expert) == \
        ref.tokens_per_expert(routing.numpy(), map_type, e, rows).tolist()
