"""One verdict per AITER entry point the project calls, from a compare's findings.

A maintainer reading a gate report wants, per entry point: did it change, and if so how.
The statuses, most severe first (an entry point gets the first that applies):

* ``removed``: the candidate's tree defines it nowhere;
* ``cannot be verified``: the harness could not drive it (it did not import, it lives where
  the loader does not look, a case raised or an adapter refused it, or its kernels reach a
  construct the interpreter mis-executes); the reason says which;
* ``numerics changed``: a contract field (declared or observed, with the witness input and
  both outputs), a case verdict or the worst error/tolerance ratio changed;
* ``signature changed``: the wrapper's parameters differ, and every case still passes;
* ``moved``: found at a new module path and verified there (all cases as before);
* ``unchanged``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tealite_verify.gate.compare import Finding, Result, Severity, entry_state


class EntryStatus(enum.Enum):
    REMOVED = "removed"
    UNVERIFIABLE = "cannot be verified"
    NUMERICS = "numerics changed"
    SIGNATURE = "signature changed"
    MOVED = "moved"
    UNCHANGED = "unchanged"


_NUMERICS_KINDS = ("new-failure", "contract", "error-growth")
_HARNESS_KINDS = ("import-error", "moved-unknown", "case-error", "refused",
                  "interpreter-gap", "load-failure")


@dataclass
class EntryVerdict:
    entry_point: str
    status: EntryStatus
    location: str | None
    old_location: str | None
    cases: int
    findings: list[Finding] = field(default_factory=list)
    probed: int = 0  # contract fields the probes observed

    @property
    def summary(self) -> str:
        """The findings that decided the status, one short line; an entry point no case and
        no probe reached says so (its verdict rests on loading alone)."""
        decisive = [f for f in self.findings if f.severity in (Severity.REGRESSION,
                                                               Severity.HARNESS)]
        shown = decisive or [f for f in self.findings if f.kind in ("moved", "signature",
                                                                    "interpreter-gap")]
        text = "; ".join(f"{f.kind}: {f.detail}" for f in shown[:3])[:400]
        if not self.cases and not self.probed:
            text = "; ".join(t for t in (text, "not exercised on this path: no case or probe "
                                               "reaches it (it loads)") if t)
        return text


def _status(findings: list[Finding]) -> EntryStatus:
    active = [f for f in findings if f.severity in (Severity.REGRESSION, Severity.HARNESS)]
    kinds = {f.kind for f in active}
    if "removed" in kinds:
        return EntryStatus.REMOVED
    if kinds & set(_HARNESS_KINDS):
        return EntryStatus.UNVERIFIABLE
    if kinds & set(_NUMERICS_KINDS):
        return EntryStatus.NUMERICS
    info = {f.kind for f in findings}
    if "signature" in info:
        return EntryStatus.SIGNATURE
    if "moved" in info:
        return EntryStatus.MOVED
    return EntryStatus.UNCHANGED


def entry_verdicts(base: dict, cand: dict, res: Result) -> list[EntryVerdict]:
    """A verdict for every entry point of the baseline or the candidate, sorted by name."""
    names = sorted(set(base["aiter"].get("entry_points", {})) |
                   set(cand["aiter"].get("entry_points", {})))
    by_ep: dict[str, list[Finding]] = {n: [] for n in names}
    for f in res.findings:
        if f.entry_point in by_ep:
            by_ep[f.entry_point].append(f)
    cases: dict[str, int] = {}
    for rec in base["cases"]:
        if rec.get("entry_point"):
            cases[rec["entry_point"]] = cases.get(rec["entry_point"], 0) + 1
    probed: dict[str, int] = {}
    for key, obs in cand.get("observed", {}).items():
        ep = key.split(":", 1)[-1]
        probed[ep] = probed.get(ep, 0) + len(obs.get("fields", {}))
    out = []
    for name in names:
        new, old = entry_state(cand, name), entry_state(base, name)
        out.append(EntryVerdict(name, _status(by_ep[name]), new.get("location"),
                                old.get("location"), cases.get(name, 0), by_ep[name],
                                probed.get(name, 0)))
    return out


def counts(verdicts: list[EntryVerdict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in verdicts:
        out[v.status.value] = out.get(v.status.value, 0) + 1
    return out
