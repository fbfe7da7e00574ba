"""FP8 GEMMs through torch._scaled_mm on a GPU vs the float64 reference and the torch backend.

Usage: python ci/device_qgemm.py [N_CASES] [OUT_JSON].  Draws FP8 per-tensor / per-row qgemm
cases with OCP formats (cuBLASLt's) from the qgemm spec, at the "local" and "large" shape
budgets, plus fixed shapes that need padding (K = 257) and large square ones.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from tealite_verify.cli import drawn_cases
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

OCP = {"e4m3", "e5m2"}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def fp8_ocp(case) -> bool:
    ra, rb = case["recipe_a"], case["recipe_b"]
    return (ra["kind"] in ("current", "delayed") and rb["kind"] in ("current", "delayed")
            and {ra["fmt"], rb["fmt"]} <= OCP and not (ra["fmt"] == rb["fmt"] == "e5m2"))


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    out = sys.argv[2] if len(sys.argv) > 2 else None
    spec = get_spec("qgemm")
    cases = []
    for size, seed in (("local", 1), ("large", 2)):
        cases += [c for c in drawn_cases(spec, 6 * n, size, seed) if fp8_ocp(c)][: n // 2]
    tensor = {"kind": "current", "fmt": "e4m3", "granularity": "tensor",
              "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate"}
    row = dict(tensor, granularity="row")
    for m, nn, k, ra, rb in ((128, 96, 257, tensor, tensor), (2048, 2048, 4096, tensor, tensor),
                             (1024, 4096, 2048, row, row), (37, 4099, 1481, row, tensor)):
        cases.append({"recipe_a": ra, "recipe_b": rb, "m": m, "n": nn, "k": k, "layout": "TN",
                      "dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False,
                      "dist_a": {"kind": "normal", "scale": 1.0},
                      "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 5})
    rows, reports = [], []
    for case in cases:
        t = time.time()
        rep = run_case(spec, case, backends=["scaled_mm", "torch"], device=DEVICE)
        reports.append(rep.to_dict())
        o = rep.outcomes["scaled_mm"]
        ratio = max((c.metrics.max_ratio for c in rep.comparisons
                     if c.lhs == "scaled_mm" and c.rhs == "reference"), default=float("nan"))
        rows.append((case["m"], case["n"], case["k"], case["layout"],
                     case["recipe_a"].get("granularity", "delayed"),
                     case["recipe_b"].get("granularity", "delayed"),
                     case["recipe_a"]["fmt"] + "x" + case["recipe_b"]["fmt"], case["out_dtype"],
                     o.status, rep.verdict, f"{ratio:.3f}", f"{time.time() - t:.1f}s"))
    for r in rows:
        print(*r, sep="\t")
    ran = [r for r in rows if r[8] == "ok"]
    print(f"{len(rows)} cases, {len(ran)} ran on scaled_mm, "
          f"{sum(r[9] == 'fail' for r in rows)} failed")
    if out:
        with open(out, "w") as f:
            json.dump(reports, f, default=str)
    return 1 if any(r[9] == "fail" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
