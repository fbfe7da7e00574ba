"""Subnormal operands treated as zero: a probed, declared numerics property of torch's CPU
matmul (tealite/backends/torch/probes.py), modelled by the gemm tier (the products with a
subnormal operand join the bound).  A GEMM that flushes subnormals passes only where that is
declared, and a GEMM wrong by more than the flushed products is still caught."""
from __future__ import annotations

import numpy as np
import torch
from tealite.numerics import Numerics

from tealite.backends.torch import gemm as torch_gemm
from tealite.backends.torch.probes import matmul_flushes_subnormal_inputs
from tealite_verify.tiers import gemm as TG
from tealite_verify.specs import get_spec
from tealite_verify.specs.gemm import make_case

BF16 = torch.bfloat16


def _subnormal_case():
    """A bf16 GEMM whose A operand holds only bf16 subnormals and B values near 2^10, so the
    products (~1e-35) stand far above the tier's underflow allowance (K x 2^-126 ~ 7.5e-37):
    a kernel that treats subnormal inputs as zero returns exact zeros."""
    spec = get_spec("gemm")
    case = make_case("NN", "bfloat16", 8, 8, 64, seed=7,
                     dist_b={"kind": "normal", "scale": 1024.0})
    inputs = spec.make_inputs(case, "cpu")
    tiny = float(torch.finfo(BF16).tiny)
    g = torch.Generator().manual_seed(0)
    sub = (torch.randint(1, 64, inputs["a"].shape, generator=g) * (tiny / 64)).to(BF16)
    inputs["a"] = sub * torch.where(torch.rand(sub.shape, generator=g) < 0.5, -1.0, 1.0).to(BF16)
    x = {k: (v.double().numpy() if isinstance(v, torch.Tensor) else v)
         for k, v in inputs.items()}
    return spec.reference(x, case)["out"], inputs


def _passes(out: torch.Tensor, exp, numerics: dict) -> bool:
    return bool(np.all(np.abs(out.double().numpy() - exp.value) <= exp.bound(numerics)))


def test_the_probe_answers_for_each_float_dtype():
    for dt in (torch.float32, torch.float16, BF16):
        assert isinstance(matmul_flushes_subnormal_inputs(dt), bool)
    assert matmul_flushes_subnormal_inputs(torch.float32) is False  # fp32: no oneDNN bf16 path


def test_the_backend_declares_what_the_probe_found():
    params = {"dtype": BF16, "bias": False, "gelu": False, "alpha": 1.0, "beta": 0.0,
              "out_dtype": BF16, "device": "cpu"}
    declared = torch_gemm._numerics(params).get("subnormal_inputs")
    assert declared == ("may_flush" if matmul_flushes_subnormal_inputs(BF16) else None)


def test_a_flushing_gemm_passes_only_where_declared():
    exp, inputs = _subnormal_case()
    assert inputs["a"].abs().max() < torch.finfo(BF16).tiny and np.abs(exp.value).max() > 0
    flushed = torch.zeros(exp.value.shape, dtype=BF16)  # every product had a subnormal operand
    assert _passes(flushed, exp, Numerics(subnormal_inputs="may_flush"))
    assert not _passes(flushed, exp, Numerics())
    # A result beyond the sum of the droppable products is wrong either way.
    off = torch.full(exp.value.shape, 1e-30, dtype=BF16)
    assert not _passes(off, exp, Numerics(subnormal_inputs="may_flush"))


def test_a_wrong_gemm_is_still_caught_when_flushing_is_declared():
    spec = get_spec("gemm")
    case = make_case("NN", "bfloat16", 8, 8, 64, seed=3)  # ordinary inputs
    inputs = spec.make_inputs(case, "cpu")
    x = {k: (v.double().numpy() if isinstance(v, torch.Tensor) else v)
         for k, v in inputs.items()}
    exp = spec.reference(x, case)["out"]
    wrong = torch.from_numpy(exp.value * (1 + 2.0 ** -5)).to(BF16)
    tol = exp.bound(Numerics(subnormal_inputs="may_flush"))
    assert not np.all(np.abs(wrong.double().numpy() - exp.value) <= tol)


def test_normal_magnitude_zeroes_only_subnormals():
    tiny = float(torch.finfo(BF16).tiny)
    x = np.array([0.0, tiny / 4, -tiny / 2, tiny, -3.0])
    assert TG.normal_magnitude(x, BF16).tolist() == [0.0, 0.0, 0.0, tiny, 3.0]



def test_the_flushed_sum_is_rounded_in_its_own_binade():
    """The local-size fuzz false alarm (docs/probabilistic.md), torch's bf16 CPU matmul on
    this machine: out[80, 6] = 4.834e-35 (normal product) - 2.70e-37 (a product with a
    subnormal operand) = 4.807e-35 exactly, just under 2^-114.  The kernel drops the second
    product and rounds the accumulator to bf16 above 2^-114, where the ulp is twice as
    large: 4.852e-35, 1.07x a bound that rounded in the exact sum's binade."""
    spec = get_spec("gemm")
    case = {"alpha": 1.0, "beta": 0.0, "bias": False, "dist_a": {"kind": "tiny",
            "sample_dtype": "float32"}, "dist_b": {"factor": 1024.0, "frac": 0.1,
            "kind": "outliers", "sample_dtype": "float32", "scale": 1.0}, "dtype": "bfloat16",
            "gelu": False, "k": 5, "layout": "TN", "m": 134, "n": 7, "out_dtype": "float32",
            "seed": 0}
    inputs = spec.make_inputs(case, "cpu")
    x = {k: (v.double().numpy() if isinstance(v, torch.Tensor) else v)
         for k, v in inputs.items()}
    exp = spec.reference(x, case)["out"]
    # What the flushing kernel does: subnormal operands read as zero, an fp32 sum, rounded to
    # the bf16 accumulator, then the fp32 epilogue (the torch backend's declared numerics).
    a, b = (torch.where(t.float().abs() < torch.finfo(BF16).tiny, 0.0, t.float())
            for t in (inputs["a"], inputs["b"]))
    got = (b @ a.t()).to(BF16).float()
    assert float(got[80, 6]) == 4.852440680194403e-35  # the value torch returned
    numerics = Numerics(subnormal_inputs="may_flush", accumulator_rounded_to=BF16)
    assert _passes(got, exp, numerics)
    # Losing a normal product is still caught under the declaration.
    wrong = got.clone()
    i = int(np.argmax(np.abs(exp.value)))
    wrong.view(-1)[i] = 0.0
    assert not _passes(wrong, exp, numerics)
