"""What the probabilistic check adds to ``mutate``'s score: each gemm / qgemm operator of the
mutation library (tealite_verify/mutate/) on the suite's cases (the cases ``mutate`` and
``pytest -m differential`` run) and on large-K zero-mean cases, judged by the deterministic
tier and by the suspicious verdict.  ``mutate`` itself counts only deterministic kills (a
suspicious case is not a failure), so its score is the same with or without the check.

Usage: python ci/probabilistic_mutation_score.py [P] [SEEDS] [OUT_JSON]  (defaults 1e-9, 4).
Per operator: suite cases run / killed (deterministic) / suspicious-only; large-K cases (128 x
128, K = 4096, fp16 / bf16 / fp32 gemm; FP8 per-row qgemm with fp32 output) likewise.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tealite_verify.mutate import plugin
from tealite_verify.mutate.base import library
from tealite_verify.mutate.runner import cases_for, dtypes_for
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.gemm import make_case

_ROW = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
        "amax_epsilon": 0.0}


def large_k_cases(op: str, seeds: int) -> list[dict]:
    if op == "gemm":
        return [make_case("TN", dt, 128, 128, 4096, seed=1000 + s)
                for s in range(seeds) for dt in ("float16", "bfloat16", "float32")]
    return [{"recipe_a": _ROW, "recipe_b": _ROW, "m": 128, "n": 128, "k": 4096, "layout": "TN",
             "dtype": "bfloat16", "out_dtype": "float32", "bias": False,
             "dist_a": {"kind": "normal", "scale": 1.0},
             "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 1000 + s}
            for s in range(seeds)]


def judge(spec, cases, p) -> dict:
    """Cases the mutant ran with torch passing: how many it fails, how many only suspicious."""
    r = {"cases": 0, "killed": 0, "suspicious_only": 0, "torch_suspicious": 0}
    for case in cases:
        rep = run_case(spec, case, backends=["torch", plugin.NAME], pairwise=False,
                       probabilistic=p)
        mine = [c for c in rep.comparisons if c.lhs == plugin.NAME]
        theirs = [c for c in rep.comparisons if c.lhs == "torch"]
        if rep.outcomes[plugin.NAME].status not in ("ok", "error") or \
                not all(c.metrics.passed for c in theirs):
            continue
        r["cases"] += 1
        r["torch_suspicious"] += any(c.metrics.suspicious for c in theirs)
        if rep.outcomes[plugin.NAME].status == "error" or \
                not all(c.metrics.passed for c in mine):
            r["killed"] += 1
        elif any(c.metrics.suspicious for c in mine):
            r["suspicious_only"] += 1
    return r


def main() -> int:
    p = float(sys.argv[1]) if len(sys.argv) > 1 else 1e-9
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rows, t0 = [], time.time()
    for m in library().values():
        if m.op not in ("gemm", "qgemm"):
            continue
        spec = get_spec(m.op)
        with plugin.registered(m):
            suite_cases = [c for d in dtypes_for(m.op) for c in cases_for(m.op, d)]
            rows.append({"operator": m.name, "must_kill": m.must_kill,
                         "suite": judge(spec, suite_cases, p),
                         "large_k": judge(spec, large_k_cases(m.op, seeds), p)})
        s, lk = rows[-1]["suite"], rows[-1]["large_k"]
        print(f"{m.name:34} suite {s['killed']:>3}/{s['cases']:<3} killed, "
              f"{s['suspicious_only']:>3} suspicious-only | K=4096 {lk['killed']:>2}/"
              f"{lk['cases']:<2} killed, {lk['suspicious_only']:>2} suspicious-only | torch "
              f"suspicious {s['torch_suspicious'] + lk['torch_suspicious']}", flush=True)
    print(f"p = {p:g} per case, {seeds} seeds per large-K case kind, {time.time() - t0:.0f} s")
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
