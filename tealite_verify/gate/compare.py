"""Judge a candidate AITER run against a baseline, finding by finding.

Every finding has a :class:`Severity` that decides the exit status (:mod:`verdicts`):

* ``REGRESSION`` (exit 1, "AITER changed"): ``new-failure`` (a case that passed now fails or
  disagrees with a peer backend), ``contract`` (a declared contract field changed, or a field
  observed by probing did, :mod:`observe`), ``error-growth`` (a key's worst error/tolerance
  ratio grew beyond ``factor`` times the baseline's; ratios below ``floor`` count as ``floor``
  so a bit-exact baseline of 0 does not make every rounding change a regression),
  ``removed`` (the candidate's tree defines the entry point nowhere);
* ``HARNESS`` (exit 2, "our adapter needs work / the harness could not drive it"): the tree
  did not load, an entry point exists but did not import (``import-error``) or lives where the
  loader's candidates do not look (``moved-unknown``), a case raised (``case-error``) or was
  refused by the backend where the baseline ran it (``refused``: an adapter rule, e.g. a
  launch that would read out of bounds, or a platform rejection), or an entry point's kernels
  reach a construct the interpreter mis-executes that the baseline's did not
  (``interpreter-gap``): its results there say nothing about AITER;
* ``INFO`` (never fails): ``moved`` (same entry point, new module, still verified there),
  ``signature`` (the wrapper's parameters changed), ``unverified`` (an interpreter gap the
  baseline had too), improvements (``fixed``, ``appeared``, ``error-shrink``).

Cases whose entry point has an interpreter gap are excused from ``new-failure`` and
``error-growth``; with ``cross`` (the same baseline run in the other execution mode, e.g.
compiled on a GPU beside the interpreter) a case whose interpreted and compiled verdicts
differ is an interpreter gap by observation.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tealite_verify.gate.record import unnum

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 0.05


class Severity(enum.Enum):
    REGRESSION = "regression"
    HARNESS = "harness"
    INFO = "info"
    IMPROVEMENT = "improvement"


@dataclass(frozen=True)
class Finding:
    kind: str
    where: str
    detail: str
    severity: Severity = Severity.REGRESSION
    entry_point: str | None = None
    case_index: int | None = None


@dataclass
class Result:
    findings: list[Finding] = field(default_factory=list)
    unchanged: int = 0
    factor: float = DEFAULT_FACTOR
    floor: float = DEFAULT_FLOOR

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity is severity]

    @property
    def regressions(self) -> list[Finding]:
        return self.of(Severity.REGRESSION)

    @property
    def harness_problems(self) -> list[Finding]:
        return self.of(Severity.HARNESS)

    @property
    def improvements(self) -> list[Finding]:
        return self.of(Severity.IMPROVEMENT)

    @property
    def notes(self) -> list[Finding]:
        return self.of(Severity.INFO)

    @property
    def passed(self) -> bool:
        return not self.regressions and not self.harness_problems

    @property
    def exit_code(self) -> int:
        """0 pass, 1 AITER's numerics regressed (a proven change wins over a harness
        problem elsewhere: both are in the report), 2 the harness could not load or drive
        part of the candidate."""
        if self.regressions:
            return 1
        return 2 if self.harness_problems else 0


# ---- entry points: loaded, moved, removed, not importable ----------------------------------

def entry_state(doc: dict, name: str) -> dict:
    """One entry point's record in a document (``aiter.entry_points``)."""
    return doc["aiter"].get("entry_points", {}).get(name) or \
        {"state": "missing", "missing_kind": "import-error",
         "reason": "not in this loader's table"}


def _load_failure(cand: dict) -> list[Finding]:
    a = cand["aiter"]
    out = []
    if not a.get("found"):
        out.append(Finding("load-failure", "aiter", a.get("reason") or "AITER not loaded",
                           Severity.HARNESS))
    for err in a.get("load_errors", []):
        out.append(Finding("load-failure", "aiter", err, Severity.HARNESS))
    return out


def _entry_points(base: dict, cand: dict) -> list[Finding]:
    out = []
    names = sorted(set(base["aiter"].get("entry_points", {})) |
                   set(cand["aiter"].get("entry_points", {})))
    for name in names:
        old, new = entry_state(base, name), entry_state(cand, name)
        where = f"entry point {name}"
        if old["state"] == "available" and new["state"] != "available":
            kind = new.get("missing_kind") or "import-error"
            sev = Severity.REGRESSION if kind == "removed" else Severity.HARNESS
            out.append(Finding(kind, where, new.get("reason", ""), sev, name))
            continue
        if old["state"] != "available" and new["state"] == "available":
            out.append(Finding("appeared", where, f"now loads from {new.get('location')}",
                               Severity.IMPROVEMENT, name))
            continue
        if new["state"] != "available":
            continue
        if old.get("location") and new.get("location") and \
                old["location"] != new["location"]:
            out.append(Finding("moved", where, f"{old['location']} -> {new['location']}",
                               Severity.INFO, name))
        if old.get("signature") is not None and new.get("signature") is not None and \
                old["signature"] != new["signature"]:
            out.append(Finding("signature", where,
                               f"{old['signature']} -> {new['signature']}", Severity.INFO,
                               name))
    return out


# ---- contracts ------------------------------------------------------------------------------

def _entry_of(key: str) -> str:
    return key.split(":", 1)[-1]


def _declared(base: dict, cand: dict) -> list[Finding]:
    out = []
    old, new = base.get("contracts", {}), cand.get("contracts", {})
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(Finding("contract", f"declared {name}", "no longer declared",
                               entry_point=_entry_of(name)))
        elif name not in old:
            out.append(Finding("contract", f"declared {name}", "new", Severity.IMPROVEMENT,
                               _entry_of(name)))
        else:
            for k in sorted(set(old[name]) | set(new[name])):
                if old[name].get(k) != new[name].get(k):
                    out.append(Finding("contract", f"declared {name}.{k}",
                                       f"{old[name].get(k)!r} -> {new[name].get(k)!r}",
                                       entry_point=_entry_of(name)))
    return out


def _observed(base: dict, cand: dict, diff) -> list[Finding]:
    out = []
    old, new = base.get("observed", {}), cand.get("observed", {})
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(Finding("contract", f"observed {name}", "no longer observed",
                               entry_point=_entry_of(name)))
            continue
        if name not in old:
            continue
        for ch in diff(old[name], new[name]):
            out.append(Finding("contract", f"observed {name}.{ch.field}", _change_text(ch),
                               entry_point=_entry_of(name)))
    return out


def _short(value, limit: int = 160) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _change_text(ch) -> str:
    """``old -> new``, then the witness: the probe's input and both releases' outputs."""
    text = f"{_short(ch.old)} -> {_short(ch.new)}"
    if getattr(ch, "witness_input", None) is not None:
        text += (f"; witness input {_short(ch.witness_input)}: baseline output "
                 f"{_short(ch.old_output)}, candidate output {_short(ch.new_output)}")
    return text


# ---- cases and error statistics -------------------------------------------------------------

def _ok(rec: dict) -> bool:
    return rec["verdict"] == "pass" and all(v == "pass" for v in rec["peers"].values())


def _case_finding(old: dict, new: dict) -> Finding | None:
    ep = old["entry_point"] or new["entry_point"]
    where = f"case {old['index']} [{old['key']}] {ep or ''}".rstrip()
    idx = old["index"]
    if old["status"] == "ok" and new["status"] == "error":
        return Finding("case-error", where, new.get("reason") or "raised", Severity.HARNESS,
                       ep, idx)
    if old["status"] == "ok" and new["status"] in ("unsupported", "unavailable"):
        return Finding("refused", where, f"the backend ran this case in the baseline and now "
                       f"refuses it: {new['status']}: {new['reason']}", Severity.HARNESS, ep,
                       idx)
    if _ok(old) and not _ok(new):
        detail = "; ".join(new["failures"]) or new.get("reason") or f"peers {new['peers']}"
        return Finding("new-failure", where, detail, Severity.REGRESSION, ep, idx)
    if not _ok(old) and _ok(new):
        return Finding("fixed", where, "now passes", Severity.IMPROVEMENT, ep, idx)
    if old["entry_point"] and new["entry_point"] and old["entry_point"] != new["entry_point"]:
        return Finding("contract", where, f"routed to entry point {old['entry_point']} -> "
                                          f"{new['entry_point']}", Severity.REGRESSION, ep, idx)
    return None


def _cases(base: dict, cand: dict) -> list[Finding]:
    new_by_index = {r["index"]: r for r in cand["cases"]}
    out = []
    for old in base["cases"]:
        new = new_by_index.get(old["index"])
        if new is None:
            out.append(Finding("case-error", f"case {old['index']} [{old['key']}]",
                               "case not run", Severity.HARNESS, old["entry_point"],
                               old["index"]))
            continue
        f = _case_finding(old, new)
        if f is not None:
            out.append(f)
    return out


def _errors(base: dict, cand: dict, res: Result) -> list[Finding]:
    out = []
    for key, old in base["entries"].items():
        new = cand["entries"].get(key)
        if new is None or not old["ran"] or not new["ran"]:
            continue
        eps = new.get("entry_points") or old.get("entry_points") or [None]
        r_old = max(unnum(old["max_ratio"]), res.floor)
        r_new = unnum(new["max_ratio"])
        if r_new > res.factor * r_old and r_new > res.floor:
            for ep in eps:
                out.append(Finding("error-growth", key, f"worst err/tol {old['max_ratio']} -> "
                                   f"{new['max_ratio']} (> {res.factor:g}x)",
                                   Severity.REGRESSION, ep))
        elif r_new * res.factor < r_old and unnum(old["max_ratio"]) > res.floor:
            out.append(Finding("error-shrink", key, f"worst err/tol {old['max_ratio']} -> "
                               f"{new['max_ratio']}", Severity.IMPROVEMENT, eps[0]))
        else:
            res.unchanged += 1
    return out


# ---- interpreter gaps -------------------------------------------------------------------------

def _gap_text(gaps: list[dict]) -> str:
    return "; ".join(f"{g['path']}:{g['line']} `{g['code']}`" for g in gaps[:3])


def _gaps(base: dict, cand: dict) -> tuple[list[Finding], set[str]]:
    """Entry points whose candidate kernels hold an interpreter gap (when run interpreted)."""
    if cand["settings"].get("execution") != "interpreter":
        return [], set()
    old, new = base.get("interpreter_gaps", {}), cand.get("interpreter_gaps", {})
    out = []
    for ep, gaps in sorted(new.items()):
        fresh = ep not in old
        out.append(Finding(
            "interpreter-gap", f"entry point {ep}",
            f"its kernels use constructs Triton's interpreter mis-executes ({_gap_text(gaps)})"
            f"; its interpreted results are not AITER's: run `gate compare --device cuda`"
            + ("" if fresh else " (the baseline had this gap too)"),
            Severity.HARNESS if fresh else Severity.INFO, ep))
    return out, set(new)


def _cross_gaps(cand: dict, cross: dict | None, diff) -> tuple[list[Finding], set]:
    """Cases whose verdict, and observed contract fields whose value, differ between this run
    and the same baseline run in the other execution mode: interpreter gaps observed (the
    compiled run is authoritative).  Returns the findings and the case indices, keys and
    ``observed backend:entry_point.field`` names they excuse."""
    if not cross:
        return [], set()
    modes = (cand["settings"].get("execution"), cross["settings"].get("execution"))
    if "interpreter" not in modes or modes[0] == modes[1]:
        raise ValueError(f"--cross-check needs one interpreted and one compiled run, got "
                         f"{modes[0]} and {modes[1]}")
    other = {r["index"]: r for r in cross["cases"]}
    out, excused = [], set()
    for rec in cand["cases"]:
        o = other.get(rec["index"])
        if o is None or rec["status"] != "ok" or o["status"] != "ok" or _ok(rec) == _ok(o):
            continue
        interp, comp = (rec, o) if modes[0] == "interpreter" else (o, rec)
        excused.update((rec["index"], rec["key"]))
        out.append(Finding("interpreter-gap", f"case {rec['index']} [{rec['key']}]",
                           f"interpreted {interp['verdict']}, compiled {comp['verdict']} "
                           f"({'; '.join(interp['failures'])[:200]})", Severity.INFO,
                           rec["entry_point"], rec["index"]))
    for ch in diff(cand.get("observed", {}), cross.get("observed", {})):
        name = f"observed {ch.where}.{ch.field}"
        excused.add(name)
        interp, comp = (ch.old, ch.new) if modes[0] == "interpreter" else (ch.new, ch.old)
        out.append(Finding("interpreter-gap", name, f"interpreted {_short(interp)}, compiled "
                           f"{_short(comp)}", Severity.INFO, _entry_of(ch.where)))
    return out, excused


def _excuse(findings: list[Finding], gapped: set[str], gap_cases: set) -> list[Finding]:
    """Results that an interpreter gap explains are not AITER regressions (``gap_cases``
    holds the case indices and keys the cross-check saw differ)."""
    out = []
    for f in findings:
        hit = (f.entry_point in gapped) or (f.case_index is not None and
                                             f.case_index in gap_cases) or \
            (f.kind in ("error-growth", "error-shrink", "contract") and f.where in gap_cases)
        if hit and f.kind in ("new-failure", "error-growth", "contract", "fixed",
                              "error-shrink"):
            out.append(Finding(f.kind, f.where, f"{f.detail} [excused: interpreter gap]",
                               Severity.INFO, f.entry_point, f.case_index))
        else:
            out.append(f)
    return out


def compare(base: dict, cand: dict, *, factor: float = DEFAULT_FACTOR,
            floor: float = DEFAULT_FLOOR, cross: dict | None = None) -> Result:
    from tealite_verify.gate.observe import diff_observations
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    if base.get("schema") != cand.get("schema"):
        raise ValueError(f"baseline schema {base.get('schema')!r} != candidate "
                         f"{cand.get('schema')!r}")
    res = Result(factor=factor, floor=floor)
    load = _load_failure(cand)
    if load and not cand["cases"]:
        res.findings = load
        return res
    gap_findings, gapped = _gaps(base, cand)
    cross_findings, gap_cases = _cross_gaps(cand, cross, diff_observations)
    if cand["settings"].get("execution") != "interpreter":
        gap_cases = set()  # a compiled run is authoritative: the cross-check only notes gaps
    judged = (_entry_points(base, cand) + _declared(base, cand) +
              _observed(base, cand, diff_observations) + _cases(base, cand) +
              _errors(base, cand, res))
    res.findings = load + gap_findings + cross_findings + _excuse(judged, gapped, gap_cases)
    return res
