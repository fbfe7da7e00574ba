"""Triton's interpreter is probed, not assumed (tealite/backends/_triton_interpreter.py): on the
device image (triton 3.6, numpy 2.5.2) it cannot run a loop bounded by a runtime scalar, and
a false-alarm campaign there reported every interpreted GEMM / reduction kernel as erroring."""
from __future__ import annotations

import os

import pytest

from tealite import registry
from tealite.backends import _triton_interpreter
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="probes Triton's interpreter (TRITON_INTERPRET=1)")

GEMM = {"alpha": 1.0, "beta": 0.0, "bias": False, "dist_a": {"kind": "normal", "scale": 1.0},
        "dist_b": {"kind": "normal", "scale": 1.0}, "dtype": "float32", "gelu": False, "k": 5,
        "layout": "TN", "m": 3, "n": 2, "out_dtype": "float32", "seed": 0}


def test_probe_runs_the_loop_here():
    assert _triton_interpreter.runtime_loop_gap() is None
    assert registry.get_backend("triton").unavailable_reason() is None


@pytest.mark.parametrize("backend", ["triton", "aiter_triton"])
def test_a_gap_makes_the_backend_unavailable_with_the_reason(backend):
    why = "Triton 3.6.0's interpreter cannot run a loop bounded by a runtime scalar"
    with _triton_interpreter.INTERPRETER.override(runtime_loop_gap=why):
        assert registry.get_backend(backend).unavailable_reason() == why
        report = run_case(get_spec("gemm"), dict(GEMM, dtype="float16", out_dtype="float16"),
                          backends=[backend, "torch"])
    assert report.outcomes[backend].status == "unavailable"
    assert why in report.outcomes[backend].reason
    assert report.verdict == "pass"  # not an error finding
