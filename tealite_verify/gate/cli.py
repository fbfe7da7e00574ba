"""``python -m tealite_verify gate capture|compare`` (see :mod:`tealite_verify.gate`).

Exit status of ``compare``: 0 the candidate passes, 1 AITER's numerics regressed (or an
entry point the project calls was removed), 2 the harness could not load or drive (part of)
the candidate, or bad input (a path that is not an AITER tree, a wheel that does not unpack,
a baseline of another schema).  A report is written in every case (``--markdown`` /
``--json``), never a bare traceback; the baseline is never written.

``--aiter PATH`` (a wheel, an unpacked wheel / source tree such as ``ci/aiter_source.sh``
exports, or an ``aiter`` package directory) selects the AITER to load; it must be given before
anything loads AITER, so the command sets ``$TEALITE_AITER_PATH`` first thing.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
import zipfile

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
    m.add_argument("--cross-check", metavar="RUN_JSON",
                   help="the same baseline run in the other execution mode (a --candidate-out "
                        "of an interpreted run beside a compiled one): cases whose verdicts "
                        "differ are interpreter gaps")


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


class GateInputError(Exception):
    """Bad input to the gate: the message names the argument and the constraint."""


def select_aiter(args) -> None:
    """Point the loader at ``--aiter`` before anything loads AITER (checked: an AITER tree or
    a wheel that unpacks to one)."""
    aiter = getattr(args, "aiter", None)
    if not aiter:
        return
    if not os.path.exists(aiter):
        raise GateInputError(f"--aiter: no such file or directory: {aiter}")
    from tealite.backends.aiter_common import loader as loader
    try:
        loader.find_source(aiter)
    except loader.AiterNotFound as exc:
        raise GateInputError(f"--aiter: {exc}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise GateInputError(f"--aiter: {aiter} is not a readable AITER wheel or tree "
                             f"({type(exc).__name__}: {exc})") from None
    os.environ[ENV_PATH] = os.path.abspath(aiter)


def read_run(path: str, arg: str) -> dict:
    """A baseline / run document, checked for this gate's schema."""
    from tealite_verify.gate.capture import SCHEMA
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise GateInputError(f"{arg}: cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise GateInputError(f"{arg}: {path} has schema {got!r}, not {SCHEMA!r} (re-capture "
                             f"it with this version: gate capture)")
    for key in ("cases", "entries", "aiter", "settings"):
        if key not in doc:
            raise GateInputError(f"{arg}: {path} lacks {key!r}: not a gate run document")
    return doc


def _outputs(args) -> list[str]:
    outs = [p for p in (getattr(args, "markdown", None), getattr(args, "json", None),
                        getattr(args, "candidate_out", None)) if p]
    base = getattr(args, "baseline", None)
    for p in outs:
        if base and os.path.abspath(p) == os.path.abspath(base):
            raise GateInputError(f"output {p} is the baseline: the gate never writes over it")
    return outs


def _fail_report(args, stage: str, message: str, detail: str = "") -> int:
    from tealite_verify.gate import report
    print(f"gate {args.gate_cmd}: {message}", file=sys.stderr)
    md = report.failure_markdown(stage, message, detail)
    base = getattr(args, "baseline", None)

    def writable(path):  # a report never lands on the baseline, even when asked to
        return path and not (base and os.path.abspath(path) == os.path.abspath(base))

    if writable(getattr(args, "markdown", None)):
        _write(args.markdown, md)
    if writable(getattr(args, "json", None)):
        _write(args.json, {"passed": False, "exit_code": 2, "stage": stage,
                           "error": message, "detail": detail[-4000:]})
    return 2


def run(args) -> int:
    try:
        _outputs(args)
        select_aiter(args)
        base = read_run(args.baseline, "--baseline") if args.gate_cmd == "compare" else None
        cross = read_run(args.cross_check, "--cross-check") \
            if getattr(args, "cross_check", None) else None
    except GateInputError as exc:
        return _fail_report(args, "input", str(exc))
    try:
        if args.gate_cmd == "contracts":
            return _contracts(args)
        if args.gate_cmd == "capture":
            return _capture(args)
        return _compare(args, base, cross)
    except Exception as exc:  # the harness's own failure: a report, exit 2, no traceback
        return _fail_report(args, args.gate_cmd, f"{type(exc).__name__}: {exc}",
                            traceback.format_exc())


def _contracts(args) -> int:
    from tealite_verify.gate import observe, report
    print(report.contracts_markdown(observe.observe_all(args.device) if args.observe
                                    else None))
    return 0


def _capture(args) -> int:
    from tealite_verify.gate import capture, report
    doc = capture.capture(ops=args.op, device=args.device, seed=args.seed,
                          per_key=args.per_key, per_op=args.per_op, draws=args.draws,
                          peers=tuple(args.peer or ("torch",)), progress=_progress)
    print(file=sys.stderr)
    if not doc["aiter"].get("found"):
        return _fail_report(args, "load", f"AITER did not load: {doc['aiter'].get('reason')}")
    _write(args.out, doc)
    fails = sum(e["fail"] + e["error"] for e in doc["entries"].values())
    print(f"gate capture: {len(doc['cases'])} cases, {len(doc['entries'])} keys, {fails} "
          f"failing case(s) recorded as the baseline state; {report._aiter_line(doc)}; "
          f"wrote {args.out}")
    return 0


def _compare(args, base: dict, cross: dict | None) -> int:
    from tealite_verify.gate import capture, compare, report
    cand = capture.rerun(base, device=args.device, progress=_progress)
    print(file=sys.stderr)
    factor = args.max_error_growth or base["settings"].get("max_error_growth",
                                                            compare.DEFAULT_FACTOR)
    res = compare.compare(base, cand, factor=factor, cross=cross)
    md = report.markdown(base, cand, res)
    print(md)
    if args.markdown:
        _write(args.markdown, md)
    if args.json:
        _write(args.json, report.to_json(base, cand, res))
    if args.candidate_out:
        _write(args.candidate_out, cand)
    return res.exit_code
