"""The runner's routing of references to a reference device (issue 5), and the specs judged
wholly on the device.

Plumbing: a reference on a device takes numpy in and gives numpy out, moving its inputs once;
without a device the numpy path is untouched (libm bit for bit); in the runner's context for a
CUDA case every norm / activation reference moves to that device and the verdicts do not
change.  Specs with device_reference compute the reference, its bounds and the comparison in
torch float64 on the device: on drawn cases they reach the numpy path's verdicts, they catch a
backend a few ulps off, and small cases keep numpy bounds.  All checked on the CPU standing in
for the device; the CUDA-only tests skip without a GPU.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch

from tealite_verify import runner
from tealite_verify.references import _device, _special
from tealite_verify.references import activations as act_ref
from tealite_verify.references import norms as norm_ref
from tealite_verify.specs import get_spec

from _helpers_reference_device import _CUDA, _hostile_values, _on

_NORM_ACT_OPS = ["act_fwd", "act_bwd", "dbias_dact", "layernorm_fwd", "layernorm_bwd",
                 "rmsnorm_fwd", "rmsnorm_bwd"]


def _record_moves(monkeypatch, run_on=None):
    """Record the device of every numpy input a reference moves (run on ``run_on`` if set)."""
    seen, real = [], _device._to_device

    def record(a, device):
        if isinstance(a, np.ndarray):
            seen.append(device)
        return real(a, run_on or device)

    monkeypatch.setattr(_device, "_to_device", record)
    return seen


# ---- plumbing: numpy in / numpy out, the default numpy path, routing of CUDA cases --------

def test_device_path_moves_inputs_once_and_returns_numpy(monkeypatch):
    moved = _record_moves(monkeypatch)
    x = np.random.default_rng(6).standard_normal((4, 8))
    x.flags.writeable = False  # like the runner's views: no torch warning, no write
    with _device.reference_device("cpu"), warnings.catch_warnings():
        warnings.simplefilter("error")
        dx, db = act_ref.dbias_dact(x, x, "gelu")
        y = act_ref.act_fwd(x, "swiglu")
    assert moved == ["cpu"] * 3  # references called by references stay on the device
    for out in (dx, db, y):
        assert type(out) is np.ndarray and out.dtype == np.float64
    assert db.shape == (8,) and y.shape == (4, 4)


def test_numpy_path_is_untouched_without_a_device(monkeypatch):
    moved = _record_moves(monkeypatch)
    x = _hostile_values()[:1]
    assert _device.namespace(x) is _device.NUMPY
    with np.errstate(all="ignore"):
        got = _special.erfc(x)
        norm_ref.layernorm_fwd(x, x[0], x[0], eps=1e-5)
        act_ref.act_bwd(x, x, "gelu_tanh")
    assert moved == []
    want = np.array([math.erfc(v) for v in x.ravel()]).reshape(x.shape)  # libm, bit for bit
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def test_cuda_cases_route_norm_and_activation_references(monkeypatch):
    """In the runner's context for a CUDA case every norm / activation reference moves
    its inputs to that device (recorded here, then run on the CPU)."""
    seen = _record_moves(monkeypatch, run_on="cpu")
    rng = np.random.default_rng(8)
    x, g = rng.standard_normal((3, 16)), rng.standard_normal(16)
    calls = [lambda: act_ref.act_fwd(x, "geglu"), lambda: act_ref.act_bwd(x, x, "silu"),
             lambda: act_ref.dbias_dact(x, x, "qgelu"),
             lambda: norm_ref.layernorm_fwd(x, g, g, eps=1e-5),
             lambda: norm_ref.layernorm_bwd(x, x, x[:, 0], x[:, 1], g),
             lambda: norm_ref.rmsnorm_fwd(x, g, eps=1e-5),
             lambda: norm_ref.rmsnorm_bwd(x, x, x[:, 1], g)]
    for i, call in enumerate(calls):
        seen.clear()
        routed = _on(_device.for_case("cuda:0"), call)
        assert seen and set(seen) == {"cuda:0"}, i
        plain = call()
        routed, plain = (o if isinstance(o, tuple) else (o,) for o in (routed, plain))
        for got, want in zip(routed, plain):
            if isinstance(want, np.ndarray) and want.dtype == np.float64:
                np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15, err_msg=str(i))


@pytest.mark.parametrize("op", _NORM_ACT_OPS + ["act_fwd_quantize", "layernorm_fwd_quantize",
                                                "rmsnorm_fwd_quantize", "gemm"])
def test_runner_verdicts_unchanged_with_device_references(op, monkeypatch):
    """Through the runner and the specs: the smoke cases judged against references on torch
    float64 (here the CPU, where a CUDA case uses its GPU) get the numpy path's verdicts."""
    spec = get_spec(op)
    plain = [runner.run_case(spec, c, backends=["torch"], device="cpu").verdict
             for c in spec.smoke_cases]
    moved = _record_moves(monkeypatch)
    on_device = _record_device_compares(monkeypatch)
    monkeypatch.setattr(_device, "for_case", lambda device: "cpu")
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 0)  # any size
    routed = [runner.run_case(spec, c, backends=["torch"], device="cpu").verdict
              for c in spec.smoke_cases]
    assert routed == plain and "pass" in plain, (plain, routed)
    if spec.device_reference:  # inputs, reference, bounds and comparison all on the device
        assert on_device and set(on_device) == {"cpu"} and not moved
    else:
        assert "cpu" in moved  # (gemm: through its GELU-epilogue smoke case)


def _record_device_compares(monkeypatch):
    """Record the device of every comparison decided on the reference device."""
    from tealite_verify.tiers import bounded as TB
    seen, real = [], TB._all_finite_within_torch

    def record(tier, actual, e, tol, thr):
        seen.append(e.device.type)
        return real(tier, actual, e, tol, thr)

    monkeypatch.setattr(TB, "_all_finite_within_torch", record)
    return seen


@_CUDA
@pytest.mark.parametrize("op", _NORM_ACT_OPS)
def test_cuda_norm_act_cases_use_gpu_references(op, monkeypatch):
    seen = _record_moves(monkeypatch)
    on_device = _record_device_compares(monkeypatch)
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 0)  # smoke cases are small
    spec = get_spec(op)
    for case in spec.smoke_cases:
        rep = runner.run_case(spec, case, backends=["torch"], device="cuda")
        assert rep.verdict in ("pass", "skip"), rep.describe()
    if spec.device_reference:
        assert on_device and set(on_device) == {"cuda"} and not seen
    else:
        assert seen and set(seen) == {"cuda"}


# ---- specs whose reference, bounds and comparison run on the device ----------------------

_DEVICE_REFERENCE_OPS = [n for n in _NORM_ACT_OPS + ["gemm"] if get_spec(n).device_reference]


@pytest.mark.parametrize("op", _DEVICE_REFERENCE_OPS)
def test_device_comparison_reaches_the_numpy_verdicts_on_drawn_cases(op, monkeypatch):
    """Drawn cases (hostile distributions, specials, empty dims) judged with the reference,
    its bounds and the comparison in torch float64 (here on the CPU) against the numpy path:
    the same verdict, mismatch count and worst ratio.  The ratio may move in its 8th digit:
    torch's exp / tanh / erf are a few float64 ulp from libm's, and an fp32 output's error
    |y - ref| is ~2^-24 of |ref|, so a 2^-52 change in ref is ~2^-28 of that error."""
    from tealite_verify.cli import drawn_cases
    spec = get_spec(op)
    cases = list(spec.smoke_cases) + drawn_cases(spec, 40, "ci", seed=5)
    plain = [runner.run_case(spec, c, backends=["torch"], device="cpu") for c in cases]
    on_device = _record_device_compares(monkeypatch)
    monkeypatch.setattr(_device, "for_case", lambda device: "cpu")
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 0)  # any size
    # Every value and bound must stay a tensor: a numpy scalar or array mixed in converts a
    # CPU tensor silently (numpy calls Tensor.__array__) but fails on a GPU; make it fail here.
    def no_implicit_numpy(self, *args, **kwargs):
        raise TypeError("a tensor on the reference device was turned into numpy implicitly")

    monkeypatch.setattr(torch.Tensor, "__array__", no_implicit_numpy)
    from tealite_verify.tiers import bounded as TB
    real, kinds = TB.compare_bounded, set()

    def typed(actual, expected, tol, out_dtype, **kw):
        kinds.add((type(expected).__name__, type(tol).__name__))
        return real(actual, expected, tol, out_dtype, **kw)

    monkeypatch.setattr(TB, "compare_bounded", typed)
    routed = [runner.run_case(spec, c, backends=["torch"], device="cpu") for c in cases]
    assert on_device and kinds == {("Tensor", "Tensor")}, kinds
    for c, p, r in zip(cases, plain, routed):
        assert r.verdict == p.verdict, (c, p.describe(), r.describe())
        for cp, cr in zip(p.comparisons, r.comparisons):
            assert cr.metrics.mismatches == cp.metrics.mismatches, c
            assert cr.metrics.max_ratio == pytest.approx(cp.metrics.max_ratio, rel=1e-6,
                                                         abs=1e-12), c


_WRONG_CASES = {
    "act_fwd": {"kind": "silu", "shape": [9, 64], "dtype": "bfloat16",
                "dist": {"kind": "normal", "scale": 2.0}, "seed": 3},
    "gemm": dict(get_spec("gemm").smoke_cases[0]),
}


@pytest.mark.parametrize("op", sorted(_WRONG_CASES))
def test_device_comparison_catches_a_wrong_backend(op, monkeypatch):
    """A backend a few output ulps off (bfloat16) fails through the device path too: the
    comparison leaves the device for the general rules and reports the same mismatches."""
    spec, case = get_spec(op), _WRONG_CASES[op]
    real_call = spec.call

    def off_by_ulps(inputs, c, backend):
        out = real_call(inputs, c, backend)
        name = next(iter(out))
        return dict(out, **{name: (out[name].float() * (1 + 2.0**-6)).to(out[name].dtype)})

    wrong = dataclasses.replace(spec, call=off_by_ulps)
    plain = runner.run_case(wrong, case, backends=["torch"], device="cpu")
    monkeypatch.setattr(_device, "for_case", lambda device: "cpu")
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 0)  # any size
    routed = runner.run_case(wrong, case, backends=["torch"], device="cpu")
    assert plain.verdict == routed.verdict == "fail"
    assert [c.metrics.mismatches for c in routed.comparisons] == \
        [c.metrics.mismatches for c in plain.comparisons]


def test_small_cases_keep_numpy_bounds_and_large_ones_move(monkeypatch):
    """Below runner.DEVICE_REFERENCE_MIN_ELEMENTS (largest input) a device_reference case
    still computes its bounds with numpy on the host (only the reference products move);
    from it on, everything runs on the device."""
    spec = get_spec("act_fwd")
    on_device = _record_device_compares(monkeypatch)
    monkeypatch.setattr(_device, "for_case", lambda device: "cpu")
    small = dict(spec.smoke_cases[0], shape=[4, 64])
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 257)
    assert runner.run_case(spec, small, backends=["torch"]).verdict == "pass"
    assert not on_device
    monkeypatch.setattr(runner, "DEVICE_REFERENCE_MIN_ELEMENTS", 256)
    assert runner.run_case(spec, small, backends=["torch"]).verdict == "pass"
    assert on_device == ["cpu"]
