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
    matrix = r.stdout.split("\nrecipe ", 1)[0]  # the matrix and its backends' lines
    assert "= wrong_gemm " in matrix and "\n  torch " in matrix


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
    assert "= wrong_gemm " in r.stdout.split("\nrecipe ", 1)[0]


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


# ---- implements(op, like=BACKEND): the same support and numerics as another backend --------
import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tealite.numerics import Numerics  # noqa: E402

import tealite  # noqa: E402
from tealite import registry  # noqa: E402


def _torch_gemm(*args, **kwargs):
    return registry.get_backend("torch").impls["gemm"].fn(*args, **kwargs)


def test_like_torch_gets_torchs_support_and_numerics(make_backend):
    plugin = make_backend("like_torch")
    plugin.implements("gemm", like="torch")(_torch_gemm)
    model = registry.get_backend("torch").impls["gemm"]
    assert plugin.impls["gemm"].support == model.support
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for epilogue in (dict(bias=False, gelu=False), dict(bias=True, gelu=True)):
            params = dict(m=64, n=64, k=64, layout="TN", dtype=dtype, out_dtype=dtype,
                          alpha=1.0, beta=0.0, device="cpu", **epilogue)
            assert plugin.impls["gemm"].numerics(params) == model.numerics(params)
    # Through dispatch, on a real call: the plug-in declares what torch declares for the case,
    # probed declarations (subnormal handling of this CPU's bf16 matmul) included.
    a, b = torch.randn(8, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    with registry.trace() as records:
        tealite.gemm(a, b, backend=plugin.name)
    (rec,) = [r for r in records if r.backend == plugin.name]
    assert rec.numerics == model.numerics(rec.params)
    assert plugin.why_unsupported("gemm", dict(rec.params, layout="XX")) == \
        model.support.why_not(dict(rec.params, layout="XX"))


def test_like_evaluates_a_device_dependent_probed_declaration_per_call(make_backend):
    """A model whose numerics depend on the device and on a probe that can change answer:
    the plug-in follows it call by call (shared, never a frozen copy)."""
    probe = {"reduced": True}

    def numerics(p):
        if p["device"] == "cuda" and probe["reduced"]:
            return {"partial_sums_rounded_to": p["dtype"]}
        return {}

    model = make_backend("model")
    model.implements("act_fwd", numerics=numerics)(lambda x, *, kind: x)
    plugin = make_backend("like_model")
    plugin.implements("act_fwd", like=model.name)(lambda x, *, kind: x)
    cpu = dict(kind="gelu", dtype=torch.bfloat16, numel=8, hidden=8, device="cpu")
    cuda = dict(cpu, device="cuda")
    declared = plugin.impls["act_fwd"].numerics
    assert declared(cpu) == Numerics()
    assert declared(cuda) == Numerics(partial_sums_rounded_to=torch.bfloat16)
    probe["reduced"] = False
    assert declared(cuda) == Numerics()


@pytest.mark.parametrize("extra", [dict(dtypes=(torch.float32,)), dict(devices=("cpu",)),
                                   dict(layouts=("TN",)), dict(check=lambda p: None),
                                   dict(numerics={"compute_dtype": torch.float32})])
def test_like_with_other_support_arguments_is_a_type_error_naming_them(make_backend, extra):
    plugin = make_backend("like_extra")
    (name,) = extra
    with pytest.raises(TypeError, match=name):
        plugin.implements("gemm", like="torch", **extra)
    assert "gemm" not in plugin.impls


def test_like_an_unknown_backend_or_an_op_it_lacks_is_a_clear_error(make_backend):
    plugin = make_backend("like_bad")
    with pytest.raises(KeyError, match="no backend named 'no_such_backend'"):
        plugin.implements("gemm", like="no_such_backend")
    with pytest.raises(ValueError, match="backend 'scaled_mm' does not implement 'gemm'"):
        plugin.implements("gemm", like="scaled_mm")
    assert not plugin.impls


# ---- repro commands carry what a fresh process needs to import the plug-in -----------------
def _shell(command: str, pythonpath: str, cwd=ROOT):
    """Run a printed command line as a user would paste it: ``python`` is this venv's, the
    plug-in is importable (installed) but nothing else is set."""
    env = {k: v for k, v in os.environ.items() if k != "TEALITE_BACKEND_MODULES"}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = pythonpath
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def wrong_gemm_in_process(monkeypatch):
    """wrong_gemm registered by importing its module in this process, as a script or test
    would: no $TEALITE_BACKEND_MODULES to copy into a repro command."""
    monkeypatch.delenv("TEALITE_BACKEND_MODULES", raising=False)
    monkeypatch.syspath_prepend(str(EXTERNAL))
    sys.modules.pop("wrong_gemm_backend", None)
    try:
        yield importlib.import_module("wrong_gemm_backend").BACKEND
    finally:
        registry.unregister_backend("wrong_gemm")
        sys.modules.pop("wrong_gemm_backend", None)


def _finding(tmp_path):
    from tealite_verify.fuzz.findings import Corpus
    from tealite_verify.fuzz.worker import classify
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    spec = get_spec("gemm")
    rep = run_case(spec, spec.smoke_cases[0], backends=["wrong_gemm"])  # TN, N = 29, K = 541
    (f,) = classify(rep, "cpu", {"torch": torch.__version__}, seed=0)
    path, _ = Corpus(tmp_path / "corpus").add(f)
    return f, path


def test_finding_of_an_in_process_plugin_replays_in_a_fresh_process(wrong_gemm_in_process,
                                                                    tmp_path):
    from tealite_verify.fuzz import report
    assert wrong_gemm_in_process.origin == "wrong_gemm_backend"
    f, path = _finding(tmp_path)
    assert f.repro.startswith("TEALITE_BACKEND_MODULES=wrong_gemm_backend python -m "), f.repro
    assert f.repro_case.startswith("TEALITE_BACKEND_MODULES=wrong_gemm_backend "), f.repro_case
    for command in (f.repro, f.repro_case):
        r = _shell(command, str(EXTERNAL))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "FAIL wrong_gemm vs reference" in r.stdout, r.stdout + r.stderr
    # The prefix is what makes `repro` work: without it the backend is not there.  (`replay`
    # also reads the module from the finding, which records it.)
    bare = _shell(f.repro_case.split(" ", 1)[1], str(EXTERNAL))
    assert "FAIL wrong_gemm vs reference" not in bare.stdout, bare.stdout
    assert f.versions["backend_modules"] == "wrong_gemm_backend"
    # The campaign's JSON and Markdown reports quote the same command.
    st = report.Stats()
    st.findings[f.signature] = {"finding": f, "path": str(path), "new": True, "hits": 1}
    doc = report.json_report({"ops": ["gemm"], "device": "cpu"}, {}, st, 1.0, [], [], False)
    assert doc["findings"][0]["repro"] == f.repro
    assert f"`{f.repro}`" in report.markdown(doc)


def test_finding_of_an_entry_point_plugin_names_the_distribution(wrong_gemm_in_process,
                                                                 tmp_path, monkeypatch):
    dist = tmp_path / "site" / "wrong_ep-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: wrong-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tealite.backends]\nwrong = wrong_gemm_backend\n")
    monkeypatch.syspath_prepend(str(dist.parent))
    f, _ = _finding(tmp_path)
    assert f.repro.endswith("  # needs: pip install wrong-ep"), f.repro
    assert "TEALITE_BACKEND_MODULES" not in f.repro
    # "Installed" (its metadata and module on the path), the command reproduces as printed.
    r = _shell(f.repro, os.pathsep.join([str(dist.parent), str(EXTERNAL)]))
    assert r.returncode == 1 and "FAIL wrong_gemm vs reference" in r.stdout, r.stdout + r.stderr
