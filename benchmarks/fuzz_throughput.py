"""Fuzzer throughput: cases/s and where a case's time goes (issue 5).

    python benchmarks/fuzz_throughput.py [--seconds 20] [--device cpu|cuda] [--ops gemm quantize]

For each op and backend (torch; plus triton with ``--device cuda``) runs
``python -m tealite_verify fuzz`` for ``--seconds`` into a scratch corpus, reads its JSON report
and prints one row: cases, cases/s and the per-case split in milliseconds -- backend (the
kernel through the tealite front-end, device-synchronized), reference (float64 view +
reference; on the GPU with ``--device cuda``), inputs (input generation), compare (tolerances,
metrics), Hypothesis (drawing, targeting, database) + event plumbing -- and the harness share:
everything but backend and reference.  Standalone: not collected by pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_campaign(op: str, backend: str, seconds: float, device: str, size: str,
                 seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fuzz-throughput-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "tealite_verify", "fuzz", "--op", op, "--backend",
               backend, "--seconds", str(seconds), "--device", device, "--size", size,
               "--seed", str(seed), "--corpus", str(Path(tmp) / "corpus"),
               "--json", str(report), "--workers", "1"]
        env = dict(os.environ)
        env.pop("TEALITE_FINDINGS", None)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=seconds + 300)
        if not report.exists():
            raise RuntimeError(f"{' '.join(cmd)} wrote no report (exit {r.returncode}):\n"
                               f"{r.stderr[-3000:]}")
        doc = json.loads(report.read_text())
        doc["_exit"] = r.returncode
        return doc


def row(op: str, backend: str, doc: dict) -> list[str]:
    t = doc["totals"]
    per = doc["time_split"]["per_case_s"]
    ms = {k: 1e3 * float(v or 0.0) for k, v in per.items()}
    total = ms.get("total") or 0.0
    kernel, reference = ms.get("backend", 0.0), ms.get("reference", 0.0)
    inputs, compare = ms.get("inputs", 0.0), ms.get("compare", 0.0)
    glue = inputs + compare + ms.get("run_case_untimed", 0.0)
    hyp = max(total - kernel - reference - glue, 0.0)
    harness = total - kernel - reference
    share = f"{100 * harness / total:.0f} %" if total else "-"
    return [op, backend, str(t["cases"]), f"{t['cases_per_s']:.1f}", f"{total:.2f}",
            f"{kernel:.2f}", f"{reference:.2f}", f"{inputs:.2f}", f"{compare:.2f}",
            f"{hyp:.2f}", share, str(t["findings"])]


HEADER = ["op", "backend", "cases", "cases/s", "ms/case", "backend ms", "reference ms",
          "inputs ms", "compare ms", "hypothesis+IPC ms", "harness share", "findings"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="budget per campaign")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--ops", nargs="+", default=["gemm", "quantize"])
    p.add_argument("--backends", nargs="+",
                   help="default: torch, plus triton with --device cuda")
    p.add_argument("--size", default="ci", help="shape budget (ci, local, large)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the raw reports here")
    args = p.parse_args(argv)
    backends = args.backends or (["torch", "triton"] if args.device == "cuda" else ["torch"])
    rows, raw = [], []
    for op in args.ops:
        for b in backends:
            doc = run_campaign(op, b, args.seconds, args.device, args.size, args.seed)
            raw.append({"op": op, "backend": b, "report": doc})
            rows.append(row(op, b, doc))
            print(f"{op}/{b}: {rows[-1][3]} cases/s", file=sys.stderr)
    versions = raw[0]["report"].get("versions", {}) if raw else {}
    print(f"fuzz throughput on {args.device} ({args.size} shapes, {args.seconds:g} s per "
          f"campaign, 1 worker); torch {versions.get('torch')}, triton "
          f"{versions.get('triton')}, gpu {versions.get('gpu') or versions.get('cuda_device')}")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
