"""Where one differential case's time goes, outside the fuzzer's process plumbing (issue 5).

    python benchmarks/case_profile.py --ops gemm quantize --size local --device cuda [--top 25]

Draws ``--cases`` cases per op with Hypothesis (fixed seed; generate phase only, or with
``--targeted`` as the fuzzer draws them: each case run and ``hypothesis.target`` steering
toward the worst err/tol ratio, which favours large and hostile cases), runs
``run_case`` on each (torch backend unless ``--backends``) after a short warm-up, and prints
the mean per-case split from the runner's own timings (inputs, backend, reference, compare,
untimed rest), plus the mean Hypothesis cost of drawing one case.  ``--top N`` adds a cProfile
of the run_case loop sorted by own time.  Standalone: not collected by pytest.
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import io
import pstats
import time


def draw_cases(spec, size: str, n: int, seed: int, targeted_on: str | None = None,
               backends=("torch",)) -> tuple[list[dict], float]:
    """``n`` cases and the mean seconds per drawn case (for ``targeted_on`` a device: the case
    runs included)."""
    from hypothesis import HealthCheck, Phase, given, settings, target
    from hypothesis import seed as hseed

    from tealite_verify.runner import run_case
    out: list[dict] = []
    phases = [Phase.generate] + ([Phase.target] if targeted_on else [])

    @settings(max_examples=n, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck))
    @hseed(seed)
    @given(case=spec.cases(None, size))
    def draw(case):
        out.append(case)
        if targeted_on:
            rep = run_case(spec, case, backends=list(backends), device=targeted_on)
            target(min(rep.max_ratio(), 1e12), label="max err/tol")

    t = time.perf_counter()
    draw()
    return out[:n], (time.perf_counter() - t) / max(len(out), 1)


def profile_op(op: str, args) -> str:
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    spec = get_spec(op)
    cases, t_draw = draw_cases(spec, args.size, args.cases, args.seed,
                               args.device if args.targeted else None, args.backends)
    for c in cases[:3]:
        run_case(spec, c, backends=args.backends, device=args.device)
    parts: collections.Counter = collections.Counter()

    def loop():
        for c in cases:
            rep = run_case(spec, c, backends=args.backends, device=args.device)
            for k, v in rep.timings.items():
                parts[k.split(":")[0]] += v

    prof = cProfile.Profile() if args.top else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    loop()
    if prof:
        prof.disable()
    total = time.perf_counter() - t
    n = len(cases)
    ms = {k: 1e3 * v / n for k, v in parts.items()}
    ms["untimed"] = 1e3 * total / n - sum(ms.values())
    harness = ms.get("inputs", 0) + ms.get("compare", 0) + ms["untimed"]
    line = (f"| {op} | {n} | {1e3 * t_draw:.2f} | {1e3 * total / n:.2f} | "
            + " | ".join(f"{ms.get(k, 0.0):.2f}" for k in
                         ("inputs", "backend", "reference", "compare", "untimed"))
            + f" | {100 * harness / (1e3 * total / n):.0f} % |")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
        print(f"--- {op}: cProfile by own time\n{s.getvalue()}")
    return line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", default=["gemm", "quantize"])
    p.add_argument("--size", default="ci")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backends", nargs="+", default=["torch"])
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--device-reference-min", type=int,
                   help="override runner.DEVICE_REFERENCE_MIN_ELEMENTS (0: always on the device)")
    p.add_argument("--targeted", action="store_true",
                   help="draw as the fuzzer does (run each case, target the worst ratio)")
    args = p.parse_args(argv)
    from tealite_verify import profiles, runner
    profiles.load("local")
    if args.device_reference_min is not None:
        runner.DEVICE_REFERENCE_MIN_ELEMENTS = args.device_reference_min
    rows = [profile_op(op, args) for op in args.ops]
    print(f"run_case split, ms per case ({args.size} shapes, {args.device}, "
          f"backends {args.backends}); harness share = (inputs + compare + untimed) / total")
    if args.targeted:
        print("(targeted: draw ms includes running the case once while drawing)")
    print("| op | cases | draw ms | total | inputs | backend | reference | compare | untimed "
          "| harness share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
