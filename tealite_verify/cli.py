"""``python -m tealite_verify {list,run,repro}``.

``list``   ops x backends: available and supported, or why not.
``run``    the main job: each op's fixed smoke cases plus Hypothesis-drawn cases, on every
           available backend, against the references and each other; a summary table; exit 1
           on any failure.
``repro``  one case (JSON, as printed in any failure) with full metrics.
"""
from __future__ import annotations

import argparse
import json
import sys

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from tealite import registry
from tealite_verify import profiles
from tealite_verify.runner import CaseReport, run_case
from tealite_verify.specs import SIZES, all_specs, get_spec


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(lines)


def cmd_list(args) -> int:
    backends = registry.backends()
    names = sorted(backends)
    rows = []
    for op in all_specs():
        row = [op]
        for n in names:
            b = backends[n]
            reason = b.unavailable_reason()
            if op not in b.impls:
                row.append("-")
            elif reason:
                row.append(f"unavailable ({reason})")
            else:
                s = b.impls[op].support
                dts = ",".join(sorted(str(d).removeprefix("torch.") for d in s.dtypes)) \
                    if s.dtypes else "any"
                row.append(f"yes [{dts}; {'/'.join(sorted(s.devices))}]")
        rows.append(row)
    print(_table(rows, ["op"] + names))
    print()
    print(_recipes_table())
    for err in registry.plugin_load_errors():
        print(f"plugin failed to load: {err}", file=sys.stderr)
    return 0


def _recipes_table() -> str:
    """Every quantization recipe with its formats and rounding modes."""
    from tealite.formats import FORMATS, FP8_FORMATS, ElementRounding, ScaleRounding
    fp8 = ", ".join(FP8_FORMATS)
    scale_modes = "/".join(m.value for m in ScaleRounding)
    elem = "/".join(r.value for r in ElementRounding)
    rows = [
        ["Float8CurrentScaling", fp8, "tensor | row", "TE fp32 rule (pow2 optional)", "rne"],
        ["Float8BlockScaling", fp8, "1x128 | 128x128", "TE fp32 rule (pow2 default)", "rne"],
        ["DelayedScaling", fp8, "tensor (given scale)", "amax history max|most_recent, "
                                                        "margin", "rne"],
        ["MXFP8BlockScaling", fp8, "1x32 E8M0", scale_modes + " (rceil default)", elem],
        ["MXFP4BlockScaling", "e2m1", "1x32 E8M0", scale_modes + " (floor default)", elem],
        ["CustomRecipe", "per role", "per role", "qfactory(Role) -> recipe", "-"],
    ]
    formats = ", ".join(f"{f.name} (max {f.max:g}{', fnuz' if f.fnuz else ''})"
                        for f in FORMATS.values())
    return (_table(rows, ["recipe", "formats", "scales", "scale rule", "element rounding"])
            + f"\nformats: {formats}; FP8 casts saturate by default (Saturation.SATURATE), "
              "NONFINITE available")


def drawn_cases(spec, n: int, size: str, seed: int) -> list[dict]:
    """``n`` cases from the spec's strategy, reproducible from ``seed``."""
    cases: list[dict] = []
    if n <= 0:
        return cases

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(None, size))
    def collect(case):
        cases.append(case)

    collect()
    return cases


def _select_backends(args) -> list[str] | None:
    return args.backend or None


def cmd_run(args) -> int:
    specs = all_specs()
    ops = list(specs) if not args.op or "all" in args.op else args.op
    rows, reports = [], []
    failed = 0
    for op in ops:
        spec = get_spec(op)
        cases = list(spec.smoke_cases) + drawn_cases(spec, args.examples, args.size, args.seed)
        counts = {"pass": 0, "fail": 0, "skip": 0}
        worst = 0.0
        for case in cases:
            rep = run_case(spec, case, backends=_select_backends(args), device=args.device)
            counts[rep.verdict] += 1
            worst = max(worst, rep.max_ratio())
            reports.append(rep)
            if rep.verdict == "fail":
                failed += 1
                print(rep.describe(), file=sys.stderr)
        rows.append([op, len(cases), counts["pass"], counts["fail"], counts["skip"],
                     f"{worst:.3f}"])
    print(_table(rows, ["op", "cases", "pass", "fail", "skip", "worst err/tol"]))
    ran = sorted({o.backend for r in reports for o in r.outcomes.values() if o.status == "ok"})
    print(f"device {args.device}; backends that ran: {', '.join(ran) or 'none'}; "
          f"{failed} failing case(s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in reports], f, indent=1, default=str)
    return 1 if failed else 0


def cmd_repro(args) -> int:
    spec = get_spec(args.op)
    case = json.loads(args.case)
    rep: CaseReport = run_case(spec, case, backends=_select_backends(args), device=args.device)
    print(rep.describe())
    if args.json:
        print(json.dumps(rep.to_dict(), indent=1, default=str))
    return 1 if rep.verdict == "fail" else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tealite_verify", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="ops x backends table")
    r = sub.add_parser("run", help="differential check of every op (the main job)")
    r.add_argument("--op", action="append", help="op name (repeatable) or 'all' (default)")
    r.add_argument("--backend", action="append", help="restrict to these backends (repeatable)")
    r.add_argument("--device", default="cpu")
    r.add_argument("--examples", type=int, default=25, help="drawn cases per op")
    r.add_argument("--size", choices=SIZES, default="ci", help="shape budget")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", help="write every case report here")
    q = sub.add_parser("repro", help="re-run one case with full metrics")
    q.add_argument("--op", required=True)
    q.add_argument("--case", required=True, help="case JSON as printed by a failure")
    q.add_argument("--backend", action="append")
    q.add_argument("--device", default="cpu")
    q.add_argument("--json", action="store_true", help="also print the report as JSON")
    args = p.parse_args(argv)
    profiles.load()
    errors = registry.load_plugins()
    for err in errors:
        print(f"warning: backend plugin failed to load: {err}", file=sys.stderr)
    return {"list": cmd_list, "run": cmd_run, "repro": cmd_repro}[args.cmd](args)
