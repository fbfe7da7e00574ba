"""A fuzz campaign's statistics and findings -> :class:`ReportData`.

The campaign keeps no CaseReports (its workers send one summary line per case), so its page
has the headroom histograms (binned by the supervisor as the lines arrive), the coverage
matrix, the findings with their replay commands, versions and notes; no error-vs-K plot and
no ULP map (those need each case's worst element, which only a ``run`` keeps).
"""
from __future__ import annotations

import math

from tealite_verify.fuzz.findings import Finding
from tealite_verify.fuzz.report import Stats
from tealite_verify.report.model import Cell, ReportData, Worst, bins_above_one

NO_CASE_DETAIL = ("a fuzz campaign keeps no per-case worst element: the error-vs-K plot and "
                  "the ULP map come from `run --html`")
SKIPS_LUMPED = ("fuzz workers count unsupported and unavailable cases together (shown as "
                "unsupported); their reasons are the notes below, where the planner gave one")


def _finding_ratio(f: Finding) -> float:
    r = f.metrics.get("max_ratio") if isinstance(f.metrics, dict) else None
    try:
        return float(r) if r is not None else math.inf
    except (TypeError, ValueError):
        return math.inf


def finding_rows(findings: dict) -> list[Worst]:
    """One row per finding of the campaign, worst err/tol first, with its replay command
    (and the ``repro --case`` form after it)."""
    rows = []
    for rec in findings.values():
        f: Finding = rec["finding"]
        repro = f.repro + (f"\n{f.repro_case}" if f.repro_case else "")
        rows.append(Worst(f.op, "/".join(f.backends), f.output or "-", _finding_ratio(f),
                          f.kind, f.detail, repro))
    return sorted(rows, key=lambda w: -w.ratio if not math.isnan(w.ratio) else -math.inf)


def coverage_cells(st: Stats) -> dict:
    """(op, backend) -> Cell; failed: the cases beyond the bound (their findings, deduplicated,
    are the worst-cases table)."""
    return {key: Cell(ran=c.cases, failed=bins_above_one(c.headroom.counts), errors=c.errors,
                      unsupported=c.skipped)
            for key, c in sorted(st.per.items())}


def from_campaign(st: Stats, findings: dict, *, device: str, settings: dict, versions: dict,
                  notes: list[str], elapsed_s: float) -> ReportData:
    """The page's data for one ``python -m tealite_verify fuzz``."""
    totals = {"cases": st.cases, "elapsed s": round(elapsed_s, 1),
              "findings": len(findings),
              "new findings": sum(1 for r in findings.values() if r["new"]),
              "crashes": st.crashes, "hangs": st.hangs}
    return ReportData(title="tealite_verify fuzz", kind="fuzz", device=device,
                      settings=settings, versions=versions, totals=totals,
                      headroom={k: c.headroom for k, c in sorted(st.per.items())
                                if c.headroom.samples},
                      coverage=coverage_cells(st), worst=finding_rows(findings),
                      notes=[NO_CASE_DETAIL, SKIPS_LUMPED] + list(notes))
