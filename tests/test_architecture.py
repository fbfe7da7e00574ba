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


def test_tealite_has_no_import_circle():
    assert not [c for c in circles(GRAPH) if _package(c[0]) == "tealite"]


# tealite's floors, bottom up.  A top-level module (tealite/types.py, formats, recipes,
# numerics, errors, _checks, ...) is the bottom floor; the registry stands on it; front-end ops
# (tealite/ops/) and backends (tealite/backends/) stand side by side on both and never import
# each other (the registry joins them at run time); the package init (the public API)
# imports whatever it re-exports.
_MAY_IMPORT = {
    "bottom": {"bottom"},
    "registry": {"bottom"},
    "front-end": {"bottom", "registry", "front-end"},
    "backend": {"bottom", "registry", "backend"},
    # compound modules (tealite/modules/) stand on the front-end ops they compose
    "module": {"bottom", "registry", "front-end", "module"},
}


def tealite_floor(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    return {"registry": "registry", "ops": "front-end", "backends": "backend",
            "modules": "module"}.get(parts[1], "bottom")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import in tealite/ that points to a floor its importer may not use."""
    bad = []
    for a, deps in graph.items():
        if _package(a) != "tealite" or tealite_floor(a) == "api":
            continue
        allowed = _MAY_IMPORT[tealite_floor(a)]
        bad += [f"{a} ({tealite_floor(a)}) -> {b} ({tealite_floor(b)})" for b in sorted(deps)
                if _package(b) == "tealite" and tealite_floor(b) not in allowed]
    return sorted(bad)


def test_tealite_layers_import_downward_only():
    """Bottom modules import nothing above them; the registry no front-end op and no backend;
    backends no front-end op (nor the package init); front-ends no backend."""
    assert not layer_violations(GRAPH)


def test_the_layer_order_check_can_fail(tmp_path):
    files = {
        "__init__.py": "from tealite.ops import a\n",
        "types.py": "import tealite.registry\n",                     # bottom -> registry
        "formats.py": "from tealite import types\n",                 # bottom -> api
        "registry.py": "def f():\n    import tealite.backends.b\n",  # registry -> backend
        "ops/__init__.py": "", "ops/a.py": "from tealite.backends import b\n",
        "backends/__init__.py": "", "backends/b.py": "from tealite.ops.a import g\n",
        "backends/c.py": "import tealite.types\nimport tealite.registry\n",  # allowed
    }
    for name, text in files.items():
        (tmp_path / "tealite" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tealite" / name).write_text(text)
    assert layer_violations(import_graph(tmp_path, ("tealite",))) == [
        "tealite.backends.b (backend) -> tealite.ops.a (front-end)",
        "tealite.formats (bottom) -> tealite (api)",
        "tealite.ops.a (front-end) -> tealite.backends (backend)",
        "tealite.ops.a (front-end) -> tealite.backends.b (backend)",
        "tealite.registry (registry) -> tealite.backends.b (backend)",
        "tealite.types (bottom) -> tealite.registry (registry)",
    ]


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


def test_the_registry_declares_every_in_tree_backend():
    """The registry imports in-tree backends by the names it declares: a backend package left
    out of IN_TREE_BACKENDS would silently never register."""
    from tealite.registry import IN_TREE_BACKENDS
    registering = {_module_name(p.parent, ROOT) for p in (ROOT / "tealite" / "backends").glob(
        "*/__init__.py") if "register_backend(" in p.read_text()}
    assert registering and registering == set(IN_TREE_BACKENDS)


def _backend_package(module: str) -> str | None:
    """The in-tree backend package a module belongs to (None: not in one)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["tealite", "backends"] and len(parts) > 2 \
        else None


def cross_backend_imports(graph: dict[str, set[str]], backend_packages) -> list[str]:
    """Imports from one backend package into another (shared code lives in a package that
    registers no backend, e.g. tealite/backends/aiter_common/)."""
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if _backend_package(a) in backend_packages
                  and _backend_package(b) in backend_packages
                  and _backend_package(a) != _backend_package(b))


def test_no_backend_imports_another():
    from tealite.registry import IN_TREE_BACKENDS
    assert not cross_backend_imports(GRAPH, set(IN_TREE_BACKENDS))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _backend_bindings(tree: ast.AST) -> dict[str, str]:
    """The names a file binds to a backend module or object: local name -> dotted path."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "tealite.backends"):
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            bound |= {a.asname: a.name for a in node.names
                      if a.asname and a.name.startswith("tealite.backends")}
    return bound


def _backend_path(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The dotted path of a backend module or object that ``node`` (a name, or an attribute
    chain such as ``tealite.backends.torch.quantize``) denotes; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    dotted = ".".join([bound.get(node.id, node.id)] + parts[::-1])
    return dotted if node.id in bound or dotted.startswith("tealite.backends.") else None


def _private_string(node: ast.AST) -> str | None:
    ok = isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value)
    return node.value if ok else None


def _reached(tree: ast.AST, bound: dict[str, str]) -> list[str]:
    """The backend's private names a file reaches: ``X._name`` for a backend-bound X, and a
    backend-bound X followed by a string ``"_name"`` in a call's arguments or in a tuple
    (``patched(X, "_name", f)``, ``with_patches((X, "_name", f))``, ``getattr``, ...)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _backend_path(node.value, bound)
            out += [f"{owner}.{node.attr}"] if owner else []
        pairs = node.args if isinstance(node, ast.Call) else \
            node.elts if isinstance(node, ast.Tuple) else []
        for owner, name in zip(pairs, pairs[1:]):
            path, private = _backend_path(owner, bound), _private_string(name)
            out += [f"{path}.{private}"] if path and private else []
    return out


def private_backend_names(root: Path = ROOT, package: str = "tealite_verify") -> list[str]:
    """Where ``package`` reaches a backend's private module or name (``_``-prefixed): in an
    import, an attribute access on a backend module, or a name handed as a string to
    ``patched`` / ``with_patches`` (or any call or tuple) beside a backend module."""
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "tealite.backends"):
                names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names if a.name.startswith("tealite.backends")]
        names = [n for n in names if any(_private(p) for p in n.split("."))]
        bad += [f"{_module_name(path, root)}: {n}"
                for n in names + _reached(tree, _backend_bindings(tree))]
    return sorted(set(bad))


def test_the_harness_reaches_no_private_backend_name():
    assert not private_backend_names()


def test_the_backend_boundary_checks_can_fail(tmp_path):
    (tmp_path / "tealite_verify").mkdir()
    (tmp_path / "tealite_verify" / "a.py").write_text(
        "from tealite.backends.aiter import _triton_loader\n"
        "from tealite.backends.aiter_triton.quantize import _fp8_name, entry_point\n"
        "import tealite.backends.torch.quantize\n")
    (tmp_path / "tealite_verify" / "b.py").write_text(
        "import tealite.backends.torch.fused\n"
        "import tealite.backends.triton.qgemm as tq\n"
        "from tealite.backends.torch import quantize as TQB\n"
        "from tealite_verify.mutate.base import patched, with_patches\n"
        "from tealite_verify.mutate import base\n"
        "_RNE = TQB._fp8_cast_rne\n"                                # attribute access
        "y = tealite.backends.torch.fused._rows(1)\n"                 # on a dotted module path
        "M = with_patches((TQB, '_mx_exponent', f), (TQB, 'fp8_cast_rne', f))\n"
        "with base.patched(tq, '_launch_one', f):\n"                 # a name as a string
        "    pass\n"
        "ok = (TQB.fp8_cast_rne, TQB.__name__, other._private, (other, '_x'), tq.DEVICES)\n")
    assert private_backend_names(tmp_path) == [
        "tealite_verify.a: tealite.backends.aiter._triton_loader",
        "tealite_verify.a: tealite.backends.aiter_triton.quantize._fp8_name",
        "tealite_verify.b: tealite.backends.torch.fused._rows",
        "tealite_verify.b: tealite.backends.torch.quantize._fp8_cast_rne",
        "tealite_verify.b: tealite.backends.torch.quantize._mx_exponent",
        "tealite_verify.b: tealite.backends.triton.qgemm._launch_one"]
    graph = {"tealite.backends.aiter_triton": {"tealite.backends.aiter.contracts"},
             "tealite.backends.aiter": {"tealite.backends.aiter_common.loader"}}
    assert cross_backend_imports(graph, {"tealite.backends.aiter",
                                         "tealite.backends.aiter_triton"}) == [
        "tealite.backends.aiter_triton -> tealite.backends.aiter.contracts"]
