"""One differential check, as ``pytest -m differential`` runs it: a backend's suite cases for
one (op, dtype), and a stored finding re-run for one backend.  Shared by the repository's
tests (tests/test_differential.py) and the pytest plug-in other repositories load
(tealite_verify/pytest_plugin.py), so both judge a backend the same way.

Each check returns a :class:`Verdict` (pass, fail with the first failing case's report and its
repro command, or skip with the reason); the caller turns it into a test outcome.
"""
from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from tealite import registry
from tealite_verify import coverage, suite
from tealite_verify.fuzz import findings as fz
from tealite_verify.runner import run_case
from tealite_verify.specs import OpSpec, get_spec


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Verdict:
    status: Status
    # FAIL: what failed (a case report, repro line included); SKIP: why nothing ran.
    message: str = ""


def check_suite(spec: OpSpec, backend: str, dtype: str, *, device: str, size: str,
                peers: list[str]) -> Verdict:
    """The spec's smoke cases, then the stratified drawn cases of ``suite.plan``, for
    ``backend`` in ``dtype``: each judged against the float64 reference and against
    ``peers`` (only the comparisons involving ``backend`` are computed).  The coverage cells
    the cases that ran exercised are recorded (``suite.record_coverage``)."""
    reason = registry.get_backend(backend).unavailable_reason()
    if reason:
        return Verdict(Status.SKIP, f"backend {backend} unavailable: {reason}")
    plan = suite.plan(spec, backend, dtype, device=device, size=size)
    cases = suite.smoke_cases(spec, dtype) + plan.cases
    known_cells = [None] * (len(cases) - len(plan.cases)) + plan.case_cells
    failures, unsupported, exercised = [], [], set()
    for case, cells in zip(cases, known_cells):
        report = run_case(spec, case, backends=[backend] + peers, device=device, focus=backend)
        outcome = report.outcomes[backend]
        if outcome.status in ("unsupported", "unavailable"):
            unsupported.append(outcome.reason)
            continue
        if cells is None:  # a smoke case: classify it too
            cells = coverage.cells_of(case, spec.make_inputs(case, "cpu"))
        exercised |= cells
        if outcome.status == "error" or report.failures:
            failures.append(report.describe())
    suite.record_coverage(spec.name, backend, dtype, exercised)
    if failures:
        return Verdict(Status.FAIL,
                       f"{len(failures)} of {len(cases)} cases failed; first:\n{failures[0]}")
    if not exercised:
        why = sorted(set(unsupported))[:2] or sorted(set(plan.unreached.values()))[:2]
        return Verdict(Status.SKIP,
                       f"{backend} accepts none of the {spec.name} cases in {dtype}: "
                       + "; ".join(why))
    return Verdict(Status.PASS)


def all_peers(spec: OpSpec, backend: str) -> list[str]:
    """Every other available backend implementing the op: a plug-in backend is compared with
    all of them (the repository's own test compares each pair once: ``suite.peers``)."""
    return [name for name, b in sorted(registry.backends().items())
            if name != backend and spec.implemented_by(b) and b.unavailable_reason() is None]


# ---- stored findings ------------------------------------------------------------------------

def finding_skip_reason(f: fz.Finding) -> str | None:
    """Why ``f`` cannot be replayed here (its device or its backends are missing), or None."""
    if str(f.device).startswith("cuda") and not torch.cuda.is_available():
        return f"finding was recorded on {f.device}; no CUDA device here"
    fz._ensure_backends(f.backends, f.versions)
    missing = [b for b in f.backends if b not in registry.backends()]
    if missing:
        mods = f.versions.get("backend_modules") or "none recorded"
        return f"backend(s) {missing} not registered here (plugin modules: {mods})"
    return None


def replay_out_of_process(path: Path, f: fz.Finding, *, timeout: float,
                          backends: list[str] | None = None, cwd: Path | None = None) -> Verdict:
    """Replay a crash or hang finding in a child (``python -m tealite_verify replay``), so a
    finding that still kills or wedges its process fails instead of ending the run."""
    env = dict(os.environ)
    if f.versions.get("backend_modules") and not env.get(registry.PLUGIN_ENV_VAR):
        env[registry.PLUGIN_ENV_VAR] = f.versions["backend_modules"]
    cmd = [sys.executable, "-m", "tealite_verify", "replay", str(path)]
    cmd += [a for b in backends or [] for a in ("--backend", b)]
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return Verdict(Status.FAIL, f"{f.kind} finding {path.name} still reproduces: replay "
                                    f"did not finish in {timeout:g} s\n{f.detail}\n"
                                    f"repro: {f.repro}")
    if r.returncode != 0:
        status = (f"killed by {_signal_name(-r.returncode)}" if r.returncode < 0
                  else f"exit status {r.returncode}")
        return Verdict(Status.FAIL, f"{f.kind} finding {path.name} still reproduces ({status}):"
                                    f"\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}\nrepro: {f.repro}")
    return Verdict(Status.PASS)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def replay_for_backend(path: Path, backend: str, *, timeout: float,
                       device: str | None = None) -> Verdict:
    """Re-run the stored finding at ``path`` on ``backend``: its case judged against the
    reference and against the finding's own backends that are available here.  A finding
    from any backend (another team's kernels, ours) becomes a regression case for this one;
    it fails while ``backend`` gets the case wrong."""
    f = fz.load_finding(path)
    if str(device or f.device).startswith("cuda") and not torch.cuda.is_available():
        return Verdict(Status.SKIP, f"finding was recorded on {f.device}; no CUDA device here")
    fz._ensure_backends(f.backends, f.versions)
    known = registry.backends()
    others = [b for b in f.backends if b != backend and b in known
              and known[b].unavailable_reason() is None]
    if f.kind in ("crash", "hang"):
        return replay_out_of_process(path, f, timeout=timeout, backends=[backend])
    spec = get_spec(f.op)
    replays = f.metrics.get("graph_replay") if f.kind == "graph-replay" else "env"
    report = run_case(spec, f.case, backends=[backend] + others, device=device or f.device,
                      focus=backend, graph_replay=replays)
    outcome = report.outcomes[backend]
    if outcome.status in ("unsupported", "unavailable"):
        return Verdict(Status.SKIP, f"{backend} does not run this case: {outcome.reason}")
    if outcome.status == "error" or report.failures or report.replay_failures:
        return Verdict(Status.FAIL, f"{f.kind} finding {path.name} (first seen on "
                                    f"{'/'.join(f.backends)}) fails on {backend}:\n"
                                    f"{report.describe()}")
    return Verdict(Status.PASS)

