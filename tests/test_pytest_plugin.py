"""The pytest plug-in (tealite_verify/pytest_plugin.py), used as a kernel team would use it:
examples/mykernels installed (offline, into a temporary directory, never into this venv), then
``pytest --tealite-backend mykernels -m differential`` run in an empty directory.  The
deliberately wrong op (act_fwd's gelu computed with the tanh approximation) fails in every
dtype with a repro command that reproduces in a fresh process; the correct ops pass; stored
findings replay on the backend.  Without its options the plug-in adds nothing and imports
nothing of the harness.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tealite_verify import pytest_plugin
from tealite_verify.fuzz import findings as fz
from tealite_verify.specs import get_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mykernels"
PLUGIN = ["-p", "tealite_verify.pytest_plugin"]
# What a caller's environment may set that would change what the child runs or judges.
_CLEARED = ("TRITON_INTERPRET", "TEALITE_FINDINGS", "TEALITE_BACKEND_MODULES",
            "TEALITE_VERIFY_DEVICE", "PYTEST_ADDOPTS", "TEALITE_COVERAGE_FILE")


def _env(*paths: Path) -> dict:
    """The child's environment: this checkout (and ``paths``) importable, the ci profile,
    no Triton interpreter (the peers are then the backends that run natively on the CPU)."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*paths, ROOT))
    env["HYPOTHESIS_PROFILE"] = "ci"
    return env


def _pytest(cwd: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """examples/mykernels installed with pip into a fresh directory: no network (--no-index),
    no dependencies, the build backend of this environment (its entry point then lives in
    the directory's dist-info, where tealite's registry finds it on sys.path)."""
    if not _can_build_offline():
        pytest.skip("no setuptools >= 70.1 (or setuptools with wheel) here: pip cannot build "
                    "examples/mykernels offline (--no-build-isolation)")
    tmp = tmp_path_factory.mktemp("mykernels")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src)  # the build writes build/ and egg-info beside the sources
    target = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-index", "--no-build-isolation", "--target", str(target),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "mykernels" / "tealite_plugin.py").is_file()
    return target


def _can_build_offline() -> bool:
    """Whether this environment can build a wheel without fetching anything: setuptools,
    with bdist_wheel built in (70.1 on) or the wheel package beside it."""
    from importlib import metadata
    try:
        version = tuple(int(p) for p in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _findings(root: Path) -> None:
    """Two stored findings (recorded against torch): a gelu case, which mykernels gets
    wrong, and an rmsnorm case, which it gets right."""
    corpus = fz.Corpus(root)
    gelu = dict(get_spec("act_fwd").smoke_cases[0], dtype="float32")
    assert gelu["kind"] == "gelu"
    corpus.add(fz.new_finding("mismatch", "act_fwd", ["torch"], gelu, "cpu", output="y"))
    rms = get_spec("rmsnorm_fwd").smoke_cases[0]
    corpus.add(fz.new_finding("mismatch", "rmsnorm_fwd", ["torch"], rms, "cpu", output="y"))


def _outcomes(stdout: str) -> dict[str, str]:
    """item name -> PASSED / FAILED / SKIPPED, from the -v progress lines."""
    return dict(re.findall(r"^tealite::(\S+) (PASSED|FAILED|SKIPPED)", stdout, re.M))


def test_the_plugin_catches_the_wrong_op_of_an_installed_backend(installed, tmp_path):
    work = tmp_path / "repo"  # the kernel team's repository: no test file, no conftest
    work.mkdir()
    _findings(tmp_path / "corpus")
    r = _pytest(work, *PLUGIN, "--tealite-backend", "mykernels", "-m", "differential",
                f"--tealite-findings={tmp_path / 'corpus'}", "-v", "-rs", env=_env(installed))
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-4000:]
    got = _outcomes(r.stdout)
    dtypes = ("float32", "bfloat16", "float16")
    finding = {f.op: f"finding[mykernels-{p.stem}]"
               for p, f in fz.Corpus(tmp_path / "corpus").all()}
    assert got == {
        **{f"differential[act_fwd-mykernels-{dt}]": "FAILED" for dt in dtypes},
        **{f"differential[rmsnorm_fwd-mykernels-{dt}]": "PASSED" for dt in dtypes},
        "differential[gemm-mykernels-float32]": "PASSED",
        # mykernels' GEMM declares float32 only: skipped with that reason, never passed
        "differential[gemm-mykernels-bfloat16]": "SKIPPED",
        "differential[gemm-mykernels-float16]": "SKIPPED",
        finding["act_fwd"]: "FAILED", finding["rmsnorm_fwd"]: "PASSED",
    }, r.stdout[-6000:]
    assert "dtype bfloat16 not in ['float32']" in r.stdout
    assert "FAIL mykernels vs reference [y]" in r.stdout and "FAIL torch" not in r.stdout
    repros = [line.split("repro: ", 1)[1] for line in r.stdout.splitlines()
              if "repro: " in line]
    assert len(repros) == 4 and all("--op act_fwd" in c and "--backend mykernels" in c
                                    and c.endswith("# needs: pip install mykernels")
                                    for c in repros), repros
    # The repro command, as printed, reproduces the failure in a fresh process.
    words = shlex.split(repros[0], comments=True)
    rr = subprocess.run([sys.executable, *words[words.index("-m"):]], cwd=work,
                        env=_env(installed), capture_output=True, text=True, timeout=300)
    assert rr.returncode == 1 and "FAIL mykernels vs reference" in rr.stdout, rr.stdout


def test_the_plugin_is_inert_without_its_options(tmp_path):
    """Loaded without --tealite-backend: no item added, and neither torch nor the harness
    imported (the probe fails if they are: with the options given, the run imports both)."""
    (tmp_path / "test_probe.py").write_text(
        "import sys\n\n\ndef test_probe():\n"
        "    assert 'torch' not in sys.modules, 'the plug-in imported torch'\n"
        "    assert not [m for m in sys.modules if m.startswith('tealite') and m not in\n"
        "                ('tealite_verify', 'tealite_verify.pytest_plugin')], 'harness'\n")
    r = _pytest(tmp_path, *PLUGIN, "-v", env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.findall(r"^\S+::\S+", r.stdout, re.M) == ["test_probe.py::test_probe"]
    active = _pytest(tmp_path, *PLUGIN, "--tealite-backend", "torch", "--tealite-op", "amax",
                     "--tealite-dtype", "float32", "-v", env=_env())
    assert re.findall(r"^(\S+::\S+) (\w+)", active.stdout, re.M) == [
        ("test_probe.py::test_probe", "FAILED"),
        ("tealite::differential[amax-torch-float32]", "PASSED")], active.stdout


class _Options:
    """A parsed command line as the plug-in reads it (``config.getoption``)."""

    def __init__(self, **given):
        self.given = given

    def getoption(self, dest):
        return self.given.get(dest, [] if dest in _REPEATED else None)


_REPEATED = ("tealite_backend", "tealite_op", "tealite_dtype", "tealite_peer")


@pytest.mark.parametrize("given,message", [
    ({"tealite_backend": ["nosuch"]}, "--tealite-backend 'nosuch': no such backend"),
    ({"tealite_backend": ["torch"], "tealite_op": ["gemmm"]}, "--tealite-op 'gemmm': no such op"),
    ({"tealite_backend": ["sdpa"], "tealite_op": ["gemm"]},
     "--tealite-op 'gemm': backend(s) ['sdpa'] do not implement it"),
    ({"tealite_backend": ["torch"], "tealite_dtype": ["fp32"]}, "--tealite-dtype 'fp32': must be"),
    ({"tealite_backend": ["torch"], "tealite_device": "gpu"}, "--tealite-device 'gpu': must be"),
    ({"tealite_backend": ["torch"], "tealite_peer": ["nosuch"]}, "--tealite-peer 'nosuch'"),
    ({"tealite_backend": ["torch"], "tealite_findings": "/nonexistent"},
     "--tealite-findings '/nonexistent': not a directory"),
])
def test_bad_options_are_refused_by_name(given, message):
    with pytest.raises(pytest.UsageError, match=re.escape(message)):
        pytest_plugin._selection(_Options(**given))


def test_options_without_a_backend_are_refused():
    with pytest.raises(pytest.UsageError, match="--tealite-op, --tealite-peer need "
                                                "--tealite-backend"):
        pytest_plugin._refuse_orphan_options(_Options(tealite_op=["gemm"],
                                                      tealite_peer=["torch"]))
    pytest_plugin._refuse_orphan_options(_Options())  # nothing given: nothing to refuse


def test_a_good_selection_is_read():
    sel = pytest_plugin._selection(_Options(tealite_backend=["torch"], tealite_op=["gemm"],
                                            tealite_peer=["none"], tealite_device="cuda:1"))
    assert (sel.backends, sel.ops, sel.dtypes, sel.device, sel.peers) == \
        (("torch",), ("gemm",), (), "cuda:1", ())
