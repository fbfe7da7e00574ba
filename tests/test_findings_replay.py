"""Replay every stored fuzz finding (issue 5): a finding that still reproduces FAILS.

The corpus is ``$TEALITE_FINDINGS`` when set, else the repository's committed ``findings/``.
Committed findings are regression tests: the test fails (with the full report) while the bug
is present and passes once it is fixed.  tests/conftest.py moves these tests to the front, so
``pytest -m differential`` replays stored findings before drawing new cases.

Mismatch and error findings replay in this process through ``findings.replay``; crash and
hang findings replay in a subprocess (``python -m tealite_verify replay``) so a finding that
still kills or wedges its process fails this test instead of ending the run (both helpers are
in tealite_verify/differential.py, shared with the pytest plug-in's findings replay).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tealite_verify import differential
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


@pytest.mark.parametrize("path", _stored())
def test_stored_finding_no_longer_reproduces(path):
    f = fz.load_finding(path)
    reason = differential.finding_skip_reason(f)
    if reason:
        pytest.skip(reason)
    if f.kind in ("crash", "hang"):
        verdict = differential.replay_out_of_process(path, f, timeout=OUT_OF_PROCESS_TIMEOUT,
                                                     cwd=ROOT)
        if verdict.status is differential.Status.FAIL:
            pytest.fail(verdict.message)
        return
    rep = fz.replay(f)
    if rep.verdict == "skip":
        pytest.skip("no backend ran the case: " + "; ".join(
            f"{o.backend}: {o.status} ({o.reason})" for o in rep.outcomes.values()))
    assert rep.verdict == "pass", (
        f"{f.kind} finding {path.name} still reproduces "
        f"(first seen {f.first_seen}, count {f.count}):\n{rep.describe()}\nrepro: {f.repro}")
