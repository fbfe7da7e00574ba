"""Unit tests of the harness's own float64 references (tealite_verify.references).

The differential tests judge kernels against these references, so the references must be
checked against something that does not share their code:

* closed-form values computed by hand with Python's ``math`` module or literal constants;
* central finite differences of the reference's own forward (for every analytic derivative);
* float64 torch autograd through independently written torch formulas (or
  ``torch.nn.functional.layer_norm`` / ``rms_norm``), which checks the analytic backward
  formulas without reusing them;
* an explicit triple loop for the GEMM layouts, indexing the *stored* operands directly.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch

from tealite.ops import activations as act_ops
from tealite.ops.gemm import LAYOUTS, gemm_dims
from tealite_verify.references import _special
from tealite_verify.references import activations as ref_act
from tealite_verify.references import gemm as ref_gemm
from tealite_verify.references import norms as ref_norms

F64 = torch.float64
PHI_1 = 0.8413447460685429  # Phi(1), the standard normal CDF at 1
PHI_2 = 0.9772498680518208  # Phi(2)
POINTWISE_KINDS = tuple(ref_act.POINTWISE)
GATED_KINDS = tuple(ref_act.GATED)
ALL_KINDS = POINTWISE_KINDS + GATED_KINDS


def _close(actual, expected, *, rtol=1e-12, atol=1e-14):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                               np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _away_from_zero(shape, seed, lo=0.1, hi=4.0):
    """Values with |x| in [lo, hi], random sign: keeps relu/srelu kinks out of FD stencils."""
    r = _rng(seed)
    return r.choice([-1.0, 1.0], size=shape) * r.uniform(lo, hi, size=shape)


def _central_fd(fn, x, h_rel=1e-6):
    """Gradient of the scalar fn(x) w.r.t. every element of x by central differences."""
    x = np.array(x, dtype=np.float64)
    grad = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        h = h_rel * max(1.0, abs(x[idx]))
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        grad[idx] = (fn(xp) - fn(xm)) / (xp[idx] - xm[idx])
    return grad


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


# =========================================================================================
# Norms
# =========================================================================================

EPS = 1e-5


def test_layernorm_fwd_hand_example():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y, mean, rsigma = ref_norms.layernorm_fwd(x, np.ones(4), np.zeros(4), eps=EPS)
    rs = 1.0 / math.sqrt(1.25 + EPS)  # biased variance of [1,2,3,4] is 1.25 (not 5/3)
    assert float(mean) == 2.5
    _close(rsigma, rs, rtol=1e-15)
    _close(y, [-1.5 * rs, -0.5 * rs, 0.5 * rs, 1.5 * rs], rtol=1e-15)
    # gamma/beta applied per column.
    g, b = np.array([1.0, 2.0, -1.0, 0.5]), np.array([0.5, 0.0, -1.0, 2.0])
    y2, _, _ = ref_norms.layernorm_fwd(x, g, b, eps=EPS)
    _close(y2, [-1.5 * rs + 0.5, -1.0 * rs, -0.5 * rs - 1.0, 0.75 * rs + 2.0], rtol=1e-15)


def test_layernorm_zero_centered_gamma():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, -2.0, 5.0, 1.0]])
    g, b = np.array([0.1, -0.2, 0.0, 0.5]), np.array([0.5, 0.0, -1.0, 2.0])
    y_zc, m_zc, r_zc = ref_norms.layernorm_fwd(x, g, b, eps=EPS, zero_centered_gamma=True)
    y_pl, m_pl, r_pl = ref_norms.layernorm_fwd(x, 1.0 + g, b, eps=EPS)
    _close(y_zc, y_pl, rtol=1e-15)
    np.testing.assert_array_equal(m_zc, m_pl)
    np.testing.assert_array_equal(r_zc, r_pl)
    # zero gamma + zero-centered == identity weight
    y0, _, _ = ref_norms.layernorm_fwd(x, np.zeros(4), np.zeros(4), eps=EPS,
                                       zero_centered_gamma=True)
    y1, _, _ = ref_norms.layernorm_fwd(x, np.ones(4), np.zeros(4), eps=EPS)
    _close(y0, y1, rtol=1e-15)
    _close(ref_norms.effective_weight(g, True), 1.0 + g, rtol=0.0)
    np.testing.assert_array_equal(ref_norms.effective_weight(g, False), g)


def test_rmsnorm_fwd_hand_example():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    g = np.array([1.0, 2.0, -1.0, 0.5])
    y, rsigma = ref_norms.rmsnorm_fwd(x, g, eps=EPS)
    rs = 1.0 / math.sqrt(7.5 + EPS)  # mean(x^2) = 30/4, no centering
    _close(rsigma, rs, rtol=1e-15)
    _close(y, [rs, 4.0 * rs, -3.0 * rs, 2.0 * rs], rtol=1e-15)
    y_zc, _ = ref_norms.rmsnorm_fwd(x, g - 1.0, eps=EPS, zero_centered_gamma=True)
    _close(y_zc, y, rtol=1e-15)
    _, rs34 = ref_norms.rmsnorm_fwd(np.array([3.0, 4.0]), np.ones(2), eps=EPS)
    _close(rs34, 1.0 / math.sqrt(12.5 + EPS), rtol=1e-15)


def test_norm_statistics_shapes_3d():
    x = _rng(20).normal(size=(2, 3, 5))
    g, b = np.ones(5), np.zeros(5)
    y, mean, rsigma = ref_norms.layernorm_fwd(x, g, b, eps=EPS)
    assert y.shape == x.shape and mean.shape == (2, 3) and rsigma.shape == (2, 3)
    _close(mean, x.mean(axis=-1), rtol=1e-14)
    _close(rsigma, 1.0 / np.sqrt(x.var(axis=-1, ddof=0) + EPS), rtol=1e-13)
    y, rsigma = ref_norms.rmsnorm_fwd(x, g, eps=EPS)
    assert y.shape == x.shape and rsigma.shape == (2, 3)
    dy = _rng(21).normal(size=x.shape)
    _, mean, rsigma = ref_norms.layernorm_fwd(x, g, b, eps=EPS)
    dx, dg, db = ref_norms.layernorm_bwd(dy, x, mean, rsigma, g)
    assert dx.shape == x.shape and dg.shape == (5,) and db.shape == (5,)
    _, rsigma = ref_norms.rmsnorm_fwd(x, g, eps=EPS)
    dx, dg = ref_norms.rmsnorm_bwd(dy, x, rsigma, g)
    assert dx.shape == x.shape and dg.shape == (5,)


def test_layernorm_bwd_closed_forms():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, -1.0, 0.5, 7.0]])
    g = np.full(4, 1.7)
    _, mean, rs = ref_norms.layernorm_fwd(x, g, np.zeros(4), eps=EPS)
    # A constant upstream gradient with a constant weight: the output's dependence on x is
    # shift- and scale-free along that direction, so dx = 0; dbeta = number of rows.
    dx, dg, db = ref_norms.layernorm_bwd(np.ones_like(x), x, mean, rs, g)
    _close(dx, np.zeros_like(x), atol=1e-14)
    _close(db, [2.0] * 4, rtol=0.0)
    # dy = xhat, g = 1: dx = rs * xhat * eps / (var + eps) (only eps keeps it nonzero).
    xhat = (x - mean[:, None]) * rs[:, None]
    var = x.var(axis=-1)
    dx, dg, _ = ref_norms.layernorm_bwd(xhat, x, mean, rs, np.ones(4))
    _close(dx, rs[:, None] * xhat * (EPS / (var + EPS))[:, None], rtol=1e-8, atol=1e-18)
    _close(dg, (xhat * xhat).sum(axis=0), rtol=1e-14)


def _torch_norm(x, gamma, beta, *, rms, zc):
    xt = torch.tensor(x, dtype=F64, requires_grad=True)
    gt = torch.tensor(gamma, dtype=F64, requires_grad=True)
    w = 1.0 + gt if zc else gt
    h = x.shape[-1]
    if rms:
        y = xt * torch.rsqrt((xt * xt).mean(dim=-1, keepdim=True) + EPS) * w
        return y, (xt, gt)
    bt = torch.tensor(beta, dtype=F64, requires_grad=True)
    y = torch.nn.functional.layer_norm(xt, (h,), w, bt, EPS)
    return y, (xt, gt, bt)


NORM_SHAPES = [(7,), (3, 6), (2, 3, 5), (4, 1)]


@pytest.mark.parametrize("zc", [False, True])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_layernorm_vs_torch_autograd(shape, zc):
    r = _rng(30)
    x = r.normal(size=shape) * 2.0 + 3.0
    h = shape[-1]
    gamma = r.normal(size=h) * (0.1 if zc else 1.0)
    beta = r.normal(size=h)
    dy = r.normal(size=shape)
    y, mean, rs = ref_norms.layernorm_fwd(x, gamma, beta, eps=EPS, zero_centered_gamma=zc)
    yt, (xt, gt, bt) = _torch_norm(x, gamma, beta, rms=False, zc=zc)
    _close(y, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    assert np.shape(mean) == shape[:-1] and np.shape(rs) == shape[:-1]
    dx, dg, db = ref_norms.layernorm_bwd(dy, x, mean, rs, gamma, zero_centered_gamma=zc)
    tdx, tdg, tdb = torch.autograd.grad(yt, (xt, gt, bt), grad_outputs=torch.tensor(dy))
    _close(dx, tdx.numpy(), rtol=1e-10, atol=1e-12)
    _close(dg, tdg.numpy(), rtol=1e-10, atol=1e-12)
    _close(db, tdb.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("zc", [False, True])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_rmsnorm_vs_torch_autograd(shape, zc):
    r = _rng(31)
    x = r.normal(size=shape) * 2.0 + 0.5
    h = shape[-1]
    gamma = r.normal(size=h) * (0.1 if zc else 1.0)
    dy = r.normal(size=shape)
    y, rs = ref_norms.rmsnorm_fwd(x, gamma, eps=EPS, zero_centered_gamma=zc)
    yt, (xt, gt) = _torch_norm(x, gamma, None, rms=True, zc=zc)
    _close(y, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    w = torch.tensor(1.0 + gamma if zc else gamma)
    _close(y, torch.nn.functional.rms_norm(torch.tensor(x), (h,), w, EPS).numpy(),
           rtol=1e-12, atol=1e-13)
    assert np.shape(rs) == shape[:-1]
    dx, dg = ref_norms.rmsnorm_bwd(dy, x, rs, gamma, zero_centered_gamma=zc)
    tdx, tdg = torch.autograd.grad(yt, (xt, gt), grad_outputs=torch.tensor(dy))
    _close(dx, tdx.numpy(), rtol=1e-10, atol=1e-12)
    _close(dg, tdg.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("zc", [False, True])
def test_layernorm_bwd_finite_differences(zc):
    r = _rng(40)
    x = r.normal(size=(2, 5)) + 1.0
    gamma, beta, dy = r.normal(size=5) * 0.5, r.normal(size=5), r.normal(size=(2, 5))

    def loss(xx=x, gg=gamma, bb=beta):
        y, _, _ = ref_norms.layernorm_fwd(xx, gg, bb, eps=EPS, zero_centered_gamma=zc)
        return float(np.sum(dy * y))

    _, mean, rs = ref_norms.layernorm_fwd(x, gamma, beta, eps=EPS, zero_centered_gamma=zc)
    dx, dg, db = ref_norms.layernorm_bwd(dy, x, mean, rs, gamma, zero_centered_gamma=zc)
    _close(dx, _central_fd(lambda v: loss(xx=v), x), rtol=1e-6, atol=1e-8)
    _close(dg, _central_fd(lambda v: loss(gg=v), gamma), rtol=1e-6, atol=1e-8)
    _close(db, _central_fd(lambda v: loss(bb=v), beta), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("zc", [False, True])
def test_rmsnorm_bwd_finite_differences(zc):
    r = _rng(41)
    x = r.normal(size=(2, 5))
    gamma, dy = r.normal(size=5) * 0.5, r.normal(size=(2, 5))

    def loss(xx=x, gg=gamma):
        y, _ = ref_norms.rmsnorm_fwd(xx, gg, eps=EPS, zero_centered_gamma=zc)
        return float(np.sum(dy * y))

    _, rs = ref_norms.rmsnorm_fwd(x, gamma, eps=EPS, zero_centered_gamma=zc)
    dx, dg = ref_norms.rmsnorm_bwd(dy, x, rs, gamma, zero_centered_gamma=zc)
    _close(dx, _central_fd(lambda v: loss(xx=v), x), rtol=1e-6, atol=1e-8)
    _close(dg, _central_fd(lambda v: loss(gg=v), gamma), rtol=1e-6, atol=1e-8)


def test_norm_bwd_uses_given_statistics():
    """Backward must use the statistics passed in (as kernels do), not recompute them."""
    r = _rng(42)
    x, dy, g = r.normal(size=(3, 4)), r.normal(size=(3, 4)), r.normal(size=4)
    mean = np.array([0.25, -1.0, 2.0])
    rs = np.array([0.5, 2.0, 1.5])
    _, dg, db = ref_norms.layernorm_bwd(dy, x, mean, rs, g)
    _close(dg, (dy * (x - mean[:, None]) * rs[:, None]).sum(axis=0), rtol=1e-13)
    _close(db, dy.sum(axis=0), rtol=1e-14)
    _, dg = ref_norms.rmsnorm_bwd(dy, x, rs, g)
    _close(dg, (dy * x * rs[:, None]).sum(axis=0), rtol=1e-13)


# =========================================================================================
# GEMM
# =========================================================================================

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
