"""Backends from outside the package: discovery (env var and entry point), and the harness
reporting a deliberately wrong one with a repro that reproduces."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

EXTERNAL = Path(__file__).parent / "external"
ROOT = Path(__file__).parent.parent


def _run(args, env_extra, cwd=ROOT):
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(EXTERNAL), *env_extra.get("PYTHONPATH", "").split(os.pathsep)]).strip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "tealite_verify", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_env_var_plugin_is_listed():
    r = _run(["list"], {"TEALITE_BACKEND_MODULES": "wrong_gemm_backend"})
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0]
    assert "wrong_gemm" in header and "torch" in header


def test_broken_plugin_is_reported_not_swallowed():
    r = _run(["list"], {"TEALITE_BACKEND_MODULES": "no_such_plugin_module"})
    assert "no_such_plugin_module" in r.stderr and "ModuleNotFoundError" in r.stderr


def test_entry_point_plugin_is_discovered(tmp_path):
    dist = tmp_path / "wrong_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wrong-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tealite.backends]\nwrong = wrong_gemm_backend\n")
    r = _run(["list"], {"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "wrong_gemm" in r.stdout.splitlines()[0]


def test_wrong_external_backend_is_reported_with_working_repro():
    env = {"TEALITE_BACKEND_MODULES": "wrong_gemm_backend"}
    r = _run(["run", "--op", "gemm", "--examples", "6"], env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL wrong_gemm vs reference" in r.stderr
    assert "FAIL torch vs wrong_gemm" in r.stderr or "FAIL wrong_gemm vs torch" in r.stderr
    assert "ok   torch vs reference" in r.stderr  # the correct backend is not blamed
    repro = next(line.split("repro: ", 1)[1] for line in r.stderr.splitlines()
                 if "repro: " in line and "wrong_gemm" in line)
    words = shlex.split(repro)
    assert words[0] == "TEALITE_BACKEND_MODULES=wrong_gemm_backend"
    rr = _run(words[words.index("-m") + 2:], env)
    assert rr.returncode == 1
    assert "FAIL wrong_gemm vs reference" in rr.stdout
