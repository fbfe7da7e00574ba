"""Unit tests of the harness's float64 GEMM reference (tealite_verify.references.gemm), checked
against an explicit triple loop for every layout, indexing the *stored* operands directly, and
an independently written torch GELU for the epilogue.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tealite.ops.gemm import LAYOUTS, gemm_dims
from tealite_verify.references import gemm as ref_gemm

from _helpers_references import F64, _close, _rng

def _stored_shapes(m, n, k, layout):
    a = (n, k) if layout[0] == "T" else (k, n)
    b = (m, k) if layout[1] == "N" else (k, m)
    return a, b


def _loop_product(a, b, m, n, k, layout):
    """D[i, j] = sum_p opB(B)[i, p] * opA(A)[p, j], indexing the stored arrays directly."""
    d = np.zeros((m, n))
    for i, j in itertools.product(range(m), range(n)):
        s = 0.0
        for p in range(k):
            a_pj = a[j, p] if layout[0] == "T" else a[p, j]
            b_ip = b[i, p] if layout[1] == "N" else b[p, i]
            s += b_ip * a_pj
        d[i, j] = s
    return d


def _int_operands(m, n, k, layout, seed=0):
    a_shape, b_shape = _stored_shapes(m, n, k, layout)
    r = _rng(seed)
    # Small integers: every product and sum is exact in float64, so compare exactly.
    return (r.integers(-4, 5, size=a_shape).astype(np.float64),
            r.integers(-4, 5, size=b_shape).astype(np.float64))


def _t_gelu(v):
    t = torch.tensor(v, dtype=F64)
    return (t * 0.5 * (1.0 + torch.erf(t / math.sqrt(2.0)))).numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_stored_shapes_match_front_end(layout):
    m, n, k = 2, 3, 4
    a_shape, b_shape = _stored_shapes(m, n, k, layout)
    assert gemm_dims(a_shape, b_shape, layout) == (m, n, k, k)
    expected = {"TN": ((3, 4), (2, 4)), "NN": ((4, 3), (2, 4)),
                "NT": ((4, 3), (4, 2)), "TT": ((3, 4), (4, 2))}[layout]
    assert (a_shape, b_shape) == expected


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mnk", [(2, 3, 4), (5, 1, 3), (1, 4, 2), (3, 2, 1)])
def test_gemm_product_vs_loop(layout, mnk):
    m, n, k = mnk
    a, b = _int_operands(m, n, k, layout, seed=m * 100 + n * 10 + k)
    d = ref_gemm.product(a, b, layout)
    assert d.shape == (m, n)
    np.testing.assert_array_equal(d, _loop_product(a, b, m, n, k, layout))
    op_b, op_a = ref_gemm.operands(a, b, layout)
    assert op_b.shape == (m, k) and op_a.shape == (k, n)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_product_with_real_values(layout):
    m, n, k = 3, 5, 7
    a_shape, b_shape = _stored_shapes(m, n, k, layout)
    r = _rng(50)
    a, b = r.normal(size=a_shape), r.normal(size=b_shape)
    _close(ref_gemm.product(a, b, layout), _loop_product(a, b, m, n, k, layout), rtol=1e-13,
           atol=1e-14)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_epilogue(layout, gelu):
    m, n, k = 2, 3, 4
    a, b = _int_operands(m, n, k, layout, seed=60)
    r = _rng(61)
    c, bias = r.normal(size=(m, n)), r.normal(size=n)
    alpha, beta = -0.5, 0.75
    loop = _loop_product(a, b, m, n, k, layout)
    pre = alpha * loop + beta * c + bias[None, :]
    d, pre_ref = ref_gemm.gemm(a, b, layout=layout, alpha=alpha, beta=beta, c=c, bias=bias,
                               gelu_epilogue=gelu)
    assert d.shape == (m, n) and pre_ref.shape == (m, n)
    _close(pre_ref, pre, rtol=1e-14, atol=1e-14)
    _close(d, _t_gelu(pre) if gelu else pre, rtol=1e-13, atol=1e-14)
    # bias broadcasts over rows (one value per output column N), not over columns
    d0, _ = ref_gemm.gemm(a, b, layout=layout, bias=bias)
    _close(d0 - loop, np.broadcast_to(bias, (m, n)), rtol=1e-14, atol=1e-14)


def test_gemm_alpha_beta_without_extras():
    a, b = _int_operands(2, 3, 4, "TN", seed=62)
    loop = _loop_product(a, b, 2, 3, 4, "TN")
    d, pre = ref_gemm.gemm(a, b, layout="TN", alpha=2.0)
    np.testing.assert_array_equal(d, 2.0 * loop)
    np.testing.assert_array_equal(pre, d)
    c = np.arange(6.0).reshape(2, 3)
    d, _ = ref_gemm.gemm(a, b, layout="TN", beta=-1.0, c=c)
    np.testing.assert_array_equal(d, loop - c)
    d, _ = ref_gemm.gemm(a, b, layout="TN", beta=0.0, c=c)  # beta == 0: c contributes nothing
    np.testing.assert_array_equal(d, loop)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_empty_m(layout, gelu):
    m, n, k = 0, 3, 4
    a, b = _int_operands(m, n, k, layout)
    d, pre = ref_gemm.gemm(a, b, layout=layout, bias=np.ones(n), gelu_epilogue=gelu)
    assert d.shape == (0, n) and pre.shape == (0, n)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_empty_k(layout, gelu):
    m, n, k = 2, 3, 0
    a, b = _int_operands(m, n, k, layout)
    np.testing.assert_array_equal(ref_gemm.product(a, b, layout), np.zeros((m, n)))
    bias = np.array([-1.0, 0.0, 2.0])
    c = np.array([[1.0, 2.0, 3.0], [-4.0, 0.5, 0.0]])
    d, pre = ref_gemm.gemm(a, b, layout=layout, alpha=3.0, beta=0.5, c=c, bias=bias,
                           gelu_epilogue=gelu)
    expected_pre = 0.5 * c + bias[None, :]
    np.testing.assert_array_equal(pre, expected_pre)
    _close(d, _t_gelu(expected_pre) if gelu else expected_pre, rtol=1e-14, atol=1e-300)
