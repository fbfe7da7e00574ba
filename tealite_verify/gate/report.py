"""The gate's Markdown (for a pull-request comment) and JSON reports."""
from __future__ import annotations

from dataclasses import asdict

from tealite.backends.aiter_common import contracts as aiter_contracts
from tealite_verify.gate.compare import Result


def _aiter_line(doc: dict) -> str:
    a = doc["aiter"]
    if not a.get("found"):
        return f"AITER not found ({a.get('reason')})"
    return (f"amd-aiter {a.get('version')} from {a.get('root')} ({a.get('found_via')}), "
            f"arch {a.get('arch')}")


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


_EXIT_TEXT = {0: "PASS", 1: "FAIL: AITER's numerics changed",
              2: "CANNOT VERIFY: the harness could not load or drive part of the candidate"}


def _findings_table(findings) -> list[str]:
    return _table(["kind", "where", "detail"],
                  [[f.kind, f.where, f.detail[:400]] for f in findings]) + [""]


def _entry_table(verdicts) -> list[str]:
    rows = []
    for v in verdicts:
        where = v.location or "-"
        if v.old_location and v.location and v.old_location != v.location:
            where = f"{v.old_location} -> {v.location}"
        rows.append([v.entry_point, v.status.value, v.cases, v.probed, where,
                     v.summary or "-"])
    return _table(["entry point", "verdict", "cases", "probed fields", "location", "why"],
                  rows) + [""]


def _exercised_table(base: dict, cand: dict) -> list[str]:
    from tealite_verify.gate.caseset import exercised, quantizing_entry_points
    from tealite_verify.gate.observe import exercised_fields
    by_cases = exercised(base["cases"], quantizing_entry_points(base))
    observed = {k.split(":", 1)[-1]: v for k, v in cand.get("observed", {}).items()}
    names = sorted(set(by_cases) | set(observed))
    rows = []
    for ep in names:
        c = by_cases.get(ep, {"cases": 0, "edges": [], "fields": []})
        probe = sorted(exercised_fields(observed[ep])) if ep in observed else []
        rows.append([ep, c["cases"], ", ".join(c["edges"]) or "-",
                     ", ".join(c["fields"]) or "-", ", ".join(probe) or "-"])
    return _table(["entry point", "cases", "edge classes in its cases",
                   "contract fields its cases exercise", "fields its probes exercise"],
                  rows) + [""]


def markdown(base: dict, cand: dict, res: Result) -> str:
    from tealite_verify.gate.verdicts import counts, entry_verdicts
    verdicts = entry_verdicts(base, cand, res)
    tally = ", ".join(f"{n} {k}" for k, n in sorted(counts(verdicts).items()))
    lines = [f"## AITER gate: {_EXIT_TEXT[res.exit_code]} (exit {res.exit_code})", "",
             f"- baseline: {_aiter_line(base)} (captured {base.get('created')}, "
             f"{base['settings'].get('execution', '?')})",
             f"- candidate: {_aiter_line(cand)} ({cand['settings'].get('execution', '?')})",
             f"- cases: {len(cand['cases'])} of {len(base['cases'])} on "
             f"{cand['settings']['device']}; error growth limit {res.factor:g}x (ratios below "
             f"{res.floor:g} count as {res.floor:g})",
             f"- entry points: {tally}",
             f"- {len(res.regressions)} regression(s), {len(res.harness_problems)} harness "
             f"problem(s), {len(res.improvements)} improvement(s), {res.unchanged} key(s) "
             f"unchanged", ""]
    lines += ["### Per entry point", ""] + _entry_table(verdicts)
    for title, found in (("Regressions (AITER changed: exit 1)", res.regressions),
                         ("Harness problems (the adapter / loader / platform: exit 2)",
                          res.harness_problems),
                         ("Notes (moves, signatures, interpreter gaps, excused results)",
                          res.notes),
                         ("Improvements", res.improvements)):
        if found:
            lines += [f"### {title}", ""] + _findings_table(found)
    lines += ["### What the cases and probes exercise, per entry point", ""]
    lines += _exercised_table(base, cand)
    lines += ["### Per key (candidate)", ""]
    rows = []
    for key, e in cand["entries"].items():
        old = base["entries"].get(key, {})
        rows.append([key, ", ".join(e["entry_points"]) or "-", f"{e['pass']}/{e['ran']}",
                     e["fail"] + e["error"], e["unsupported"], old.get("max_ratio", "-"),
                     e["max_ratio"]])
    lines += _table(["op / backend / recipe / dtype / shape", "entry points", "pass/ran",
                     "fail", "unsupported", "err/tol before", "err/tol now"], rows)
    return "\n".join(lines) + "\n"


def failure_markdown(stage: str, message: str, detail: str = "") -> str:
    """The report when the gate itself could not run (exit 2): what, where, why."""
    lines = ["## AITER gate: CANNOT VERIFY: the harness could not run (exit 2)", "",
             f"- stage: {stage}", f"- reason: {message}", ""]
    if detail:
        lines += ["<details><summary>detail</summary>", "", "```", detail[-4000:], "```",
                  "", "</details>", ""]
    return "\n".join(lines)


def to_json(base: dict, cand: dict, res: Result) -> dict:
    from tealite_verify.gate.verdicts import entry_verdicts

    def finding(f):
        d = asdict(f)
        d["severity"] = f.severity.value
        return d

    return {"passed": res.passed, "exit_code": res.exit_code, "factor": res.factor,
            "floor": res.floor,
            "entry_points": [{"entry_point": v.entry_point, "verdict": v.status.value,
                              "location": v.location, "old_location": v.old_location,
                              "cases": v.cases, "why": v.summary}
                             for v in entry_verdicts(base, cand, res)],
            "regressions": [finding(f) for f in res.regressions],
            "harness_problems": [finding(f) for f in res.harness_problems],
            "notes": [finding(f) for f in res.notes],
            "improvements": [finding(f) for f in res.improvements],
            "unchanged_keys": res.unchanged,
            "baseline": {"aiter": base["aiter"], "created": base.get("created"),
                         "versions": base.get("versions"), "settings": base.get("settings")},
            "candidate": cand}


def contracts_markdown(observed: dict | None = None) -> str:
    """Declared contracts of every AITER entry point, the differences from TE, and (when
    given) what probing observed."""
    lines = ["### AITER entry points and their declared contracts", ""]
    rows = [[c.backend, c.entry_point, c.op, c.fp8 or "-", c.scale_rule or "-",
             c.element_rounding or "-", c.saturation or "-", "; ".join(c.layouts) or "-"]
            for c in aiter_contracts.contracts()]
    lines += _table(["backend", "entry point", "op", "fp8", "scale rule", "elements",
                     "saturation", "layouts"], rows)
    lines += ["", "### Contract differences from TransformerEngine", ""]
    diffs = aiter_contracts.differences_from_te()
    lines += _table(["backend", "entry point", "op", "field", "AITER", "TE", "notes"],
                    [[d["backend"], d["entry_point"], d["op"], d["field"], d["aiter"], d["te"],
                      d["notes"]] for d in diffs]) if diffs else ["(none declared)"]
    if observed is not None:
        from tealite_verify.gate.observe import exercised_fields
        lines += ["", "### Observed by probing the loaded AITER", ""]
        lines += _table(["entry point", "probe", "fields probed", "unprobed", "error"],
                        [[k, v.get("probe", "-"), ", ".join(sorted(exercised_fields(v))) or "-",
                          ", ".join(v.get("unprobed", {})) or "-", v.get("error", "")]
                         for k, v in observed.items()])
        rows = []
        for k, v in observed.items():
            for name, value in v.get("fields", {}).items():
                shown = ", ".join(value) if isinstance(value, list) else value
                rows.append([k, name, shown])
            rows += [[k, name, f"(unprobed: {why})"] for name, why in v.get("unprobed", {}).items()]
        lines += ["", "#### Observed fields (each from its own probe blocks)", ""]
        lines += _table(["entry point", "field", "observed"], rows) if rows else ["(none)"]
    return "\n".join(lines) + "\n"
