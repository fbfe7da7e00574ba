"""Unit tests of the harness's float64 activation references (tealite_verify.references).

The differential tests judge kernels against these references, so the references must be
checked against something that does not share their code:

* closed-form values computed by hand with Python's ``math`` module or literal constants;
* central finite differences of the reference's own forward (for every analytic derivative);
* float64 torch autograd through independently written torch formulas, which checks the
  analytic backward formulas without reusing them.

Norms are in test_references_norms.py, GEMM in test_references_gemm.py.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from tealite.ops import activations as act_ops
from tealite_verify.references import _special
from tealite_verify.references import activations as ref_act

from _helpers_references import F64, _central_fd, _close, _rng

PHI_1 = 0.8413447460685429  # Phi(1), the standard normal CDF at 1
PHI_2 = 0.9772498680518208  # Phi(2)
POINTWISE_KINDS = tuple(ref_act.POINTWISE)
GATED_KINDS = tuple(ref_act.GATED)
ALL_KINDS = POINTWISE_KINDS + GATED_KINDS


def _away_from_zero(shape, seed, lo=0.1, hi=4.0):
    """Values with |x| in [lo, hi], random sign: keeps relu/srelu kinks out of FD stencils."""
    r = _rng(seed)
    return r.choice([-1.0, 1.0], size=shape) * r.uniform(lo, hi, size=shape)


# ---- independent torch formulas (float64, written from the math, not from the references) ---

def _t_pointwise(kind, x):
    if kind == "gelu":
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if kind == "relu":
        return torch.clamp(x, min=0.0)
    if kind == "silu":
        return x / (1.0 + torch.exp(-x))
    if kind == "qgelu":
        return x / (1.0 + torch.exp(-1.702 * x))
    if kind == "srelu":
        return torch.clamp(x, min=0.0) ** 2
    raise KeyError(kind)


_T_GATED_BASE = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu",
                 "sreglu": "srelu"}


def _t_act(kind, x):
    if kind in _T_GATED_BASE:
        n = x.shape[-1] // 2
        return _t_pointwise(_T_GATED_BASE[kind], x[..., :n]) * x[..., n:]
    return _t_pointwise(kind, x)


# ---- scalar hand formulas with math (for closed-form checks) ------------------------------

def _m_sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


_M_POINTWISE = {
    "gelu": lambda v: v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + math.tanh(
        math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3))),
    "relu": lambda v: v if v > 0 else 0.0,
    "silu": lambda v: v * _m_sigmoid(v),
    "qgelu": lambda v: v * _m_sigmoid(1.702 * v),
    "srelu": lambda v: v * v if v > 0 else 0.0,
}


# =========================================================================================
# Activations: inventory
# =========================================================================================

def test_reference_kinds_match_front_end():
    assert set(ref_act.POINTWISE) == set(act_ops.POINTWISE)
    assert ref_act.GATED == act_ops.GATED
    assert set(_M_POINTWISE) == set(ref_act.POINTWISE)
    assert _T_GATED_BASE == ref_act.GATED


# =========================================================================================
# Activations: closed-form values
# =========================================================================================

def test_gelu_closed_form():
    x = np.array([0.0, 1.0, -1.0, 2.0, -2.0])
    expected = [0.0, PHI_1, -(1.0 - PHI_1), 2.0 * PHI_2, -2.0 * (1.0 - PHI_2)]
    _close(ref_act.gelu(x), expected, rtol=1e-14, atol=0.0)
    assert ref_act.gelu(np.array(0.0)) == 0.0
    _close(ref_act.act_fwd(x, "gelu"), expected, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("v", [1.0, -2.0, 0.5, 3.0])
def test_gelu_tanh_closed_form(v):
    inner = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v * v * v)
    expected = 0.5 * v * (1.0 + math.tanh(inner))
    _close(ref_act.gelu_tanh(np.array([v])), [expected], rtol=1e-14, atol=1e-300)


def test_gelu_tanh_known_value():
    # gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)), and it differs from exact gelu(1).
    _close(ref_act.gelu_tanh(np.array([1.0])), [0.8411919906082768], rtol=1e-14)
    assert abs(ref_act.gelu_tanh(np.array([1.0]))[0] - PHI_1) > 1e-4


def test_silu_qgelu_closed_form():
    x = np.array([1.0, -1.0, 2.5, -0.3])
    _close(ref_act.silu(x[:1]), [1.0 / (1.0 + math.exp(-1.0))], rtol=1e-15)
    _close(ref_act.silu(x), [v / (1.0 + math.exp(-v)) for v in x], rtol=1e-14)
    _close(ref_act.qgelu(x), [v / (1.0 + math.exp(-1.702 * v)) for v in x], rtol=1e-14)
    assert ref_act.QGELU_ALPHA == 1.702
    assert ref_act.GELU_TANH_C == 0.044715


def test_relu_srelu_closed_form():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(ref_act.relu(x), [0.0, 0.0, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(ref_act.srelu(x), [0.0, 0.0, 0.0, 0.25, 9.0])
    np.testing.assert_array_equal(ref_act.drelu(x), [0.0, 0.0, 0.0, 1.0, 1.0])  # relu'(0) = 0
    np.testing.assert_array_equal(ref_act.dsrelu(x), [0.0, 0.0, 0.0, 1.0, 6.0])


@pytest.mark.parametrize("kind", POINTWISE_KINDS)
def test_pointwise_against_math(kind):
    x = np.linspace(-6.0, 6.0, 49)
    expected = [_M_POINTWISE[kind](float(v)) for v in x]
    _close(ref_act.act_fwd(x, kind), expected, rtol=1e-12, atol=1e-15)
    assert ref_act.act_fwd(x.reshape(7, 7), kind).shape == (7, 7)


def test_sigmoid_extremes_do_not_overflow():
    x = np.array([-800.0, -50.0, 0.0, 50.0, 800.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        s = _special.sigmoid(x)
        outs = [f(x) for kind in POINTWISE_KINDS for f in ref_act.POINTWISE[kind]]
    assert np.all(np.isfinite(s))
    assert s[0] == pytest.approx(0.0, abs=1e-300) and s[-1] == 1.0 and s[2] == 0.5
    _close(s[1], math.exp(-50.0) / (1.0 + math.exp(-50.0)), rtol=1e-14)
    for o in outs:
        assert np.all(np.isfinite(o))
    # silu(+-800) -> 800 and -0; dsilu -> 1 and 0.
    _close(ref_act.silu(x[[0, -1]]), [0.0, 800.0], atol=0.0, rtol=0.0)
    _close(ref_act.dsilu(x[[0, -1]]), [0.0, 1.0], atol=1e-300, rtol=0.0)


def test_sigmoid_symmetry_and_math():
    x = np.linspace(-30.0, 30.0, 61)
    s = _special.sigmoid(x)
    _close(s + _special.sigmoid(-x), np.ones_like(x), rtol=1e-15)
    _close(s, [_m_sigmoid(v) for v in x], rtol=1e-14, atol=0.0)


# The far negative tail must be accurate relative to the value (no 1 + erf cancellation).
@pytest.mark.parametrize("kind,v,expected", [
    # x * Phi(x) with Phi from erfc (no cancellation); gelu_tanh via 1 + tanh(u) = 2 sigmoid(2u)
    ("gelu", -7.0, -7.0 * 0.5 * math.erfc(7.0 / math.sqrt(2.0))),
    ("gelu", -10.0, -10.0 * 0.5 * math.erfc(10.0 / math.sqrt(2.0))),
    ("gelu_tanh", -10.0, -10.0 / (1.0 + math.exp(
        -2.0 * math.sqrt(2.0 / math.pi) * (-10.0 - 0.044715 * 1000.0)))),
])
def test_left_tail_relative_accuracy(kind, v, expected):
    _close(ref_act.act_fwd(np.array([v]), kind), [expected], rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("kind", GATED_KINDS)
def test_gated_forward_hand_example(kind):
    base = _M_POINTWISE[ref_act.GATED[kind]]
    # N = 2: a = [1.5, -0.7] is activated, b = [-3.0, 2.0] is the linear multiplier.
    x = np.array([[1.5, -0.7, -3.0, 2.0],
                  [0.4, 2.0, 0.5, -1.0]])
    expected = np.array([[base(1.5) * -3.0, base(-0.7) * 2.0],
                         [base(0.4) * 0.5, base(2.0) * -1.0]])
    y = ref_act.act_fwd(x, kind)
    assert y.shape == (2, 2)
    _close(y, expected, rtol=1e-14, atol=1e-300)
    # Swapping the halves must give something else (so a swap bug cannot hide).
    swapped = np.array([[base(-3.0) * 1.5, base(2.0) * -0.7],
                        [base(0.5) * 0.4, base(-1.0) * 2.0]])
    assert not np.allclose(y, swapped)


@pytest.mark.parametrize("kind", GATED_KINDS)
def test_gated_shapes(kind):
    x = _rng(3).normal(size=(2, 3, 8))
    y = ref_act.act_fwd(x, kind)
    assert y.shape == (2, 3, 4)
    assert ref_act.act_bwd(np.ones((2, 3, 4)), x, kind).shape == (2, 3, 8)


def test_reglu_backward_hand_example():
    # a = [2, -1], b = [5, 7], dy = [1, 3]: da = dy relu'(a) b = [5, 0]; db = dy relu(a) = [2, 0].
    x = np.array([[2.0, -1.0, 5.0, 7.0]])
    dy = np.array([[1.0, 3.0]])
    np.testing.assert_array_equal(ref_act.act_bwd(dy, x, "reglu"), [[5.0, 0.0, 2.0, 0.0]])


def test_swiglu_backward_hand_example():
    a, b, dy = 1.0, -2.0, 0.5
    s = _m_sigmoid(a)
    expected = [dy * (s + a * s * (1.0 - s)) * b, dy * a * s]
    _close(ref_act.act_bwd(np.array([dy]), np.array([a, b]), "swiglu"), expected, rtol=1e-14)


# =========================================================================================
# Activations: derivatives vs finite differences and torch autograd
# =========================================================================================

@pytest.mark.parametrize("kind", POINTWISE_KINDS)
def test_pointwise_derivative_finite_differences(kind):
    f, df = ref_act.POINTWISE[kind]
    x = _away_from_zero((40,), seed=1, hi=6.0)
    h = 1e-6 * np.maximum(1.0, np.abs(x))
    fd = (f(x + h) - f(x - h)) / ((x + h) - (x - h))  # elementwise, so all at once
    _close(df(x), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_act_bwd_finite_differences(kind):
    shape = (2, 6) if kind in GATED_KINDS else (3, 4)
    x = _away_from_zero(shape, seed=2)
    dy = _rng(5).normal(size=ref_act.act_fwd(x, kind).shape)
    fd = _central_fd(lambda xx: float(np.sum(dy * ref_act.act_fwd(xx, kind))), x)
    _close(ref_act.act_bwd(dy, x, kind), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("shape", [(16,), (3, 10), (2, 3, 8)])
def test_act_fwd_bwd_vs_torch_autograd(kind, shape):
    x = _away_from_zero(shape, seed=7, hi=6.0)
    xt = torch.tensor(x, dtype=F64, requires_grad=True)
    yt = _t_act(kind, xt)
    dy = _rng(8).normal(size=tuple(yt.shape))
    (gt,) = torch.autograd.grad(yt, xt, grad_outputs=torch.tensor(dy, dtype=F64))
    _close(ref_act.act_fwd(x, kind), yt.detach().numpy(), rtol=1e-12, atol=1e-15)
    _close(ref_act.act_bwd(dy, x, kind), gt.numpy(), rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("kind", POINTWISE_KINDS)
def test_pointwise_dX_vs_torch_autograd(kind):
    f, df = ref_act.POINTWISE[kind]
    x = _away_from_zero((64,), seed=9, hi=8.0)
    xt = torch.tensor(x, dtype=F64, requires_grad=True)
    (gt,) = torch.autograd.grad(_t_pointwise(kind, xt).sum(), xt)
    _close(df(x), gt.numpy(), rtol=1e-11, atol=1e-14)
    _close(f(x), _t_pointwise(kind, xt).detach().numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 4)])
def test_dbias_dact(kind, shape):
    x = _away_from_zero(shape, seed=11)
    out_shape = ref_act.act_fwd(x, kind).shape
    dy = _rng(12).normal(size=out_shape)
    dx, dbias = ref_act.dbias_dact(dy, x, kind)
    np.testing.assert_array_equal(dx, ref_act.act_bwd(dy, x, kind))
    assert dbias.shape == (shape[-1],)
    _close(dbias, dx.sum(axis=tuple(range(dx.ndim - 1))), rtol=1e-14)
    # Independent: dbias is the gradient w.r.t. a bias added before the activation.
    xt = torch.tensor(x, dtype=F64)
    bias = torch.zeros(shape[-1], dtype=F64, requires_grad=True)
    (gb,) = torch.autograd.grad(_t_act(kind, xt + bias), bias,
                                grad_outputs=torch.tensor(dy, dtype=F64))
    _close(dbias, gb.numpy(), rtol=1e-11, atol=1e-13)
