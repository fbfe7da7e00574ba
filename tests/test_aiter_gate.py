"""The AITER gate end to end, with real AITER code (the installed amd-aiter, or
``$TEALITE_AITER_PATH``), on the CPU through Triton's interpreter.

* Proof: a copy of the installed AITER with one kernel's rounding constant changed fails the
  gate; an unchanged copy passes it; a copy with a module moved fails it (vanished entry point).
* The committed baseline (ci/baselines/) still describes the installed AITER: ``gate compare``
  against it passes — the same check the CI workflow runs on a pin bump.

Each gate run is a subprocess: one process holds one AITER copy (the loader's rule).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tealite.backends.aiter import _triton_loader as L

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "ci" / "baselines" / "aiter-gate-cpu-interpreter.json"
REASON = L.why_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")

# AITER's Triton MXFP4 scale rule (EVEN): add half an E2M1 mantissa ulp (bit 21) to the amax
# bits, then floor.  Doubling the constant rounds amax up a whole ulp: a "rounding constant"
# change of the kind a release can slip in.
KERNEL = Path("aiter/ops/triton/_triton_kernels/quant.py")
ORIGINAL = "amax = (amax + 0x200000).to(tl.uint32, bitcast=True) & 0xFF800000"
MODIFIED = "amax = (amax + 0x400000).to(tl.uint32, bitcast=True) & 0xFF800000"


def _gate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE="ci")
    if "--aiter" in args:
        env.pop("TEALITE_AITER_PATH", None)  # --aiter decides
    return subprocess.run([sys.executable, "-m", "tealite_verify", "gate", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=900)


def _copy_aiter(dest: Path) -> Path:
    root, _ = L.find_source()
    shutil.copytree(root / "aiter", dest / "aiter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    base = tmp_path_factory.mktemp("aiter-copies")
    clean = _copy_aiter(base / "clean")
    bad = _copy_aiter(base / "modified")
    src = (bad / KERNEL).read_text()
    assert src.count(ORIGINAL) == 1, "the kernel line this proof edits has changed upstream"
    (bad / KERNEL).write_text(src.replace(ORIGINAL, MODIFIED))
    out = base / "baseline.json"
    r = _gate("capture", "--aiter", str(clean), "--op", "quantize", "--per-op", "4",
              "--draws", "150", "--out", str(out), cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert any(c["entry_point"] == "dynamic_mxfp4_quant" and c["verdict"] == "pass"
               for c in doc["cases"]), "the baseline must exercise the edited kernel"
    return clean, bad, out


def test_the_gate_fails_on_a_copy_with_a_changed_rounding_constant(copies, tmp_path):
    _, bad, baseline = copies
    md = tmp_path / "report.md"
    r = _gate("compare", "--baseline", str(baseline), "--aiter", str(bad), "--markdown",
              str(md), "--json", str(tmp_path / "report.json"), cwd=REPO)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False
    assert str(bad) in report["candidate"]["aiter"]["root"]  # the modified copy was loaded
    kinds = {f["kind"] for f in report["regressions"]}
    assert "new-failure" in kinds
    assert any("dynamic_mxfp4_quant" in f["where"] for f in report["regressions"]
               if f["kind"] == "new-failure")
    assert "AITER gate: FAIL" in md.read_text()


def test_the_gate_passes_on_an_unchanged_copy(copies, tmp_path):
    clean, _, baseline = copies
    r = _gate("compare", "--baseline", str(baseline), "--aiter", str(clean), "--json",
              str(tmp_path / "report.json"), cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "report.json").read_text())["regressions"] == []


def test_the_gate_fails_when_a_module_moves(copies, tmp_path):
    """A release that moves a module where this loader does not look (AITER moved its Triton
    modules between versions): the entry point is reported missing, and the gate fails."""
    _, _, baseline = copies
    moved = _copy_aiter(tmp_path / "moved")
    src = moved / "aiter/ops/triton/gemm_a16w16.py"
    src.rename(src.with_name("gemm_a16w16_renamed.py"))
    r = _gate("compare", "--baseline", str(baseline), "--aiter", str(moved), "--json",
              str(tmp_path / "report.json"), cwd=REPO)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    regressions = json.loads((tmp_path / "report.json").read_text())["regressions"]
    assert {"kind": "vanished", "where": "entry point gemm_a16w16"} in \
        [{k: f[k] for k in ("kind", "where")} for f in regressions]


@pytest.mark.skipif(not BASELINE.exists(), reason=f"no committed baseline at {BASELINE}")
def test_the_committed_baseline_matches_the_installed_aiter(tmp_path):
    doc = json.loads(BASELINE.read_text())
    root, _ = L.find_source()
    if doc["aiter"].get("version") != L._version(root):
        pytest.skip(f"baseline is for amd-aiter {doc['aiter'].get('version')}, installed "
                    f"{L._version(root)}: the gate workflow judges that pin bump")
    r = _gate("compare", "--baseline", str(BASELINE), "--json", str(tmp_path / "r.json"),
              cwd=REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
