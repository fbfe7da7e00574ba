"""The AITER loader across AITER's history: declared candidates with version ranges, the
classification of what does not load, and the adapters' dispatch on AITER's private API.

(a) Without an AITER release cache (CI): the candidate table, version ranges, the
    dict-vs-(dict, is_tuned) ``_get_config`` adaptation, and ``missing_kind`` on small
    synthetic trees built from the installed AITER (each loaded in a subprocess: one process
    holds one AITER copy).
(b) With ``$TEALITE_AITER_CACHE`` (a directory of ``ci/aiter_source.sh`` exports, one per
    tag): every tree loads, in its own subprocess, with no entry point failing to import.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from tealite.backends.aiter_common import _loader_candidates as C
from tealite.backends.aiter_common import loader as L

REASON = L.why_unavailable()
CACHE = os.environ.get("TEALITE_AITER_CACHE")
CACHE_SKIP = "set TEALITE_AITER_CACHE to a directory of ci/aiter_source.sh exports"

# Runs in a fresh interpreter: load one tree, print what the loader reports as JSON.
_LOAD = textwrap.dedent("""
    import json, sys
    from tealite.backends.aiter_common import loader as L
    at = L.load(sys.argv[1])
    print(json.dumps({"version": at.version, "functions": sorted(at.functions),
                      "locations": at.locations, "signatures": at.signatures,
                      "missing": at.missing, "missing_kind": at.missing_kind,
                      "load_errors": at.load_errors, "notes": at.notes}))
""")


def _load_in_subprocess(root) -> tuple[dict, str]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop(L.ENV_PATH, None)
    out = subprocess.run([sys.executable, "-c", _LOAD, str(root)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


# ---- (a) versions and candidates -----------------------------------------------------------

def test_versions_order_as_pep_440():
    ordered = ["0.1.7.post2.dev18", "0.1.7.post2", "0.1.7.post3", "0.1.9", "0.1.9.post1",
               "0.1.10.dev1", "0.1.10rc1", "0.1.10", "0.1.10.post1", "0.1.20.post1", "1.0"]
    keys = [C.version_key(v) for v in ordered]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert C.version_key("v0.1.10") == C.version_key("0.1.10")
    assert C.version_key("0.1.10+rocm7") == C.version_key("0.1.10")
    assert C.version_key("unknown") is None and C.version_key("") is None


def test_a_candidate_range_is_since_inclusive_until_exclusive():
    c = C.Candidate("m", "f", since="0.1.9.post1", until="0.1.10")
    assert [c.admits(v) for v in ("0.1.9", "0.1.9.post1", "0.1.9.post2", "0.1.10")] == \
        [False, True, True, False]
    assert C.Candidate("m", "f").admits("9.9")  # open on both sides
    # An unknown or unparseable version tries every candidate.
    assert c.admits(None) and c.admits("not-a-version")


def test_candidates_are_chosen_by_version_in_table_order():
    flat, moved = C.ENTRY_POINTS["gemm_a8w8"]
    assert C.admitted("gemm_a8w8", "0.1.9.post1") == ((flat,), (moved,))
    assert C.admitted("gemm_a8w8", "0.1.10") == ((moved,), (flat,))
    assert C.admitted("gemm_a8w8", None) == ((flat, moved), ())
    assert C.admitted("gemm_a8w8", "0.1.7.post2.dev18")[0] == (flat,)  # the pinned wheel


def test_every_entry_point_has_a_candidate_for_every_version():
    """No gap in the table: each entry point is tried somewhere for any release version."""
    assert set(C.ENTRY_POINTS) == {c.name for c in C.CANDIDATES}
    assert L.ENTRY_POINTS is C.ENTRY_POINTS
    for version in ("0.1.7.post2", "0.1.9.post1", "0.1.10", "0.1.20.post1", "9.0"):
        for name in C.ENTRY_POINTS:
            assert C.admitted(name, version)[0], (name, version)
    for c in C.CANDIDATES:  # ranges are well formed
        assert c.since is None or c.until is None or \
            C.version_key(c.since) < C.version_key(c.until)


def test_version_comes_from_aiter_source_first(tmp_path):
    (tmp_path / "aiter" / "ops" / "triton").mkdir(parents=True)
    (tmp_path / "aiter" / "_version.py").write_text("__version__ = '0.0.1'\n")
    assert L._version(tmp_path) == "0.0.1"
    (tmp_path / L.SOURCE_FILE).write_text("tag=v0.1.9.post1\ncommit=abc\nversion=0.1.9.post1\n")
    assert L._version(tmp_path) == "0.1.9.post1"


def test_a_directory_that_is_not_an_aiter_tree_raises_naming_it(tmp_path):
    (tmp_path / "aiter").mkdir()
    with pytest.raises(L.AiterNotFound, match="not an AITER tree") as err:
        L.load(tmp_path)
    assert str(tmp_path) in str(err.value)
    bad = tmp_path / "amd_aiter-0.0-py3-none-any.whl"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(L.AiterNotFound, match=str(bad)):
        L.find_source(bad)


# ---- (a) classification on tiny trees (pure functions, no AITER) ----------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "aiter" / "ops" / "triton" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _attempt(module: str, *, error: str | None = None, absent: bool = False) -> C.Attempt:
    return C.Attempt(C.Candidate(module, "f"), error, absent)


def test_classify_removed_moved_and_import_error(tmp_path):
    root = _tree(tmp_path, {"old.py": "x = 1\n", "pkg/__init__.py": "",
                            "pkg/new.py": "if True:\n    def f(a):\n        return a\n"})
    assert C.modules_defining(root, "f") == ["pkg.new"]
    kind, why = C.classify("f", root, [_attempt("old")], (), "1.0")
    assert kind == "moved-unknown" and "aiter.ops.triton.pkg.new" in why
    kind, why = C.classify("g", root, [_attempt("old")], (), "1.0")
    assert kind == "removed" and "no module" in why
    kind, why = C.classify("f", root, [_attempt("old", error="RuntimeError: boom")], (), "1.0")
    assert kind == "import-error" and "RuntimeError: boom" in why
    # A module that is simply not in the tree is not an import error.
    kind, _ = C.classify("g", root, [_attempt("gone", error="ModuleNotFoundError: x",
                                              absent=True)], (), "1.0")
    assert kind == "removed"


def test_classify_names_a_candidate_excluded_by_its_range(tmp_path):
    root = _tree(tmp_path, {"flat.py": "def f():\n    pass\n"})
    excluded = (C.Candidate("flat", "f", until="0.1.10"),)
    kind, why = C.classify("f", root, [_attempt("moved.f", absent=True)], excluded, "0.1.10")
    assert kind == "moved-unknown" and "excludes 0.1.10" in why


# ---- (a) adapters: dispatch on AITER's private API, not on its version ----------------------

def test_get_config_result_is_a_dict_or_a_dict_and_is_tuned():
    pytest.importorskip("triton")
    from tealite.backends.aiter_triton import gemm as G
    cfg = {"BLOCK_SIZE_M": 64}
    assert G.config_dict(cfg) is cfg  # up to v0.1.9
    assert G.config_dict((cfg, True)) is cfg  # v0.1.9.post1 on
    with pytest.raises(TypeError, match="^adapter:"):
        G.config_dict([cfg])


def test_get_config_is_found_under_an_alias():
    """v0.1.16's gemm_a16w16 imports it as _get_triton_config."""
    pytest.importorskip("triton")
    from tealite.backends.aiter_triton import gemm as G

    def _get_config(m, n, k):
        return {"m": m}

    mod = types.ModuleType("fake_aiter_module")
    mod._get_triton_config = _get_config
    assert G.config_function(mod) is _get_config
    mod._get_config = len
    assert G.config_function(mod) is len
    with pytest.raises(LookupError, match="^adapter:"):
        G.config_function(types.ModuleType("empty"))


def test_optional_keywords_are_passed_only_where_the_wrapper_takes_them():
    """v0.1.15 dropped gemm_afp4wfp4_preshuffled_weight_scales' use_aot."""
    pytest.importorskip("triton")
    from tealite.backends.aiter_triton import gemm as G
    assert G.accepts(lambda x, use_aot=True: x, "use_aot")
    assert not G.accepts(lambda x, config=None: x, "use_aot")
    assert G.accepts(lambda x, **kw: x, "use_aot")


def test_scale_load_masks_are_read_from_the_kernel_source():
    from tealite.backends.aiter_common import kernel_facts as K

    def kernel_src():  # stands for a Triton kernel body (only its source is read)
        a = tl.load(a_scale_ptrs)  # noqa: F821
        b = tl.load(b_scale_ptrs, mask=m, other=127)  # noqa: F821
        c = tl.load(x_ptrs)  # noqa: F821
        return a, b, c

    assert K.masked_loads(types.SimpleNamespace(fn=kernel_src), "scale") == (False, True)
    assert K.masked_loads(types.SimpleNamespace(fn=len), "scale") is None


def test_a_k_step_cap_the_wrapper_raises_after_splitting_is_lifted(monkeypatch):
    """From v0.1.7.post3 gemm_afp4wfp4 splits K with the K step it is handed, then raises the
    step to >= 128: an interpreter cap of 32 would leave split parts shorter than one step.
    The launch seen in the dry run lifts the cap to the step AITER launches with."""
    pytest.importorskip("triton")
    if REASON is not None:
        pytest.skip(f"AITER not available: {REASON}")
    from tealite.backends.aiter_triton import _qgemm_configs as Q

    def observe(entry, m, n, k, cfg):  # what such a wrapper launches with
        bk = max(cfg["BLOCK_SIZE_K"], 128)
        return {"BLOCK_SIZE_K": bk, "SPLITK_BLOCK_SIZE": 2 * cfg["BLOCK_SIZE_K"],
                "NUM_KSPLIT": 4}, "_gemm_afp4wfp4_kernel"

    monkeypatch.setattr(Q, "aiter_config", lambda entry, *a, caps=None: {"BLOCK_SIZE_K": 32,
                                                                        "NUM_KSPLIT": 4})
    monkeypatch.setattr(Q, "_observe", observe)
    assert Q._config(Q.FP4, 7, 5, 256)["BLOCK_SIZE_K"] == 128
    assert Q.effective_config(Q.FP4, 7, 5, 256)["SPLITK_BLOCK_SIZE"] == 256


@pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")
def test_the_launch_seen_in_a_dry_run_is_the_replayed_one_on_the_installed_aiter():
    """On amd-aiter 0.1.7.post2 the dry run (AITER's own host code) and the replay of its
    adjustments agree: the dry run is what adapts the backend to later versions."""
    pytest.importorskip("triton")
    from tealite.backends.aiter_triton import DEVICES, INTERPRET
    from tealite.backends.aiter_triton import _qgemm_configs as Q
    import torch
    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("no GPU and not under TRITON_INTERPRET=1")
    assert DEVICES
    shapes = {Q.A8W8: (16, 32, 256), Q.A8W8_PER_TOKEN: (16, 32, 300),
              Q.A8W8_BLOCK: (20, 130, 256), Q.FP4: (8, 32, 256),
              Q.FP4_SHUFFLED_SCALES: (40, 48, 256), Q.FP4_SHUFFLED_WEIGHT: (40, 64, 512)}
    for entry, (m, n, k) in shapes.items():
        seen = Q.launched(entry, m, n, k)
        assert seen is not None, entry
        replay = Q.replayed_config(entry, m, n, k)
        keys = [key for key in Q._LAUNCH_KEYS if key in replay]
        assert {key: seen[0][key] for key in keys} == {key: replay[key] for key in keys}, entry


# ---- (a) synthetic trees built from the installed AITER --------------------------------------

def _copy_installed(dest: Path) -> Path:
    root, _ = L.find_source()
    shutil.copytree(Path(root) / "aiter", dest / "aiter",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "configs", "dist"))
    shutil.copytree(Path(root) / "aiter" / "ops" / "triton" / "configs",
                    dest / "aiter" / "ops" / "triton" / "configs", dirs_exist_ok=True)
    return dest


def _delete_function(path: Path, name: str) -> None:
    text = path.read_text()
    node = next(n for n in ast.parse(text).body
                if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = text.splitlines(keepends=True)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    path.write_text("".join(lines[:first] + lines[node.end_lineno:]))


@pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")
def test_missing_kinds_on_a_synthetic_tree(tmp_path):
    """A renamed module -> moved-unknown (naming where the def went), a deleted function ->
    removed, a module raising at import -> import-error with the exception; the rest loads,
    and the tree's AITER_SOURCE version selects the candidates."""
    tree = _copy_installed(tmp_path)
    ops = tree / "aiter" / "ops" / "triton"
    (ops / "norm.py").rename(ops / "norm_moved_here.py")
    _delete_function(ops / "quant.py", "static_per_tensor_quant_fp8_i8")
    fused = ops / "fused_mxfp4_quant.py"
    fused.write_text("raise RuntimeError('synthetic import failure')\n" + fused.read_text())
    (tree / L.SOURCE_FILE).write_text("tag=synthetic\nversion=0.1.7.post2\n")
    rep, stderr = _load_in_subprocess(tree)
    assert rep["version"] == "0.1.7.post2" and rep["load_errors"] == []
    kinds = rep["missing_kind"]
    assert kinds["layer_norm"] == "moved-unknown"
    assert "aiter.ops.triton.norm_moved_here" in rep["missing"]["layer_norm"]
    assert kinds["static_per_tensor_quant_fp8_i8"] == "removed"
    assert kinds["fused_rms_mxfp4_quant"] == "import-error"
    assert "RuntimeError: synthetic import failure" in rep["missing"]["fused_rms_mxfp4_quant"]
    assert "Traceback" not in rep["missing"]["fused_rms_mxfp4_quant"]
    assert set(kinds) == {"layer_norm", "layernorm2d_fwd_with_dynamicquant",
                          "_layernorm_forward", "_layernorm_backward",
                          "static_per_tensor_quant_fp8_i8", "fused_rms_mxfp4_quant"}
    assert set(rep["functions"]) | set(kinds) == set(C.ENTRY_POINTS)
    assert rep["locations"]["gemm_a8w8"] == "aiter.ops.triton.gemm_a8w8:gemm_a8w8"
    assert rep["signatures"]["rms_norm"].startswith("(input")
    assert "Traceback" not in stderr


@pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")
def test_a_tree_whose_triton_package_fails_to_import_still_loads(tmp_path):
    tree = _copy_installed(tmp_path)
    init = tree / "aiter" / "ops" / "triton" / "__init__.py"
    init.write_text("raise ImportError('synthetic package failure')\n")
    rep, _ = _load_in_subprocess(tree)
    assert rep["functions"] == [] and any("synthetic package failure" in e
                                          for e in rep["load_errors"])
    assert set(rep["missing_kind"].values()) == {"import-error"}
    assert set(rep["missing_kind"]) == set(C.ENTRY_POINTS)


# ---- (b) the real release trees --------------------------------------------------------------

def _cache_tags() -> list[str]:
    if not CACHE or not Path(CACHE).is_dir():
        return []
    return sorted(p.name for p in Path(CACHE).iterdir() if (p / "aiter" / "ops").is_dir())


@pytest.mark.skipif(not CACHE, reason=CACHE_SKIP)
@pytest.mark.parametrize("tag", _cache_tags() or ["(none)"])
def test_every_release_tree_loads_without_import_errors(tag):
    if tag == "(none)":
        pytest.skip(f"{CACHE} holds no AITER export ({CACHE_SKIP})")
    root = Path(CACHE) / tag
    rep, stderr = _load_in_subprocess(root)
    assert rep["load_errors"] == []
    assert set(rep["functions"]) | set(rep["missing_kind"]) == set(C.ENTRY_POINTS)
    errors = {k: rep["missing"][k] for k, v in rep["missing_kind"].items() if v == "import-error"}
    assert not errors, errors
    assert rep["version"] == L._version(root)
    assert "Traceback" not in stderr, stderr[-2000:]  # e.g. torch's exit-time op cleanup
