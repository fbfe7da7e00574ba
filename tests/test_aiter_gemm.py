"""AITER's ``gemm_a16w16`` as the ``aiter_triton`` backend's ``gemm`` (under Triton's CPU
interpreter in CI with ``$TEALITE_AITER_PATH`` set, or on a GPU): every TE layout through
transposed views, the bias epilogue, the rejected cases with their reasons, a missing entry
point, seeded wrong variants the harness must catch, and the interpreter bugs that make bf16
unjudgeable there (proved on AITER's own kernel)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings

import tealite
from tealite import registry
from tealite.backends.aiter_common.contracts import contracts
from tealite.backends.aiter_triton import INTERPRET
from tealite.errors import UnsupportedCase
from tealite_verify import profiles
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_aiter import mine_failed, ran, seeded_variant_is_caught
from tealite_verify.specs.gemm import make_case

AT = registry.get_backend("aiter_triton")
REASON = AT.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"aiter_triton unavailable: {REASON}")
DEV = "cpu" if INTERPRET else "cuda"
# bf16 is rejected under the interpreter (see the interpreter tests at the end).
DT = "float16" if INTERPRET else "bfloat16"
SPEC = get_spec("gemm")
ENTRY = "gemm_a16w16"
PEERS = ["aiter_triton", "torch"]


def _run(case, backends=PEERS):
    return run_case(SPEC, case, backends=backends, device=DEV)


def _kernels():
    from tealite.backends.aiter_triton import kernels
    return kernels()


# ---- what runs --------------------------------------------------------------------------------

CASES = {
    "TN-square-tile-tails": make_case("TN", DT, 29, 48, 257),
    "NN-bias": make_case("NN", DT, 33, 17, 96, bias=True),
    "NT-fp32-out": make_case("NT", DT, 20, 40, 100, out_dtype="float32"),
    "TT-bias-fp32-out": make_case("TT", DT, 17, 31, 64, out_dtype="float32", bias=True),
    "TN-k1": make_case("TN", DT, 5, 3, 1),
    "NN-empty-m": make_case("NN", DT, 0, 16, 64),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layouts_and_bias_match_the_reference(name):
    report = _run(CASES[name])
    assert ran(report).numerics.entry_point == ENTRY
    assert report.verdict == "pass", report.describe()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT", "TT"])
def test_non_square_shapes_follow_the_te_transpose_convention(layout):
    """M, N, K all different: D = op_B(B) @ op_A(A) of shape (M, N), A stored (N, K) for T?
    and (K, N) for N?, B stored (M, K) for ?N and (K, M) for ?T.  Any other reading of the
    views either fails on the shapes or gives a different product."""
    m, n, k = 5, 24, 40
    g = torch.Generator().manual_seed(7)
    a_shape = (n, k) if layout[0] == "T" else (k, n)
    b_shape = (m, k) if layout[1] == "N" else (k, m)
    # Small integers: every product and sum is exact in fp16 inputs and fp32 accumulation.
    a = torch.randint(-3, 4, a_shape, generator=g).to(getattr(torch, DT)).to(DEV)
    b = torch.randint(-3, 4, b_shape, generator=g).to(getattr(torch, DT)).to(DEV)
    out = tealite.gemm(a, b, layout=layout, out_dtype=torch.float32, backend="aiter_triton").out
    op_a = a.double().cpu().numpy()
    op_a = op_a.T if layout[0] == "T" else op_a
    op_b = b.double().cpu().numpy()
    op_b = op_b.T if layout[1] == "T" else op_b
    assert tuple(out.shape) == (m, n)
    np.testing.assert_array_equal(out.cpu().double().numpy(), op_b @ op_a)


def test_out_is_written_in_place():
    a = torch.randn(24, 64).to(getattr(torch, DT)).to(DEV)
    b = torch.randn(9, 64).to(getattr(torch, DT)).to(DEV)
    out = torch.full((9, 24), float("nan"), dtype=torch.float32, device=DEV)
    r = tealite.gemm(a, b, layout="TN", out_dtype=torch.float32, out=out, backend="aiter_triton")
    assert r.out.data_ptr() == out.data_ptr()
    want = b.double() @ a.double().t()
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


def _accepted(case: dict) -> dict:
    """The drawn case with the epilogue AITER has (no GELU, alpha 1, beta 0) and, under the
    interpreter, no bf16 output: the spec's draws otherwise rarely reach this backend."""
    out_dtype = case["out_dtype"]
    if INTERPRET and out_dtype == "bfloat16":
        out_dtype = "float32"
    return dict(case, gelu=False, alpha=1.0, beta=0.0, out_dtype=out_dtype)


@given(case=SPEC.cases(DT, profiles.shape_size()).map(_accepted))
@settings(settings())
def test_drawn_cases_aiter_accepts_match_reference_and_torch(case):
    report = _run(case)
    ran(report)
    assert not mine_failed(report), report.describe()


# ---- what is rejected, and why ------------------------------------------------------------------

REJECTED = {
    "gelu": ({"gelu": True}, "pre-activation"),
    "alpha": ({"alpha": 0.5}, "no alpha"),
    "beta": ({"beta": 1.0}, "cannot accumulate"),
    "fp32-inputs": ({"dtype": "float32", "out_dtype": "float32"}, "dtype float32 not in"),
    "empty-k": ({"k": 0}, "K == 0"),
}
if INTERPRET:
    REJECTED["bf16-inputs-interpreter"] = ({"dtype": "bfloat16", "out_dtype": "float32"},
                                           "raw uint16 bits")
    REJECTED["bf16-output-interpreter"] = ({"out_dtype": "bfloat16"}, "truncates")


@pytest.mark.parametrize("name", list(REJECTED))
def test_unsupported_cases_are_rejected_with_the_reason(name):
    overrides, why = REJECTED[name]
    report = _run(dict(make_case("TN", DT, 8, 16, 64), **overrides), backends=["aiter_triton"])
    outcome = report.outcomes["aiter_triton"]
    assert outcome.status == "unsupported", report.describe()
    assert why in outcome.reason, outcome.reason


def test_missing_entry_point_is_rejected_with_the_loaders_reason(monkeypatch):
    at = _kernels()
    monkeypatch.delitem(at.functions, ENTRY)
    monkeypatch.setitem(at.missing, ENTRY, "aiter.ops.triton.gemm.basic.gemm_a16w16: moved (test)")
    report = _run(make_case("TN", DT, 8, 16, 64), backends=["aiter_triton"])
    outcome = report.outcomes["aiter_triton"]
    assert outcome.status == "unsupported"
    assert f"lacks {ENTRY}: aiter.ops.triton.gemm.basic.gemm_a16w16: moved (test)" in outcome.reason
    with pytest.raises(UnsupportedCase, match="moved \\(test\\)"):
        a = torch.randn(16, 64).to(getattr(torch, DT)).to(DEV)
        tealite.gemm(a, a[:8], backend="aiter_triton")


def test_contract_is_declared_and_reported():
    (c,) = [c for c in contracts("aiter_triton") if c.entry_point == ENTRY]
    assert c.op == "gemm" and c.layouts
    num = AT.impls["gemm"].numerics(dict(m=8, n=16, k=64, layout="TN", dtype=torch.float16,
                                         out_dtype=torch.float16, bias=True, gelu=False,
                                         alpha=1.0, beta=0.0, device=DEV))
    assert num.entry_point == ENTRY and num.compute_dtype == torch.float32
    assert num.epilogue_in_accumulator is True  # the bias seeds the accumulator


# ---- seeded wrong variants: the harness must catch them -----------------------------------------

def _transposed_weight(fn):
    return lambda x, w, **kw: fn(x, w.t(), **kw)


def _bias_dropped(fn):
    return lambda x, w, **kw: fn(x, w, **dict(kw, bias=None))


def _x_scaled(fn):  # 2^-6 relative error on every input (kept by bf16 and fp16 alike)
    return lambda x, w, **kw: fn((x.float() * (1 + 2.0 ** -6)).to(x.dtype), w, **kw)


SEEDED = {
    "transposed-weight": (_transposed_weight, make_case("TN", DT, 20, 64, 64)),
    "bias-dropped": (_bias_dropped, make_case("NN", DT, 17, 40, 96, bias=True)),
    "input-perturbed": (_x_scaled, make_case("NT", DT, 24, 33, 128, out_dtype="float32")),
}


@pytest.mark.parametrize("name", list(SEEDED))
def test_seeded_wrong_variant_is_caught_and_the_correct_one_passes(monkeypatch, name):
    wrap, case = SEEDED[name]
    seeded_variant_is_caught(_run, _kernels().functions, ENTRY, wrap, case, monkeypatch)


# ---- the interpreter bugs behind the bf16 rejections ---------------------------------------------

interpreter_only = pytest.mark.skipif(not INTERPRET, reason="Triton interpreter bugs")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b, input_precision="ieee"))


@interpreter_only
def test_interpreter_bf16_dot_is_garbage_on_aiter_kernel_and_a_plain_dot():
    """The same exactly representable values: AITER's kernel is exact with fp16 operands and
    wrong with bf16 ones, and so is a bare tl.dot: the interpreter's bf16 dot, not AITER."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 5, (16, 32), generator=g).float()
    w = torch.randint(-4, 5, (16, 32), generator=g).float()
    want = x.double() @ w.double().t()
    fn = _kernels().functions[ENTRY]
    y16 = fn(x.half(), w.half(), dtype=torch.float32)
    ybf = fn(x.bfloat16(), w.bfloat16(), dtype=torch.float32)
    assert torch.equal(y16.double(), want)
    assert (ybf.double() - want).abs().max() > 1e3  # raw uint16 bits multiplied
    a, b = x[:, :16].contiguous(), w[:, :16].t().contiguous()
    c16 = torch.empty(16, 16)
    cbf = torch.empty(16, 16)
    _dot_kernel[(1,)](a.half(), b.half(), c16, N=16)
    _dot_kernel[(1,)](a.bfloat16(), b.bfloat16(), cbf, N=16)
    assert torch.equal(c16.double(), a.double() @ b.double())
    assert (cbf.double() - a.double() @ b.double()).abs().max() > 1e3


@interpreter_only
def test_interpreter_bf16_output_is_truncated_not_rounded():
    """AITER's .to(bfloat16) of the fp32 accumulator: in the interpreter the bf16 output is
    the fp32 output with its low 16 bits cleared (truncation), not round-to-nearest-even."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(32, 64, generator=g).half()
    w = torch.randn(48, 64, generator=g).half()
    fn = _kernels().functions[ENTRY]
    y32 = fn(x, w, dtype=torch.float32)
    ybf = fn(x, w, dtype=torch.bfloat16)
    truncated = (y32.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()
    assert torch.equal(ybf.view(torch.int16), truncated.view(torch.int16))
    assert not torch.equal(ybf.view(torch.int16), y32.bfloat16().view(torch.int16))
