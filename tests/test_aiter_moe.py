"""AITER's fused MoE as the composed layer's expert FFN (forward only), judged by the composed
MoE layer check (tealite_verify/moe_layer.py) on y, probs and the routing map.

* ``aiter_triton``: AITER's own Triton ``moe_align_block_size_triton`` + ``fused_moe`` run in
  Triton's interpreter (fp16 and fp32; bf16 is refused there with the reason).
* ``aiter`` (CK / ASM, ROCm): ``aiter.fused_moe`` against a FAKE ``aiter`` that computes the
  documented result (torch_moe's semantics in float64, weighted rows and their sum rounded to
  the dtype as declared) and asserts the argument conventions the real wrapper needs (int32
  ids, fp32 weights, contiguous (E, 2F, H) / (E, H, F) weights, Silu, no quantization).  These
  prove the adapter and the refusals, not CK's numerics (an MI300 / MI350 run).

A w1 with its gate and up halves swapped (the convention a fused kernel could get wrong) is
caught by the layer check, a correct path is not."""
from __future__ import annotations

import dataclasses
import enum
import sys
import types

import pytest
import torch

from tealite import registry
from tealite.backends import aiter as A
from tealite.errors import UnsupportedCase
from tealite_verify import moe_layer as ml

_TRITON = registry.get_backend("aiter_triton")
_TRITON_WHY = _TRITON.unavailable_reason()
needs_triton = pytest.mark.skipif(_TRITON_WHY is not None,
                                  reason=f"aiter_triton unavailable: {_TRITON_WHY}")

CASES = [ml.LayerCase(12, 16, 8, 4, 2, "float16", seed=1),
         ml.LayerCase(9, 32, 16, 6, 3, "float32", seed=2),
         ml.LayerCase(5, 8, 8, 8, 2, "float16", seed=3)]   # experts with no token


def _judge(stages, case, inputs=None):
    inputs = inputs or ml.make_inputs(case)
    out = ml.run_layer(stages, inputs, case)
    return ml.check_layer(out, inputs, case, stages.numerics(case.torch_dtype))


def _swapped_halves(stages):
    """The fused path fed w1 with gate and up swapped (judged against the true w1)."""
    fused = stages.fused_forward

    def forward(x, w1, w2, w, ids, kind):
        f = w1.shape[1] // 2
        return fused(x, torch.cat([w1[:, f:], w1[:, :f]], dim=1), w2, w, ids, kind)
    return dataclasses.replace(stages, fused_forward=forward)


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.dtype}-{c.tokens}x{c.experts}")
def test_aiter_triton_fused_moe_passes_the_layer_check(case):
    metrics = _judge(ml.aiter_triton_stages(), case)
    assert set(metrics) == {"routing_map", "y", "probs"}
    assert all(m.passed for m in metrics.values()), {k: m.summary() for k, m in metrics.items()}


@needs_triton
def test_aiter_triton_gate_up_swap_is_caught():
    metrics = _judge(_swapped_halves(ml.aiter_triton_stages()), CASES[0])
    assert not metrics["y"].passed


@needs_triton
def test_aiter_triton_refusals_name_the_reason():
    from tealite.backends.aiter_triton import INTERPRET
    from tealite.backends.aiter_triton import moe as M
    case = ml.LayerCase(4, 8, 4, 2, 1, "float16")
    x, w1, w2 = (ml.make_inputs(case)[k] for k in ("x", "w1", "w2"))
    ids, w = torch.zeros(4, 1, dtype=torch.int32), torch.ones(4, 1)
    with pytest.raises(UnsupportedCase, match="gated SiLU"):
        M.fused_experts(x, w1, w2, w, ids, kind="geglu")
    if INTERPRET:
        with pytest.raises(UnsupportedCase, match="interpreter"):
            M.fused_experts(x.bfloat16(), w1.bfloat16(), w2.bfloat16(), w, ids)


# ---- CK / ASM (ROCm) against a fake aiter ----------------------------------------------------

class _Activation(enum.Enum):
    Silu = 0
    Gelu = 1


class _Quant(enum.Enum):
    No = 0
    per_Token = 1


def make_fake(calls: list) -> types.ModuleType:
    fake = types.ModuleType("aiter")
    fake.__version__ = "0.0-fake"
    fake.__tealite_fake_arch__ = "gfx942"
    fake.__tealite_fake_devices__ = ("cpu",)
    fake.ActivationType, fake.QuantType = _Activation, _Quant

    def fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None,
                  activation=_Activation.Silu, quant_type=_Quant.No, **kw):
        calls.append("fused_moe")
        assert activation is _Activation.Silu and quant_type is _Quant.No
        assert topk_ids.dtype == torch.int32 and topk_weight.dtype == torch.float32
        for t in (hidden_states, w1, w2, topk_weight, topk_ids):
            assert t.is_contiguous()
        e, f2, h = w1.shape
        assert w2.shape == (e, h, f2 // 2) and hidden_states.shape[1] == h
        dt = hidden_states.dtype
        out = torch.zeros(hidden_states.shape, dtype=dt)
        for s in range(topk_ids.shape[1]):  # stage 2 adds each slot's weighted rows in
            x = hidden_states.double()
            wt = w1[topk_ids[:, s].long()].double()
            act_in = torch.einsum("th,tnh->tn", x, wt).to(dt).double()
            g, u = act_in.split(f2 // 2, dim=-1)
            a = (torch.nn.functional.silu(g) * u).to(dt).double()
            rows = torch.einsum("tf,thf->th", a, w2[topk_ids[:, s].long()].double())
            out = (out.double() + (topk_weight[:, s, None].double() * rows).to(dt)).to(dt)
        return out

    fake.fused_moe = fused_moe
    return fake


@pytest.fixture
def ck_calls(monkeypatch):
    record: list = []
    monkeypatch.setitem(sys.modules, "aiter", make_fake(record))
    A.reset()
    with A.PLATFORM.override(rocm=True, gpu_visible=True):
        yield record
    A.reset()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ck_fused_moe_adapter_passes_the_layer_check(ck_calls, dtype):
    case = ml.LayerCase(12, 16, 8, 4, 2, dtype, seed=4)
    metrics = _judge(ml.aiter_ck_stages(), case)
    assert ck_calls == ["fused_moe"]
    assert all(m.passed for m in metrics.values()), {k: m.summary() for k, m in metrics.items()}


def test_ck_gate_up_swap_is_caught(ck_calls):
    metrics = _judge(_swapped_halves(ml.aiter_ck_stages()),
                     ml.LayerCase(12, 16, 8, 4, 2, "bfloat16", seed=4))
    assert not metrics["y"].passed


def test_ck_refusals_name_the_reason(ck_calls):
    from tealite.backends.aiter import moe as M
    case = ml.LayerCase(4, 8, 4, 2, 1, "float32")
    x, w1, w2 = (ml.make_inputs(case)[k] for k in ("x", "w1", "w2"))
    ids, w = torch.zeros(4, 1, dtype=torch.int32), torch.ones(4, 1)
    with pytest.raises(UnsupportedCase, match="bf16 / fp16"):
        M.fused_experts(x, w1, w2, w, ids)
    with pytest.raises(UnsupportedCase, match="gated SiLU"):
        M.fused_experts(x.half(), w1.half(), w2.half(), w, ids, kind="reglu")
    assert ck_calls == []


def test_ck_missing_entry_point_is_the_reason(monkeypatch):
    fake = make_fake([])
    del fake.fused_moe
    monkeypatch.setitem(sys.modules, "aiter", fake)
    A.reset()
    try:
        from tealite.backends.aiter import moe as M
        x = torch.zeros(2, 8, dtype=torch.bfloat16)
        with pytest.raises(UnsupportedCase, match="no aiter.fused_moe"):
            M.fused_experts(x, torch.zeros(2, 8, 8, dtype=torch.bfloat16),
                            torch.zeros(2, 8, 4, dtype=torch.bfloat16), torch.ones(2, 1),
                            torch.zeros(2, 1, dtype=torch.int32))
    finally:
        A.reset()


def test_contracts_are_declared():
    from tealite.backends.aiter_common.contracts import contracts
    got = {(c.backend, c.entry_point) for c in contracts()}
    assert {("aiter", "fused_moe"), ("aiter_triton", "fused_moe")} <= got


# ---- through the registry: the moe_ffn_fwd op and its spec -----------------------------------

@needs_triton
def test_moe_ffn_fwd_spec_on_aiter_triton_and_torch():
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    spec = get_spec("moe_ffn_fwd")
    for case in spec.smoke_cases:
        rep = run_case(spec, case, backends=["aiter_triton", "torch"])
        assert rep.verdict == "pass", rep.describe()
        o = rep.outcomes["aiter_triton"]
        if case["dtype"] == "bfloat16":
            assert o.status == "unsupported" and "interpreter" in o.reason
        else:
            assert o.status == "ok" and o.numerics.entry_point == "fused_moe"
            assert str(o.numerics.moe_merge) == "rows_rounded"


def test_moe_ffn_fwd_on_ck_through_the_registry(ck_calls):
    import tealite
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    spec = get_spec("moe_ffn_fwd")
    case = dict(spec.smoke_cases[1])  # bf16
    rep = run_case(spec, case, backends=["aiter", "torch"])
    assert rep.verdict == "pass" and rep.outcomes["aiter"].status == "ok", rep.describe()
    assert ck_calls == ["fused_moe"]
    with pytest.raises(UnsupportedCase, match="dtype float32 not in"):
        x = torch.zeros(2, 8)
        tealite.moe_ffn_fwd(x, torch.zeros(2, 8, 8), torch.zeros(2, 8, 4), torch.ones(2, 1),
                            torch.zeros(2, 1, dtype=torch.int32), backend="aiter")


def test_moe_ffn_fwd_bad_input_names_the_argument():
    import tealite
    from tealite.errors import TealiteArgumentError
    x, w1, w2 = torch.zeros(3, 8), torch.zeros(2, 8, 8), torch.zeros(2, 8, 4)
    w = torch.ones(3, 1)
    with pytest.raises(TealiteArgumentError, match="topk_ids must be expert ids in"):
        tealite.moe_ffn_fwd(x, w1, w2, w, torch.full((3, 1), 2))
    with pytest.raises(TealiteArgumentError, match="distinct"):
        tealite.moe_ffn_fwd(x, w1, w2, torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(TealiteArgumentError, match="w2 must have shape"):
        tealite.moe_ffn_fwd(x, w1, torch.zeros(2, 8, 8), w, torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(TealiteArgumentError, match="topk_weights dtype"):
        tealite.moe_ffn_fwd(x, w1, w2, w.half(), torch.zeros(3, 1, dtype=torch.int64))
