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
``mutate`` the mutation score: deliberate bugs applied to the torch backend, killed by the
           suite's cases, by fuzz, or survived and why; ``--thresholds`` each op's detection
           threshold (tealite_verify/mutate/, docs/mutation.md).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys


from tealite import registry
from tealite_verify import coverage, listing, profiles, suite
from tealite_verify.tables import table
from tealite_verify.gate import cli as gate_cli
from tealite_verify.mutate import cli as mutate_cli
from tealite_verify.report import html_path
from tealite_verify.progress import RunProgress
from tealite_verify.runner import CaseReport, run_case
from tealite_verify.specs import SIZES, all_specs, get_spec


_table = table  # the name the subcommand modules used


def drawn_cases(spec, n: int, size: str, seed: int) -> list[dict]:
    """``n`` cases from the spec's strategy (any dtype), reproducible from ``seed``."""
    return suite.draw_cases(spec, None, n, size, seed)


def _select_backends(args) -> list[str] | None:
    return args.backend or None


def _stratified(spec, args) -> list[dict]:
    """The suite's stratified cases (tealite_verify/suite.py) of every selected backend that
    implements the op, in each dtype, without repeats."""
    names = args.backend or sorted(registry.backends())
    out: list[dict] = []
    for name in names:
        b = registry.backends().get(name)
        if b is None or not spec.implemented_by(b) or b.unavailable_reason():
            continue
        for dtype in spec.dtypes:
            for case in suite.plan(spec, name, dtype, device=args.device, size=args.size).cases:
                if case not in out:
                    out.append(case)
    return out


def _record_coverage(spec, rep: CaseReport) -> set:
    """Record the cells of a case that ran for each backend it ran on; returns them."""
    ran = [o.backend for o in rep.outcomes.values() if o.status == "ok"]
    if not ran:
        return set()
    cells = coverage.cells_of(rep.case, spec.make_inputs(rep.case, "cpu"))
    dtype = rep.case.get("dtype", spec.dtypes[0])
    for name in ran:
        suite.record_coverage(spec.name, name, dtype, cells)
    return set(cells)


def _probabilistic(args) -> float | None:
    """The per-case false-alarm probability asked for (``--probabilistic [P]``, implied at
    its default by ``--fail-on-suspicious``, else $TEALITE_VERIFY_PROBABILISTIC), or None;
    a bad value raises ValueError naming the option."""
    from tealite_verify.tiers import probabilistic as prob
    if args.probabilistic is not None:
        return prob.check_probability(args.probabilistic, "--probabilistic")
    if args.fail_on_suspicious:
        return prob.DEFAULT_FALSE_ALARM
    return prob.target_from_env()


def _prob_row(stats: dict, rep: CaseReport) -> None:
    """Accumulate one case into the run's probabilistic summary row [checked, suspicious,
    worst prob err/bound, worst err/err(torch)] (cases with no probabilistic check skipped)."""
    probs = [c.metrics for c in rep.comparisons
             if c.rhs == "reference" and c.metrics.prob_ratio is not None]
    if not probs:
        return
    row = stats.setdefault(rep.op, [0, 0, 0.0, 0.0])
    row[0] += 1
    row[1] += rep.graded_verdict == "suspicious"
    row[2] = max(row[2], max(m.prob_ratio for m in probs))
    row[3] = max([row[3]] + [m.fa_ratio for m in probs if m.fa_ratio is not None])


def _prob_table(stats: dict, p_case: float) -> str:
    rows = [[op, n, s, f"{w:.3f}", f"{fa:.3g}"] for op, (n, s, w, fa) in stats.items()]
    head = (f"probabilistic check (Higham-Mary bound, false-alarm probability {p_case:g} per "
            "case; suspicious = within the deterministic bound, beyond this one; "
            "err/err(torch): FlashAttention-style ratio, 1 by construction for torch):\n")
    return head + (_table(rows, ["op", "checked", "suspicious", "worst prob err/bound",
                                 "worst err/err(torch)"]) if rows else "no op with the check ran")


def _graph_replay(args) -> int | None:
    """Replays per case of the graph-replay check (``--graph-replay [N]``, else
    $TEALITE_VERIFY_GRAPH_REPLAY), or None; a bad value raises ValueError naming the option."""
    from tealite_verify import graph_replay
    if getattr(args, "graph_replay", None) is not None:
        return graph_replay.check_replays(args.graph_replay, "--graph-replay")
    return graph_replay.replays_from_env()


def cmd_run(args) -> int:
    try:
        p_case = _probabilistic(args)
        replays = _graph_replay(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prob_stats: dict = {}
    specs = all_specs()
    ops = list(specs) if not args.op or "all" in args.op else args.op
    rows, reports = [], []
    failed = 0
    shown = RunProgress(len(ops), enabled=args.progress)
    for op in ops:
        spec = get_spec(op)
        shown.begin_op(op)
        cases = list(spec.smoke_cases) + _stratified(spec, args) + \
            drawn_cases(spec, args.examples, args.size, args.seed)
        counts = {"pass": 0, "fail": 0, "skip": 0}
        exercised: set = set()
        worst = 0.0
        for case in cases:
            rep = run_case(spec, case, backends=_select_backends(args), device=args.device,
                           probabilistic=p_case, graph_replay=replays)
            counts[rep.verdict] += 1
            worst = max(worst, rep.max_ratio())
            reports.append(rep)
            exercised |= _record_coverage(spec, rep)
            if rep.verdict == "fail":
                failed += 1
                shown.above(rep.describe())
            elif rep.graded_verdict == "suspicious":
                shown.above(rep.describe())
            _prob_row(prob_stats, rep)
            shown.case_done(rep.verdict == "fail")
        got, total = coverage.ratio(exercised, spec.coverage)
        rows.append([op, len(cases), counts["pass"], counts["fail"], counts["skip"],
                     f"{worst:.3f}", f"{got}/{total}"])
        shown.op_done()
    shown.finish()
    print(_table(rows, ["op", "cases", "pass", "fail", "skip", "worst err/tol", "cells"]))
    print("cells: coverage-matrix cells the cases that ran exercised, over every backend; "
          "per backend and dtype: python -m tealite_verify list --coverage")
    ran = sorted({o.backend for r in reports for o in r.outcomes.values() if o.status == "ok"})
    print(f"device {args.device}; backends that ran: {', '.join(ran) or 'none'}; "
          f"{failed} failing case(s)")
    suspicious = sum(r[1] for r in prob_stats.values())
    if p_case is not None:
        print(_prob_table(prob_stats, p_case))
        print(f"{suspicious} suspicious case(s)"
              + (" (--fail-on-suspicious: exit 1)" if suspicious and args.fail_on_suspicious
                 else " (not failures)" if suspicious else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in reports], f, indent=1, default=str)
    if args.html:
        from tealite_verify.report.write import write_run
        path = write_run(args.html, reports, device=args.device, settings=vars(args))
        print(f"report: {path}")
    return 1 if failed or (args.fail_on_suspicious and suspicious) else 0


def cmd_repro(args) -> int:
    try:
        p_case = _probabilistic(args)
        replays = _graph_replay(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spec = get_spec(args.op)
    case = json.loads(args.case)
    rep: CaseReport = run_case(spec, case, backends=_select_backends(args), device=args.device,
                               probabilistic=p_case, graph_replay=replays)
    print(rep.describe())
    if args.json:
        print(json.dumps(rep.to_dict(), indent=1, default=str))
    return 1 if rep.verdict == "fail" else 0


def cmd_fuzz(args) -> int:
    from tealite_verify.tiers import probabilistic as prob
    from tealite_verify.fuzz.findings import default_corpus_dir
    from tealite_verify.fuzz.supervisor import Campaign, FuzzConfig
    from tealite_verify.fuzz.worker import plan_targets
    from tealite_verify import graph_replay
    try:
        p_case = _probabilistic(args)
        replays = _graph_replay(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if p_case is not None:  # the workers inherit the environment (runner.run_case reads it)
        os.environ[prob.ENV_VAR] = repr(p_case)
    if replays is not None:
        os.environ[graph_replay.ENV_VAR] = str(replays)
    seconds = args.seconds if args.seconds is not None else 60.0 * args.minutes
    cfg = FuzzConfig(ops=args.op or ["all"], backends=args.backend, dtypes=args.dtype,
                     recipe=args.recipe, seconds=seconds, seed=args.seed, device=args.device,
                     workers=args.workers, corpus=str(args.corpus or default_corpus_dir()),
                     case_timeout=args.case_timeout, size=args.size, batch=args.batch,
                     variants=args.variants,
                     json_path=args.json, markdown_path=args.markdown, verbose=args.verbose,
                     db_always=args.db_every_run, max_cases=args.max_cases)
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
          f"{cfg.corpus}; seed {cfg.seed}"
          + (f"; probabilistic check, false-alarm probability {p_case:g} per case"
             if p_case is not None else ""), file=sys.stderr)
    campaign = Campaign(cfg, targets, notes)
    rc = campaign.run()
    if args.html:
        from tealite_verify.report.write import write_fuzz
        print(f"report: {write_fuzz(args.html, campaign)}", file=sys.stderr)
    if rc == 0 and args.fail_on_suspicious and campaign.stats.suspicious_cases:
        print(f"{campaign.stats.suspicious_cases} suspicious case(s) (--fail-on-suspicious)",
              file=sys.stderr)
        return 1
    return rc


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


def _add_probabilistic_args(p) -> None:
    p.add_argument("--probabilistic", nargs="?", const="1e-9", metavar="P",
                   help="also judge GEMMs by the probabilistic Higham-Mary bound "
                        "(lambda sqrt(K) u, lambda set so a correct backend is flagged with "
                        "probability <= P per case; default P 1e-9): a case within the "
                        "deterministic bound but beyond it is reported 'suspicious', not "
                        "failed; with the FlashAttention-style ratio to a same-precision "
                        "torch computation beside it (docs/probabilistic.md).  Also "
                        "$TEALITE_VERIFY_PROBABILISTIC=P")
    p.add_argument("--fail-on-suspicious", action="store_true",
                   help="exit 1 on suspicious cases too (implies --probabilistic)")


def _add_graph_replay_arg(p) -> None:
    p.add_argument("--graph-replay", nargs="?", const="3", metavar="N",
                   help="also capture each backend's call in a CUDA graph and replay it N "
                        "times (default 3) with other allocations and work in between: "
                        "outputs must stay bit-identical to eager (a 'graph-replay' finding "
                        "names the replay and the tensor otherwise).  Off the GPU a static-"
                        "buffer emulation runs (docs/graph-replay.md).  Also "
                        "$TEALITE_VERIFY_GRAPH_REPLAY=N")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


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
    z.add_argument("--max-cases", type=_positive_int, metavar="N",
                   help="also stop once N cases are done (the time budget still applies): "
                        "size a campaign by cases")
    z.add_argument("--workers", type=int, help="worker processes (default with --device cuda: "
                                              "up to 4 per visible GPU, at least 4 cores "
                                              "each, GPUs dealt round-robin; else 1)")
    z.add_argument("--corpus", help="findings directory (default $TEALITE_FINDINGS or "
                                    "./findings)")
    z.add_argument("--json", help="write the JSON report here")
    z.add_argument("--markdown", help="write a Markdown summary (PR comment) here")
    z.add_argument("--html", type=html_path,
                   help="write a self-contained HTML report here (docs/report.md)")
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
    _add_probabilistic_args(z)
    _add_graph_replay_arg(z)
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
    listing.add_parser(sub)
    r = sub.add_parser("run", help="differential check of every op (the main job)")
    r.add_argument("--op", action="append", help="op name (repeatable) or 'all' (default)")
    r.add_argument("--backend", action="append", help="restrict to these backends (repeatable)")
    r.add_argument("--device", default="cpu")
    r.add_argument("--examples", type=int, default=25, help="drawn cases per op")
    r.add_argument("--size", choices=SIZES, default="ci", help="shape budget")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", help="write every case report here")
    r.add_argument("--html", type=html_path,
                   help="write a self-contained HTML report here (docs/report.md)")
    r.add_argument("--no-progress", "--quiet", dest="progress", action="store_false",
                   help="no progress display on stderr (by default: one updating line on a "
                        "terminal, else a line every 30 s; the summary and failures are "
                        "printed either way)")
    _add_probabilistic_args(r)
    _add_graph_replay_arg(r)
    q = sub.add_parser("repro", help="re-run one case with full metrics")
    q.add_argument("--op", required=True)
    q.add_argument("--case", required=True, help="case JSON as printed by a failure")
    q.add_argument("--backend", action="append")
    q.add_argument("--device", default="cpu")
    q.add_argument("--json", action="store_true", help="also print the report as JSON")
    _add_probabilistic_args(q)
    _add_graph_replay_arg(q)
    _add_fuzz_parser(sub)
    gate_cli.add_parser(sub)
    mutate_cli.add_parser(sub)
    args = p.parse_args(argv)
    profiles.load()
    errors = registry.load_plugins()
    for err in errors:
        print(f"warning: backend plugin failed to load: {err}", file=sys.stderr)
    return {"list": listing.run, "run": cmd_run, "repro": cmd_repro, "fuzz": cmd_fuzz,
            "replay": cmd_replay, "gate": gate_cli.run,
            "mutate": mutate_cli.run}[args.cmd](args)
