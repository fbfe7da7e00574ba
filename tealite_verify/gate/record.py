"""What the gate records of one case run and how cases aggregate per key.

A case record keeps what a later compare needs: the AITER backend's status (``ok``,
``unsupported``/``unavailable`` with the reason, ``error``), the entry point it ran, its
verdict against the reference and against each peer backend, and error statistics (worst
error/tolerance ratio, worst absolute error, mismatched and excused element counts).
Non-finite numbers are written as the strings ``"inf"`` / ``"nan"`` so the JSON stays
standard.
"""
from __future__ import annotations

import math

from tealite_verify.runner import CaseReport


def num(x: float):
    """A JSON-safe float: non-finite values as strings."""
    x = float(x)
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def unnum(x) -> float:
    return float(x)  # float("inf") / float("nan") parse the strings back


def case_record(index: int, op: str, backend: str, key: str, rep: CaseReport,
                switch: str | None = None) -> dict:
    """``switch``: the backend switch the case ran under (caseset.SWITCHES), kept only when
    given (records without one stay as they were)."""
    o = rep.outcomes[backend]
    rec = {"index": index, "op": op, "backend": backend, "key": key, "case": rep.case,
           "status": o.status, "reason": o.reason,
           "entry_point": o.numerics.entry_point, "verdict": "n/a", "peers": {},
           "max_ratio": 0.0, "max_abs_err": 0.0, "mismatches": 0, "excused": 0,
           "failures": []}
    if switch is not None:
        rec["switch"] = switch
    if o.status == "error":
        rec["verdict"] = "error"
    if o.status != "ok":
        return rec
    ratio = abs_err = 0.0
    mism = excused = 0
    failed = False
    for c in rep.comparisons:
        m = c.metrics
        if c.lhs != backend and c.rhs != backend:
            continue
        if c.rhs == "reference":
            ratio = max(ratio, m.max_ratio if not math.isnan(m.max_ratio) else math.inf)
            abs_err = max(abs_err, m.max_abs_err if not math.isnan(m.max_abs_err) else math.inf)
            mism += m.mismatches
            excused += m.excused
            if not m.passed:
                failed = True
                rec["failures"].append(f"{c.output}: {m.summary()}")
        else:
            peer = c.rhs if c.lhs == backend else c.lhs
            ok = rec["peers"].get(peer, "pass") == "pass" and m.passed
            rec["peers"][peer] = "pass" if ok else "fail"
    rec.update(verdict="fail" if failed else "pass", max_ratio=num(ratio),
               max_abs_err=num(abs_err), mismatches=mism, excused=excused)
    return rec


def aggregate(records: list[dict]) -> dict[str, dict]:
    """Per key: cases, ran, pass, fail, error, unsupported (+ reasons), entry points, worst
    ratio and absolute error, mismatches, peer disagreements."""
    out: dict[str, dict] = {}
    for r in records:
        a = out.setdefault(r["key"], {
            "op": r["op"], "backend": r["backend"], "cases": 0, "ran": 0, "pass": 0,
            "fail": 0, "error": 0, "unsupported": 0, "reasons": [], "entry_points": [],
            "max_ratio": 0.0, "max_abs_err": 0.0, "mismatches": 0, "peer_fail": 0})
        a["cases"] += 1
        if r["status"] == "ok":
            a["ran"] += 1
            a[r["verdict"]] += 1
            a["max_ratio"] = num(max(unnum(a["max_ratio"]), unnum(r["max_ratio"])))
            a["max_abs_err"] = num(max(unnum(a["max_abs_err"]), unnum(r["max_abs_err"])))
            a["mismatches"] += r["mismatches"]
            a["peer_fail"] += sum(v == "fail" for v in r["peers"].values())
        elif r["status"] == "error":
            a["error"] += 1
            if r["reason"] and r["reason"] not in a["reasons"]:
                a["reasons"].append(r["reason"])
        else:
            a["unsupported"] += 1
            if r["reason"] and r["reason"] not in a["reasons"]:
                a["reasons"].append(r["reason"])
        ep = r.get("entry_point")
        if ep and ep not in a["entry_points"]:
            a["entry_points"].append(ep)
            a["entry_points"].sort()
    return dict(sorted(out.items()))
