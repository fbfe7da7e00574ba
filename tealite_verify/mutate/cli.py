"""``python -m tealite_verify mutate``: the mutation score, or (``--thresholds``) each op's
detection threshold.  Exit 0; 1 when a must-kill operator survived (or was not run within the
budget); 2 on bad arguments."""
from __future__ import annotations

import json
import sys

from tealite_verify.specs import all_specs


def add_parser(sub) -> None:
    p = sub.add_parser("mutate", help="mutation score: deliberate bugs vs the suite and fuzz",
                       description="Apply each mutation operator (tealite_verify/mutate/) to "
                       "the torch backend and report whether the suite's cases kill it, else "
                       "whether fuzzing does within --fuzz-seconds, else why it survived "
                       "(undetectable by design / not exercised).  docs/mutation.md.")
    p.add_argument("--op", action="append", help="only operators of this op (repeatable)")
    p.add_argument("--operator", action="append",
                   help="only this mutation operator (repeatable; see --list)")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="time budget for the whole command (default 10)")
    p.add_argument("--fuzz-seconds", type=float, default=20.0,
                   help="fuzz budget per operator (default 20; startup not included)")
    p.add_argument("--fuzz", choices=("survivors", "all", "none"), default="survivors",
                   help="which operators to fuzz: those the suite did not kill (default), "
                        "all, or none")
    p.add_argument("--dtype", action="append",
                   help="run the suite's cases of these dtypes only (repeatable)")
    p.add_argument("--json", help="write the report as JSON here")
    p.add_argument("--markdown", help="write the report as Markdown here")
    p.add_argument("--thresholds", action="store_true",
                   help="instead of the score: each op's detection threshold (smallest "
                        "single-element error in output ulps its tier catches)")
    p.add_argument("--list", action="store_true", help="list the operators and exit")


class BadArgument(ValueError):
    pass


def select(args):
    """The operators named by --op / --operator (all by default)."""
    from tealite_verify.mutate.base import library
    lib = library()
    ops = set(all_specs())
    for op in args.op or []:
        if op not in ops:
            raise BadArgument(f"--op {op!r}: no op spec of that name; known: {sorted(ops)}")
        if not any(m.op == op for m in lib.values()):
            raise BadArgument(f"--op {op!r}: the library has no mutation operator for it")
    for name in args.operator or []:
        if name not in lib:
            raise BadArgument(f"--operator {name!r}: no mutation operator of that name; "
                              f"see 'mutate --list'")
    chosen = [m for m in lib.values()
              if (not args.op or m.op in args.op)
              and (not args.operator or m.name in args.operator)]
    if not chosen:
        raise BadArgument("--op / --operator: no operator matches both")
    return chosen


def _check(args) -> None:
    if args.minutes <= 0:
        raise BadArgument(f"--minutes must be > 0, got {args.minutes:g}")
    if args.fuzz_seconds <= 0:
        raise BadArgument(f"--fuzz-seconds must be > 0, got {args.fuzz_seconds:g}")
    known = sorted({d for s in all_specs().values() for d in s.dtypes})
    for d in args.dtype or []:
        if d not in known:
            raise BadArgument(f"--dtype {d!r}: not a dtype of any spec; known: {known}")


def threshold_ops(args) -> list[str]:
    """The ops --thresholds measures: --op's (each must have a target), else all."""
    from tealite_verify.mutate.thresholds import TARGETS
    if args.operator:
        raise BadArgument("--operator: --thresholds measures ops, not operators (use --op)")
    for op in args.op or []:
        if op not in TARGETS:
            raise BadArgument(f"--op {op!r}: no threshold target for it; known: "
                              f"{sorted(TARGETS)}")
    return list(args.op or sorted(TARGETS))


def run(args) -> int:
    try:
        _check(args)
        if args.thresholds:
            return _thresholds(args, threshold_ops(args))
        chosen = select(args)
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        return _list(chosen)
    return _score(args, chosen)


def _list(chosen) -> int:
    from tealite_verify.tables import table as _table
    rows = [[m.name, m.op, m.kind, "yes" if m.must_kill else "no",
             m.description + (f" [{m.why_not}]" if m.why_not else "")] for m in chosen]
    print(_table(rows, ["operator", "op", "kind", "must-kill", "description"]))
    return 0


def _score(args, chosen) -> int:
    from tealite_verify.tables import table as _table
    from tealite_verify.mutate import report
    from tealite_verify.mutate.runner import Plan, must_kill_survivors, score

    def say(msg: str) -> None:
        print(f"[mutate] {msg}", file=sys.stderr, flush=True)

    plan = Plan(chosen, dtypes=args.dtype, minutes=args.minutes,
                fuzz_seconds=args.fuzz_seconds, fuzz=args.fuzz, progress=say)
    scores = score(plan)
    print(_table(report.score_rows(scores), report.SCORE_HEADER))
    print(report.totals_line(scores))
    meta = {"machine": report.machine(), "minutes": args.minutes,
            "fuzz_seconds": args.fuzz_seconds, "fuzz": args.fuzz, "dtypes": args.dtype}
    if args.json:
        doc = {"tool": "python -m tealite_verify mutate", **meta,
               "totals": report.totals(scores), "operators": [s.to_dict() for s in scores]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.score_markdown(scores, meta))
    bad = must_kill_survivors(scores)
    for s in bad:
        print(f"must-kill operator not killed: {s.mutation.name} ({s.verdict}"
              f"{': ' + s.reason if s.reason else ''})", file=sys.stderr)
    return 1 if bad else 0


def _thresholds(args, ops) -> int:
    from tealite_verify.tables import table as _table
    from tealite_verify.mutate import report
    from tealite_verify.mutate.thresholds import op_thresholds
    rows = []
    for op in ops:
        rows += op_thresholds(op, dtypes=args.dtype)
        print(f"[mutate] thresholds: {op} done", file=sys.stderr, flush=True)
    print(_table(report.threshold_rows(rows), report.THRESHOLD_HEADER))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": report.machine(), "thresholds": [r.to_dict() for r in rows]},
                      f, indent=1, default=str)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown_table(report.THRESHOLD_HEADER,
                                          report.threshold_rows(rows)) + "\n")
    return 0

