"""Running ``python -m tealite_verify fuzz`` / ``replay`` in subprocesses for the fuzz tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXTERNAL = Path(__file__).parent / "external"
ROOT = Path(__file__).parent.parent


def env_with(plugins: str | None = None, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXTERNAL), env.get("PYTHONPATH")) if p)
    env.pop("TEALITE_BACKEND_MODULES", None)
    env.pop("TEALITE_FINDINGS", None)
    if plugins:
        env["TEALITE_BACKEND_MODULES"] = plugins
    env.update(extra)
    return env


def fuzz_args(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tealite_verify", "fuzz", "--corpus", str(tmp / "corpus"),
            "--json", str(tmp / "report.json"), "--markdown", str(tmp / "report.md"), *args]


def run_fuzz(tmp: Path, *args: str, env: dict, timeout: float = 240):
    return subprocess.run(fuzz_args(tmp, *args), env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def report(tmp: Path) -> dict:
    return json.loads((tmp / "report.json").read_text())


def stored(tmp: Path) -> dict[str, dict]:
    """Finding files in the campaign's corpus: {file name: finding JSON}."""
    return {p.name: json.loads(p.read_text()) for p in sorted((tmp / "corpus").glob("*.json"))}


REQUIRED = ("kind", "op", "backends", "output", "case", "device", "detail", "metrics",
            "versions", "seed", "repro", "signature", "count", "first_seen", "last_seen",
            "recipe", "dtype", "shape")


def assert_complete(f: dict) -> None:
    missing = [k for k in REQUIRED if k not in f]
    assert not missing, f"finding lacks {missing}: {f}"
    assert f["repro"].split("python -m tealite_verify replay ", 1)[1], f["repro"]
    assert f["versions"].get("torch") and "python" in f["versions"]
    assert f["case"] and f["backends"] and f["op"]
