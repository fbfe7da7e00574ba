"""Grouped quantize (+ dbias), issue 16: the front-end's argument checks, empty groups, the
bit-for-bit contract with per-group ``quantize`` on torch and Triton (interpreted), the parity
tier (tiers/parity.py) and the dbias bound catching wrong implementations while passing correct
ones that round differently.

Wrong and legitimately different implementations are plug-in backends (``make_backend``) that
differ from torch's in exactly one thing.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tealite
import tealite.recipes as R
from tealite import registry
from tealite.backends.torch import grouped_quantize as T
from tealite.errors import TealiteArgumentError
from tealite.moe_types import GroupedQuantized, split_offsets
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.parity import judge_outputs

SPEC = get_spec("grouped_quantize")
CURRENT = R.Float8CurrentScaling()
TRITON = registry.get_backend("triton").unavailable_reason() is None
needs_triton = pytest.mark.skipif(not TRITON, reason="triton backend unavailable (set "
                                                     "TRITON_INTERPRET=1 or run on a GPU)")
FIELDS = ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax")


# ---- bad input ---------------------------------------------------------------------------

def _x(m=6, k=64, dtype=torch.float32):
    return torch.randn(m, k, dtype=dtype)


@pytest.mark.parametrize("kwargs, match", [
    (dict(m_splits=[2, 3]), "m_splits must sum to the token count 6, got 5"),
    (dict(m_splits=[7, -1]), "m_splits must be non-negative, got -1 at index 1"),
    (dict(m_splits=[]), "m_splits must name at least one group"),
    (dict(m_splits=[2.0, 4.0]), "m_splits must be a sequence of ints"),
    (dict(m_splits=torch.tensor([2.0, 4.0])), "m_splits must be a 1-D integer tensor"),
    (dict(recipe="fp8"), "recipe must be one of"),
    (dict(rowwise=False), "at least one of rowwise / columnwise"),
    (dict(dbias=1), "dbias must be a bool"),
    (dict(scale=torch.ones(2)), "scale= is only for recipes that take a given scale"),
    (dict(recipe=R.DelayedScaling()), "DelayedScaling needs scale= .* one per group"),
    (dict(recipe=R.DelayedScaling(), scale=torch.ones(1)),
     r"scale must have shape \(2,\) \(one given scale per group\)"),
    (dict(recipe=R.MXFP8BlockScaling(), columnwise=True, x=_x(64)),
     "m_splits.0. for columnwise MX quantization must be a multiple of 32"),
    (dict(recipe=R.MXFP8BlockScaling(), x=_x(6, 48)),
     r"K \(x.shape\[1\]\) for rowwise MX quantization must be a multiple of 32"),
    (dict(x=torch.randn(6)), "x must be 2-D"),
])
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(x=_x(), m_splits=[2, 4], recipe=CURRENT)
    if "x" in kwargs and kwargs["x"].dim() == 2:
        args["m_splits"] = [kwargs["x"].shape[0] - 1, 1] if "m_splits" not in kwargs \
            else args["m_splits"]
    args.update(kwargs)
    x, splits, recipe = args.pop("x"), args.pop("m_splits"), args.pop("recipe")
    with pytest.raises(TealiteArgumentError, match=match):
        tealite.grouped_quantize(x, splits, recipe, **args)


def test_m_splits_as_an_int_tensor_and_mx_pad():
    x = _x(40)
    out = tealite.grouped_quantize(x, torch.tensor([30, 10]), R.MXFP8BlockScaling(),
                                   columnwise=True, pad=True)
    assert [q.shape for q in out.tensors] == [(30, 64), (10, 64)]


# ---- empty groups and the contract with per-group quantize ---------------------------------

BACKENDS = ["torch"] + (["triton"] if TRITON else [])
RECIPES = [CURRENT, R.Float8CurrentScaling(force_pow2_scales=True),
           R.Float8BlockScaling(block=(1, 128)), R.Float8BlockScaling(block=(128, 128)),
           R.Float8BlockScaling(block=(1, 128), force_pow2_scales=False),
           R.Float8CurrentScaling(granularity="row"), R.MXFP8BlockScaling()]


def _bits(t):
    return None if t is None else t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_groups_give_empty_tensors_and_zero_dbias(backend):
    x = _x(7, 32, torch.bfloat16)
    out = tealite.grouped_quantize(x, [0, 7, 0], CURRENT, columnwise=True, dbias=True,
                                   backend=backend)
    assert isinstance(out, GroupedQuantized) and len(out.tensors) == 3
    for g in (0, 2):
        q = out.tensors[g]
        assert q.data.shape == (0, 32) and q.columnwise_data.shape == (32, 0)
        assert q.scale_inv.item() == 1.0 and q.amax.item() == 0.0  # TE: amax 0 -> scale 1
    assert out.dbias.dtype == torch.bfloat16 and out.dbias.shape == (3, 32)
    assert torch.equal(out.dbias[0], torch.zeros(32, dtype=torch.bfloat16))
    assert torch.equal(out.dbias[2], torch.zeros(32, dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", RECIPES, ids=str)
def test_each_group_is_what_quantize_gives_it_alone(backend, recipe):
    """The contract, checked directly: prime groups straddle every block boundary."""
    mx = recipe.family is R.Family.MX
    blocked = recipe.scale_granularity is R.Granularity.BLOCK
    # Blocks of 128 rows need a group past 128 rows; the others stay small (interpreter).
    splits = [0, 37, 3, 64] if mx else [5, 0, 131, 3] if blocked else [5, 0, 13, 3]
    x = torch.randn(sum(splits), 160 if blocked else 64) * 3
    x[5:5 + splits[2]] *= 100  # one group far larger: a whole-tensor scale would show
    out = tealite.grouped_quantize(x, splits, recipe, columnwise=True, pad=mx,
                                   backend=backend)
    offs = split_offsets(splits)
    for g, q in enumerate(out.tensors):
        alone = tealite.quantize(x[offs[g]:offs[g + 1]], recipe, columnwise=True, pad=mx,
                                 backend=backend)
        for f in FIELDS:
            got, want = getattr(q, f), getattr(alone, f)
            assert (got is None) == (want is None), (g, f)
            if got is not None:
                assert got.shape == want.shape, (g, f)
                assert torch.equal(_bits(got), _bits(want)), (g, f)


@needs_triton
@pytest.mark.parametrize("case", SPEC.smoke_cases, ids=lambda c: str(c["recipe"]["kind"]))
def test_triton_and_torch_agree_with_the_references(case):
    report = run_case(SPEC, case, backends=["torch", "triton"])
    assert report.verdict == "pass", report.describe()
    assert Tier.PARITY in {c.metrics.tier for c in report.comparisons}


# ---- the parity tier ---------------------------------------------------------------------

def test_parity_tier_passes_equal_bits_and_any_nan():
    nan_a = torch.tensor([1.0, float("nan")])
    nan_b = torch.tensor([1.0, -float("nan")])  # another NaN pattern: NaN matches NaN
    m = judge_outputs({"g0.data": nan_a}, {"g0.data": nan_b})
    assert m.passed and m.tier is Tier.PARITY


def test_parity_tier_catches_one_bit_and_a_lost_group():
    a = torch.tensor([1.0, 2.0])
    b = torch.tensor([1.0, float(np.nextafter(np.float32(2.0), np.float32(3.0)))])
    m = judge_outputs({"g0.data": a, "g1.data": a}, {"g0.data": a, "g1.data": b})
    assert not m.passed and m.mismatches == 1 and "g1.data" in m.note
    lost = judge_outputs({"g0.data": a}, {"g0.data": a, "g1.data": a})
    assert not lost.passed and "g1.data" in lost.shape_error


def _variant(make_backend, name, fn):
    b = make_backend(name)
    torch_b = registry.get_backend("torch")
    b.implements("quantize", like="torch")(torch_b.impls["quantize"].fn)
    b.implements("grouped_quantize", like="torch")(fn)
    return b.name


POW2_CASE = dict(SPEC.smoke_cases[1])  # block 1x128 with pow2 scales, three groups


def test_a_grouped_only_bug_fails_parity(make_backend):
    def pow2_dropped(x, m_splits, recipe, **kw):
        return T.grouped_quantize(x, m_splits, dataclasses.replace(
            recipe, force_pow2_scales=False), **kw)

    name = _variant(make_backend, "gq_pow2_dropped", pow2_dropped)
    report = run_case(SPEC, POW2_CASE, backends=[name])
    parity = [c for c in report.comparisons if c.output == "parity"]
    assert len(parity) == 1 and not parity[0].metrics.passed


# ---- the dbias bound ----------------------------------------------------------------------

DBIAS_CASE = dict(SPEC.smoke_cases[0], dtype="bfloat16", m_splits=[40, 0, 200, 17],
                  shape=[257, 33], dist={"kind": "normal", "scale": 2.0})


def _with_dbias(dbias_fn):
    def impl(x, m_splits, recipe, **kw):
        out = T.grouped_quantize(x, m_splits, recipe, **dict(kw, dbias=False))
        return GroupedQuantized(out.tensors, dbias_fn(x, split_offsets(m_splits)))
    return impl


def _rows(x, offs):
    return [x[offs[g]:offs[g + 1]] for g in range(len(offs) - 1)]


def _reversed_fp32(x, offs):  # another summation order, still fp32
    return torch.stack([r.float().flip(0).cumsum(0)[-1] if len(r) else
                        torch.zeros(x.shape[1]) for r in _rows(x, offs)]).to(x.dtype)


def _float64(x, offs):  # more accurate than declared: one rounding
    return torch.stack([r.double().sum(0) for r in _rows(x, offs)]).to(x.dtype)


def _bf16_accumulator(x, offs):  # rounds to bf16 after every addition
    out = []
    for r in _rows(x, offs):
        acc = torch.zeros(x.shape[1], dtype=torch.bfloat16)
        for row in r:
            acc = acc + row
        out.append(acc)
    return torch.stack(out)


def _dbias_verdict(make_backend, fn):
    name = _variant(make_backend, "gq_dbias", _with_dbias(fn))
    report = run_case(SPEC, DBIAS_CASE, backends=[name])
    return [c.metrics for c in report.comparisons if c.output == "dbias"][0]


@pytest.mark.parametrize("fn", [_reversed_fp32, _float64])
def test_dbias_bound_passes_correct_sums_in_another_order(make_backend, fn):
    m = _dbias_verdict(make_backend, fn)
    assert m.passed, m


def test_dbias_bound_catches_a_bf16_accumulator(make_backend):
    m = _dbias_verdict(make_backend, _bf16_accumulator)
    assert not m.passed and m.mismatches > 0, m


@needs_triton
@pytest.mark.parametrize("recipe", [CURRENT, R.DelayedScaling(), R.Float8BlockScaling(),
                                    R.Float8BlockScaling(block=(128, 128))], ids=str)
def test_triton_fused_recipes_never_launch_per_group(monkeypatch, recipe):
    """FP8 per-tensor and block recipes take the one-launch path: the per-group quantize (the
    split path the other recipes fall back to) is never called."""
    from tealite.backends.triton import grouped_quantize as G

    def refuse(*a, **k):
        raise AssertionError("per-group launch on a fused recipe")

    monkeypatch.setattr(G.triton_quantize, "quantize", refuse)
    scale = torch.ones(4) if recipe.scale_given else None
    out = tealite.grouped_quantize(_x(9, 40), [2, 0, 6, 1], recipe, columnwise=True,
                                   dbias=True, scale=scale, backend="triton")
    assert len(out.tensors) == 4 and out.dbias.shape == (4, 40)


@needs_triton
@pytest.mark.parametrize("recipe", [CURRENT, R.Float8BlockScaling()], ids=str)
def test_triton_device_work_does_not_grow_with_the_groups(recipe):
    """What a call asks of the device (torch kernel ops, Triton launches, host reads) is the
    same for 2 groups and 8: per-group work is host Python only (was one scale clone per
    group, columnwise per-tensor).  Op level was host-bound (docs/benchmarks.md)."""
    from benchmarks.host_cost_moe import counting, torch_kernel_ops
    from tealite.backends.triton import grouped_quantize as G

    def device_work(splits):
        def call():
            return tealite.grouped_quantize(_x(16, 40), splits, recipe, columnwise=True,
                                            dbias=True, backend="triton")
        call()  # the first call builds the cached tables
        with counting([G], stub=True) as counts:  # stubbed: the interpreter's copies aside
            ops = torch_kernel_ops(call)
        ops.pop("aten::randn", None)  # _x's
        return ops, dict(counts.launches), dict(counts.reads)

    two = device_work([8, 8])
    assert two == device_work([2, 2, 2, 0, 4, 2, 2, 2])
    assert not two[2] and sum(two[0].values()) <= 2, two
