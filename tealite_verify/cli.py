"""``python -m tealite_verify {list,run,repro,fuzz,replay}``.

``list``   ops x backends: available and supported, or why not.
``run``    the main job: each op's fixed smoke cases plus Hypothesis-drawn cases, on every
           available backend, against the references and each other; a summary table; exit 1
           on any failure.
``repro``  one case (JSON, as printed in any failure) with full metrics.
``fuzz``   a time-bounded, crash-isolated Hypothesis campaign (tealite_verify/fuzz/); findings
           are saved to a corpus directory; exit 1 on findings, 130 when interrupted.
``replay`` re-run one stored finding with full metrics; exit 1 while it still reproduces.
``gate``   the AITER version gate: ``gate capture --out FILE`` writes a baseline for the
           installed AITER, ``gate compare --baseline FILE [--aiter PATH]`` fails a candidate
           that regresses it (tealite_verify/gate/).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from tealite import registry
from tealite_verify import profiles
from tealite_verify.gate import cli as gate_cli
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
    print()
    print(_probed_table())
    for err in registry.plugin_load_errors():
        print(f"plugin failed to load: {err}", file=sys.stderr)
    return 0


def _probed_table() -> str:
    """Numerics the backends probe on this machine instead of assuming (declared to the
    tiers per case): which can change between CPUs and GPUs CI lands on."""
    import torch

    from tealite.backends.torch import probes
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    return "probed on this machine:\n" + _table([list(r) for r in probes.describe(devices)],
                                                 ["kernel", "device", "finding"])


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


def cmd_fuzz(args) -> int:
    from tealite_verify.fuzz.findings import default_corpus_dir
    from tealite_verify.fuzz.supervisor import Campaign, FuzzConfig
    from tealite_verify.fuzz.worker import plan_targets
    seconds = args.seconds if args.seconds is not None else 60.0 * args.minutes
    cfg = FuzzConfig(ops=args.op or ["all"], backends=args.backend, dtypes=args.dtype,
                     recipe=args.recipe, seconds=seconds, seed=args.seed, device=args.device,
                     workers=args.workers, corpus=str(args.corpus or default_corpus_dir()),
                     case_timeout=args.case_timeout, size=args.size, batch=args.batch,
                     variants=args.variants,
                     json_path=args.json, markdown_path=args.markdown, verbose=args.verbose,
                     db_always=args.db_every_run)
    try:
        targets, notes = plan_targets(cfg.ops, cfg.backends, cfg.dtypes, cfg.recipe, cfg.device)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    if not targets:
        print("error: nothing to fuzz with these filters", file=sys.stderr)
        return 2
    print(f"[fuzz] {len(targets)} target(s) for {seconds:g} s on {cfg.device}; corpus "
          f"{cfg.corpus}; seed {cfg.seed}", file=sys.stderr)
    return Campaign(cfg, targets, notes).run()


STARTUP_ALLOWANCE_S = 30.0


def _replay_out_of_process(args, f) -> int:
    """Crash and hang findings: the replay itself runs in a child that may die or wedge."""
    # The child's imports (torch, backends) take seconds: they do not count as the case.
    timeout = args.timeout or float(f.metrics.get("timeout_s") or 60.0) + STARTUP_ALLOWANCE_S
    cmd = [sys.executable, "-m", "tealite_verify", "replay", args.finding, "--in-process"]
    for b in args.backend or []:
        cmd += ["--backend", b]
    if args.device:
        cmd += ["--device", args.device]
    if args.json:
        cmd.append("--json")
    env = dict(os.environ)
    if f.versions.get("backend_modules") and not env.get(registry.PLUGIN_ENV_VAR):
        env[registry.PLUGIN_ENV_VAR] = f.versions["backend_modules"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"{f.kind} finding still reproduces: no result within {timeout:g} s",
              file=sys.stderr)
        return 1
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        print(f"{f.kind} finding still reproduces: the replay died with {name}", file=sys.stderr)
        return 1
    return rc


def cmd_replay(args) -> int:
    from tealite_verify.fuzz.findings import load_finding, replay
    f = load_finding(args.finding)
    if not args.in_process:
        print(f"finding {f.id}: {f.kind} in {f.op} ({'/'.join(f.backends)}) on {f.device}, "
              f"seen {f.count}x ({f.first_seen} .. {f.last_seen})\n  recorded: {f.detail}")
        sys.stdout.flush()
    if f.kind in ("crash", "hang") and not args.in_process:
        return _replay_out_of_process(args, f)
    rep: CaseReport = replay(f, backends=args.backend, device=args.device)
    print(rep.describe())
    if args.json:
        print(json.dumps(rep.to_dict(), indent=1, default=str))
    if rep.verdict == "skip":
        print("no backend ran the case (see the statuses above)", file=sys.stderr)
    return 1 if rep.verdict == "fail" else 0


def _add_fuzz_parser(sub) -> None:
    z = sub.add_parser("fuzz", help="time-bounded crash-isolated fuzzing campaign",
                       description="Hypothesis-driven fuzzing of ops x backends for a fixed "
                       "time; findings are saved (atomically, deduplicated) to the corpus.")
    z.add_argument("--op", action="append", help="op name (repeatable) or 'all' (default)")
    z.add_argument("--backend", action="append",
                   help="judge only these backends (repeatable; default: all that implement "
                        "the op on the device)")
    z.add_argument("--recipe", help="only cases whose recipe description contains this "
                                    "substring, e.g. 'mx[e2m1' or 'block['")
    z.add_argument("--dtype", action="append", help="input dtype(s), e.g. bfloat16")
    budget = z.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=1.0, help="time budget (default 1)")
    budget.add_argument("--seconds", type=float, help="time budget in seconds")
    z.add_argument("--seed", type=int, default=0)
    z.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    z.add_argument("--workers", type=int, help="worker processes (default with --device cuda: "
                                              "up to 4 per visible GPU, at least 4 cores "
                                              "each, GPUs dealt round-robin; else 1)")
    z.add_argument("--corpus", help="findings directory (default $TEALITE_FINDINGS or "
                                    "./findings)")
    z.add_argument("--json", help="write the JSON report here")
    z.add_argument("--markdown", help="write a Markdown summary (PR comment) here")
    z.add_argument("--case-timeout", type=float, default=60.0,
                   help="seconds one case may take before it is a hang (default 60)")
    z.add_argument("--size", choices=SIZES, default="ci", help="shape budget")
    z.add_argument("--batch", type=int, default=100,
                   help="examples per Hypothesis run (each run has a fresh seed)")
    z.add_argument("--variants", type=int, default=4,
                   help="data seeds run per drawn case (same shape / recipe / distribution): "
                        "amortizes Hypothesis's drawing cost over several kernel runs; the "
                        "failing variant is the case recorded (default 4)")
    z.add_argument("--verbose", action="store_true", help="pass the workers' stderr through")
    z.add_argument("--db-every-run", action="store_true",
                   help="use the Hypothesis example database in every run, not only each "
                        "target's first (keeps the Pareto front of high ratios; ~2x slower)")
    y = sub.add_parser("replay", help="re-run one stored finding with full metrics")
    y.add_argument("finding", help="a finding's JSON file")
    y.add_argument("--backend", action="append", help="override the finding's backends")
    y.add_argument("--device", help="override the finding's device")
    y.add_argument("--timeout", type=float, help="crash / hang findings: seconds before the "
                                                 "replay counts as hung (default: recorded)")
    y.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    y.add_argument("--json", action="store_true", help="also print the report as JSON")


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
    _add_fuzz_parser(sub)
    gate_cli.add_parser(sub)
    args = p.parse_args(argv)
    profiles.load()
    errors = registry.load_plugins()
    for err in errors:
        print(f"warning: backend plugin failed to load: {err}", file=sys.stderr)
    return {"list": cmd_list, "run": cmd_run, "repro": cmd_repro, "fuzz": cmd_fuzz,
            "replay": cmd_replay, "gate": gate_cli.run}[args.cmd](args)
