"""Replay every stored fuzz finding (issue 5): a finding that still reproduces FAILS.

The corpus is ``$TEALITE_FINDINGS`` when set, else the repository's committed ``findings/``.
Committed findings are regression tests: the test fails (with the full report) while the bug
is present and passes once it is fixed.  tests/conftest.py moves these tests to the front, so
``pytest -m differential`` replays stored findings before drawing new cases.

Mismatch and error findings replay in this process through ``findings.replay``; crash and
hang findings replay in a subprocess (``python -m tealite_verify replay``) so a finding that
still kills or wedges its process fails this test instead of ending the run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tealite import registry
from tealite_verify.fuzz import findings as fz

pytestmark = pytest.mark.differential

ROOT = Path(__file__).parent.parent
# A crash or hang replay gets this long (seconds); a hang finding reproduces by timing out.
OUT_OF_PROCESS_TIMEOUT = float(os.environ.get("TEALITE_REPLAY_TIMEOUT", "120"))


def corpus_dir() -> Path:
    return fz.default_corpus_dir() if os.environ.get(fz.ENV_VAR) else ROOT / "findings"


def _stored() -> list:
    root = corpus_dir()
    stored = fz.Corpus(root).all() if root.is_dir() else []
    if not stored:
        return [pytest.param(None, id="empty-corpus", marks=pytest.mark.skip(
            reason=f"no stored findings in {root}"))]
    return [pytest.param(path, id=path.stem) for path, _ in stored]


def _skip_reason(f: fz.Finding) -> str | None:
    if str(f.device).startswith("cuda") and not torch.cuda.is_available():
        return f"finding was recorded on {f.device}; no CUDA device here"
    fz._ensure_backends(f.backends, f.versions)
    missing = [b for b in f.backends if b not in registry.backends()]
    if missing:
        mods = f.versions.get("backend_modules") or "none recorded"
        return f"backend(s) {missing} not registered here (plugin modules: {mods})"
    return None


def _replay_out_of_process(path: Path, f: fz.Finding) -> None:
    env = dict(os.environ)
    if f.versions.get("backend_modules") and not env.get(registry.PLUGIN_ENV_VAR):
        env[registry.PLUGIN_ENV_VAR] = f.versions["backend_modules"]
    cmd = [sys.executable, "-m", "tealite_verify", "replay", str(path)]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=OUT_OF_PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{f.kind} finding {path.name} still reproduces: replay did not finish "
                    f"in {OUT_OF_PROCESS_TIMEOUT:g} s\n{f.detail}\nrepro: {f.repro}")
    if r.returncode != 0:
        status = (f"killed by signal {-r.returncode}" if r.returncode < 0
                  else f"exit status {r.returncode}")
        pytest.fail(f"{f.kind} finding {path.name} still reproduces ({status}):\n"
                    f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}\nrepro: {f.repro}")


@pytest.mark.parametrize("path", _stored())
def test_stored_finding_no_longer_reproduces(path):
    f = fz.load_finding(path)
    reason = _skip_reason(f)
    if reason:
        pytest.skip(reason)
    if f.kind in ("crash", "hang"):
        _replay_out_of_process(path, f)
        return
    rep = fz.replay(f)
    if rep.verdict == "skip":
        pytest.skip("no backend ran the case: " + "; ".join(
            f"{o.backend}: {o.status} ({o.reason})" for o in rep.outcomes.values()))
    assert rep.verdict == "pass", (
        f"{f.kind} finding {path.name} still reproduces "
        f"(first seen {f.first_seen}, count {f.count}):\n{rep.describe()}\nrepro: {f.repro}")
