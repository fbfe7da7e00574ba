"""ci/aiter_source.sh on a small local git repository shaped like ROCm/aiter: it exports a
tag's aiter/ tree with its AITER_SOURCE record, reuses an identical export, and refuses bad
input with one clear error naming it (exit 2)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "ci" / "aiter_source.sh"
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def clone(tmp_path):
    repo = tmp_path / "aiter-clone"
    (repo / "aiter" / "ops" / "triton").mkdir(parents=True)
    (repo / "aiter" / "ops" / "triton" / "quant.py").write_text("def dynamic_mxfp4_quant(x):\n"
                                                                "    return x\n")
    (repo / "csrc").mkdir()
    (repo / "csrc" / "kernel.cu").write_text("// not exported\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    _git(repo, "tag", "v0.1.7.post2")
    (repo / "README.md").write_text("no aiter tree in this tag\n")
    _git(repo, "rm", "-rq", "aiter")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "two")
    _git(repo, "tag", "not-aiter")
    return repo


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)


def test_a_tag_is_exported_with_its_record(clone, tmp_path):
    dest = tmp_path / "cache" / "v0.1.7.post2"
    r = _run("v0.1.7.post2", str(dest), str(clone))
    assert r.returncode == 0, r.stderr
    assert (dest / "aiter/ops/triton/quant.py").read_text().startswith("def dynamic_mxfp4")
    assert not (dest / "csrc").exists()  # only aiter/
    record = dict(line.split("=", 1) for line in (dest / "AITER_SOURCE").read_text().split())
    assert record["tag"] == "v0.1.7.post2" and record["version"] == "0.1.7.post2"
    assert record["commit"] == _git(clone, "rev-parse", "v0.1.7.post2^{commit}")
    again = _run("v0.1.7.post2", str(dest), str(clone))  # an identical export is reused
    assert again.returncode == 0 and again.stdout.strip() == str(dest)


@pytest.mark.parametrize("args,needle", [
    (("no-such-tag", "{dest}", "{clone}"), "TAG no-such-tag is not a tag"),
    (("not-aiter", "{dest}", "{clone}"), "has no aiter/ops/triton"),
    (("v0.1.7.post2", "{dest}", "{tmp}"), "is not a git repository"),
    (("v0.1.7.post2",), "usage"),
])
def test_bad_input_is_one_clear_error(clone, tmp_path, args, needle):
    fill = {"dest": str(tmp_path / "out"), "clone": str(clone), "tmp": str(tmp_path / "x")}
    (tmp_path / "x").mkdir()
    r = _run(*(a.format(**fill) for a in args))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_occupied_directory_is_not_overwritten(clone, tmp_path):
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    r = _run("v0.1.7.post2", str(dest), str(clone))
    assert r.returncode == 2 and "remove it first" in r.stderr
    assert (dest / "mine.txt").read_text() == "keep"
