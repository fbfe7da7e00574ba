"""The gate's Markdown (for a pull-request comment) and JSON reports."""
from __future__ import annotations

from dataclasses import asdict

from tealite.backends.aiter import contracts as aiter_contracts
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


def markdown(base: dict, cand: dict, res: Result) -> str:
    verdict = "PASS" if res.passed else "FAIL"
    lines = [f"## AITER gate: {verdict}", "",
             f"- baseline: {_aiter_line(base)} (captured {base.get('created')})",
             f"- candidate: {_aiter_line(cand)}",
             f"- cases: {len(cand['cases'])} on {cand['settings']['device']}; error growth "
             f"limit {res.factor:g}x (ratios below {res.floor:g} count as {res.floor:g})",
             f"- {len(res.regressions)} regression(s), {len(res.improvements)} improvement(s), "
             f"{res.unchanged} key(s) unchanged", ""]
    if res.regressions:
        lines += ["### Regressions", ""]
        lines += _table(["kind", "where", "detail"],
                        [[f.kind, f.where, f.detail[:300]] for f in res.regressions])
        lines.append("")
    if res.improvements:
        lines += ["### Improvements", ""]
        lines += _table(["kind", "where", "detail"],
                        [[f.kind, f.where, f.detail[:300]] for f in res.improvements])
        lines.append("")
    lines += ["### Per key (candidate)", ""]
    rows = []
    for key, e in cand["entries"].items():
        old = base["entries"].get(key, {})
        rows.append([key, ", ".join(e["entry_points"]) or "-", f"{e['pass']}/{e['ran']}",
                     e["fail"] + e["error"], e["unsupported"], old.get("max_ratio", "-"),
                     e["max_ratio"]])
    lines += _table(["op / backend / recipe / dtype / shape", "entry points", "pass/ran",
                     "fail", "unsupported", "err/tol before", "err/tol now"], rows)
    diffs = cand.get("contract_differences", [])
    if diffs:
        lines += ["", "### Contract differences from TransformerEngine (declared)", ""]
        lines += _table(["backend", "entry point", "op", "field", "AITER", "TE", "notes"],
                        [[d["backend"], d["entry_point"], d["op"], d["field"], d["aiter"],
                          d["te"], d["notes"][:200]] for d in diffs])
    return "\n".join(lines) + "\n"


def to_json(base: dict, cand: dict, res: Result) -> dict:
    return {"passed": res.passed, "factor": res.factor, "floor": res.floor,
            "regressions": [asdict(f) for f in res.regressions],
            "improvements": [asdict(f) for f in res.improvements],
            "unchanged_keys": res.unchanged,
            "baseline": {"aiter": base["aiter"], "created": base.get("created"),
                         "versions": base.get("versions")},
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
        lines += ["", "### Observed by probing the loaded AITER", ""]
        lines += _table(["entry point", "probe", "conventions reproduced bit-exactly", "error"],
                        [[k, v.get("probe", "-"), ", ".join(v["matches"]) or "none",
                          v.get("error", "")] for k, v in observed.items()])
    return "\n".join(lines) + "\n"
