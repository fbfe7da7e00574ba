"""The compound modules LayerNormLinear / LayerNormMLP (tealite/modules/, issue 17 part 5),
judged by the propagated bound (tealite_verify/module_chain.py, tiers/modules.py): a correct
module on torch and on interpreted Triton passes under every recipe, and each wrong stage
(dgrad with the un-transposed weight, the activation's derivative at the wrong point, the FP8
scale inverted, the norm output not quantized where the recipe says) is caught."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tealite
import tealite.modules.layernorm_mlp as lm
from tealite.errors import TealiteArgumentError
from tealite.modules import LayerNormLinear, LayerNormMLP, ModuleBackends
from tealite.types import QuantizedTensor
from tealite_verify import module_chain as mc

TORCH, TRITON = ModuleBackends.every("torch"), ModuleBackends.every("triton")


def _failed(metrics: dict) -> set[str]:
    return {name for name, m in metrics.items() if not m.passed}


# --- correct modules pass -------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["none", "current", "delayed", "mxfp8"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_mlp_and_linear_pass(recipe, dtype):
    for case in (mc.ModuleCase("mlp", 32, 32, 32, dtype, activation="gelu", recipe=recipe),
                 mc.ModuleCase("mlp", 32, 32, 32, dtype, normalization="RMSNorm",
                               activation="swiglu", zero_centered_gamma=True, recipe=recipe,
                               seed=3),
                 mc.ModuleCase("linear", 32, 32, 32, dtype, recipe=recipe, bias=False,
                               return_layernorm_output=True, seed=5)):
        assert not _failed(mc.run_and_check(case, TORCH)), case


@pytest.mark.parametrize("recipe", ["none", "current", "mxfp8"])
def test_triton_mlp_passes(recipe):
    """Every sub-op interpreted on tealite's Triton kernels, tiny shapes."""
    case = mc.ModuleCase("mlp", 32, 32, 32, "bfloat16", activation="swiglu", recipe=recipe)
    assert not _failed(mc.run_and_check(case, TRITON))


def test_mixed_backends_pass():
    mixed = ModuleBackends(norm="triton", gemm="torch", act="triton", quantize="torch",
                           qgemm="triton")
    case = mc.ModuleCase("mlp", 32, 32, 32, "bfloat16", recipe="delayed")
    assert not _failed(mc.run_and_check(case, mixed))


def test_fp16_storage_and_a_returned_norm_output_pass():
    """fp16 rounds every intermediate differently from bf16: legitimate, within the bound."""
    case = mc.ModuleCase("linear", 24, 32, 48, "float16", return_layernorm_output=True)
    assert not _failed(mc.run_and_check(case, TORCH))


# --- wrong stages are caught ----------------------------------------------------------------

def test_dgrad_with_the_untransposed_weight_is_caught(monkeypatch):
    real = lm._mm

    def wrong(a, b, layout, cfg, out_dtype, bias=None):
        return real(a, b, "TN" if layout == "NN" else layout, cfg, out_dtype, bias)
    monkeypatch.setattr(lm, "_mm", wrong)
    case = mc.ModuleCase("linear", 16, 32, 32, "bfloat16")  # square W: the shapes still fit
    assert "dx" in _failed(mc.run_and_check(case, TORCH))


def test_the_activation_derivative_at_the_wrong_point_is_caught(monkeypatch):
    def wrong(da, h, kind, backend=None):  # at the activation's output, not its input
        return tealite.act_bwd(da, tealite.act_fwd(h, kind), kind, backend=backend)
    monkeypatch.setattr(lm, "act_bwd", wrong)
    case = mc.ModuleCase("mlp", 16, 32, 32, "bfloat16", activation="gelu")
    assert {"dx", "dw1"} <= _failed(mc.run_and_check(case, TORCH))


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_an_inverted_fp8_scale_is_caught(monkeypatch, recipe):
    real = lm.quantize

    def wrong(t, rec, **kw):
        q = real(t, rec, **kw)
        return dataclasses.replace(q, scale_inv=1 / q.scale_inv,
                                   columnwise_scale_inv=1 / q.columnwise_scale_inv)
    monkeypatch.setattr(lm, "quantize", wrong)
    case = mc.ModuleCase("mlp", 16, 32, 32, "float32", recipe=recipe)
    assert {"y", "dx", "dw1", "dw2"} <= _failed(mc.run_and_check(case, TORCH))


@pytest.mark.parametrize("recipe", ["current", "delayed", "mxfp8"])
def test_the_norm_output_left_unquantized_is_caught(monkeypatch, recipe):
    """fp32 storage keeps the norm's own error far below an FP8 step: the reference's codes
    are then known exactly and skipping the quantization shows."""
    real_cast, real_mm = lm._cast, lm._mm

    def cast(t, cfg, scales, amaxes, name):
        return t if name == "input1" else real_cast(t, cfg, scales, amaxes, name)

    def mm(a, b, layout, cfg, out_dtype, bias=None):
        if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor):
            return real_mm(a, b, layout, cfg, out_dtype, bias)
        a, b = (tealite.dequantize(t, out_dtype=out_dtype) if isinstance(t, QuantizedTensor)
                else t for t in (a, b))
        return tealite.gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias).out
    monkeypatch.setattr(lm, "_cast", cast)
    monkeypatch.setattr(lm, "_mm", mm)
    case = mc.ModuleCase("linear", 32, 32, 32, "float32", recipe=recipe)
    assert {"y", "dw1"} <= _failed(mc.run_and_check(case, TORCH))


# --- bad input names the argument ---------------------------------------------------------

def test_bad_input_names_the_argument():
    with pytest.raises(TealiteArgumentError, match="normalization must be one of"):
        LayerNormLinear(8, 8, normalization="BatchNorm")
    with pytest.raises(TealiteArgumentError, match="activation must be one of"):
        LayerNormMLP(8, 8, activation="tanh")
    with pytest.raises(TealiteArgumentError, match="recipe must be None"):
        LayerNormMLP(8, 8, recipe="fp8")
    with pytest.raises(TealiteArgumentError, match="ffn_hidden_size must be a positive int"):
        LayerNormMLP(8, 0)
    with pytest.raises(TealiteArgumentError, match="backends must be a ModuleBackends"):
        LayerNormLinear(8, 8, backends="torch")
    mod = LayerNormLinear(8, 4)
    with pytest.raises(TealiteArgumentError, match="x's last dim must be hidden_size=8"):
        mod(torch.randn(3, 5))
    with pytest.raises(TealiteArgumentError, match="x dtype"):
        mod(torch.randn(3, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="recipe must be one of"):
        mc.ModuleCase(recipe="fp4")
    import tealite.recipes as R
    mx = LayerNormLinear(32, 16, recipe=R.MXFP8BlockScaling())
    with pytest.raises(TealiteArgumentError, match="out_features must be a multiple of 32"):
        mx(torch.randn(32, 32))
    with pytest.raises(TealiteArgumentError, match=r"tokens \(x's leading dims\) must be"):
        LayerNormLinear(32, 32, recipe=R.MXFP8BlockScaling())(torch.randn(8, 32))


def test_leading_dims_and_return_layernorm_output():
    mod = LayerNormMLP(16, 8, activation="swiglu", return_layernorm_output=True)
    x = torch.randn(2, 3, 16, requires_grad=True)
    y, z = mod(x)
    assert y.shape == x.shape and z.shape == x.shape
    (y.sum() + z.sum()).backward()
    assert x.grad.shape == x.shape and mod.fc1_weight.grad.shape == (16, 16)


def test_the_benchmark_records_every_sub_op_of_a_step():
    """benchmarks/test_bench_modules.py times each recorded sub-op alone: the recorder must see
    the whole step (fp8: 6 quantizes, 6 qgemms; norm and activation forward and backward)."""
    import tealite.recipes as R
    from benchmarks.test_bench_modules import recorded_sub_ops, step_flops
    mod = LayerNormMLP(32, 32, recipe=R.Float8CurrentScaling())
    x = torch.randn(32, 32, requires_grad=True)
    calls: list = []
    with recorded_sub_ops(calls):
        mod(x).sum().backward()
    names = [c[0] for c in calls]
    assert names.count("quantize") == 6 and names.count("qgemm") == 6
    assert {"layernorm_fwd", "layernorm_bwd", "act_fwd", "act_bwd"} <= set(names)
    assert lm.quantize.__name__ == "quantize"  # restored
    assert step_flops(32, 32, 32, 32) == 6 * 2 * 32 * 32 * 32


@pytest.mark.parametrize("recipe", ["current", "delayed", "mxfp8"])
def test_the_quantize_step_bound_holds_and_allows_nothing_where_no_rounding_can_move(recipe):
    """tiers/modules.quantize_bound: a backend quantizing any v̂ within E of v lands within
    the bound of the reference's Q(v); where [v - E, v + E] holds no rounding boundary the
    allowance is only the scale's spread, so most elements carry almost none (what catches a
    skipped quantization)."""
    import numpy as np

    from tealite_verify.references import modules as rm
    from tealite_verify.tiers.modules import quantize_bound
    g = torch.Generator().manual_seed(7)
    v = torch.randn(32, 64, generator=g, dtype=torch.float64) * 3
    e = 2.0 ** -12 * v.abs()
    rec = mc.RECIPES[recipe]
    step = rm.QuantStep(rec.kind, rec.fmt, scale=64.0 if recipe == "delayed" else None)
    want = rm.qdq(v.numpy(), step)
    tol = quantize_bound(v.numpy(), e.numpy(), want, step)
    scale = {"scale": torch.tensor([64.0])} if recipe == "delayed" else {}
    for _ in range(3):
        v_hat = (v + (torch.rand(v.shape, generator=g, dtype=torch.float64) * 2 - 1) * e).float()
        got = tealite.dequantize(tealite.quantize(v_hat, rec, **scale), out_dtype=torch.float32)
        assert (np.abs(got.double().numpy() - want) <= tol).all()
    # current scaling: the backend's amax (hence scale) may differ by E, a relative 2^-12
    # shift of every value; still far below e4m3's half step (2^-4) nearly everywhere.
    assert (tol <= 2.0 ** -10 * np.abs(v.numpy())).mean() > 0.9
