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

With ``QuantType.per_1x128`` it checks the blockscale layouts read from CK's kernel
(a2_scale (tokens * topk, K/128), w2_scale (E, N/128, K/128), fp32, the arch's E4M3 codes,
block_m 16 / 64) and computes with the scales applied per 128 block.

These prove the adapter's plumbing (splits -> sorted ids, the weight layouts, padding, scale
layouts, the output) and its refusals -- not CK's numerics, which need an MI300 / MI350 run.
A seeded plumbing bug (expert ids off by one, the NN weight left untransposed, activation
scales of the wrong token) fails the harness.
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
from tealite_verify.specs.grouped_qgemm import _BLK, _CUR, _smoke

SPEC = get_spec("grouped_gemm")


class _Quant(enum.Enum):  # aiter_enum.h's values
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x32 = 3
    per_1x128 = 4


class _Act(enum.Enum):
    No = -1
    Silu = 0


def _mock_id(token: int, slot: int) -> int:
    return (token & 0xFFFFFF) | ((slot & 0xFF) << 24)


def _block_scaled(codes, scales, rows_dim: int) -> torch.Tensor:
    """float64 codes x their 128-block scales (1x128 rows, or 128x128 with ``rows_dim``)."""
    s = scales.double().repeat_interleave(128, -1)
    if rows_dim:
        s = s.repeat_interleave(128, -2)
    return codes.double() * s[..., :codes.shape[-2], :codes.shape[-1]] if rows_dim else \
        codes.double() * s[..., :codes.shape[-1]]


def make_fake(calls: list, arch: str = "gfx950") -> types.ModuleType:
    fake = types.ModuleType("aiter")
    fake.__version__ = "0.0-fake"
    fake.__tealite_fake_arch__ = arch
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
        assert sorted_weights is None  # no routing weight multiplied in stage 2
        assert block_m == unit_seen[-1]
        tokens, slots, k = inter_states.shape
        e, n, kw = w2.shape
        assert slots == topk and kw == k and k % 128 == 0 and n % 128 == 0
        assert w1.shape[0] == e and w1.dtype == w2.dtype == inter_states.dtype
        dt = out.dtype
        assert dt in (torch.bfloat16, torch.float16)
        for t in (inter_states, w2, out):
            assert t.is_contiguous()
        assert out.shape == (tokens, n)
        if quant_type is _Quant.per_1x128:  # blockscale instances: block_m 16 / 64
            assert block_m in (16, 64) and k % (256 if block_m == 16 else 128) == 0
            assert w2.dtype == {"gfx950": torch.float8_e4m3fn,
                                "gfx942": torch.float8_e4m3fnuz}[arch]
            kb, nb = k // 128, n // 128
            assert a2_scale.shape == (tokens * topk, kb) and w2_scale.shape == (e, nb, kb)
            for t in (a2_scale, w2_scale):
                assert t.dtype == torch.float32 and t.is_contiguous()
            x = _block_scaled(inter_states, a2_scale.view(tokens, topk, kb), 0)
            w = _block_scaled(w2, w2_scale, 1)
        else:
            assert quant_type is _Quant.No and w2_scale is None and a2_scale is None
            assert block_m in (32, 64, 128, 256) and inter_states.dtype == dt
            x, w = inter_states.double(), w2.double()
        for p in range(int(num_valid_ids[0])):
            mock = int(sorted_token_ids[p]) & 0xFFFFFFFF
            tok, slot = mock & 0xFFFFFF, mock >> 24
            if tok >= tokens:
                continue  # a padding row
            expert = int(sorted_expert_ids[p // block_m])
            row = (x[tok, slot] @ w[expert].t()).to(dt)
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


# ---- grouped_qgemm: FP8 block scaling (QuantType.per_1x128) ---------------------------------

QSPEC = get_spec("grouped_qgemm")
_ACT = dict(_BLK, block=[1, 128])
QCASES = {
    "TN-ragged-KN": _smoke(_BLK, _ACT, "TN", [0, 7, 2], 17, 200),
    "TN-blocks-span-experts": _smoke(_BLK, _ACT, "TN", [70, 0, 3, 65], 130, 256,
                                     out_dtype="float16"),
    "NN-shared-fp32-scales": _smoke(dict(_BLK, force_pow2_scales=False),
                                    dict(_ACT, force_pow2_scales=False), "NN", [5, 3], 9, 130,
                                    shared_weight=True),
}


@pytest.mark.parametrize("name", list(QCASES))
def test_blockscale_stage2_passes_the_harness(calls, name):
    report = run_case(QSPEC, QCASES[name], backends=["aiter", "torch"])
    outcome = report.outcomes["aiter"]
    assert outcome.status == "ok" and report.verdict == "pass", report.describe()
    assert outcome.numerics.entry_point == G.STAGE2_BLOCK
    assert calls == ["moe_sorting_fwd", "ck_moe_stage2_fwd"]


def test_activation_scales_of_the_wrong_token_are_caught(calls, monkeypatch):
    good = G.token_rows

    def rolled(b_ops, k_pad):
        x, s = good(b_ops, k_pad)
        return x, torch.roll(s, 1, dims=0)
    monkeypatch.setattr(G, "token_rows", rolled)
    report = run_case(QSPEC, QCASES["TN-ragged-KN"], backends=["aiter", "torch"])
    assert report.outcomes["aiter"].status == "ok", report.describe()
    assert any(c.lhs == "aiter" and c.rhs == "reference" for c in report.failures)


@pytest.mark.parametrize("ra, rb, match", [
    (_CUR, _CUR, "only FP8 block scaling"),
    (_ACT, _ACT, "got A (1, 128)"),
])
def test_qgemm_refusals_name_the_reason(calls, ra, rb, match):
    report = run_case(QSPEC, _smoke(ra, rb, "TN", [3, 2], 8, 128), backends=["aiter", "torch"])
    outcome = report.outcomes["aiter"]
    assert outcome.status == "unsupported" and match in outcome.reason, report.describe()
    assert calls == []


def test_ocp_codes_are_refused_on_gfx942(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", make_fake([], arch="gfx942"))
    A.reset()
    try:
        with A.PLATFORM.override(rocm=True, gpu_visible=True):
            report = run_case(QSPEC, QCASES["TN-ragged-KN"], backends=["aiter", "torch"])
        assert "e4m3fnuz codes" in report.outcomes["aiter"].reason, report.describe()
    finally:
        A.reset()
