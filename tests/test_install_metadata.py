"""tealite installs into the user's torch stack, not ours (issue 18).

pyproject.toml declares torch and triton as ranges that admit the versions the code runs on
(torch 2.11 + triton 3.6 on the lent GPUs, 2.13 + 3.9 in CI); the exact CPU builds CI installs
live in ci/constraints-cpu.txt.  And pip, asked to install the project's real metadata (a wheel
setuptools builds from pyproject.toml) into an environment that already holds another torch,
keeps it although the index offers CI's: ``pip install --dry-run --report`` into a throwaway
venv whose site-packages hold stand-in ``*.dist-info`` records (pip decides from metadata
alone, so no torch is downloaded or installed), read by ci/pip_report.py.  Under the old hard
pin ``torch==2.13.0`` the same check reports torch replaced (the negative control).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11's "
                                                "tomllib")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "ci" / "constraints-cpu.txt"
RANGED = ("torch", "triton")
# The versions each ranged package must admit: GPU images' (torch 2.11's CUDA build and the
# triton 3.6 it requires), CI's CPU builds, ROCm builds of the kind the issue names (a release,
# a nightly: a pre-release of the next version).
NIGHTLY = "2.12.0.dev20260115+rocm7.1"
MUST_ADMIT = {"torch": ("2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.10.0+rocm7.0", NIGHTLY),
              "triton": ("3.6.0", "3.9.0")}


def _load_report_checker():
    spec = importlib.util.spec_from_file_location("ci_pip_report", ROOT / "ci" / "pip_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pip_report = _load_report_checker()


def with_old_pin(pyproject_text: str) -> str:
    """The text with the core torch requirement put back to the pin before issue 18."""
    text, n = re.subn(r'"torch\s*[<>=~!][^"]*"', '"torch==2.13.0"', pyproject_text)
    assert n == 1, f"expected one torch requirement in pyproject.toml, found {n}"
    return text


# ---- the declared ranges -------------------------------------------------------------------

def requirements(project: dict) -> dict[str, list[Requirement]]:
    """Every requirement of ``[project]``, by where it is declared (``""``: the core list)."""
    groups = {"": project.get("dependencies", [])}
    groups.update(project.get("optional-dependencies", {}))
    return {where: [Requirement(r) for r in reqs] for where, reqs in groups.items()}


def range_problems(project: dict) -> list[str]:
    """Why the ranged packages' declarations would not keep a user's torch / triton: an exact
    pin, or a range excluding a version the code runs on.  Empty when they are fine."""
    out = []
    for where, reqs in requirements(project).items():
        for req in (r for r in reqs if r.name in RANGED):
            label = f"{req} ({'dependencies' if not where else f'extra {where!r}'})"
            if any(s.operator in ("==", "===") for s in req.specifier):
                out.append(f"{label}: an exact pin, not a range")
            out += [f"{label}: excludes {v}" for v in MUST_ADMIT[req.name]
                    if not req.specifier.contains(v, prereleases=True)]
    return out


def test_torch_and_triton_are_ranges_admitting_the_gpu_and_ci_versions():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = {r.name for reqs in requirements(project).values() for r in reqs}
    assert set(RANGED) <= declared
    assert range_problems(project) == []


def test_the_range_check_catches_the_old_hard_pin():
    project = tomllib.loads(with_old_pin(PYPROJECT.read_text()))["project"]
    assert range_problems(project) == [
        "torch==2.13.0 (dependencies): an exact pin, not a range",
        "torch==2.13.0 (dependencies): excludes 2.11.0",
        "torch==2.13.0 (dependencies): excludes 2.11.0+cu130",
        "torch==2.13.0 (dependencies): excludes 2.10.0+rocm7.0",
        f"torch==2.13.0 (dependencies): excludes {NIGHTLY}"]


def test_the_test_extra_brings_no_triton():
    """ROCm's torch brings Triton as pytorch-triton-rocm (the same ``triton`` package): an extra
    pulling PyPI's triton would overwrite it for anyone installing the test tools."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert "triton" not in {r.name for r in requirements(project)["test"]}


def test_the_constraints_pin_ci_builds_inside_the_ranges():
    pins = [Requirement(line) for line in CONSTRAINTS.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert {p.name: str(p.specifier) for p in pins} == {"torch": "==2.13.0+cpu",
                                                         "triton": "==3.9.0"}
    declared = {r.name: r for reqs in requirements(
        tomllib.loads(PYPROJECT.read_text())["project"]).values() for r in reqs}
    for pin in pins:
        version = next(iter(pin.specifier)).version
        assert declared[pin.name].specifier.contains(version, prereleases=True), pin


# ---- what pip does with the real metadata --------------------------------------------------

def _metadata(name: str, version: str) -> str:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"


def _hold(site: Path, name: str, version: str) -> None:
    """A stand-in installed distribution: pip reads the dist-info, never the package."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_metadata(name, version))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _offer(index: Path, name: str, version: str) -> None:
    """A stand-in wheel on the local index (metadata only)."""
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(index / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", _metadata(name, version))
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tealite-test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def _project_wheel(tmp: Path, pyproject_text: str) -> Path:
    """The project's wheel, built by setuptools from ``pyproject_text`` (its packages empty:
    only the metadata matters to pip's resolver)."""
    setuptools = pytest.importorskip("setuptools", reason="building the metadata needs "
                                                          "setuptools (the build backend)")
    if Version(setuptools.__version__) < Version("68"):
        pytest.skip(f"setuptools {setuptools.__version__} is older than pyproject's >= 68")
    src = tmp / "src"
    for pkg in ("tealite", "tealite_verify"):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "__init__.py").write_text("")
    (src / "pyproject.toml").write_text(pyproject_text)
    (src / "README.md").write_text("tealite\n")
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", build, str(tmp / "dist")], cwd=src,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "dist" / done.stdout.strip().splitlines()[-1]


def _dry_run(tmp: Path, wheel: Path, extras: str, held: dict[str, str],
             offered: dict[str, str]) -> dict:
    """pip's report for installing ``wheel[extras]`` into a fresh venv holding ``held``, with
    ``offered`` (and nothing else: --no-index, no config) on the index."""
    pip_version = Version(subprocess.run([sys.executable, "-m", "pip", "--version"],
                                         capture_output=True, text=True).stdout.split()[1])
    if pip_version < Version("22.3"):
        pytest.skip(f"pip {pip_version} has no --python (22.3+) to install into another venv")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    for name, version in held.items():
        _hold(site, name, version)
    index = tmp / "index"
    index.mkdir()
    for name, version in offered.items():
        _offer(index, name, version)
    # The machine's pip configuration (constraints, find-links, indexes) stays out of it.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    report = tmp / "report.json"
    spec = f"tealite{extras} @ {wheel.as_uri()}"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--dry-run", "--quiet", "--report", str(report),
                           "--no-index", "--find-links", str(index), spec],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(report.read_text())


# The tools a dry run installs, each with no dependencies of its own here.
_BASE = {"numpy": "2.1.0", "ml_dtypes": "0.5.1", "hypothesis": "6.120.0"}
# What the index offers: CI's builds of torch / triton (newer than the stacks' ones) and tools.
_INDEX = {"torch": "2.13.0", "triton": "3.9.0", "pytest": "8.3.0", "pytest_benchmark": "5.1.0",
          "matplotlib": "3.9.0"}
STACKS = {
    # a CUDA stack as on the lent GPUs: torch 2.11 with the triton it requires
    "cuda-torch-2.11": ("[triton]", {"torch": "2.11.0", "triton": "3.6.0", **_BASE}),
    # a ROCm nightly: its Triton is pytorch-triton-rocm, so no triton extra
    "rocm-nightly": ("[test]", {"torch": NIGHTLY,
                                "pytorch_triton_rocm": "3.4.0", **_BASE}),
}


@pytest.fixture(scope="module")
def project_wheel(tmp_path_factory):
    return _project_wheel(tmp_path_factory.mktemp("build"), PYPROJECT.read_text())


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_pip_keeps_the_installed_torch(stack, project_wheel, tmp_path):
    extras, held = STACKS[stack]
    report = _dry_run(tmp_path, project_wheel, extras, held, _INDEX)
    assert pip_report.replaced(report, held) == []
    assert "tealite" in pip_report.installs(report)
    assert "triton" not in pip_report.installs(report)


def test_pip_replaces_the_installed_torch_under_the_old_pin(tmp_path):
    extras, held = STACKS["cuda-torch-2.11"]
    wheel = _project_wheel(tmp_path / "build", with_old_pin(PYPROJECT.read_text()))
    report = _dry_run(tmp_path, wheel, extras, held, _INDEX)
    assert pip_report.replaced(report, held) == ["torch 2.11.0 -> 2.13.0"]


def test_the_report_checker_cli(tmp_path, capsys):
    report = {"version": "1", "install": [{"metadata": {"name": "Torch", "version": "2.13.0"}},
                                          {"metadata": {"name": "tealite", "version": "0.1.0"}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert pip_report.main([str(path), "triton=3.6.0"]) == 0
    assert pip_report.main([str(path), "torch=2.11.0"]) == 1
    assert "REPLACED: torch 2.11.0 -> 2.13.0" in capsys.readouterr().out
    assert pip_report.main([str(path), "torch"]) == 2
    assert "expected NAME=VERSION" in capsys.readouterr().err
    with pytest.raises(ValueError, match="version None"):
        pip_report.installs({"install": []})
