"""The gate's verdict classes on AITER's real tagged trees (the committed baseline against a
release), where a tag shows the class; the classes no tag shows are proven on patched copies
in test_aiter_gate.py.

Needs ``$TEALITE_AITER_CACHE``: a directory of ``ci/aiter_source.sh TAG DIR`` exports
(``$TEALITE_AITER_CACHE/v0.1.10/aiter/...``).  CI has no clone of ROCm/aiter and may not
commit AITER code, so there these tests are skipped with that reason; docs/aiter-history.md
records the full run over every tag.

* v0.1.7.post3 (CPU interpreter): AITER's ``_mxfp4_quant_op`` was rewritten (round to nearest
  even) with ``not`` on tensors, which the interpreter mis-executes: the three MXFP4 entry
  points cannot be verified here (interpreter gap, their results excused, not a regression);
  ``gemm_afp4wfp4_preshuffled_scales`` calls a kernel name that no longer exists (NameError:
  the harness cannot drive it); ``fused_rms_mxfp4_quant`` returns a 4-tuple (signature
  changed, the adapter copes, its other cases verify).
  From the same tag AITER launches its FP4 GEMM with 128-long K steps and unmasked scale
  loads: the adapter refuses K = 32 (the case would read out of bounds).
* v0.1.10: the modules moved (quant/, normalization/, gemm/basic/): entry points are found at
  the new paths and still verified there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tealite.backends.aiter_common import loader as L

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "ci" / "baselines" / "aiter-gate-cpu-interpreter.json"
CACHE = os.environ.get("TEALITE_AITER_CACHE")
pytestmark = [
    pytest.mark.skipif(not CACHE, reason="set TEALITE_AITER_CACHE to a directory of "
                                         "ci/aiter_source.sh exports (CI has no AITER clone)"),
    pytest.mark.skipif(L.why_unavailable() is not None, reason="AITER not installed"),
]


def _tree(tag: str) -> Path:
    tree = Path(CACHE or "") / tag
    if not (tree / "aiter" / "ops" / "triton").is_dir():
        pytest.skip(f"no export of {tag} in $TEALITE_AITER_CACHE")
    return tree


@pytest.fixture(scope="module")
def gate_runs(tmp_path_factory):
    out = {}

    def run(tag: str):
        if tag not in out:
            d = tmp_path_factory.mktemp(tag)
            env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE="ci")
            env.pop("TEALITE_AITER_PATH", None)
            r = subprocess.run([sys.executable, "-m", "tealite_verify", "gate", "compare",
                                "--baseline", str(BASELINE), "--aiter", str(_tree(tag)),
                                "--json", str(d / "r.json")], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=900)
            report = json.loads((d / "r.json").read_text())
            out[tag] = (r.returncode, report,
                        {e["entry_point"]: e for e in report["entry_points"]})
        return out[tag]
    return run


MXFP4 = ("dynamic_mxfp4_quant", "fused_rms_mxfp4_quant", "act_mul_and_mxfp4_quant")


def test_v0_1_7_post3_mxfp4_rewrite_is_an_interpreter_gap_not_a_regression(gate_runs):
    rc, report, eps = gate_runs("v0.1.7.post3")
    assert rc == 2, report.get("error")
    for ep in MXFP4:
        assert eps[ep]["verdict"] == "cannot be verified", eps[ep]
        assert "interpreter-gap" in eps[ep]["why"] and "not saturate_mask" in eps[ep]["why"]
    assert not [f for f in report["regressions"] if f["entry_point"] in MXFP4]


def test_v0_1_7_post3_a_wrapper_that_raises_cannot_be_verified(gate_runs):
    _, report, eps = gate_runs("v0.1.7.post3")
    ep = eps["gemm_afp4wfp4_preshuffled_scales"]
    assert ep["verdict"] == "cannot be verified"
    assert "NameError" in ep["why"]


def test_v0_1_7_post3_an_unsafe_launch_is_refused_not_run(gate_runs):
    """From v0.1.7.post3 AITER floors the FP4 GEMM's K step at 128 while its E8M0 scale loads
    stay unmasked: for K = 32 the launch would read scale bytes past K/32.  The adapter refuses
    the case (it ran in the baseline): the harness cannot drive it, which is not a verdict on
    AITER's numerics."""
    _, report, eps = gate_runs("v0.1.7.post3")
    ep = eps["gemm_afp4wfp4"]
    assert ep["verdict"] == "cannot be verified" and "EVEN_K" in ep["why"]


def test_v0_1_7_post3_a_changed_return_shape_is_a_signature_change(gate_runs):
    _, report, _ = gate_runs("v0.1.7.post3")
    sig = [f for f in report["notes"] if f["kind"] == "signature"
           and f["entry_point"] == "fused_rms_mxfp4_quant"]
    assert sig and "output_unquantized_inp1" in sig[0]["detail"]


def test_v0_1_10_moved_modules_are_found_and_still_verified(gate_runs):
    rc, report, eps = gate_runs("v0.1.10")
    assert rc in (0, 2), report.get("error")  # 2: the interpreter gaps above, nothing else
    for ep, where in (("gemm_a8w8", "gemm.basic.gemm_a8w8"), ("_rmsnorm_forward",
                      "normalization.rmsnorm"), ("_layernorm_backward", "normalization.norm")):
        assert eps[ep]["verdict"] == "moved", eps[ep]
        assert eps[ep]["location"].startswith(f"aiter.ops.triton.{where}:")
        assert eps[ep]["cases"] > 0
    assert report["regressions"] == []
    unexpected = [f for f in report["harness_problems"] if f["entry_point"] not in
                  MXFP4 + ("gemm_afp4wfp4_preshuffled_scales", "gemm_afp4wfp4")]
    assert unexpected == [], unexpected
