"""Unit tests of the harness's float64 layernorm / rmsnorm references
(tealite_verify.references.norms), checked against closed-form values computed by hand, central
finite differences of the reference's own forward, and float64 torch autograd through
``torch.nn.functional.layer_norm`` / ``rms_norm`` or an independently written formula.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tealite_verify.references import norms as ref_norms

from _helpers_references import F64, _central_fd, _close, _rng

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
