"""False alarms of the opt-in probabilistic check on correct backends, at the large K where it
is tighter than the deterministic bound (the fuzzer's shapes rarely reach there: ~1-2 % of its
"local" cases have K >= 1024).

Usage: python ci/probabilistic_false_alarms.py [N] [SEED] [BACKEND] [P] [OUT_JSON] [DEVICE]
(defaults 300, 0, torch, 1e-9, none ("-"), cpu).  Draws N cases per op (gemm, qgemm) from the
specs' "local" strategies (every layout, dtype, epilogue, recipe and value distribution the
fuzzer draws: normal, uniform (nonzero mean), outliers, zero rows, integers, tiny / subnormal,
wide range), then sets K to one of 1024, 2048, 4096, 8192 and caps M, N at 64.  Prints the
cases judged, the suspicious ones (with their repro), deterministic failures, and the prob
err/bound quantiles (all, and fp32 outputs apart).
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from tealite_verify.cli import drawn_cases
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

KS = (1024, 2048, 4096, 8192)


def large_k(case: dict, rng: random.Random) -> dict:
    return dict(case, k=rng.choice(KS), m=min(case["m"], 64), n=min(case["n"], 64))


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    backend = sys.argv[3] if len(sys.argv) > 3 else "torch"
    p = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-9
    device = sys.argv[6] if len(sys.argv) > 6 else "cpu"
    rng = random.Random(seed)
    out, t0 = {}, time.time()
    for op in ("gemm", "qgemm"):
        spec = get_spec(op)
        ratios, sus, det_fail, skipped = [], [], [], 0
        fp32_out = []  # there the accumulation term, not the output rounding, dominates
        for case in drawn_cases(spec, n, "local", seed):
            rep = run_case(spec, large_k(case, rng), backends=[backend], pairwise=False,
                           probabilistic=p, device=device)
            if rep.verdict == "skip":
                skipped += 1
                continue
            for c in rep.comparisons:
                if c.metrics.prob_ratio is not None:
                    ratios.append(c.metrics.prob_ratio)
                    if rep.case["out_dtype"] == "float32":
                        fp32_out.append(c.metrics.prob_ratio)
                if not c.metrics.passed:
                    det_fail.append(rep.repro(backend))
                elif c.metrics.suspicious:
                    sus.append(rep.repro(backend))
        q = np.quantile(ratios, [0.5, 0.9, 0.99, 1.0]) if ratios else [np.nan] * 4
        q32 = np.quantile(fp32_out, [0.5, 0.99, 1.0]) if fp32_out else [np.nan] * 3
        out[op] = {"comparisons": len(ratios), "skipped_cases": skipped,
                   "suspicious": sus, "deterministic_failures": det_fail,
                   "prob_ratio_quantiles": {"50%": q[0], "90%": q[1], "99%": q[2], "max": q[3]},
                   "fp32_out": {"comparisons": len(fp32_out), "50%": q32[0], "99%": q32[1],
                                "max": q32[2]}}
        print(f"{op}: {len(ratios)} comparisons judged ({skipped} cases skipped), "
              f"{len(sus)} suspicious, {len(det_fail)} deterministic failures; prob err/bound "
              f"median {q[0]:.3g}, 90% {q[1]:.3g}, 99% {q[2]:.3g}, max {q[3]:.3g}; fp32 "
              f"outputs ({len(fp32_out)}): median {q32[0]:.3g}, 99% {q32[1]:.3g}, "
              f"max {q32[2]:.3g}")
        for r in sus[:5] + det_fail[:5]:
            print("  " + r)
    print(f"backend {backend} on {device}, p = {p:g} per case, seed {seed}, "
          f"{time.time() - t0:.0f} s")
    if len(sys.argv) > 5 and sys.argv[5] != "-":
        Path(sys.argv[5]).write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
