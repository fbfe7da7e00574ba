"""The mutation score: each operator judged by the suite's cases, then (survivors) by fuzz.

Per operator and dtype the suite's cases (``tealite_verify.suite.suite_cases``, the cases
``pytest -m differential`` runs) go through ``run_case`` with the torch backend and the mutant
side by side (no pairwise comparisons): the mutant is **killed** on a case where its outputs
fail the reference or it raises while torch passes the same case.  A case torch itself fails
is a false alarm of the harness, counted apart and never a kill; a case the mutant reports
unsupported does not count.  Torch's outputs also tell whether the mutation changed anything:
a survivor whose outputs changed on some case while every comparison stayed within tolerance
is **undetectable by design** (its effect is inside the declared bound: the largest err/tol it
reached is reported); one whose outputs never changed was **not exercised**.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from tealite_verify import suite
from tealite_verify.mutate import plugin
from tealite_verify.mutate.base import Mutation
from tealite_verify.mutate.fuzz import FuzzResult
from tealite_verify.runner import CaseReport, run_case
from tealite_verify.specs import get_spec

KILLED_SUITE, KILLED_FUZZ, SURVIVED, NOT_RUN = "killed-suite", "killed-fuzz", "survived", \
    "not-run"
UNDETECTABLE, NOT_EXERCISED = "undetectable-by-design", "not-exercised"


@dataclass
class SuiteResult:
    dtypes: list[str]
    cases: int = 0            # cases the mutant ran (ok or error)
    unsupported: int = 0
    killed: int = 0
    changed: int = 0          # cases whose outputs differ from torch's
    # The mutant's worst err/tol, over the outputs it changed, on cases it passed.
    max_ratio_changed: float = 0.0
    torch_failed: int = 0     # harness false alarms on torch itself (excluded)
    complete: bool = True     # False: stopped by the time budget
    first_kill: dict | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Score:
    mutation: Mutation
    suite: SuiteResult | None = None
    fuzz: FuzzResult | None = None

    @property
    def verdict(self) -> str:
        if self.suite is not None and self.suite.killed:
            return KILLED_SUITE
        if self.fuzz is not None and self.fuzz.killed:
            return KILLED_FUZZ
        if self.suite is None or not self.suite.complete:
            return NOT_RUN
        return SURVIVED

    @property
    def reason(self) -> str:
        if self.verdict != SURVIVED:
            return ""
        return UNDETECTABLE if self.suite.changed else NOT_EXERCISED

    def to_dict(self) -> dict:
        m = self.mutation
        return {"operator": m.name, "op": m.op, "kind": m.kind, "description": m.description,
                "must_kill": m.must_kill, "why_not": m.why_not, "verdict": self.verdict,
                "reason": self.reason,
                "suite": self.suite.to_dict() if self.suite else None,
                "fuzz": self.fuzz.to_dict() if self.fuzz else None}


# ---- comparing outputs -----------------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point and t.element_size() in (1, 2, 4, 8):
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                       8: torch.int64}[t.element_size()])
    return t


def outputs_differ(a: dict, b: dict) -> bool:
    """True when two backends' outputs differ in any way: names, shapes, dtypes or bits
    (NaN payloads and the sign of zero included)."""
    if set(a) != set(b):
        return True
    for name, x in a.items():
        y = b[name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bits(x), _bits(y)):
                return True
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return True
    return False


def _failed(report: CaseReport, backend: str) -> bool:
    o = report.outcomes.get(backend)
    if o is None:
        return False
    if o.status == "error":
        return True
    return any(not c.metrics.passed for c in report.comparisons if c.lhs == backend)


def changed_outputs(a: dict, b: dict) -> set[str]:
    """Names of the outputs that differ (present in one only, or in shape, dtype or bits)."""
    return {n for n in set(a) | set(b)
            if n not in a or n not in b or outputs_differ({n: a[n]}, {n: b[n]})}


def _max_ratio(report: CaseReport, backend: str, outputs: set[str]) -> float:
    """The backend's worst err/tol against the reference over ``outputs``."""
    return max((c.metrics.max_ratio for c in report.comparisons
                if c.lhs == backend and c.rhs == "reference" and c.output in outputs),
               default=0.0)


def _kill_detail(report: CaseReport, dtype: str) -> dict:
    o = report.outcomes[plugin.NAME]
    if o.status == "error":
        what = f"raised: {o.reason}"
    else:
        bad = [c for c in report.comparisons if c.lhs == plugin.NAME and not c.metrics.passed]
        what = "; ".join(f"[{c.output}] {c.metrics.summary()}" for c in bad)[:400]
    return {"dtype": dtype, "case": report.case, "detail": what}


# ---- the suite ---------------------------------------------------------------------------------

_CASES: dict[tuple, list[dict]] = {}


def cases_for(op: str, dtype: str, size: str = "ci") -> list[dict]:
    """The suite's cases for the mutant (declared like torch, so shared by every operator of
    the op; cached).  Call with the mutant registered."""
    key = (op, dtype, size)
    if key not in _CASES:
        _CASES[key] = suite.suite_cases(get_spec(op), plugin.NAME, dtype, size=size)
    return _CASES[key]


def dtypes_for(op: str, wanted: list[str] | None = None) -> list[str]:
    """The spec's dtypes, or those of ``wanted`` the spec has (an op without any of them, e.g.
    a float32-only layout op, keeps its first dtype)."""
    have = list(get_spec(op).dtypes)
    if not wanted:
        return have
    picked = [d for d in have if d in wanted]
    return picked or have[:1]


def suite_score(mutation: Mutation, *, dtypes: list[str] | None = None, size: str = "ci",
                stop_at_first_kill: bool = True,
                deadline: float | None = None) -> SuiteResult:
    """Run the suite's cases on the mutant (and torch, side by side)."""
    spec = get_spec(mutation.op)
    res = SuiteResult(dtypes=dtypes_for(mutation.op, dtypes))
    t0 = time.monotonic()
    with plugin.registered(mutation):
        for dtype in res.dtypes:
            for case in cases_for(mutation.op, dtype, size):
                if deadline is not None and time.monotonic() > deadline:
                    res.complete = False
                    break
                report = run_case(spec, case, backends=["torch", plugin.NAME], pairwise=False)
                _account(res, report, dtype)
                if res.killed and stop_at_first_kill:
                    break
            if (res.killed and stop_at_first_kill) or not res.complete:
                break
    res.seconds = time.monotonic() - t0
    return res


def _account(res: SuiteResult, report: CaseReport, dtype: str) -> None:
    mutant = report.outcomes[plugin.NAME]
    if mutant.status in ("unsupported", "unavailable"):
        res.unsupported += 1
        return
    res.cases += 1
    if report.outcomes["torch"].status != "ok" or _failed(report, "torch"):
        res.torch_failed += 1
        return
    changed = {"(raised)"} if mutant.status != "ok" else \
        changed_outputs(report.outcomes["torch"].outputs, mutant.outputs)
    res.changed += int(bool(changed))
    if _failed(report, plugin.NAME):
        res.killed += 1
        if res.first_kill is None:
            res.first_kill = _kill_detail(report, dtype)
    elif changed:
        # Only the outputs the mutation touched: the others' ratios are torch's own.
        res.max_ratio_changed = max(res.max_ratio_changed,
                                    _max_ratio(report, plugin.NAME, changed))


# ---- the whole score ----------------------------------------------------------------------------

@dataclass
class Plan:
    mutations: list[Mutation]
    dtypes: list[str] | None = None
    minutes: float = 10.0
    fuzz_seconds: float = 20.0
    fuzz: str = "survivors"   # "survivors" | "all" | "none"
    size: str = "ci"
    progress: Callable[[str], None] | None = None
    extra: dict = field(default_factory=dict)


FUZZ_STARTUP_S = 15.0  # a fuzz subprocess's imports and worker start, on this 2-core CPU


def score(plan: Plan) -> list[Score]:
    """Suite for every operator, then fuzz for survivors (or all), within ``plan.minutes``."""
    from tealite_verify.mutate import fuzz as mutate_fuzz
    deadline = time.monotonic() + 60.0 * plan.minutes
    say = plan.progress or (lambda msg: None)
    scores = []
    for m in plan.mutations:
        s = Score(m, suite_score(m, dtypes=plan.dtypes, size=plan.size,
                                 stop_at_first_kill=plan.fuzz != "all", deadline=deadline))
        say(f"{m.name}: {s.verdict}{' (' + s.reason + ')' if s.reason else ''}")
        scores.append(s)
    targets = [s for s in scores if plan.fuzz == "all" or
               (plan.fuzz == "survivors" and s.verdict != KILLED_SUITE)]
    for i, s in enumerate(targets):
        left = deadline - time.monotonic()
        share = min(plan.fuzz_seconds, left / (len(targets) - i) - FUZZ_STARTUP_S)
        if share < 1.0:
            s.fuzz = FuzzResult(seconds=0.0, note="not fuzzed: the --minutes budget is spent")
            continue
        s.fuzz = mutate_fuzz.fuzz_mutant(s.mutation, share)
        say(f"{s.mutation.name}: fuzz {share:.0f} s -> "
            f"{'killed in %.0f s' % s.fuzz.time_to_finding_s if s.fuzz.killed else 'no kill'}"
            + (f" ({s.fuzz.note})" if s.fuzz.note else ""))
    return scores


def must_kill_survivors(scores: list[Score]) -> list[Score]:
    return [s for s in scores if s.mutation.must_kill and s.verdict not in
            (KILLED_SUITE, KILLED_FUZZ)]


def dumps(scores: list[Score]) -> str:
    return json.dumps([s.to_dict() for s in scores], indent=1, default=str)
