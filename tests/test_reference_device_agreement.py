"""Norm and activation references on a reference device agree with the numpy path (issue 5).

The norm and activation references (and the fused ones built on them) are written once against
the array namespace of references._device: numpy with libm, or torch float64 on the case's
device.  Here both paths run on hostile inputs (NaN, +-Inf, subnormals, overflowing powers,
exp / erfc tails) and on plain data, on the CPU through reference_device("cpu") and on a GPU
where there is one; the agreement checks are shown to fail on seeded device-path bugs and to
let a GPU libm's few-ulp differences through.  GEMM products: test_reference_device_gemm.py.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tealite_verify.references import _device, _special
from tealite_verify.references import activations as act_ref
from tealite_verify.references import norms as norm_ref

from _helpers_reference_device import _CUDA, _hostile_values, _on


# =========================================================================================
# Norm and activation references on a reference device, checked on the CPU through
# reference_device("cpu") (torch float64) against the numpy path.  Both run the same formulas
# and differ only in exp / tanh / erf / erfc (a few ulp each), x**3 (pow vs x*x*x) and the
# order of sums.  So they must put NaN and +-Inf in the same places and elsewhere agree within
# AGREE_K float64 rounding units of each formula's condition magnitude (the formula on
# absolute values, plus what exp / tanh amplify): ~1e-15 relative where nothing cancels.
# =========================================================================================

U64 = 2.0**-53  # float64 unit roundoff
AGREE_K = 16  # rounding units of the magnitude allowed between the two paths (seen: <= 4)
ABS_FLOOR = 2.0**-1060  # 2^14 subnormal spacings: where erfc / exp tails go subnormal
_ACT_KINDS = tuple(act_ref.POINTWISE) + tuple(act_ref.GATED)


def _hostile_dy(shape, seed=1):
    dy = np.random.default_rng(seed).standard_normal(shape)
    dy.flat[:6] = [np.nan, np.inf, -np.inf, 0.0, 1e300, 1e-300]
    return dy


def _finite_mag(mag, want):
    """Where a magnitude overflowed (inf * 0 at x = +-Inf, x**3 = Inf), the value's own."""
    mag = np.broadcast_to(mag, want.shape)
    return np.where(np.isfinite(mag), mag, np.abs(want))


def _assert_paths_agree(want, got, mag, what):
    """NaN / +-Inf identical; elsewhere |got - want| <= AGREE_K u mag (+ a subnormal floor).
    Returns the worst |got - want| / (u mag)."""
    assert isinstance(got, np.ndarray) and got.dtype == np.float64, (what, type(got))
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN")
    inf = np.isinf(want) | np.isinf(got)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{what}: Inf")
    ok = np.isfinite(want) & np.isfinite(got)
    scale = U64 * _finite_mag(mag, want)[ok]
    err = np.abs(got[ok] - want[ok])
    bad = err > AGREE_K * scale + ABS_FLOOR
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} beyond {AGREE_K} u x magnitude; "
                           f"worst {want[ok][bad][:3]} vs {got[ok][bad][:3]}")
    ratio = np.divide((err - ABS_FLOOR).clip(0), scale, out=np.zeros_like(err), where=scale > 0)
    return float(ratio.max(initial=0.0))


# ---- activations: condition magnitudes (numpy; bounds only) ------------------------------

def _tanh_u(x):
    return act_ref.SQRT_2_OVER_PI * (x + act_ref.GELU_TANH_C * x**3)


def _act_mag(kind, x):
    """Magnitude of f(x) for a pointwise kind (x's own rounding excluded: both paths share x)."""
    ax = np.abs(x)
    if kind in ("relu", "srelu"):
        return np.abs(act_ref.POINTWISE[kind][0](x))
    if kind in ("silu", "qgelu"):
        return ax * _special.sigmoid((1.0 if kind == "silu" else act_ref.QGELU_ALPHA) * x)
    if kind == "gelu":
        return ax * _special.normal_cdf(x)
    if kind == "gelu_tanh":  # x**3 differs by an ulp: exp amplifies it by |2u| (1 - s)
        u = _tanh_u(x)
        s = _special.sigmoid(2.0 * u)
        return ax * s * (1.0 + np.where(s < 1.0, 2.0 * np.abs(u) * (1.0 - s), 0.0))
    raise KeyError(kind)


def _dact_mag(kind, x):
    """Magnitude of f'(x): the derivative formula on absolute values (1 - s, 1 - t^2 cancel)."""
    ax = np.abs(x)
    if kind in ("relu", "srelu"):
        return np.abs(act_ref.POINTWISE[kind][1](x))
    if kind in ("silu", "qgelu"):
        a = 1.0 if kind == "silu" else act_ref.QGELU_ALPHA
        s = _special.sigmoid(a * x)
        return s + a * ax * s * (1.0 + s)
    if kind == "gelu":
        return _special.normal_cdf(x) + ax * _special.normal_pdf(x)
    if kind == "gelu_tanh":
        u = _tanh_u(x)
        t = np.tanh(u)
        slope = act_ref.SQRT_2_OVER_PI * (1.0 + 3.0 * act_ref.GELU_TANH_C * x * x)
        dt = np.where(np.abs(t) < 1.0, (1.0 - t * t) * np.abs(u), 0.0)  # from u's ulp
        return 0.5 * (1.0 + np.abs(t)) + 0.5 * ax * (1.0 + t * t) * slope + dt * (
            0.5 + ax * np.abs(t) * slope)
    raise KeyError(kind)


def _act_bwd_mag(kind, dy, x):
    if kind in act_ref.GATED:
        base = act_ref.GATED[kind]
        a, b = act_ref._split(x)
        return np.concatenate([np.abs(dy) * _dact_mag(base, a) * np.abs(b),
                               np.abs(dy) * _act_mag(base, a)], axis=-1)
    return np.abs(dy) * _dact_mag(kind, x)


def _act_worst_ratios(kind, device="cpu"):
    """Worst err / (u magnitude) of the device path against numpy: fwd, bwd."""
    x = _hostile_values()
    gated = kind in act_ref.GATED
    dy = _hostile_dy((x.shape[0], x.shape[1] // 2) if gated else x.shape)
    with np.errstate(all="ignore"):
        a, b = act_ref._split(x) if gated else (x, 1.0)
        mag_f = _act_mag(act_ref.GATED.get(kind, kind), a) * np.abs(b)
        fwd = _assert_paths_agree(act_ref.act_fwd(x, kind), _on(device, act_ref.act_fwd, x, kind),
                                  mag_f, f"{kind} fwd")
        bwd = _assert_paths_agree(act_ref.act_bwd(dy, x, kind),
                                  _on(device, act_ref.act_bwd, dy, x, kind),
                                  _act_bwd_mag(kind, dy, x), f"{kind} bwd")
    return fwd, bwd


def _dbias_worst_ratios(kind, device="cpu"):
    x = _hostile_values()
    dy = _hostile_dy(x.shape)
    with np.errstate(all="ignore"):
        dx, db = act_ref.dbias_dact(dy, x, kind)
        got_dx, got_db = _on(device, act_ref.dbias_dact, dy, x, kind)
        mag = _act_bwd_mag(kind, dy, x)
        mag_db = (x.shape[0] + 2) * (_finite_mag(mag, dx) + np.abs(dx)).sum(axis=0)
        return (_assert_paths_agree(dx, got_dx, mag, f"{kind} dx"),
                _assert_paths_agree(db, got_db, mag_db, f"{kind} dbias"))


@pytest.mark.parametrize("kind", _ACT_KINDS)
def test_device_activation_references_agree_with_numpy(kind):
    _act_worst_ratios(kind)
    if kind in act_ref.POINTWISE:
        _dbias_worst_ratios(kind)


# ---- norms: hostile rows and float64 error magnitudes (in units of u) ---------------------

def _hostile_rows(hidden=64, seed=3):
    """Rows: plain, offset 100 (centering cancels), constant (var 0), tiny (x^2 underflows),
    huge (x^2 overflows), NaN, +-Inf, subnormals, magnitudes spread over 1e-300..1e300."""
    rng = np.random.default_rng(seed)
    z, col = rng.standard_normal((12, hidden)), np.arange(hidden)
    rows = [z[0], z[1] + 100.0, np.full(hidden, 7.0), z[2] * 1e-200, z[3] * 1e200,
            np.where(col == 5, np.nan, z[4]), np.where(col == 9, np.inf, z[5]),
            np.where(col == 2, -np.inf, z[6]), z[7] * 5e-320,
            rng.choice([-1.0, 1.0], hidden) * np.exp(rng.uniform(-690, 690, hidden)),
            z[8] * 1e150, z[9] - 3.0]
    return np.stack(rows).reshape(2, 6, hidden)  # 3-D: leading dims are rows too


def _rows_abs_sum(t):
    return np.abs(t).reshape(-1, t.shape[-1]).sum(axis=0)


def _norm_fwd_mags(x, g_eff, beta, mean, rs, eps):
    """(y, [mean,] rsigma): each sum's order error (H + 2) u |terms|, then propagation."""
    h = x.shape[-1]
    if mean is None:  # RMSNorm
        ms = (x * x).mean(axis=-1)
        rel_rs = 0.5 * (h + 2) * ms / (ms + eps) + 3.0
        return [np.abs(x * rs[..., None] * g_eff) * (rel_rs[..., None] + 3.0), rel_rs * rs]
    e_mean = (h + 2) * np.abs(x).mean(axis=-1)
    dev = np.abs(x - mean[..., None])
    var = (dev**2).mean(axis=-1)
    # the mean's error enters var at first order at most (generous), then the squares' sum
    e_var = 2.0 * dev.mean(axis=-1) * e_mean + U64 * e_mean**2 + (h + 3) * var
    rel_rs = 0.5 * e_var / (var + eps) + 3.0
    xhat = dev * rs[..., None]
    e_xhat = e_mean[..., None] * rs[..., None] + xhat * (rel_rs[..., None] + 2.0)
    e_y = np.abs(g_eff) * e_xhat + 2.0 * (xhat * np.abs(g_eff) + np.abs(beta))
    return [e_y, e_mean, rel_rs * rs]


def _norm_bwd_mags(dy, x, mean, rs, g_eff):
    """(dx, dgamma[, dbeta]) from the same statistics: only the means and sums differ."""
    h, rows = x.shape[-1], x.size // x.shape[-1]
    r = rs[..., None]
    xhat = np.abs((x - (0.0 if mean is None else mean[..., None])) * r)
    gdy = np.abs(dy * g_eff)
    m2 = (gdy * xhat).mean(axis=-1, keepdims=True)
    mag_dx = r * ((h + 3) * xhat * m2 + 4.0 * (gdy + xhat * m2))
    mags = [mag_dx, (rows + 2) * _rows_abs_sum(dy * xhat)]
    if mean is None:
        return mags
    mags[0] = mag_dx + r * (h + 6) * gdy.mean(axis=-1, keepdims=True)
    return mags + [(rows + 2) * _rows_abs_sum(dy)]


def _norm_worst_ratios(rms, zc, device="cpu", eps=1e-5):
    x, dy = _hostile_rows(), _hostile_dy((2, 6, 64))
    gamma, beta = np.random.default_rng(4).standard_normal((2, x.shape[-1]))
    g_eff = norm_ref.effective_weight(gamma, zc)
    name = ("rmsnorm" if rms else "layernorm") + (" zc" if zc else "")
    with np.errstate(all="ignore"):
        if rms:
            fwd = functools.partial(norm_ref.rmsnorm_fwd, x, gamma, eps=eps,
                                    zero_centered_gamma=zc)
        else:
            fwd = functools.partial(norm_ref.layernorm_fwd, x, gamma, beta, eps=eps,
                                    zero_centered_gamma=zc)
        want, got = fwd(), _on(device, fwd)
        mean, rs = (None if rms else want[1]), want[-1]
        mags = _norm_fwd_mags(x, g_eff, 0.0 if rms else beta, mean, rs, eps)
        ratios = [_assert_paths_agree(w, g, m, f"{name} fwd output {i}")
                  for i, (w, g, m) in enumerate(zip(want, got, mags))]
        if rms:
            bwd = functools.partial(norm_ref.rmsnorm_bwd, dy, x, rs, gamma,
                                    zero_centered_gamma=zc)
        else:
            bwd = functools.partial(norm_ref.layernorm_bwd, dy, x, mean, rs, gamma,
                                    zero_centered_gamma=zc)
        want, got = bwd(), _on(device, bwd)
        mags = _norm_bwd_mags(dy, x, mean, rs, g_eff)
        return ratios + [_assert_paths_agree(w, g, m, f"{name} bwd output {i}")
                         for i, (w, g, m) in enumerate(zip(want, got, mags))]


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero_centered"])
def test_device_norm_references_agree_with_numpy(rms, zc):
    _norm_worst_ratios(rms, zc)


# ---- ordinary data: normwise agreement ----------------------------------------------------

def _plain_outputs(seed=5, rows=16, hidden=1024):
    """Every norm / activation reference on well-conditioned data: name -> thunk."""
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((rows, hidden)) * 3.0, rng.standard_normal((rows, hidden))
    g, b = rng.standard_normal(hidden), rng.standard_normal(hidden)
    _, mean, rs = norm_ref.layernorm_fwd(x, g, b, eps=1e-5)
    thunks = {
        "layernorm_fwd": lambda: norm_ref.layernorm_fwd(x, g, b, eps=1e-5),
        "layernorm_bwd": lambda: norm_ref.layernorm_bwd(dy, x, mean, rs, g),
        "rmsnorm_fwd": lambda: norm_ref.rmsnorm_fwd(x, g, eps=1e-5, zero_centered_gamma=True),
        "rmsnorm_bwd": lambda: norm_ref.rmsnorm_bwd(dy, x, rs, g)}
    for kind in _ACT_KINDS:
        dyk = dy[:, : hidden // 2] if kind in act_ref.GATED else dy
        thunks[f"{kind}_fwd"] = lambda k=kind: (act_ref.act_fwd(x, k),)
        thunks[f"{kind}_bwd"] = lambda k=kind, d=dyk: (act_ref.act_bwd(d, x, k),)
        if kind in act_ref.POINTWISE:
            thunks[f"{kind}_dbias_dact"] = lambda k=kind: act_ref.dbias_dact(dy, x, k)
    return thunks


def _assert_plain_agreement():
    for name, thunk in _plain_outputs().items():
        bound = 1e-14 if name in ("gelu_tanh_bwd", "gelu_tanh_dbias_dact") else 1e-15
        for i, (want, got) in enumerate(zip(thunk(), _on("cpu", thunk))):
            assert isinstance(got, np.ndarray) and got.dtype == np.float64
            err = np.max(np.abs(got - want)) / np.max(np.abs(want))
            assert err <= bound, f"{name} output {i}: normwise {err:.3g} > {bound}"


def test_device_references_agree_to_1e15_normwise_on_plain_data():
    """Normwise the two paths agree to ~1e-16 (bound: 1e-15) on ordinary data.  Except
    dgelu_tanh: its 1 - tanh(u)^2 cancels as |x| grows, so a one-ulp tanh difference comes out
    multiplied by ~|x| (1 + 3 c x^2) (~40 at |x| = 9): bound 1e-14 (seen 2.4e-15)."""
    _assert_plain_agreement()


# ---- the agreement checks can fail: seeded device-path bugs are caught --------------------

def _buggy_namespace(bug):
    """A torch float64 namespace on the CPU with one seeded bug (or a benign ulp change)."""
    ns = _device.TorchF64(torch.device("cpu"))
    ulp = 2.0**-52
    if bug == "tanh_in_float32":
        ns.tanh = lambda t: torch.tanh(t.float()).double()
    elif bug == "erfc_as_one_minus_erf":  # cancels in the left tail
        ns.erfc = lambda t: 1.0 - torch.special.erf(t)
    elif bug == "maximum_drops_nan":
        ns.maximum = lambda a, b: torch.where(a > b, a, ns.asarray(b))
    elif bug == "mean_in_float32":
        ns.mean = lambda t, axis, keepdims=False: torch.mean(
            t.float(), dim=axis, keepdim=keepdims).double()
    elif bug == "sum_drops_last_row":
        ns.sum = lambda t, axis, keepdims=False: torch.sum(t[:-1], dim=axis, keepdim=keepdims)
    elif bug == "benign_libm_ulps":  # what a GPU's libm may do: erfc 5 ulp, exp / tanh 2 ulp
        ns.erfc = lambda t: torch.special.erfc(t) * (1.0 + 5 * ulp)
        ns.exp = lambda t: torch.exp(t) * (1.0 - 2 * ulp)
        # tanh saturates to exactly +-1 in any libm: perturb it below saturation only
        ns.tanh = lambda t: torch.where(torch.tanh(t).abs() < 0.999,
                                        torch.tanh(t) * (1.0 - 2 * ulp), torch.tanh(t))
    else:
        raise KeyError(bug)
    return ns


def _all_agreement_checks():
    for kind in _ACT_KINDS:
        _act_worst_ratios(kind)
    for kind in act_ref.POINTWISE:
        _dbias_worst_ratios(kind)
    for rms in (False, True):
        for zc in (False, True):
            _norm_worst_ratios(rms, zc)


# bug -> (the hostile-input check that catches it first, caught on plain data too)
_SEEDED_BUGS = {"tanh_in_float32": ("gelu_tanh bwd", True),
                "erfc_as_one_minus_erf": ("gelu fwd", False),
                "maximum_drops_nan": ("relu fwd: NaN", False),
                "mean_in_float32": ("layernorm fwd", True),
                "sum_drops_last_row": ("gelu dbias", True)}


@pytest.mark.parametrize("bug", sorted(_SEEDED_BUGS))
def test_seeded_device_bug_is_caught(bug, monkeypatch):
    ns = _buggy_namespace(bug)
    monkeypatch.setattr(_device, "_torch_namespace", lambda device: ns)
    first, on_plain_data = _SEEDED_BUGS[bug]
    with pytest.raises(AssertionError, match=first):
        _all_agreement_checks()
    if on_plain_data:  # a precision bug, not only a special-value one
        with pytest.raises(AssertionError, match="normwise"):
            _assert_plain_agreement()


def test_benign_ulp_differences_are_not_flagged(monkeypatch):
    """No false alarm: a few ulp more in erfc / exp / tanh (a GPU's libm) still agrees."""
    ns = _buggy_namespace("benign_libm_ulps")
    monkeypatch.setattr(_device, "_torch_namespace", lambda device: ns)
    _all_agreement_checks()


# ---- on a CUDA device: the same agreement checks against the GPU's torch float64 ---------

@_CUDA
@pytest.mark.parametrize("kind", _ACT_KINDS)
def test_gpu_activation_references_agree_with_numpy(kind):
    _act_worst_ratios(kind, "cuda")
    if kind in act_ref.POINTWISE:
        _dbias_worst_ratios(kind, "cuda")


@_CUDA
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero_centered"])
def test_gpu_norm_references_agree_with_numpy(rms, zc):
    _norm_worst_ratios(rms, zc, "cuda")
