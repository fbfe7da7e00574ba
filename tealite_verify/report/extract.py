"""A ``run``'s CaseReports -> :class:`ReportData`: small pure functions, one per part of the
page.  They read the typed reports (``Outcome``, ``Comparison``, ``Metrics``); nothing is
re-run and nothing is serialized here.

A "sample" is one backend on one case: its worst comparison with the reference (the largest
``max_ratio`` over the case's outputs), as the fuzz workers report it too.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Iterable

import numpy as np

from tealite_verify.report.model import (Cell, Headroom, KPoint, ReportData, Skip, UlpPoint,
                                         Worst)
from tealite_verify.runner import CaseReport, Comparison
from tealite_verify.tiers import primitives
from tealite_verify.tiers.metrics import Tier

WORST_KEPT = 20      # rows of the worst-cases table
SKIP_STATUSES = ("unsupported", "unavailable")


def _against_reference(rep: CaseReport, backend: str) -> list[Comparison]:
    return [c for c in rep.comparisons if c.lhs == backend and c.rhs == "reference"]


def _worst_comparison(rep: CaseReport, backend: str) -> Comparison | None:
    """The backend's comparison with the largest err/tol (NaN counts as the largest)."""
    mine = _against_reference(rep, backend)
    return max(mine, key=lambda c: (math.isnan(c.metrics.max_ratio), c.metrics.max_ratio),
               default=None)


def headroom(reports: Iterable[CaseReport]) -> dict:
    """(op, backend) -> Headroom over every case the backend ran."""
    out: dict = {}
    for rep in reports:
        for name, o in rep.outcomes.items():
            worst = _worst_comparison(rep, name) if o.status == "ok" else None
            if worst is not None:
                out.setdefault((rep.op, name), Headroom()).add(worst.metrics.max_ratio)
    return dict(sorted(out.items()))


def coverage_cells(reports: Iterable[CaseReport]) -> dict:
    """(op, backend) -> Cell: ran / failed / error / unsupported / unavailable counts."""
    out: dict = {}
    for rep in reports:
        for name, o in rep.outcomes.items():
            cell = out.setdefault((rep.op, name), Cell())
            if o.status == "ok":
                cell.ran += 1
                cell.failed += any(not c.metrics.passed for c in _against_reference(rep, name))
            elif o.status == "error":
                cell.errors += 1
            elif o.status == "unsupported":
                cell.unsupported += 1
            else:
                cell.unavailable += 1
    return dict(sorted(out.items()))


def skips(reports: Iterable[CaseReport]) -> list[Skip]:
    """Every distinct (op, backend, status, reason) of a case not run, with its count."""
    seen: collections.Counter = collections.Counter()
    for rep in reports:
        for name, o in rep.outcomes.items():
            if o.status in SKIP_STATUSES:
                seen[(rep.op, name, o.status, o.reason or "(no reason given)")] += 1
    return [Skip(*key, count=n) for key, n in sorted(seen.items())]


def _worst_of(rep: CaseReport, name: str) -> Worst | None:
    o = rep.outcomes[name]
    if o.status == "error":
        return Worst(rep.op, name, "-", math.inf, "error", o.reason or "", rep.repro(name))
    c = _worst_comparison(rep, name) if o.status == "ok" else None
    if c is None:
        return None
    failed = any(not x.metrics.passed for x in _against_reference(rep, name))
    return Worst(rep.op, name, c.output, c.metrics.max_ratio, "fail" if failed else "pass",
                 c.metrics.summary(), rep.repro(name))


def _severity(w: Worst) -> tuple:
    """Sort key, worst first: failures and errors before passes, then by err/tol."""
    r = w.ratio if not math.isnan(w.ratio) else math.inf
    return (w.verdict == "pass", -r)


def worst_cases(reports: Iterable[CaseReport], kept: int = WORST_KEPT) -> list[Worst]:
    """The ``kept`` worst (case, backend) results: every failure and error first."""
    rows = [w for rep in reports for name in rep.outcomes
            if (w := _worst_of(rep, name)) is not None]
    return sorted(rows, key=_severity)[:kept]


def _worst_error(c: Comparison) -> tuple[float, float] | None:
    """(|actual - expected|, tolerance) at the comparison's worst element, when finite."""
    m = c.metrics
    if m.worst_actual is None or m.worst_expected is None or m.worst_tol is None:
        return None
    try:
        err = abs(float(m.worst_actual) - float(m.worst_expected))
    except (TypeError, ValueError):
        return None
    return (err, float(m.worst_tol)) if math.isfinite(err) and math.isfinite(m.worst_tol) \
        else None


def k_points(reports: Iterable[CaseReport]) -> list[KPoint]:
    """Every comparison judged by the GEMM tier in a case with a K: its worst element's error
    and the bound there."""
    out = []
    for rep in reports:
        k = rep.case.get("k")
        if not isinstance(k, int):
            continue
        for c in rep.comparisons:
            if c.rhs == "reference" and c.metrics.tier is Tier.GEMM:
                eb = _worst_error(c)
                if eb is not None:
                    out.append(KPoint(rep.op, c.lhs, k, *eb))
    return out


def _rows_cols(case: dict) -> tuple[int, int] | None:
    shape = case.get("shape")
    if not isinstance(shape, (list, tuple)) or not shape:
        return None
    return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1, int(shape[-1])


def _ulps(c: Comparison, dtype) -> float | None:
    """The worst element's error in ulps of ``dtype`` at the reference value."""
    eb = _worst_error(c)
    if eb is None:
        return None
    try:
        spacing = float(primitives.ulp(dtype, float(c.metrics.worst_expected)))
    except ValueError:  # not a float format the tiers know (integer codes)
        return None
    return eb[0] / spacing


def ulp_points(reports: Iterable[CaseReport]) -> list[UlpPoint]:
    """Every comparison judged by the ULP tier in a case with a shape: the worst element's
    error in output ulps, at (rows, last dim)."""
    out = []
    for rep in reports:
        rc = _rows_cols(rep.case)
        if rc is None:
            continue
        for c in rep.comparisons:
            o = rep.outcomes.get(c.lhs)
            got = o.outputs.get(c.output) if o is not None else None
            if c.rhs != "reference" or c.metrics.tier is not Tier.ULP or \
                    not hasattr(got, "dtype"):
                continue
            u = _ulps(c, got.dtype)
            if u is not None:
                out.append(UlpPoint(rep.op, c.lhs, c.output, *rc, u))
    return out


def totals(reports: list[CaseReport]) -> dict:
    verdicts = collections.Counter(r.graded_verdict for r in reports)
    return {"cases": len(reports), "pass": verdicts["pass"], "fail": verdicts["fail"],
            "skip": verdicts["skip"], "suspicious": verdicts["suspicious"]}


def from_run(reports: list[CaseReport], *, device: str, settings: dict,
             versions: dict) -> ReportData:
    """The page's data for one ``python -m tealite_verify run``."""
    data = ReportData(title="tealite_verify run", kind="run", device=device,
                      settings=settings, versions=versions, totals=totals(reports),
                      headroom=headroom(reports), coverage=coverage_cells(reports),
                      skips=skips(reports), worst=worst_cases(reports),
                      k_points=k_points(reports), ulp_points=ulp_points(reports))
    if not data.k_points:
        data.notes.append("no GEMM-tier comparison in this run: no error-vs-K plot")
    if not data.ulp_points:
        data.notes.append("no ULP-tier comparison with a finite worst element in this run: "
                          "no ULP map")
    return data
