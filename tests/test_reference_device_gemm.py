"""Where the GEMM-family float64 reference products run (issue 5), and the runner's timings.

On CUDA the gemm / qgemm reference products run as torch float64 matmuls on the case's device;
on the CPU they stay numpy.  float64 on either side: the products agree to float64 rounding
(within twice float64's K-term dot-product bound, exactly on integer operands).  The norm and
activation references on a device: test_reference_device_agreement.py; the runner's routing
of them and the specs judged wholly on the device: test_reference_device_routing.py.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from tealite_verify import runner
from tealite_verify.references import _device
from tealite_verify.references import gemm as gemm_ref
from tealite_verify.references import qgemm as qgemm_ref
from tealite_verify.specs import get_spec

from _helpers_reference_device import _CUDA


def _operands(m=37, n=29, k=301, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, k)), rng.standard_normal((m, k))  # A (N,K), B (M,K): "TN"


def _assert_float64_close(got, want, a_abs, b_abs, layout):
    """|got - want| within twice float64's K-term dot-product bound on |B||A|."""
    k = a_abs.shape[1] if layout[0] == "T" else a_abs.shape[0]
    bound = 2 * k * np.finfo(np.float64).eps * gemm_ref.product(a_abs, b_abs, layout)
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound)


def test_default_reference_device_is_numpy():
    assert _device.current() is None
    a, b = _operands()
    np.testing.assert_array_equal(gemm_ref.product(a, b, "TN"), b @ a.T)


def test_runner_picks_the_gpu_only_for_cuda_cases():
    assert _device.for_case("cpu") is None
    assert _device.for_case("cuda") == "cuda" and _device.for_case("cuda:1") == "cuda:1"


def test_torch_path_matches_numpy_and_context_resets():
    """The mechanism itself, on the CPU: torch float64 on device 'cpu' through the context."""
    a, b = _operands()
    calls = []
    real = torch.from_numpy

    def spy(x):
        calls.append(x.shape)
        return real(x)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "from_numpy", spy)
        with _device.reference_device("cpu"):
            assert _device.current() == "cpu"
            got = gemm_ref.product(a, b, "TN")
            got_q = qgemm_ref.qgemm(a, b)
    assert len(calls) == 4  # both products went through torch
    assert _device.current() is None
    _assert_float64_close(got, b @ a.T, np.abs(a), np.abs(b), "TN")
    _assert_float64_close(got_q, b @ a.T, np.abs(a), np.abs(b), "TN")
    ai, bi = np.round(a * 8), np.round(b * 8)  # integer operands: every sum is exact
    with _device.reference_device("cpu"):
        np.testing.assert_array_equal(gemm_ref.product(ai, bi, "TN"), bi @ ai.T)
    with pytest.raises(ZeroDivisionError), _device.reference_device("cpu"):
        1 / 0
    assert _device.current() is None


def _recording_spec(op):
    """The op's spec with a reference that records the reference device it ran under."""
    spec, seen = get_spec(op), []

    def recording(x, case):
        seen.append(_device.current())
        return spec.reference(x, case)

    return dataclasses.replace(spec, reference=recording), seen


def test_run_case_on_cpu_keeps_numpy_references():
    spec, seen = _recording_spec("gemm")
    rep = runner.run_case(spec, spec.smoke_cases[0], backends=["torch"], device="cpu")
    assert rep.verdict == "pass" and seen == [None]


def test_timings_split_the_case():
    spec = get_spec("gemm")
    t0 = time.perf_counter()
    rep = runner.run_case(spec, spec.smoke_cases[1], backends=["torch"], device="cpu")
    wall = time.perf_counter() - t0
    assert rep.verdict == "pass"
    assert set(rep.timings) == {"inputs", "backend:torch", "reference", "compare"}
    assert all(v >= 0 for v in rep.timings.values())
    assert sum(rep.timings.values()) <= wall
    assert rep.to_dict()["timings"] == rep.timings


def test_timings_without_a_running_backend_have_no_reference_entry():
    spec = get_spec("gemm")
    rep = runner.run_case(spec, spec.smoke_cases[0], backends=["no_such_backend"],
                          device="cpu")
    assert "reference" not in rep.timings and "backend:no_such_backend" in rep.timings


@_CUDA
@pytest.mark.parametrize("layout", ["TN", "NN", "NT", "TT"])
def test_gpu_products_match_numpy(layout):
    rng = np.random.default_rng(7)
    m, n, k = 61, 45, 1003
    a = rng.standard_normal((n, k) if layout[0] == "T" else (k, n))
    b = rng.standard_normal((m, k) if layout[1] == "N" else (k, m))
    want = _numpy_product(a, b, layout)
    with _device.reference_device("cuda"):
        got = gemm_ref.product(a, b, layout)
    _assert_float64_close(got, want, np.abs(a), np.abs(b), layout)
    ai, bi = np.round(a * 8), np.round(b * 8)
    with _device.reference_device("cuda"):
        exact = gemm_ref.product(ai, bi, layout)
    np.testing.assert_array_equal(exact, _numpy_product(ai, bi, layout))


def _numpy_product(a, b, layout):
    op_b, op_a = gemm_ref.operands(a, b, layout)
    return op_b @ op_a


@_CUDA
@pytest.mark.parametrize("op", ["gemm", "qgemm"])
def test_cuda_cases_use_gpu_references(op):
    spec, seen = _recording_spec(op)
    for case in spec.smoke_cases:
        rep = runner.run_case(spec, case, backends=["torch"], device="cuda")
        assert rep.verdict in ("pass", "skip"), rep.describe()
        if rep.verdict == "pass":
            assert "reference" in rep.timings
    assert seen and all(d == "cuda" for d in seen)
