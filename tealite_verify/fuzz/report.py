"""Campaign statistics and their presentations: the progress line (stderr, every ~2 s), the
final op x backend table, the JSON report and the Markdown summary for a PR comment.

Time split per case (seconds, summed over cases): "backend:<name>" and "reference" come from
``CaseReport.timings``; "inputs" and "compare" are the harness's own work inside ``run_case``;
"hypothesis" is the time between cases (drawing, targeting, shrinking, event I/O).  Harness
overhead = inputs + compare + hypothesis + whatever ``run_case`` did outside the timed stages.
"""
from __future__ import annotations

import collections
import math
import sys
import time
from dataclasses import dataclass, field

from tealite_verify.report.model import Headroom


@dataclass
class OpBackend:
    cases: int = 0          # cases this backend ran (status ok)
    skipped: int = 0        # unsupported / unavailable
    errors: int = 0
    max_ratio: float = 0.0
    findings: int = 0
    # Opt-in probabilistic check (tiers/probabilistic.py): cases it judged, suspicious ones, the
    # worst prob err/bound and FlashAttention-style ratio, and prob err/bound per bucket.
    prob_cases: int = 0
    suspicious: int = 0
    max_prob_ratio: float = 0.0
    max_fa_ratio: float = 0.0
    prob_hist: collections.Counter = field(default_factory=collections.Counter)
    # err/tol of every case it ran, binned (the HTML report's headroom histogram)
    headroom: Headroom = field(default_factory=Headroom)


# Upper edges of the prob err/bound histogram buckets (a bucket is "<= edge").
PROB_BUCKETS = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 2.0, math.inf)
SUSPICIOUS_KEPT = 100  # suspicious cases kept with their repro in the report


def prob_bucket(r: float) -> str:
    edge = next(e for e in PROB_BUCKETS if r <= e)
    return f"<={edge:g}" if math.isfinite(edge) else f">{PROB_BUCKETS[-2]:g}"


@dataclass
class Stats:
    cases: int = 0
    verdicts: collections.Counter = field(default_factory=collections.Counter)
    per: dict = field(default_factory=dict)            # (op, backend) -> OpBackend
    per_op_cases: collections.Counter = field(default_factory=collections.Counter)
    time_split: collections.Counter = field(default_factory=collections.Counter)
    findings: dict = field(default_factory=dict)       # signature -> {finding, path, new, hits}
    crashes: int = 0
    hangs: int = 0
    restarts: int = 0
    suspicious: list = field(default_factory=list)     # the first SUSPICIOUS_KEPT, with repro
    suspicious_cases: int = 0
    false_alarm: float | None = None  # the probabilistic check's per-case probability

    def _cell(self, op: str, backend: str) -> OpBackend:
        return self.per.setdefault((op, backend), OpBackend())

    def add_case(self, ev: dict) -> None:
        op = ev.get("op", "?")
        self.cases += 1
        self.per_op_cases[op] += 1
        self.verdicts[ev.get("verdict", "?")] += 1
        for name, st in (ev.get("backends") or {}).items():
            cell = self._cell(op, name)
            status = st.get("status")
            if status == "ok":
                cell.cases += 1
                cell.max_ratio = max(cell.max_ratio, float(st.get("ratio") or 0.0))
                cell.headroom.add(float(st.get("ratio") or 0.0))
                if st.get("prob_ratio") is not None:
                    self._add_probabilistic(cell, st)
            elif status == "error":
                cell.errors += 1
            else:
                cell.skipped += 1
        if ev.get("probabilistic") is not None:
            self.false_alarm = ev["probabilistic"]
        if ev.get("suspicious"):
            self.suspicious_cases += 1
            for s in ev["suspicious"]:
                if len(self.suspicious) < SUSPICIOUS_KEPT:
                    self.suspicious.append(dict(s, op=op, case=ev.get("case")))
        timings = ev.get("timings") or {}
        total = float(ev.get("t_total") or 0.0)
        timed = 0.0
        for k, v in timings.items():
            key = "backend" if k.startswith("backend:") else k
            self.time_split[key] += float(v)
            timed += float(v)
        self.time_split["run_case_untimed"] += max(0.0, total - timed)
        self.time_split["hypothesis"] += float(ev.get("t_gen") or 0.0)
        self.time_split["total"] += total + float(ev.get("t_gen") or 0.0)

    @staticmethod
    def _add_probabilistic(cell: OpBackend, st: dict) -> None:
        r = float(st["prob_ratio"])
        cell.prob_cases += 1
        cell.suspicious += bool(st.get("suspicious"))
        cell.max_prob_ratio = max(cell.max_prob_ratio, r)
        if st.get("fa_ratio") is not None:
            cell.max_fa_ratio = max(cell.max_fa_ratio, float(st["fa_ratio"]))
        cell.prob_hist[prob_bucket(r)] += 1

    @property
    def probabilistic(self) -> bool:
        """Whether any case was judged by the opt-in probabilistic check."""
        return any(c.prob_cases for c in self.per.values())

    def bump_findings(self, op: str, backends) -> None:
        for b in backends:
            self._cell(op, b).findings += 1

    def overhead(self) -> dict:
        """Mean seconds per case of each part and the harness's share."""
        n = max(1, self.cases)
        split = {k: v / n for k, v in self.time_split.items()}
        total = split.get("total", 0.0)
        harness = sum(split.get(k, 0.0) for k in ("inputs", "compare", "hypothesis",
                                                   "run_case_untimed"))
        return {"per_case_s": split, "harness_s": harness,
                "harness_fraction": harness / total if total else None,
                "backend_s": split.get("backend", 0.0),
                "reference_s": split.get("reference", 0.0)}


def _clock(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


def progress(st: Stats, elapsed: float, left: float, workers: int, final=False) -> None:
    rate = st.cases / elapsed if elapsed > 0 else 0.0
    new = sum(1 for f in st.findings.values() if f["new"])
    line = (f"[fuzz] {_clock(elapsed)} elapsed, {_clock(max(0.0, left))} left | "
            f"{st.cases} cases, {rate:.1f}/s | {len(st.findings)} findings ({new} new) | "
            + (f"{st.suspicious_cases} suspicious | " if st.probabilistic else "")
            + f"crashes {st.crashes}, hangs {st.hangs} | workers {workers}")
    tty = sys.stderr.isatty()
    end = "\n" if final or not tty else ""
    print(("\r" if tty else "") + line, end=end, file=sys.stderr, flush=True)


def _ratio(r: float) -> str:
    return "inf" if not math.isfinite(r) or r >= 1e12 else f"{r:.3g}"


def table_rows(st: Stats) -> list[list[str]]:
    rows = []
    prob = st.probabilistic
    for (op, b), c in sorted(st.per.items()):
        row = [op, b, str(c.cases), str(c.skipped), str(c.errors), _ratio(c.max_ratio),
               str(c.findings)]
        if prob:  # "-": the check does not apply to this op (only GEMM reductions have it)
            row += ([str(c.suspicious), _ratio(c.max_prob_ratio), _ratio(c.max_fa_ratio)]
                    if c.prob_cases else ["-", "-", "-"])
        rows.append(row)
    return rows


TABLE_HEADER = ["op", "backend", "cases", "skipped", "errors", "max err/tol", "findings"]
PROB_HEADER = ["suspicious", "max prob err/bound", "max err/err(torch)"]


def table_header(st: Stats) -> list[str]:
    return TABLE_HEADER + (PROB_HEADER if st.probabilistic else [])


def summary_table(st: Stats) -> str:
    rows = table_rows(st)
    if not rows:
        return "no cases ran"
    header = table_header(st)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def json_report(config: dict, versions: dict, st: Stats, elapsed: float, targets, notes,
                interrupted: bool) -> dict:
    findings = []
    for sig, rec in st.findings.items():
        f = rec["finding"]
        findings.append({"signature": sig, "id": f.id, "kind": f.kind, "op": f.op,
                         "backends": f.backends, "output": f.output, "dtype": f.dtype,
                         "recipe": f.recipe, "shape": f.shape, "detail": f.detail,
                         "metrics": f.metrics, "path": rec["path"], "new": rec["new"],
                         "hits_this_campaign": rec["hits"], "count": f.count,
                         "repro": f.repro, "repro_case": f.repro_case})
    return {
        "tool": "python -m tealite_verify fuzz",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config, "versions": versions, "targets": targets, "notes": notes,
        "interrupted": interrupted,
        "totals": {"elapsed_s": elapsed, "cases": st.cases,
                   "cases_per_s": st.cases / elapsed if elapsed > 0 else 0.0,
                   "verdicts": dict(st.verdicts), "per_op_cases": dict(st.per_op_cases),
                   "findings": len(st.findings),
                   "new_findings": sum(1 for r in st.findings.values() if r["new"]),
                   "crashes": st.crashes, "hangs": st.hangs, "worker_restarts": st.restarts},
        "time_split": st.overhead(),
        "table": [dict(zip(table_header(st), r)) for r in table_rows(st)],
        "findings": findings,
        "probabilistic": probabilistic_report(st),
    }


def probabilistic_report(st: Stats) -> dict | None:
    """The opt-in probabilistic check's part of the JSON report; None when it was off."""
    if not st.probabilistic:
        return None
    return {
        "false_alarm_probability_per_case": st.false_alarm,
        "suspicious_cases": st.suspicious_cases,
        "per_backend": [{"op": op, "backend": b, "cases": c.prob_cases,
                         "suspicious": c.suspicious, "max_prob_ratio": c.max_prob_ratio,
                         "max_fa_ratio": c.max_fa_ratio,
                         "prob_ratio_histogram": {k: c.prob_hist[k] for k in
                                                  map(prob_bucket, PROB_BUCKETS)
                                                  if c.prob_hist[k]}}
                        for (op, b), c in sorted(st.per.items()) if c.prob_cases],
        "suspicious": st.suspicious,
        "note": "fa ratio = max|backend - ref| / max|same-precision torch - ref|: 1 by "
                "construction for the torch backend (the same computation)",
    }


def markdown(doc: dict) -> str:
    t = doc["totals"]
    cfg = doc["config"]
    v = doc.get("versions") or {}
    ops = ", ".join(cfg.get("ops") or ["all"])
    status = "interrupted" if doc["interrupted"] else \
        ("**findings**" if t["findings"] else "no findings")
    out = [f"### tealite fuzz: {status}", "",
           f"`{ops}` on {cfg.get('device')} for {t['elapsed_s']:.0f} s: {t['cases']} cases "
           f"({t['cases_per_s']:.1f}/s), {t['findings']} findings ({t['new_findings']} new), "
           f"{t['crashes']} crashes, {t['hangs']} hangs.", ""]
    split = doc["time_split"]
    if t["cases"]:
        frac = split.get("harness_fraction")
        out += [f"Per case: backend {1e3 * split['backend_s']:.2f} ms, reference "
                f"{1e3 * split['reference_s']:.2f} ms, harness {1e3 * split['harness_s']:.2f} ms"
                + (f" ({100 * frac:.0f} % of the case)" if frac is not None else "") + ".", ""]
    header = list(doc["table"][0]) if doc["table"] else TABLE_HEADER
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(r[h]) for h in header) + " |" for r in doc["table"]]
    out += _markdown_probabilistic(doc.get("probabilistic"))
    if doc["findings"]:
        out += ["", "| kind | op | backends | case | detail | repro |", "|---|---|---|---|---|---|"]
        for f in doc["findings"]:
            case = " ".join(x for x in (f["dtype"], f["shape"], f["recipe"]) if x)
            detail = f["detail"].replace("|", "\\|")[:200]
            out.append(f"| {f['kind']}{' (new)' if f['new'] else ''} | {f['op']} | "
                       f"{'/'.join(f['backends'])} | {case} | {detail} | `{f['repro']}` |")
    out += ["", f"<sub>torch {v.get('torch')}, triton {v.get('triton')}, "
                f"python {v.get('python')}, gpu {v.get('gpu', 'none')}, seed {cfg.get('seed')}"
                "</sub>", ""]
    return "\n".join(out)


def _markdown_probabilistic(prob: dict | None) -> list[str]:
    if not prob:
        return []
    p = prob.get("false_alarm_probability_per_case")
    out = ["", f"Probabilistic check (Higham-Mary, false-alarm probability {p} per case; "
               "\"suspicious\" is not a finding): "
               f"{prob['suspicious_cases']} suspicious case(s). The err/err(torch) column is the "
               "FlashAttention-style ratio, 1 by construction for torch."]
    if prob["suspicious"]:
        out += ["", "| op | backend | output | prob err/bound | err/err(torch) | repro |",
                "|---|---|---|---|---|---|"]
        for s in prob["suspicious"][:20]:
            fa = s.get("fa_ratio")
            out.append(f"| {s['op']} | {s['backend']} | {s['output']} | "
                       f"{_ratio(s['prob_ratio'])} | {'-' if fa is None else _ratio(fa)} | "
                       f"`{s['repro']}` |")
    return out
