#!/usr/bin/env python3
"""The false-alarm campaign's summary (ci/false_alarm_campaign.sh): reads the fuzz JSON report,
writes campaign.json + campaign.md (command, machine, cases, cases/s, backends that ran per op,
findings) and exits with the campaign's status: 0 = the wanted cases with 0 findings, 1 =
findings, 3 = fewer cases than wanted (the time cap came first), 130 = interrupted, 2 = the
fuzz failed otherwise."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

OK, FINDINGS, ERROR, SHORT, INTERRUPTED = 0, 1, 2, 3, 130


def verdict(totals: dict, wanted: int, fuzz_status: int, interrupted: bool) -> tuple[int, str]:
    """(exit status, one line) for a campaign's totals."""
    if totals.get("findings"):
        return FINDINGS, (f"{totals['findings']} finding(s): each is a false alarm to fix in "
                          "the tiers or a backend bug to report")
    if interrupted or fuzz_status == INTERRUPTED:
        return INTERRUPTED, f"interrupted after {totals.get('cases', 0)} cases"
    if fuzz_status not in (0, 1):
        return ERROR, f"the fuzz exited with status {fuzz_status}"
    if totals.get("cases", 0) < wanted:
        return SHORT, (f"only {totals.get('cases', 0)} of {wanted} cases before the time cap "
                       "(raise MAX_MINUTES or WORKERS)")
    return OK, f"{totals['cases']} cases, 0 findings"


def backends_that_ran(doc: dict) -> dict[str, dict[str, int]]:
    """{op: {backend: cases it ran}} from the report's op x backend table."""
    out: dict[str, dict[str, int]] = {}
    for row in doc.get("table", []):
        out.setdefault(str(row.get("op")), {})[str(row.get("backend"))] = int(row.get("cases")
                                                                              or 0)
    return out


def machine() -> dict:
    """What the campaign ran on (recorded with its numbers)."""
    info = {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "cpu": _cpu_model(), "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
            "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "")}
    try:
        import torch
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i)
                            for i in range(torch.cuda.device_count())]
    except Exception as exc:  # the summary must not fail on a broken torch: say so instead
        info["gpus"] = f"unknown ({type(exc).__name__})"
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summarize(doc: dict, *, device: str, wanted: int, seed: int, fuzz_status: int,
              command: str, host: dict) -> dict:
    t = doc.get("totals", {})
    status, line = verdict(t, wanted, fuzz_status, bool(doc.get("interrupted")))
    return {"status": status, "verdict": line, "command": command, "device": device,
            "seed": seed, "cases_wanted": wanted, "cases": t.get("cases", 0),
            "elapsed_s": t.get("elapsed_s", 0.0), "cases_per_s": t.get("cases_per_s", 0.0),
            "findings": t.get("findings", 0), "crashes": t.get("crashes", 0),
            "hangs": t.get("hangs", 0), "workers": (doc.get("config") or {}).get("workers"),
            "machine": host, "versions": doc.get("versions", {}),
            "ran": backends_that_ran(doc), "notes": doc.get("notes", []),
            "found": [{k: f.get(k) for k in ("kind", "op", "backends", "output", "detail",
                                              "path")} for f in doc.get("findings", [])]}


def markdown(s: dict) -> str:
    m, v = s["machine"], s["versions"]
    gpus = ", ".join(m["gpus"]) if isinstance(m.get("gpus"), list) else m.get("gpus", "none")
    lines = [f"### False-alarm campaign ({s['device']}): {s['verdict']}", "",
             f"`{s['command']}`", "",
             "| seed | cases | wanted | elapsed | cases/s | workers | findings | crashes | hangs |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| {s['seed']} | {s['cases']} | {s['cases_wanted']} | {s['elapsed_s']:.0f} s | "
             f"{s['cases_per_s']:.1f} | {s['workers'] or 'default'} | {s['findings']} | "
             f"{s['crashes']} | {s['hangs']} |", "",
             f"Machine: {m['cpu']} ({m['cpus']} CPUs), GPUs: {gpus or 'none'}; "
             f"ONEDNN_MAX_CPU_ISA={m['ONEDNN_MAX_CPU_ISA'] or '(unset)'}, "
             f"TRITON_INTERPRET={m['TRITON_INTERPRET'] or '(unset)'}; torch "
             f"{v.get('torch')}, triton {v.get('triton')}, aiter {v.get('aiter')}.", "",
             "| op | backend: cases it ran |", "|---|---|"]
    for op, per in sorted(s["ran"].items()):
        lines.append(f"| {op} | " + ", ".join(f"{b}: {n}" for b, n in sorted(per.items()))
                     + " |")
    for f in s["found"]:
        lines.append(f"\n- **{f['kind']}** {f['op']} ({'/'.join(f['backends'] or [])}) "
                     f"[{f['output']}]: {f['detail']} ({f['path']})")
    lines += [f"\nnote: {n}" for n in s["notes"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--report", required=True, help="the fuzz --json report")
    p.add_argument("--out", required=True, help="directory for campaign.json / campaign.md")
    p.add_argument("--device", required=True)
    p.add_argument("--cases", type=int, required=True, help="cases wanted")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--fuzz-status", type=int, required=True)
    p.add_argument("--command", required=True)
    a = p.parse_args(argv)
    doc = json.loads(Path(a.report).read_text())
    s = summarize(doc, device=a.device, wanted=a.cases, seed=a.seed,
                  fuzz_status=a.fuzz_status, command=a.command, host=machine())
    out = Path(a.out)
    (out / "campaign.json").write_text(json.dumps(s, indent=1, default=str))
    md = markdown(s)
    (out / "campaign.md").write_text(md)
    print(md)
    return s["status"]


if __name__ == "__main__":
    sys.exit(main())
