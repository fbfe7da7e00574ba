"""The AITER gate end to end, with real AITER code (the installed amd-aiter, or
``$TEALITE_AITER_PATH``), on the CPU through Triton's interpreter, one verdict class per
patched copy of the installed AITER:

* numerics changed: one kernel's rounding constant changed -> exit 1 (new failures, and the
  observed contract field);
* unchanged: an unchanged copy -> exit 0;
* moved: a module moved to the later layout the loader knows -> exit 0, "moved", verified;
* removed: the wrapper deleted -> exit 1, "removed";
* adapter failure: a module that raises at import / one moved where the loader does not look
  -> exit 2, "cannot be verified";
* interpreter gap: a ``not`` on a tensor added to a kernel (the same values compiled) ->
  exit 2, "cannot be verified", its results excused.
* The committed baseline (ci/baselines/) still describes the installed AITER.

The same classes on AITER's real tagged trees are in test_aiter_gate_history.py.  Each gate
run is a subprocess: one process holds one AITER copy (the loader's rule).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tealite.backends.aiter_common import loader as L

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
    _edit(bad / KERNEL, ORIGINAL, MODIFIED)
    out = base / "baseline.json"
    r = _gate("capture", "--aiter", str(clean), "--op", "quantize", "--op", "gemm",
              "--per-op", "4", "--draws", "150", "--out", str(out), cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    for ep in ("dynamic_mxfp4_quant", "gemm_a16w16"):
        assert any(c["entry_point"] == ep and c["verdict"] == "pass" for c in doc["cases"]), \
            f"the baseline must exercise {ep}"
    return clean, bad, out


def _edit(path: Path, old: str, new: str) -> None:
    src = path.read_text()
    assert src.count(old) == 1, f"the line this proof edits has changed upstream: {old!r}"
    path.write_text(src.replace(old, new))


def _compare(baseline: Path, tree: Path, tmp_path: Path):
    js = tmp_path / "report.json"
    r = _gate("compare", "--baseline", str(baseline), "--aiter", str(tree), "--json", str(js),
              "--markdown", str(tmp_path / "report.md"), cwd=REPO)
    assert js.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(js.read_text())
    verdicts = {e["entry_point"]: e["verdict"] for e in report.get("entry_points", [])}
    return r, report, verdicts


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
    r, report, verdicts = _compare(baseline, clean, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert report["regressions"] == [] and report["harness_problems"] == []
    assert set(verdicts.values()) == {"unchanged"}


def test_a_module_moved_to_the_later_layout_is_moved_and_still_verified(copies, tmp_path):
    """AITER v0.1.10 moved its GEMM modules to ops/triton/gemm/basic/: the loader's declared
    candidates find the entry point there (the copy has no version, so every candidate is
    tried), and its cases still pass."""
    _, _, baseline = copies
    moved = _copy_aiter(tmp_path / "moved")
    (moved / "aiter/_version.py").unlink(missing_ok=True)  # version unknown: all candidates
    triton_dir = moved / "aiter/ops/triton"
    (triton_dir / "gemm/basic").mkdir(parents=True)
    for pkg in ("gemm", "gemm/basic"):
        (triton_dir / pkg / "__init__.py").write_text("")
    (triton_dir / "gemm_a16w16.py").rename(triton_dir / "gemm/basic/gemm_a16w16.py")
    r, report, verdicts = _compare(baseline, moved, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert verdicts["gemm_a16w16"] == "moved"
    loc = {e["entry_point"]: e["location"] for e in report["entry_points"]}["gemm_a16w16"]
    assert loc.startswith("aiter.ops.triton.gemm.basic.gemm_a16w16")


def test_a_removed_wrapper_is_an_aiter_regression(copies, tmp_path):
    _, _, baseline = copies
    gone = _copy_aiter(tmp_path / "removed")
    for module in ("gemm_a16w16.py", "gemm_a16w16_agnostic.py"):  # both define it
        _edit(gone / "aiter/ops/triton" / module, "def gemm_a16w16(", "def _retired_a16w16(")
    r, report, verdicts = _compare(baseline, gone, tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert verdicts["gemm_a16w16"] == "removed"
    assert {"removed"} <= {f["kind"] for f in report["regressions"]}


@pytest.mark.parametrize("how", ["import-error", "moved-unknown"])
def test_an_entry_point_the_harness_cannot_reach_exits_2(copies, tmp_path, how):
    _, _, baseline = copies
    broken = _copy_aiter(tmp_path / how)
    module = broken / "aiter/ops/triton/gemm_a16w16.py"
    if how == "import-error":
        module.write_text("raise ImportError('needs a ROCm-only module')\n" + module.read_text())
    else:  # a module name no candidate of the loader names
        module.rename(module.with_name("gemm_a16w16_renamed.py"))
    r, report, verdicts = _compare(baseline, broken, tmp_path)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert verdicts["gemm_a16w16"] == "cannot be verified"
    assert how in {f["kind"] for f in report["harness_problems"]}
    if how == "moved-unknown":  # the report names where the definition went
        assert "gemm_a16w16_renamed" in json.dumps(report["harness_problems"])
    assert report["regressions"] == []


def test_an_interpreter_gap_in_a_kernel_is_not_an_aiter_regression(copies, tmp_path):
    """A ``not`` on a tensor (elementwise when compiled: values unchanged there) added to the
    MXFP4 kernel: the gate finds it in the source and marks the entry points that reach it."""
    _, _, baseline = copies
    gap = _copy_aiter(tmp_path / "gap")
    line = "e = (qx >> 23) & 0xFF"
    _edit(gap / KERNEL, line, f"{line}\n    e = tl.where(not (e > 255), e, e)")
    r, report, verdicts = _compare(baseline, gap, tmp_path)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert verdicts["dynamic_mxfp4_quant"] == "cannot be verified"
    gaps = [f for f in report["harness_problems"] if f["kind"] == "interpreter-gap"]
    assert gaps and "not (e > 255)" in gaps[0]["detail"]
    assert report["regressions"] == []


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
