"""Run a kernel-compiling script in a fresh process without ``TRITON_INTERPRET`` (CI has no GPU:
Triton cross-compiles for sm_90 / gfx942 there, and the interpreter forgives what a compiled
kernel does not).  The script prints one JSON value; the tests assert on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compiled_json(script: str, timeout: int = 300):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
