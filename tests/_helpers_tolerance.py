"""Shared helpers of the tolerance tests (test_tolerance_primitives.py, test_tolerance_tiers.py,
test_seeded_wrong_backends.py): dtype constants, a correctly rounded float64 -> dtype cast, case
builders and end-to-end assertions through the runner, and float64 activation formulas.

The ``make_backend`` fixture these tests use is in conftest.py.
"""
from __future__ import annotations

import torch
from tealite.numerics import Numerics
import torch.nn.functional as F

from tealite.ops.activations import GATED
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.gemm import make_case

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
NUM32 = Numerics(compute_dtype=FP32)
# One output ULP at 1.0 (relative): 2^-7 for bf16, 2^-10 for fp16.
ULP_REL = {BF16: 2.0**-7, FP16: 2.0**-10}


def _round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Correctly rounded float64 -> ``dtype``.

    torch's float64 -> float16/bfloat16 ``.to()`` goes through float32 (double rounding: a value
    just below a tie can be rounded to the tie, then away), so it is *not* one rounding.  Round to
    odd into float32 first (truncate, set the last bit when inexact), then round to nearest: with
    >= 2 spare bits that is exactly the correctly rounded result.
    """
    x = x.to(FP64)
    f = x.to(FP32)
    if dtype == FP32:
        return f
    bits = f.view(torch.int32)
    bits = torch.where(f.double().abs() > x.abs(), bits - 1, bits)  # toward zero
    bits = torch.where(bits.view(FP32).double() != x, bits | 1, bits)  # sticky bit
    return bits.view(FP32).to(dtype)


_gemm_case = make_case  # the gemm spec's own case builder


def _act_case(kind, shape, dtype, seed=11, scale=2.0):
    return {"kind": kind, "shape": shape, "dtype": dtype,
            "dist": {"kind": "normal", "scale": scale}, "seed": seed,
            "dist_dy": {"kind": "normal", "scale": 1.0}}


def _norm_case(shape, dtype, *, rms, **kw):
    case = {"shape": shape, "dtype": dtype, "weight_dtype": dtype, "zero_centered_gamma": False,
            "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0}, "seed": 7,
            "dist_dy": {"kind": "normal", "scale": 1.0}}
    if not rms:
        case["offset"] = 0.0
    case.update(kw)
    return case


def _comparisons(report, lhs, rhs):
    return [c for c in report.comparisons if {c.lhs, c.rhs} == {lhs, rhs}]


def assert_caught(op, cases, wrong, *, outputs=None):
    """torch passes; ``wrong`` fails against the reference and pairwise against torch."""
    spec = get_spec(op)
    for case in cases:
        report = run_case(spec, case, backends=["torch", wrong])
        info = report.describe()
        assert report.outcomes["torch"].status == "ok", info
        assert report.outcomes[wrong].status == "ok", info  # caught by numerics, not a crash
        torch_ref = _comparisons(report, "torch", "reference")
        assert torch_ref and all(c.metrics.passed for c in torch_ref), info
        bad_ref = [c for c in _comparisons(report, wrong, "reference") if not c.metrics.passed]
        bad_pair = [c for c in _comparisons(report, "torch", wrong) if not c.metrics.passed]
        assert bad_ref, "wrong backend not caught against the reference:\n" + info
        assert bad_pair, "wrong backend not caught pairwise against torch:\n" + info
        if outputs is not None:
            assert {c.output for c in bad_ref} & set(outputs), info
        assert report.verdict == "fail"


def assert_passes(op, cases, name):
    spec = get_spec(op)
    for case in cases:
        report = run_case(spec, case, backends=["torch", name])
        assert report.verdict == "pass", report.describe()
        assert len(_comparisons(report, "torch", name)) >= 1


_PW64 = {"gelu": lambda v: F.gelu(v), "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
         "relu": F.relu, "silu": F.silu, "qgelu": lambda v: v * torch.sigmoid(1.702 * v),
         "srelu": lambda v: F.relu(v) ** 2}


def _act64(x, kind):
    if kind in GATED:
        a, g = x.chunk(2, dim=-1)
        return _PW64[GATED[kind]](a) * g
    return _PW64[kind](x)


def _grad64(dy, x, kind):
    with torch.enable_grad():
        x64 = x.detach().double().requires_grad_(True)
        (dx,) = torch.autograd.grad(_act64(x64, kind), x64, dy.double())
    return dx


def _rows(t):
    return t.reshape(-1, t.shape[-1]).sum(dim=0)


def _weight64(gamma, zc):
    g = gamma.double()
    return g + 1.0 if zc else g
