"""Presentations of a mutation score and of detection thresholds: text table, JSON, Markdown."""
from __future__ import annotations

import os
import platform
import time

from tealite_verify.mutate.runner import KILLED_FUZZ, KILLED_SUITE, SURVIVED, Score
from tealite_verify.mutate.thresholds import MAX_LOG2

SCORE_HEADER = ["operator", "op", "must-kill", "verdict", "evidence"]
THRESHOLD_HEADER = ["op", "output", "tier", "dtype", "cases", "every case", "median case",
                    "every case, abs(element) >= 2^-100"]


def machine() -> dict:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def verdict_text(s: Score) -> str:
    v = s.verdict
    if v == KILLED_FUZZ:
        return f"killed-fuzz in {s.fuzz.time_to_finding_s:.0f} s"
    if v == SURVIVED:
        return f"survived: {s.reason}"
    return v


def evidence(s: Score) -> str:
    r, f = s.suite, s.fuzz
    if r is None:
        return ""
    if s.verdict == KILLED_SUITE:
        k = r.first_kill
        text = f"{r.killed}/{r.cases} cases ({k['dtype']}: {k['detail'][:90]})"
        if f is not None and f.seconds:  # --fuzz all: the fuzzer's own verdict beside it
            text += (f"; fuzz: killed in {f.time_to_finding_s:.0f} s" if f.killed else
                     f"; fuzz: no kill in {f.seconds:.0f} s") + (f" ({f.note})" if f.note else "")
        return text
    parts = [f"{r.cases} suite cases, {r.changed} changed"]
    if r.changed:
        parts.append(f"max err/tol {r.max_ratio_changed:.3g} on changed outputs")
    if r.torch_failed:
        parts.append(f"{r.torch_failed} torch false alarms excluded")
    if f is not None:
        parts.append(f"fuzz {f.seconds:.0f} s, {f.cases} cases" if f.seconds else f.note)
        if f.killed:
            parts.append(f"finding: {f.finding[:90]}")
        elif f.note and f.seconds:
            parts.append(f.note)
    return "; ".join(parts)


def score_rows(scores: list[Score]) -> list[list[str]]:
    return [[s.mutation.name, s.mutation.op, "yes" if s.mutation.must_kill else "no",
             verdict_text(s), evidence(s)] for s in scores]


def totals(scores: list[Score]) -> dict:
    n = len(scores)
    by = {v: sum(1 for s in scores if s.verdict == v) for v in
          (KILLED_SUITE, KILLED_FUZZ, SURVIVED, "not-run")}
    must = [s for s in scores if s.mutation.must_kill]
    return {"operators": n, **by,
            "must_kill": len(must),
            "must_kill_killed_by_suite": sum(1 for s in must if s.verdict == KILLED_SUITE),
            "score": (by[KILLED_SUITE] + by[KILLED_FUZZ]) / n if n else 0.0}


def totals_line(scores: list[Score]) -> str:
    t = totals(scores)
    return (f"{t['operators']} operators: {t[KILLED_SUITE]} killed by the suite, "
            f"{t[KILLED_FUZZ]} by fuzz, {t[SURVIVED]} survived, {t['not-run']} not run "
            f"(score {100 * t['score']:.0f} %); must-kill {t['must_kill_killed_by_suite']}/"
            f"{t['must_kill']} killed by the suite")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def cell(c) -> str:
        return str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def score_markdown(scores: list[Score], meta: dict) -> str:
    m = meta.get("machine", {})
    head = [f"### tealite mutation score: {totals_line(scores)}", "",
            f"<sub>{m.get('cpu')} ({m.get('cores')} cores), torch {m.get('torch')}, "
            f"{m.get('date')}; fuzz {meta.get('fuzz')} ({meta.get('fuzz_seconds'):g} s each), "
            f"budget {meta.get('minutes'):g} min</sub>", ""]
    return "\n".join(head) + markdown_table(SCORE_HEADER, score_rows(scores)) + "\n"


def _k(v) -> str:
    if v is None:
        return f"> 2^{MAX_LOG2}"
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


def threshold_rows(rows) -> list[list[str]]:
    return [[r.op, r.output, r.tier, r.dtype, str(r.cases), _k(r.every) if r.cases else "-",
             _k(r.median) if r.cases else "-",
             f"{_k(r.every_normal)} ({r.cases_normal} cases)" if r.cases_normal else "-"]
            for r in rows]
