"""Layering (issue 14): the import graph of tealite/ and tealite_verify/, built from the
source with ``ast`` (every import, module-level or inside a function), must have no circle and
must respect the layer order.  A deliberately circular pair of modules and an upward import are
caught (the checks can fail)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tealite", "tealite_verify")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules ``path`` imports (a ``from M import x`` counts as M.x if that is a
    module, else M)."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1]
                                + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    out = set()
    for m in found:
        while m and m not in known:
            m = m.rpartition(".")[0]
        if m and m != name:
            out.add(m)
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    paths = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    return {n: _imported(n, p, set(paths)) for n, p in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


GRAPH = import_graph()


def _package(module: str) -> str:
    return module.split(".")[0]


def test_tealite_never_imports_tealite_verify():
    assert not [f"{a} -> {b}" for a, deps in GRAPH.items() if _package(a) == "tealite"
                for b in deps if _package(b) == "tealite_verify"]


def test_tealite_verify_has_no_import_circle():
    assert not [c for c in circles(GRAPH) if _package(c[0]) == "tealite_verify"]


@pytest.mark.xfail(strict=True, reason="issue 14 part 1, not done yet: the front-end <-> "
                   "registry <-> backends circle (backends import QuantizedTensor, GATED, "
                   "layout helpers and LAYOUTS from tealite/ops/, registry.load_plugins "
                   "imports tealite.backends)")
def test_tealite_has_no_import_circle():
    assert not [c for c in circles(GRAPH) if _package(c[0]) == "tealite"]


def test_library_modules_import_no_cli():
    cli = {m for m in GRAPH if m == "tealite_verify.cli" or m.endswith(".cli")}
    bad = [f"{a} -> {b}" for a, deps in GRAPH.items() if a not in cli
           and a != "tealite_verify.__main__" for b in deps if b in cli]
    assert not bad


def test_tiers_import_no_specs():
    """Tiers sit below specs, the runner and the CLI: they import none of them (and no old
    tolerance module is left beside the package)."""
    tiers = [m for m in GRAPH if m.startswith("tealite_verify.tiers")]
    assert "tealite_verify.tiers.metrics" in tiers
    assert not [m for m in GRAPH if m.startswith("tealite_verify.tolerance")]
    above = ("tealite_verify.specs", "tealite_verify.runner", "tealite_verify.cli")
    assert not [f"{a} -> {b}" for a in tiers for b in GRAPH[a] if b.startswith(above)]


def test_the_checks_can_fail(tmp_path):
    pkg = tmp_path / "tealite"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from tealite.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import a\n")  # lazy: still a circle
    (pkg / "up.py").write_text("import tealite_verify.cli\n")
    (tmp_path / "tealite_verify").mkdir()
    (tmp_path / "tealite_verify" / "__init__.py").write_text("")
    (tmp_path / "tealite_verify" / "cli.py").write_text("")
    graph = import_graph(tmp_path)
    assert circles(graph) == [["tealite.sub.a", "tealite.sub.b"]]
    assert graph["tealite.up"] == {"tealite_verify.cli"}  # an upward import is seen


def test_references_import_no_tealite_code():
    """A float64 reference never calls the code it judges: nothing of tealite/ at all."""
    refs = [m for m in GRAPH if m.startswith("tealite_verify.references")]
    assert refs
    assert not [f"{a} -> {b}" for a in refs for b in GRAPH[a] if _package(b) == "tealite"]
