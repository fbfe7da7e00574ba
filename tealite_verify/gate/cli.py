"""``python -m tealite_verify gate capture|compare`` (see :mod:`tealite_verify.gate`).

Exit status of ``compare``: 0 the candidate passes, 1 it regressed, 2 bad usage / unreadable
baseline.  ``--aiter PATH`` (a wheel, an unpacked wheel / source tree, or an ``aiter`` package
directory) selects the AITER to load; it must be given before anything loads AITER, so the
command sets ``$TEALITE_AITER_PATH`` first thing.
"""
from __future__ import annotations

import json
import os
import sys

ENV_PATH = "TEALITE_AITER_PATH"


def add_parser(sub) -> None:
    g = sub.add_parser("gate", help="AITER version gate: capture a baseline, compare a "
                                    "candidate against it")
    gsub = g.add_subparsers(dest="gate_cmd", required=True)
    c = gsub.add_parser("capture", help="run the seeded case set, write a baseline")
    c.add_argument("--out", required=True, help="baseline JSON to write")
    c.add_argument("--aiter", help="AITER wheel / source tree / package dir to load")
    c.add_argument("--op", action="append", help="restrict to these ops (repeatable)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--per-key", type=int, default=2,
                   help="cases kept per op x backend x recipe x dtype x shape class")
    c.add_argument("--per-op", type=int, default=12, help="cases kept per op and backend")
    c.add_argument("--draws", type=int, default=300, help="strategy draws per op")
    c.add_argument("--peer", action="append", help="peer backends (default: torch)")
    t = gsub.add_parser("contracts", help="every AITER entry point's declared contract and "
                                          "where it differs from TE (Markdown)")
    t.add_argument("--observe", action="store_true",
                   help="also probe the loaded AITER for the contracts it follows")
    t.add_argument("--device", default="cpu")
    m = gsub.add_parser("compare", help="re-run a baseline's cases against a candidate AITER")
    m.add_argument("--baseline", required=True)
    m.add_argument("--aiter", help="candidate AITER wheel / source tree / package dir "
                                   "(default: the installed one)")
    m.add_argument("--device", help="default: the baseline's")
    m.add_argument("--max-error-growth", type=float, default=None,
                   help="fail when a key's worst err/tol grows beyond this factor (2)")
    m.add_argument("--markdown", help="write the Markdown report here (also printed)")
    m.add_argument("--json", help="write the JSON report here")
    m.add_argument("--candidate-out", help="also write the candidate run as a baseline file")


def _progress(rec: dict) -> None:
    mark = {"pass": ".", "fail": "F", "error": "E"}.get(rec["verdict"], "s")
    print(mark, end="", file=sys.stderr, flush=True)


def _write(path: str, doc) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        if isinstance(doc, str):
            f.write(doc)
        else:
            json.dump(doc, f, indent=1, sort_keys=False)
            f.write("\n")
    os.replace(tmp, path)


def select_aiter(args) -> int:
    """Point the loader at ``--aiter`` before anything loads AITER; 2 on a bad path."""
    aiter = getattr(args, "aiter", None)
    if aiter:
        if not os.path.exists(aiter):
            print(f"--aiter: no such file or directory: {aiter}", file=sys.stderr)
            return 2
        os.environ[ENV_PATH] = os.path.abspath(aiter)
    return 0


def run(args) -> int:
    if select_aiter(args):
        return 2
    from tealite_verify.gate import capture, compare, report
    if args.gate_cmd == "contracts":
        from tealite_verify.gate import observe
        print(report.contracts_markdown(observe.observe_all(args.device) if args.observe
                                        else None))
        return 0
    if args.gate_cmd == "capture":
        doc = capture.capture(ops=args.op, device=args.device, seed=args.seed,
                              per_key=args.per_key, per_op=args.per_op, draws=args.draws,
                              peers=tuple(args.peer or ("torch",)), progress=_progress)
        print(file=sys.stderr)
        _write(args.out, doc)
        fails = sum(e["fail"] + e["error"] for e in doc["entries"].values())
        print(f"gate capture: {len(doc['cases'])} cases, {len(doc['entries'])} keys, {fails} "
              f"failing case(s) recorded as the baseline state; {report._aiter_line(doc)}; "
              f"wrote {args.out}")
        return 0
    try:
        with open(args.baseline) as f:
            base = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"--baseline: cannot read {args.baseline}: {exc}", file=sys.stderr)
        return 2
    if base.get("schema") != capture.SCHEMA:
        print(f"--baseline: schema {base.get('schema')!r} is not {capture.SCHEMA!r}",
              file=sys.stderr)
        return 2
    cand = capture.rerun(base, device=args.device, progress=_progress)
    print(file=sys.stderr)
    factor = args.max_error_growth or base["settings"].get("max_error_growth",
                                                            compare.DEFAULT_FACTOR)
    res = compare.compare(base, cand, factor=factor)
    md = report.markdown(base, cand, res)
    print(md)
    if args.markdown:
        _write(args.markdown, md)
    if args.json:
        _write(args.json, report.to_json(base, cand, res))
    if args.candidate_out:
        _write(args.candidate_out, cand)
    return 0 if res.passed else 1
