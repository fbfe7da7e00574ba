"""Bad GEMM input gets a clear error naming the argument and the constraint it broke; nothing is
silently broadcast, truncated or reinterpreted.

Every check here runs in the op front-ends before any backend is chosen, so these tests run
on the CPU only.  A tensor on the ``meta`` device stands in for "a second device".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tealite
from tealite.ops.gemm import LAYOUTS

from _helpers_bad_input import BF16, F16, F32, K, M, N, esc, raises, stored, t

@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_valid_shapes_pass(layout):
    # The sanity baseline every bad case below perturbs.
    a, b = stored(layout)
    r = tealite.gemm(a, b, layout=layout)
    assert r.out.shape == (M, N) and r.pre_gelu is None


def test_gemm_wrong_rank():
    a, b = stored("TN")
    with raises(r"a must be 2-D, got shape \(8,\)"):
        tealite.gemm(t(K), b)
    with raises(r"b must be 2-D, got shape \(2, 5, 8\)"):
        tealite.gemm(a, t(2, M, K))
    with raises(r"a must be 2-D, got shape \(\)"):
        tealite.gemm(torch.tensor(1.0), b)


def test_gemm_non_tensor():
    a, b = stored("TN")
    with raises(r"a must be a torch.Tensor, got ndarray"):
        tealite.gemm(np.ones((N, K), np.float32), b)
    with raises(r"b must be a torch.Tensor, got list"):
        tealite.gemm(a, [[1.0] * K] * M)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_k_mismatch_names_k_and_both_shapes(layout):
    a, b = stored(layout, k_a=K, k_b=K + 1)
    pattern = (rf"contraction dims differ under layout {layout}: "
               rf"a gives K={K} \(a shape {esc(str(tuple(a.shape)))}\), "
               rf"b gives K={K + 1} \(b shape {esc(str(tuple(b.shape)))}\)")
    with raises(pattern):
        tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_wrong_layout_for_shapes_is_not_silently_transposed(layout):
    # Operands stored for another layout must fail under this one (M, N, K all differ, so
    # no two layouts accept the same stored shapes).
    for other in LAYOUTS:
        if other == layout:
            continue
        a, b = stored(other)
        with raises("contraction dims differ"):
            tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("bad", [torch.int32, torch.float64, torch.int8, torch.complex64])
@pytest.mark.parametrize("which", ["a", "b"])
def test_gemm_unsupported_dtype(which, bad):
    a, b = stored("TN")
    if which == "a":
        a = a.to(bad)
    else:
        b = b.to(bad)
    name = str(bad).removeprefix("torch.")
    with raises(rf"{which} dtype must be one of \(float32, bfloat16, float16\), got {name}"):
        tealite.gemm(a, b)


def test_gemm_ab_dtype_mismatch():
    a, b = stored("TN")
    with raises(r"a and b must share a dtype, got a torch.float32 and b torch.bfloat16"):
        tealite.gemm(a, b.to(BF16))


@pytest.mark.parametrize("layout", ["tn", "XN", "T", "TNN", "", None, ("T", "N")])
def test_gemm_bad_layout(layout):
    a, b = stored("TN")
    with raises(r"layout must be one of \('TN', 'NN', 'NT', 'TT'\), got " + esc(repr(layout))):
        tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.int32, torch.float8_e4m3fn,
                                       "float32", F32.itemsize])
def test_gemm_bad_out_dtype(out_dtype):
    a, b = stored("TN")
    with raises(r"out_dtype must be one of \(float32, bfloat16, float16\), got "):
        tealite.gemm(a, b, out_dtype=out_dtype)


def test_gemm_string_out_dtype_message_is_unambiguous():
    a, b = stored("TN")
    with raises(r"out_dtype must be one of \(float32, bfloat16, float16\), got 'float32'"):
        tealite.gemm(a, b, out_dtype="float32")


@pytest.mark.parametrize("shape", [(N + 1,), (1,), (N - 1,), (1, N), (M, N), (K,)], ids=str)
def test_gemm_bias_wrong_shape(shape):
    a, b = stored("TN", dtype=BF16)
    bias = t(*shape, dtype=BF16)
    if len(shape) != 1:
        match = rf"bias must be 1-D, got shape {esc(str(shape))}"
    else:
        match = (rf"bias must have shape \({N},\) \(one value per output column N\), "
                 rf"got {esc(str(shape))}")
    with raises(match):
        tealite.gemm(a, b, bias=bias)


@pytest.mark.parametrize("bias_dtype", [F32, F16, torch.float64, torch.int32])
def test_gemm_bias_wrong_dtype(bias_dtype):
    a, b = stored("TN", dtype=BF16)
    name = str(bias_dtype).removeprefix("torch.")
    with raises(rf"bias dtype must be one of \(bfloat16\), got {name}"):
        tealite.gemm(a, b, bias=t(N, dtype=bias_dtype))


@pytest.mark.parametrize("shape", [(M, N + 1), (N, M), (1, N), (M, 1), (M * N,), (1, M, N)],
                         ids=str)
@pytest.mark.parametrize("layout", ["TN", "NT"])
def test_gemm_out_wrong_shape(layout, shape):
    a, b = stored(layout)
    out = t(*shape)
    if len(shape) != 2:
        match = rf"out must be 2-D, got shape {esc(str(shape))}"
    else:
        match = (rf"out must have shape \({M}, {N}\) \(\(M, N\) for layout {layout}\), "
                 rf"got {esc(str(shape))}")
    with raises(match):
        tealite.gemm(a, b, layout=layout, out=out, beta=1.0)


def test_gemm_out_wrong_dtype():
    a, b = stored("TN", dtype=BF16)
    with raises(r"out dtype must be one of \(bfloat16\), got float32"):
        tealite.gemm(a, b, out=t(M, N))  # out_dtype defaults to a's dtype
    with raises(r"out dtype must be one of \(float32\), got bfloat16"):
        tealite.gemm(a, b, out=t(M, N, dtype=BF16), out_dtype=F32)


@pytest.mark.parametrize("beta", [1.0, -0.5, 1e-30, 1])
def test_gemm_beta_without_out(beta):
    a, b = stored("TN")
    with raises(r"beta != 0 needs out= holding the prior output"):
        tealite.gemm(a, b, beta=beta)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_gemm_non_finite_scalars(name, value):
    a, b = stored("TN")
    with raises(rf"{name} must be finite, got {value}"):
        tealite.gemm(a, b, out=t(M, N), **{name: value})


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", ["1.0", True, None, torch.tensor(1.0), 1 + 0j],
                         ids=["str", "bool", "None", "tensor", "complex"])
def test_gemm_non_number_scalars(name, value):
    a, b = stored("TN")
    with raises(rf"{name} must be a Python float, got {type(value).__name__}"):
        tealite.gemm(a, b, out=t(M, N), **{name: value})


def test_gemm_huge_int_alpha_is_an_argument_error():
    a, b = stored("TN")
    with raises(r"alpha must be finite"):
        tealite.gemm(a, b, alpha=10**400)


@pytest.mark.parametrize("gelu", [1, 0, None, "yes", np.bool_(True)], ids=repr)
def test_gemm_gelu_must_be_bool(gelu):
    a, b = stored("TN")
    with raises(r"gelu must be a bool, got "):
        tealite.gemm(a, b, gelu=gelu)


@pytest.mark.parametrize("which", ["a", "b", "bias", "out"])
def test_gemm_mixed_devices(which):
    a, b = stored("TN")
    kw = {"a": a, "b": b, "bias": t(N), "out": t(M, N)}
    kw[which] = kw[which].to("meta")
    with raises(rf"all tensors must be on one device; got .*{which} on meta"):
        tealite.gemm(kw.pop("a"), kw.pop("b"), beta=1.0, **kw)
    # The message lists every tensor's device, the CPU ones too.
    with raises(r"all tensors must be on one device; got a on cpu, b on meta"):
        tealite.gemm(a, b.to("meta"))
