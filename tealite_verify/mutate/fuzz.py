"""One fuzz campaign on a mutant: ``python -m tealite_verify fuzz`` in a subprocess with the
mutant plug-in, stopped at its first finding.

The campaign is the project's own fuzzer, unchanged: ``TEALITE_BACKEND_MODULES`` imports
``tealite_verify.mutate.plugin`` with ``TEALITE_MUTANT=<operator>``, ``--backend mutant`` judges
only the mutant, and the corpus is a scratch directory (a finding of an earlier campaign must
not count).  At the supervisor's first "[fuzz] finding" line the campaign is interrupted
(SIGINT: it still writes its JSON report).  The time to the finding is read from the report:
the stored finding's ``first_seen`` minus the campaign's start (``finished - elapsed_s``), at
the report's one-second resolution; it includes Hypothesis shrinking the failing case, since
the worker reports a finding once its run is over.  A finding on a case the torch backend
fails too is a harness false alarm, not a kill.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tealite import registry
from tealite_verify.mutate import plugin
from tealite_verify.mutate.base import Mutation


@dataclass
class FuzzResult:
    """One operator's fuzz campaign: whether and when it found the mutant."""

    seconds: float            # the campaign's budget
    killed: bool = False
    time_to_finding_s: float | None = None  # from the JSON report (campaign start -> finding)
    wall_s: float = 0.0       # the whole subprocess, startup included
    cases: int = 0
    finding: str = ""
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


FINDING_LINE = "[fuzz] finding"
# After the budget: the fuzzer's shrink grace (at most 60 s), the case timeout (60 s) and its
# stop grace; then the campaign is interrupted, and killed if it still does not end.
OVERRUN_S = 150.0
INTERRUPT_GRACE_S = 30.0


def fuzz_command(mutation: Mutation, seconds: float, corpus: str, json_path: str,
                 seed: int = 0) -> tuple[list[str], dict]:
    """The command line and environment of the campaign."""
    env = dict(os.environ)
    mods = [m for m in env.get(registry.PLUGIN_ENV_VAR, "").split(",") if m.strip()]
    env[registry.PLUGIN_ENV_VAR] = ",".join(["tealite_verify.mutate.plugin"] + mods)
    env[plugin.ENV_VAR] = mutation.name
    cmd = [sys.executable, "-m", "tealite_verify", "fuzz", "--op", mutation.op,
           "--backend", plugin.NAME, "--seconds", f"{seconds:g}", "--corpus", corpus,
           "--json", json_path, "--seed", str(seed)]
    return cmd, env


def _iso(s: str) -> float:
    return dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def read_report(json_path: str) -> dict:
    return json.loads(Path(json_path).read_text())


def first_finding(doc: dict) -> dict | None:
    """The stored finding (full, with its case and first_seen) the report found first."""
    best = None
    for f in doc.get("findings", []):
        if plugin.NAME not in f.get("backends", []):
            continue
        stored = json.loads(Path(f["path"]).read_text()) if f.get("path") else f
        if best is None or _iso(stored["first_seen"]) < _iso(best["first_seen"]):
            best = stored
    return best


def time_to_finding(doc: dict, finding: dict) -> float:
    start = _iso(doc["finished"]) - float(doc["totals"]["elapsed_s"])
    return max(0.0, _iso(finding["first_seen"]) - start)


def torch_fails_too(finding: dict) -> bool:
    """Replay a mismatch / error finding's case on torch (crash / hang cases are not replayed
    in this process: they could take it down)."""
    if finding.get("kind") not in ("mismatch", "error", "parity"):
        return False
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    rep = run_case(get_spec(finding["op"]), finding["case"], backends=["torch"],
                   device=finding.get("device", "cpu"), pairwise=False)
    return rep.verdict == "fail"


def _watch(proc: subprocess.Popen, seen: list, lines: list) -> None:
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        if FINDING_LINE in line and not seen:
            seen.append(time.monotonic())
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass


def fuzz_mutant(mutation: Mutation, seconds: float, *, seed: int = 0) -> FuzzResult:
    res = FuzzResult(seconds=float(seconds))
    with tempfile.TemporaryDirectory(prefix="tealite-mutate-") as tmp:
        json_path = os.path.join(tmp, "report.json")
        cmd, env = fuzz_command(mutation, seconds, os.path.join(tmp, "corpus"), json_path,
                                seed)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        seen: list = []
        lines: list = []
        reader = threading.Thread(target=_watch, args=(proc, seen, lines), daemon=True)
        reader.start()
        _wait(proc, seconds + OVERRUN_S)
        reader.join(timeout=5.0)
        res.wall_s = time.monotonic() - t0
        if not os.path.exists(json_path):
            res.note = f"the fuzz command wrote no report (exit {proc.returncode}): " + \
                " | ".join(lines[-3:])[:300]
            return res
        _judge(res, read_report(json_path))
    return res


def _wait(proc: subprocess.Popen, limit: float) -> None:
    try:
        proc.wait(timeout=limit)
        return
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _judge(res: FuzzResult, doc: dict) -> None:
    res.cases = int(doc["totals"]["cases"])
    finding = first_finding(doc)
    if finding is None:
        return
    res.finding = f"{finding['kind']} [{finding.get('output')}] {finding['detail']}"[:400]
    if torch_fails_too(finding):
        res.note = "its finding fails on torch too (a harness false alarm, not a kill)"
        return
    res.killed = True
    res.time_to_finding_s = time_to_finding(doc, finding)
