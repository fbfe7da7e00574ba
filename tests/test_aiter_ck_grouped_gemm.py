"""CK's MoE stage-2 GEMM (``moe_sorting_fwd`` + ``ck_moe_stage2_fwd``, the ``aiter`` backend on
ROCm) as tealite's ``grouped_gemm``, on a CPU against a FAKE ``aiter``.

The fake implements CK's documented conventions with torch and asserts every argument layout
the real entry points need: ``moe_sorting_fwd`` builds CK's sorted tables as CK's own host
reference does (``reference_moe_sorting.hpp``: ids ``(slot << 24) | token``, each expert's
rows padded to whole ``unit_size`` blocks with the id of token ``M``, experts without rows
skipped, garbage past ``num_valid_ids[0]``) and zeroes the output buffer; ``ck_moe_stage2_fwd``
reads only the valid sorted rows, takes each block's expert from ``sorted_expert_ids``, and
atomically adds the dtype-rounded row products into ``out``.  It asserts int32 / fp32
tables, (M, 1, K) tokens, (E, N, K) contiguous weights, K (and N) whole 128 steps, ``block_m``
equal to the sorting's unit, no routing weights and ``QuantType.No``.

These prove the adapter's plumbing (splits -> sorted ids, the weight layouts, padding, the
output) and its refusals -- not CK's numerics, which need an MI300 / MI350 run.  A seeded
plumbing bug (expert ids off by one, the NN weight left untransposed) fails the harness.
"""
from __future__ import annotations

import enum
import sys
import types

import pytest
import torch

import tealite
from tealite.backends import aiter as A
from tealite.backends.aiter import grouped_gemm as G
from tealite.backends.aiter_common import contracts
from tealite.errors import UnsupportedCase
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.grouped_gemm import make_case

SPEC = get_spec("grouped_gemm")


class _Quant(enum.Enum):
    No = 0
    per_Tensor = 1


class _Act(enum.Enum):
    No = -1
    Silu = 0


def _mock_id(token: int, slot: int) -> int:
    return (token & 0xFFFFFF) | ((slot & 0xFF) << 24)


def make_fake(calls: list) -> types.ModuleType:
    fake = types.ModuleType("aiter")
    fake.__version__ = "0.0-fake"
    fake.__tealite_fake_arch__ = "gfx942"
    fake.__tealite_fake_devices__ = ("cpu",)
    fake.QuantType, fake.ActivationType = _Quant, _Act
    unit_seen: list = []

    def moe_sorting_fwd(topk_ids, topk_weights, sorted_token_ids, sorted_weights,
                        sorted_expert_ids, num_valid_ids, moe_buf, num_experts, unit_size,
                        local_expert_mask=None, num_local_tokens=None, dispatch_policy=0):
        calls.append("moe_sorting_fwd")
        m, topk = topk_ids.shape
        assert topk_ids.dtype == torch.int32 and topk_ids.is_contiguous()
        assert topk_weights.dtype == torch.float32 and topk_weights.shape == (m, topk)
        assert bool(((topk_ids >= 0) & (topk_ids < num_experts)).all())
        padded = m * topk + num_experts * unit_size - topk  # fused_moe.moe_sorting's sizes
        assert sorted_token_ids.shape == (padded,) and sorted_token_ids.dtype == torch.int32
        assert sorted_weights.shape == (padded,) and sorted_weights.dtype == torch.float32
        assert sorted_expert_ids.shape == (-(-padded // unit_size),)
        assert sorted_expert_ids.dtype == num_valid_ids.dtype == torch.int32
        assert num_valid_ids.shape == (2,) and moe_buf.shape[0] == m
        unit_seen.append(unit_size)
        rows: list[int] = []
        experts: list[int] = []
        for e in range(num_experts):
            mine = [_mock_id(t, s) for t in range(m) for s in range(topk)
                    if int(topk_ids[t, s]) == e]
            if not mine:
                continue  # skip_experts_with_zero_token
            blocks = -(-len(mine) // unit_size)
            rows += mine + [_mock_id(m, topk)] * (blocks * unit_size - len(mine))
            experts += [e] * blocks
        sorted_token_ids.fill_(-7)  # garbage past num_valid_ids[0]
        sorted_expert_ids.fill_(-7)
        sorted_token_ids[:len(rows)] = torch.tensor(rows, dtype=torch.int64).to(torch.int32)
        sorted_expert_ids[:len(experts)] = torch.tensor(experts, dtype=torch.int32)
        num_valid_ids[0], num_valid_ids[1] = len(rows), m
        moe_buf.zero_()

    def ck_moe_stage2_fwd(inter_states, w1, w2, sorted_token_ids, sorted_expert_ids,
                          num_valid_ids, out, topk, kernelName="", w2_scale=None,
                          a2_scale=None, block_m=32, sorted_weights=None,
                          quant_type=_Quant.No, activation=_Act.Silu):
        calls.append("ck_moe_stage2_fwd")
        assert quant_type is _Quant.No and w2_scale is None and a2_scale is None
        assert sorted_weights is None  # no routing weight multiplied in stage 2
        assert block_m == unit_seen[-1] and block_m in (32, 64, 128, 256)
        tokens, slots, k = inter_states.shape
        e, n, kw = w2.shape
        assert slots == topk and kw == k and k % 128 == 0 and n % 128 == 0
        dt = inter_states.dtype
        assert dt in (torch.bfloat16, torch.float16) and w2.dtype == dt == out.dtype
        assert w1.shape[0] == e and w1.dtype == w2.dtype
        for t in (inter_states, w2, out):
            assert t.is_contiguous()
        assert out.shape == (tokens, n)
        for p in range(int(num_valid_ids[0])):
            mock = int(sorted_token_ids[p]) & 0xFFFFFFFF
            tok, slot = mock & 0xFFFFFF, mock >> 24
            if tok >= tokens:
                continue  # a padding row
            expert = int(sorted_expert_ids[p // block_m])
            row = (inter_states[tok, slot].double() @ w2[expert].double().t()).to(dt)
            out[tok] = (out[tok].double() + row.double()).to(dt)  # the atomic add
        return out

    fake.moe_sorting_fwd = moe_sorting_fwd
    fake.ck_moe_stage2_fwd = ck_moe_stage2_fwd
    return fake


@pytest.fixture
def calls(monkeypatch):
    record: list = []
    monkeypatch.setitem(sys.modules, "aiter", make_fake(record))
    A.reset()
    with A.PLATFORM.override(rocm=True, gpu_visible=True):
        yield record
    A.reset()


def _run(case):
    return run_case(SPEC, case, backends=["aiter", "torch"])


CASES = {
    "TN-empty-groups-ragged-KN": make_case("TN", "bfloat16", [5, 0, 17, 1, 0, 13], 24, 40),
    "TN-blocks-span-experts": make_case("TN", "float16", [40, 0, 33, 70], 130, 128),
    "NN-one-group": make_case("NN", "bfloat16", [0, 29, 0], 17, 33),
    "NN-shared-weight": make_case("NN", "float16", [3, 0, 7], 20, 20, shared_weight=True),
    "TN-K-zero": make_case("TN", "bfloat16", [2, 3], 8, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_stage2_adapter_passes_the_harness(calls, name):
    report = _run(CASES[name])
    outcome = report.outcomes["aiter"]
    assert outcome.status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()
    assert outcome.numerics.entry_point == "ck_moe_stage2_fwd"
    assert calls == ["moe_sorting_fwd", "ck_moe_stage2_fwd"]


def test_sorted_tables_follow_cks_reference():
    """The fake's tables on a hand-checked case (2 rows of expert 1, 1 of expert 2, unit 4)."""
    fake = make_fake([])
    ids = torch.tensor([[1], [2], [1]], dtype=torch.int32)
    padded = 3 + 3 * 4 - 1
    tables = (torch.empty(padded, dtype=torch.int32), torch.empty(padded),
              torch.empty(4, dtype=torch.int32), torch.empty(2, dtype=torch.int32))
    fake.moe_sorting_fwd(ids, torch.ones(3, 1), *tables[:2], tables[2], tables[3],
                         torch.ones(3, 8), 3, 4)
    pad = _mock_id(3, 1)
    assert tables[0][:8].tolist() == [0, 2, pad, pad, 1, pad, pad, pad]
    assert tables[2][:2].tolist() == [1, 2] and tables[3].tolist() == [8, 3]


def _off_by_one(splits, device):
    ids = _good_ids(splits, device)
    return (ids + 1) % len(splits)


_good_ids = G.expert_ids


def test_expert_ids_off_by_one_is_caught(calls, monkeypatch):
    case = CASES["TN-empty-groups-ragged-KN"]
    monkeypatch.setattr(G, "expert_ids", _off_by_one)
    report = _run(case)
    assert report.outcomes["aiter"].status == "ok", report.describe()
    assert any(c.lhs == "aiter" and c.rhs == "reference" for c in report.failures)
    assert not any(c.lhs == "torch" and c.rhs == "reference" for c in report.failures)


def test_untransposed_nn_weight_is_caught(calls, monkeypatch):
    good = G.weights_nk
    monkeypatch.setattr(G, "weights_nk", lambda a, layout: good(a, "TN"))
    report = _run(make_case("NN", "float16", [4, 9], 24, 24))  # N == K: shapes still fit
    assert report.outcomes["aiter"].status == "ok", report.describe()
    assert any(c.lhs == "aiter" and c.rhs == "reference" for c in report.failures)


@pytest.mark.parametrize("kw, match", [
    (dict(layout="NT"), "layout NT not in"),
    (dict(bias=True), "no bias"),
    (dict(accumulate=True), "round the product and the sum"),
    (dict(dtype="float32", out_dtype="float32"), "dtype float32 not in"),
    (dict(out_dtype="float32"), "not out_dtype"),
])
def test_refusals_name_the_reason(calls, kw, match):
    case = make_case(kw.pop("layout", "TN"), kw.pop("dtype", "bfloat16"), [3, 2], 8, 16,
                     m=4, **kw)
    report = _run(case)
    outcome = report.outcomes["aiter"]
    assert outcome.status == "unsupported" and match in outcome.reason, report.describe()
    assert calls == []


def test_missing_entry_point_is_the_reason(monkeypatch):
    fake = make_fake([])
    del fake.ck_moe_stage2_fwd
    monkeypatch.setitem(sys.modules, "aiter", fake)
    A.reset()
    try:
        with A.PLATFORM.override(rocm=True, gpu_visible=True):
            with pytest.raises(UnsupportedCase, match="no aiter.ck_moe_stage2_fwd"):
                tealite.grouped_gemm(torch.zeros(2, 8, 8, dtype=torch.bfloat16),
                                     torch.zeros(3, 8, dtype=torch.bfloat16), [1, 2],
                                     backend="aiter")
    finally:
        A.reset()


def test_contracts_are_declared():
    got = {c.entry_point: c for c in contracts.contracts("aiter")}
    for entry in G.ENTRY_POINTS:
        assert got[entry].op == "grouped_gemm" and entry in A.ENTRY_POINTS
