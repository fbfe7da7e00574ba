"""Turn the suite's pytest-benchmark JSON into a Markdown benchmark record.

    python benchmarks/report.py bench.json [-o bench.md]

Header: GPU, driver, CUDA/HIP, torch, triton, Python, AITER as loaded, the in-run copy
bandwidth and how times were taken.  One table per group (copy, quantize, norm, gemm, qgemm,
grouped_gemm, softmax): kernel, backend, shape, device ms (median of the device-event
repetitions), wall ms (pytest-benchmark's median of op + sync), GB/s or TFLOP/s, % of the
reference (copy bandwidth or the torch baseline of the same run), the issue-4 target and
whether it was met.  Then the target summary, rows that did not run (with the reason) and
failures.
"""
from __future__ import annotations

import argparse
import json
import sys

GROUPS = ("copy", "quantize", "norm", "gemm", "qgemm", "grouped_gemm", "softmax")


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _busy_factor(ei: dict) -> float | None:
    """device ms / the kernels' own busy ms ($TEALITE_BENCH_PROFILE rows): above 1 the device
    waited on the host (front-end Python, a sync) inside the timed call."""
    busy, ms = ei.get("kernel_busy_ms"), ei.get("device_ms_median")
    return ms / busy if busy and ms else None


def _rate(ei: dict) -> str:
    f = _busy_factor(ei)
    if ei.get("gbps") is not None:
        kernels = f" (kernels alone {ei['gbps'] * f:.0f})" if f else ""
        return f"{ei['gbps']:.0f} GB/s{kernels}"
    if ei.get("tflops") is not None:
        kernels = f" (kernels alone {ei['tflops'] * f:.1f})" if f else ""
        return f"{ei['tflops']:.1f} TFLOP/s{kernels}"
    return "-"


def _kernels_alone(ei: dict) -> str:
    f = _busy_factor(ei)
    if not f or ei.get("pct_of_reference") is None:
        return ""
    return (f"; kernels alone {ei['pct_of_reference'] * f:.1f} % ({ei['kernel_busy_ms']:.4f} ms "
            f"busy in {ei.get('kernels_per_call', 0):.0f} kernels per call)")


def _reference(ei: dict) -> str:
    if ei.get("reference") is None:
        return "-"
    if ei.get("reference_error"):
        return f"{ei['reference']}: did not run"
    return f"{_fmt(ei.get('pct_of_reference'), '.1f')} % of {ei['reference']}"


def _verdict(ei: dict) -> str:
    if ei.get("target_pct") is None:
        return "-"
    if ei.get("judged") is False:
        return "not judged (smoke)"
    met = ei.get("met")
    return "met" if met else ("missed" if met is False else "no reference")


def _row(bench: dict) -> str:
    ei = bench["extra_info"]
    wall_ms = bench["stats"]["median"] * 1e3
    check = f" (rel. err {ei['rel_err']:.1e})" if ei.get("rel_err") is not None else ""
    target = f">= {ei['target_pct']:.0f} %" if ei.get("target_pct") is not None else "-"
    return (f"| {ei.get('kernel', bench['name'])}{check} | {ei.get('backend', '?')} | "
            f"{ei.get('shape', '?')} {ei.get('dtype', '')} | "
            f"{_fmt(ei.get('device_ms_median'), '.4f')} | {wall_ms:.4f} | {_rate(ei)} | "
            f"{_reference(ei)} | {target} | {_verdict(ei)} |")


def _header(data: dict) -> list[str]:
    tl = data.get("tealite", {})
    env = tl.get("environment", {})
    benches = data.get("benchmarks", [])
    first = benches[0]["extra_info"] if benches else {}
    lines = [f"# tealite benchmarks: {env.get('gpu') or env.get('cpu') or 'unknown device'}", ""]
    hw = []
    if env.get("gpu"):
        l2 = env.get("l2_bytes")
        hw.append(f"GPU {env['gpu']} ({env.get('sm_count')} SMs"
                  + (f", L2 {l2 / 2**20:.0f} MiB" if l2 else "") + ")")
        hw.append(f"driver {env.get('driver') or 'unknown'}")
    else:
        hw.append(f"no GPU ({env.get('cpu', 'cpu')}): smoke mode, wall-clock timing")
    if env.get("cuda"):
        hw.append(f"CUDA {env['cuda']}")
    if env.get("hip"):
        hw.append(f"HIP {env['hip']}")
    hw += [f"torch {env.get('torch')}", f"triton {env.get('triton')}",
           f"Python {env.get('python')}"]
    if env.get("triton_interpret"):
        hw.append("TRITON_INTERPRET=1")
    lines.append(", ".join(hw) + f"; {data.get('datetime', '')}.")
    lines.append("")
    copy_gbps = next((b["extra_info"].get("reference_value") for b in benches
                      if b["extra_info"].get("reference") == "device copy"), None)
    lines.append(f"Size: {first.get('size', '?')}; device copy bandwidth this run: "
                 f"{_fmt(copy_gbps, '.0f', '?')} GB/s (bytes read + written).  Device ms = "
                 f"median of {first.get('reps', '?')} {first.get('timer', '?')} repetitions, "
                 "L2 flushed between them; wall ms = pytest-benchmark median of op + device "
                 "sync.  Bandwidth counts input read once + outputs written once.")
    aiter = env.get("aiter")
    lines.append("")
    lines.append("AITER: " + ("; ".join(aiter) if aiter else "not loaded (rows skipped)"))
    for note in env.get("aiter_notes") or []:
        lines.append(f"- {note}")
    return lines


def render(data: dict) -> str:
    lines = _header(data)
    benches = data.get("benchmarks", [])
    head = ("| kernel | backend | shape | device ms | wall ms | rate | vs reference | target "
            "| verdict |\n|---|---|---|---|---|---|---|---|---|")
    groups = list(GROUPS) + sorted({b["extra_info"].get("group", "?") for b in benches}
                                   - set(GROUPS))
    for group in groups:
        rows = [b for b in benches if b["extra_info"].get("group") == group]
        if rows:
            lines += ["", f"## {group}", "", head] + [_row(b) for b in rows]
    targeted = [b["extra_info"] for b in benches if b["extra_info"].get("target_pct") is not None]
    if targeted:
        lines += ["", "## Issue-4 targets", ""]
        for ei in targeted:
            lines.append(f"- {ei['kernel']} ({ei['backend']}): {_reference(ei)}, target >= "
                         f"{ei['target_pct']:.0f} %: **{_verdict(ei)}**{_kernels_alone(ei)}")
    tl = data.get("tealite", {})
    if tl.get("skipped"):
        lines += ["", "## Not run", ""]
        lines += [f"- `{s['test']}`: {s['reason']}" for s in tl["skipped"]]
    if tl.get("failed"):
        lines += ["", "## Failed", ""]
        lines += [f"- `{f['test']}` ({f['phase']}): {f['error']}" for f in tl["failed"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="pytest-benchmark JSON (--benchmark-json) of benchmarks/")
    ap.add_argument("-o", "--output", help="Markdown file to write (default: stdout)")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        text = render(json.load(f))
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
