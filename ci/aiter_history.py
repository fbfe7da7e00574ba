#!/usr/bin/env python3
"""Run the AITER gate over AITER's tagged history and tabulate the verdicts.

    ci/aiter_history.py --cache /path/to/exports [--tags v0.1.8 v0.1.9 ...] --out DIR
                        [--baseline ci/baselines/aiter-gate-cpu-interpreter.json]
                        [--device cpu|cuda] [--jobs 2]

``--cache`` holds one ``ci/aiter_source.sh TAG DIR`` export per tag (``DIR = cache/TAG``).
For every tag it runs, each gate command in its own process (one process holds one AITER):

* ``pinned -> TAG``: ``gate compare`` of the committed baseline against the tag;
* ``TAG capture``: a baseline captured on the tag itself (the next bump's baseline);
* ``PREV -> TAG``: ``gate compare`` of the previous tag's capture against the tag.

It writes ``DIR/history.json`` (every verdict, exit code, per-entry-point status and wall
time) and ``DIR/history.md`` (the tables docs/aiter-history.md quotes), plus each report.
Wall times are the benchmark of issue 12 (gate time per candidate on the machine it ran on).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINNED = REPO / "ci" / "baselines" / "aiter-gate-cpu-interpreter.json"


def _tag_key(tag: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\-]|post", tag.lstrip("v")))


def _gate(args: list[str], device: str, log: Path) -> tuple[int, float]:
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", PYTHONUNBUFFERED="1")
    env.pop("TEALITE_AITER_PATH", None)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    t = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "tealite_verify", "gate", *args], cwd=REPO,
                            env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - t


def _summary(report: Path) -> dict:
    try:
        js = json.loads(report.read_text())
    except (OSError, ValueError):
        return {"entry_points": {}, "regressions": [], "harness": [], "error": "no report"}
    return {"entry_points": {e["entry_point"]: e["verdict"]
                             for e in js.get("entry_points", [])},
            "regressions": [f"{f['kind']}: {f['where']}" for f in js.get("regressions", [])],
            "harness": [f"{f['kind']}: {f['where']}" for f in js.get("harness_problems", [])],
            "error": js.get("error")}


def compare(baseline: Path, tree: Path, out: Path, name: str, device: str) -> dict:
    args = ["compare", "--baseline", str(baseline), "--aiter", str(tree), "--markdown",
            str(out / f"{name}.md"), "--json", str(out / f"{name}.json")]
    if device != "cpu":
        args += ["--device", device]
    rc, secs = _gate(args, device, out / f"{name}.log")
    return {"run": name, "exit": rc, "seconds": round(secs, 1),
            **_summary(out / f"{name}.json")}


def capture(tree: Path, out: Path, tag: str, device: str) -> dict:
    path = out / f"capture-{tag}.json"
    rc, secs = _gate(["capture", "--aiter", str(tree), "--out", str(path), "--device", device],
                     device, out / f"capture-{tag}.log")
    return {"run": f"capture {tag}", "exit": rc, "seconds": round(secs, 1),
            "baseline": str(path) if rc == 0 else None}


def _per_tag(tag: str, cache: Path, out: Path, baseline: Path, device: str) -> dict:
    tree = cache / tag
    return {"tag": tag, "pinned": compare(baseline, tree, out, f"pinned-to-{tag}", device),
            "capture": capture(tree, out, tag, device)}


def _table(rows: list[list], header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def _verdict_text(r: dict) -> str:
    eps = r.get("entry_points", {})
    changed = {k: v for k, v in eps.items() if v != "unchanged"}
    text = ", ".join(f"{k}: {v}" for k, v in sorted(changed.items())) or "all unchanged"
    return text if not r.get("error") else f"{r['error']}"


def markdown(doc: dict) -> str:
    lines = [f"Machine: {doc['machine']}; device {doc['device']}; baseline {doc['baseline']}",
             "", "### Pinned baseline -> each tag", ""]
    lines += _table([[t["tag"], t["pinned"]["exit"], t["pinned"]["seconds"],
                      _verdict_text(t["pinned"])] for t in doc["tags"]],
                    ["candidate", "exit", "s", "entry points not unchanged"])
    lines += ["", "### Consecutive bumps (previous tag's own capture -> tag)", ""]
    lines += _table([[b["from"], b["to"], b["exit"], b["seconds"], _verdict_text(b)]
                     for b in doc["bumps"]],
                    ["from", "to", "exit", "s", "entry points not unchanged"])
    lines += ["", "### Captures", ""]
    lines += _table([[t["tag"], t["capture"]["exit"], t["capture"]["seconds"]]
                     for t in doc["tags"]], ["tag", "exit", "s"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tags", nargs="*", help="default: every directory in --cache")
    p.add_argument("--baseline", type=Path, default=PINNED)
    p.add_argument("--device", default="cpu")
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    tags = sorted(a.tags or [d.name for d in a.cache.iterdir()
                             if (d / "aiter" / "ops" / "triton").is_dir()], key=_tag_key)
    missing = [t for t in tags if not (a.cache / t / "aiter").is_dir()]
    if missing:
        print(f"--cache: no export for {missing} (ci/aiter_source.sh TAG {a.cache}/TAG)",
              file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        per_tag = list(ex.map(lambda t: _per_tag(t, a.cache, a.out, a.baseline, a.device),
                              tags))

    def bump(prev: dict, cur: dict) -> dict:
        base = prev["capture"].get("baseline")
        if base is None:
            return {"from": prev["tag"], "to": cur["tag"], "exit": "-", "seconds": 0,
                    "entry_points": {}, "error": f"no capture of {prev['tag']}"}
        r = compare(Path(base), a.cache / cur["tag"], a.out,
                    f"{prev['tag']}-to-{cur['tag']}", a.device)
        return {"from": prev["tag"], "to": cur["tag"], **r}

    with cf.ThreadPoolExecutor(a.jobs) as ex:
        bumps = list(ex.map(lambda i: bump(per_tag[i - 1], per_tag[i]),
                            range(1, len(per_tag))))
    doc = {"machine": f"{platform.node()} {platform.processor() or platform.machine()} "
                      f"{os.cpu_count()} cores", "device": a.device,
           "baseline": str(a.baseline), "tags": per_tag, "bumps": bumps}
    (a.out / "history.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out / "history.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
