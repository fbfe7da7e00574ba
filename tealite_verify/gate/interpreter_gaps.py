"""Constructs in a candidate AITER's kernel sources that Triton's CPU interpreter mis-executes.

The gate on the CPU runs AITER's kernels in the interpreter (``TRITON_INTERPRET=1``).  Some
Python constructs mean one thing to the Triton compiler and another to the interpreter, so an
interpreted result can differ from the compiled one with AITER's code unchanged in meaning.
Such a difference is an *interpreter gap*, not an AITER regression: the gate finds the
constructs in the candidate's sources, maps them to the entry points whose kernels reach them,
and marks those entry points' results as not verifiable on the interpreter.

Known constructs (NUMERICS.md, "Triton interpreter"):

* ``not x``, ``x and y``, ``x or y`` on a tensor inside a ``@triton.jit`` function: the
  compiler lowers them elementwise; the interpreter takes the truth value of the whole numpy
  array (AITER's ``_mxfp4_quant_op`` from v0.1.7.post3: every interpreted code comes out +-6).

A ``not`` / ``and`` / ``or`` whose operands are all compile-time constants (parameters or
locals annotated ``tl.constexpr``, ALL_CAPS names, literals) is evaluated by Python in both
worlds and is not flagged.  The scan is name-based: it follows calls by function name through
every module of the tree (AITER's jit helpers have unique names), starting at the entry
point's wrapper.

The other interpreter bugs NUMERICS.md lists (bf16 ``tl.dot``, fp32 -> fp8 ``.to()``, bf16
stores) are handled where the backend calls the kernel (rejections and strict xfails), so
they never reach the gate as results.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

KIND_BOOL_ON_TENSOR = "python-bool-op-on-tensor"


@dataclass(frozen=True)
class Gap:
    """One mis-executed construct: where it is and which kernel function holds it."""

    kind: str
    path: str        # relative to the tree root, e.g. aiter/ops/triton/_triton_kernels/quant.py
    line: int
    function: str
    code: str

    def describe(self) -> str:
        return f"{self.path}:{self.line} in {self.function}: `{self.code}` ({self.kind})"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "path": self.path, "line": self.line,
                "function": self.function, "code": self.code}


def _is_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "jit"


def _is_constexpr_annotation(ann: ast.expr | None) -> bool:
    return ann is not None and "constexpr" in ast.unparse(ann)


def _constexpr_names(fn: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs
             if _is_constexpr_annotation(a.annotation)}
    for node in ast.walk(fn):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                _is_constexpr_annotation(node.annotation):
            names.add(node.target.id)
    return names


# Names whose use is a Python-level fact in both worlds: ``isinstance(x, tl.tensor)``,
# ``x.dtype``, ``x.shape``.
_STATIC_CALLS = ("isinstance", "hasattr", "len", "getattr")
_STATIC_ATTRS = ("dtype", "shape", "type", "element_ty", "numel")


def _static_names(node: ast.expr) -> set[int]:
    """ids of Name nodes used only for a Python-level fact (type or shape queries)."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") in _STATIC_CALLS:
            out.add(id(sub.func))
            out.update(id(n) for a in sub.args for n in ast.walk(a) if isinstance(n, ast.Name))
        elif isinstance(sub, ast.Attribute) and sub.attr in _STATIC_ATTRS:
            out.update(id(n) for n in ast.walk(sub.value) if isinstance(n, ast.Name))
    return out


def _is_constant_expr(node: ast.expr, constexpr: set[str]) -> bool:
    static = _static_names(node)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and id(sub) not in static and \
                not (sub.id in constexpr or sub.id.isupper()):
            return False
        if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") not in _STATIC_CALLS:
            return False  # a call may return a tensor
    return True


def _control_flow_tests(fn: ast.FunctionDef) -> set[int]:
    """ids of nodes inside an if / while / assert / conditional-expression test: compiled
    Triton takes only scalars there, where the interpreter's Python truth value agrees."""
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            out.update(id(n) for n in ast.walk(node.test))
    return out


def _module_aliases(tree: ast.Module) -> set[str]:
    """Names bound by ``import`` statements (``tl``, ``triton``): module attributes such as
    ``tl.float32`` are compile-time facts."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.asname or a.name.split(".")[0] for a in node.names)
    return out


def _bool_ops(fn: ast.FunctionDef, rel: str, source: str, modules: set[str]) -> list[Gap]:
    constexpr = _constexpr_names(fn) | modules
    in_tests = _control_flow_tests(fn)
    gaps = []
    for stmt in fn.body:  # the body only: decorators hold heuristics lambdas, run in Python
        for node in ast.walk(stmt):
            if id(node) in in_tests:
                continue
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                operands = [node.operand]
            elif isinstance(node, ast.BoolOp):
                operands = list(node.values)
            else:
                continue
            if all(_is_constant_expr(o, constexpr) for o in operands):
                continue
            code = ast.get_source_segment(source, node) or ast.unparse(node)
            gaps.append(Gap(KIND_BOOL_ON_TENSOR, rel, node.lineno, fn.name,
                            " ".join(code.split())))
    return gaps


def _called_names(fn: ast.AST) -> set[str]:
    """Names a function calls or launches (``f(...)``, ``mod.f(...)``, ``kernel[grid](...)``)."""
    out = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        if isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Name):
            out.add(target.id)
        elif isinstance(target, ast.Attribute):
            out.add(target.attr)
    return out


@dataclass(frozen=True)
class _Function:
    name: str
    jit: bool
    calls: frozenset[str]
    gaps: tuple[Gap, ...]


def _scan_file(path: Path, root: Path) -> list[_Function]:
    source = path.read_text(errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    rel = path.relative_to(root).as_posix()
    modules = _module_aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            jit = any(_is_jit(d) for d in node.decorator_list)
            gaps = tuple(_bool_ops(node, rel, source, modules)) if jit else ()
            out.append(_Function(node.name, jit, frozenset(_called_names(node)), gaps))
    return out


@lru_cache(maxsize=8)
def _index(root: str) -> dict[str, tuple[_Function, ...]]:
    """Every function under ``aiter/ops/triton`` of the tree, by name."""
    base = Path(root)
    funcs: dict[str, list[_Function]] = {}
    for path in sorted((base / "aiter" / "ops" / "triton").rglob("*.py")):
        for f in _scan_file(path, base):
            funcs.setdefault(f.name, []).append(f)
    return {k: tuple(v) for k, v in funcs.items()}


def gaps_reached_from(root: str | Path, entry_point: str) -> list[Gap]:
    """Interpreter gaps in the jit functions reachable from ``entry_point``'s wrapper."""
    index = _index(str(Path(root)))
    seen: set[str] = set()
    todo = [entry_point]
    gaps: list[Gap] = []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for f in index.get(name, ()):
            gaps.extend(f.gaps)
            todo.extend(sorted(f.calls - seen))
    return sorted(set(gaps), key=lambda g: (g.path, g.line, g.code))


def scan(root: str | Path, entry_points: list[str]) -> dict[str, list[dict]]:
    """``{entry point: [gap dicts]}`` for the entry points whose kernels reach a gap."""
    out = {}
    for ep in sorted(entry_points):
        found = gaps_reached_from(root, ep)
        if found:
            out[ep] = [g.as_dict() for g in found]
    return out
