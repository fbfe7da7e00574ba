#!/usr/bin/env python3
"""Verdicts must not change (issue 14's constraint): record what the harness says about a fixed
set of cases, and check later that it still says exactly that.

    python ci/verdicts.py record OUT.json.gz [--seeds 0 1 2] [--examples N]
    python ci/verdicts.py check BASELINE.json.gz [--report DIFF.json]

``record`` takes, for each seed, every op's smoke cases plus N drawn cases (the `run` command's
draw, ``cli.drawn_cases``) and the replayable case of every finding in ``findings/``, runs each
on every backend available here, and stores the cases with each outcome's status and every
comparison's metrics (timings left out).  ``check`` re-runs *the stored cases* (not a new draw:
a refactor may change the strategies) and reports every difference in status, reason,
declared numerics or metrics; exit 1 on any, 0 when identical.  The AITER gate has its own
baseline and check: ``ci/aiter_gate.sh compare``.

Record and check on the same kind of machine: interpreted Triton's fp32 ``tl.dot`` runs through
numpy's BLAS, whose summation order depends on the CPU kernel it picks, so a few fp32 GEMM
metrics (triton vs reference / torch) differ between CPUs while every verdict stays the same.
The committed baseline was recorded on the CI machine kind (2-core AMD EPYC) at f17e4e1, the
commit before issue 14's refactor began (683 cases), and re-recorded after issue 15 merged the
attention family (932 cases: the 683 unchanged, checked first, plus softmax, attention and
RoPE on every CPU backend), then extended after issue 16 merged the MoE family (1529 cases: the
932 kept as they were, plus the drawn and smoke cases of the 17 MoE ops and the composed
``moe_layer`` check from a fresh record, re-checked unchanged before committing), then after
issue 17 (1889 cases: the 1529 kept, four shuffle_weight entries' worst-element values
re-read as signed int16 after tiers/exact.py's bit-pattern fix (verdicts unchanged), plus 360
cases of the multi-tensor, bulk-scaling, dropout, transpose and layernorm_mlp specs), then
1957 (the 1889 kept, plus the smoke and drawn cases of the two specs added since without
entries: add_rmsnorm_pad 35, attention_bwd_fp8 33; seventh session).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _normalized(rep) -> dict:
    d = rep.to_dict()
    d.pop("timings", None)
    d.pop("repro", None)
    return json.loads(json.dumps(d, sort_keys=True, default=str))


def _cases(seeds, examples: int) -> list[tuple[str, dict]]:
    from tealite_verify.cli import drawn_cases
    from tealite_verify.fuzz.findings import Corpus
    from tealite_verify.specs import all_specs
    out = []
    for op, spec in all_specs().items():
        out += [(op, c) for c in spec.smoke_cases]
        for seed in seeds:
            out += [(op, c) for c in drawn_cases(spec, examples, "ci", seed)]
    out += [(f.op, f.case) for _, f in Corpus(ROOT / "findings").all()]
    return out


def _run(op: str, case: dict) -> dict:
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    return _normalized(run_case(get_spec(op), case, probabilistic=None))


def record(args) -> int:
    from tealite_verify import profiles
    profiles.load("ci")
    cases = _cases(args.seeds, args.examples)
    results = [{"op": op, "case": case, "report": _run(op, case)} for op, case in cases]
    meta = {"triton_interpret": os.environ.get("TRITON_INTERPRET"), "seeds": args.seeds,
            "examples": args.examples}
    with gzip.open(args.out, "wt") as f:
        json.dump({"meta": meta, "results": results}, f, sort_keys=True)
    print(f"recorded {len(results)} cases in {args.out}")
    return 0


def _differences(old: dict, new: dict, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{path}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new))
                for d in _differences(a, b, f"{path}[{i}]")]
    if old == new or (isinstance(old, float) and isinstance(new, float)
                      and old != old and new != new):  # NaN == NaN: the same verdict
        return []
    return [f"{path}: {old!r} -> {new!r}"]


def _known_backends_only(new: dict, old: dict) -> tuple[dict, set[str]]:
    """``new`` with the outcomes and comparisons of backends the baseline report does not
    have left out (a backend added since -- sdpa -- changes no verdict of the others);
    returns those backends too."""
    known = set(old.get("outcomes", {}))
    added = set(new.get("outcomes", {})) - known
    if not added:
        return new, added
    kept = dict(new, outcomes={b: o for b, o in new["outcomes"].items() if b in known})
    if isinstance(new.get("comparisons"), list):
        kept["comparisons"] = [c for c in new["comparisons"]
                               if not ({c.get("lhs"), c.get("rhs")} & added)]
    return kept, added


def check(args) -> int:
    from tealite_verify import profiles
    profiles.load("ci")
    with gzip.open(args.baseline, "rt") as f:
        base = json.load(f)
    if base["meta"].get("triton_interpret") != os.environ.get("TRITON_INTERPRET"):
        print("error: the baseline was recorded with TRITON_INTERPRET="
              f"{base['meta'].get('triton_interpret')}: check under the same setting",
              file=sys.stderr)
        return 2
    changed, added = [], set()
    for r in base["results"]:
        now, new_backends = _known_backends_only(_run(r["op"], r["case"]), r["report"])
        added |= new_backends
        diffs = _differences(r["report"], now)
        if diffs:
            changed.append({"op": r["op"], "case": r["case"], "differences": diffs[:20]})
    if args.report:
        Path(args.report).write_text(json.dumps(changed, indent=1))
    for c in changed[:10]:
        print(f"{c['op']} {json.dumps(c['case'], sort_keys=True)}\n  " +
              "\n  ".join(c["differences"][:5]))
    if added:
        print(f"backends not in the baseline (left out of the comparison): {sorted(added)}")
    print(f"{len(changed)} of {len(base['results'])} cases changed")
    return 1 if changed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--examples", type=int, default=10)
    c = sub.add_parser("check")
    c.add_argument("baseline")
    c.add_argument("--report", help="write every difference here (JSON)")
    args = p.parse_args(argv)
    return {"record": record, "check": check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
