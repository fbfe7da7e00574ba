"""docs/plugins.md cannot go stale silently (issue 13): its per-op tables are checked against
what the op front-ends really pass to an implementation, and its (and the README's) complete
plug-in example is run through the harness.

The signature check registers a recording backend declared ``like="torch"`` for every op: its
implementations accept anything, record it, and delegate to torch's.  Each spec's smoke cases
then go through the front-end (``spec.call``), so the recorded arguments, keyword names, value
types, return value and the params handed to ``check`` / ``numerics`` are the real ones.
"""
from __future__ import annotations

import ast
import collections
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Optional, Union

import pytest
import torch

from tealite import recipes as R
from tealite import registry
from tealite.attention_types import AttentionConfig
from tealite.moe_types import GroupedQuantized, MapType, RouterConfig, RowIdMap
from tealite.ops.quantize import QuantizedTensor
from tealite.training_types import AdamOptions, SGDOptions
from tealite.registry import Backend, register_backend, unregister_backend
from tealite.training_types import BulkScalingUpdate
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs, get_spec

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "plugins.md"
README = ROOT / "README.md"
RECORDER = "doc_recorder"

# The type names the doc's table uses (it says what they stand for above the table).
TYPES = {"Tensor": torch.Tensor, "torch": torch, "Optional": Optional, "tuple": tuple,
         "dict": dict, "int": int, "float": float, "bool": bool, "str": str,
         "QuantizedTensor": QuantizedTensor, "DelayedScaling": R.DelayedScaling,
         "AttentionConfig": AttentionConfig, "RouterConfig": RouterConfig,
         "MapType": MapType, "RowIdMap": RowIdMap, "GroupedQuantized": GroupedQuantized,
         "AdamOptions": AdamOptions, "SGDOptions": SGDOptions,
         "Recipe": Union[R.Float8CurrentScaling, R.Float8BlockScaling, R.DelayedScaling,
                         R.MXBlockScaling]}
TYPES.update({"list": list, "BulkScalingUpdate": BulkScalingUpdate})  # issue 17 (bulk scaling)


# ---- parsing the doc ---------------------------------------------------------------------
def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table: (header cells, body rows of cells)."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _code(cell: str) -> str:
    m = re.search(r"`([^`]*)`", cell)
    assert m, f"no `code` in table cell {cell!r}"
    return m.group(1)


def _table(header_start: list[str], text: str | None = None):
    for header, rows in _tables(text if text is not None else DOC.read_text()):
        if header[:len(header_start)] == header_start:
            return rows
    raise AssertionError(f"docs/plugins.md has no table headed {header_start}")


class Documented(typing.NamedTuple):
    positional: list[tuple[str, object]]   # (name, type)
    keyword: dict[str, object]             # name -> type
    returns: object


def _annotation(node, where: str):
    assert node is not None, f"{where}: every documented argument needs a type"
    return eval(compile(ast.Expression(node), where, "eval"), dict(TYPES))  # noqa: S307


def documented_signatures(text: str | None = None) -> dict[str, Documented]:
    out = {}
    for row in _table(["op", "called by", "implementation signature", "returns"], text):
        op = _code(row[0])
        sig = _code(row[2])
        fn = ast.parse(f"def f{sig}: pass").body[0]
        args = fn.args
        assert not (args.vararg or args.kwarg), f"{op}: document the arguments one by one"
        positional = [(a.arg, _annotation(a.annotation, f"{op}.{a.arg}"))
                      for a in args.posonlyargs + args.args]
        keyword = {a.arg: _annotation(a.annotation, f"{op}.{a.arg}") for a in args.kwonlyargs}
        returns = _annotation(ast.parse(_code(row[3]), mode="eval").body, f"{op} returns")
        out[op] = Documented(positional, keyword, returns)
    return out


def documented_params(text: str | None = None) -> dict[str, set[str]]:
    return {_code(row[0]): {k.strip() for k in _code(row[1]).split(",")}
            for row in _table(["op", "params"], text)}


def conforms(value, ann) -> bool:
    """``value`` is an instance of the documented type ``ann`` (unions, tuples, Optional)."""
    if ann is None or ann is type(None):
        return value is None
    origin = typing.get_origin(ann)
    if origin is Union:
        return any(conforms(value, a) for a in typing.get_args(ann))
    if origin is tuple:
        args = typing.get_args(ann)
        return (isinstance(value, tuple) and len(value) == len(args)
                and all(conforms(v, a) for v, a in zip(value, args)))
    return isinstance(value, origin or ann)


# ---- recording what the front-ends pass ----------------------------------------------------
def registry_ops() -> set[str]:
    return {op for b in registry.backends().values() for op in b.impls}


@pytest.fixture(scope="module")
def recorded():
    """op -> [(args, kwargs, result, params)] for every smoke case of every op."""
    model = registry.get_backend("torch")
    rec: dict[str, list] = collections.defaultdict(list)
    backend = Backend(name=RECORDER, auto_dispatch=False, description="tests/test_plugin_docs")

    def recorder(op):
        def impl(*args, **kwargs):
            result = model.impls[op].fn(*args, **kwargs)
            rec[op].append([args, kwargs, result, None])
            return result
        return impl

    missing = sorted(registry_ops() - set(model.impls))
    assert not missing, f"ops the torch backend does not implement: {missing}"
    for op in registry_ops():
        backend.implements(op, like="torch")(recorder(op))
    register_backend(backend)
    try:
        specs = all_specs()
        for op in sorted(registry_ops()):
            assert op in specs, f"op {op} has no spec of the same name to call it through"
            spec = specs[op]
            for case in spec.smoke_cases:
                # Every op the call dispatches (a grouped op's split path calls gemm too).
                before = {o: len(rec[o]) for o in registry_ops()}
                with registry.trace() as dispatched:
                    spec.call(spec.make_inputs(case, "cpu"), case, RECORDER)
                for o, start in before.items():
                    mine = [r.params for r in dispatched if r.backend == RECORDER and r.op == o]
                    for entry, params in zip(rec[o][start:], mine):
                        entry[3] = params
    finally:
        unregister_backend(RECORDER)
    return rec


def mismatches(op: str, doc: Documented, calls: list, params_doc: set[str]) -> list[str]:
    """What differs between the doc's row for ``op`` and the calls the front-end made."""
    bad = []
    for args, kwargs, result, params in calls:
        if len(args) != len(doc.positional):
            bad.append(f"{op}: called with {len(args)} positional argument(s), documented "
                       f"{[n for n, _ in doc.positional]}")
        if set(kwargs) != set(doc.keyword):
            bad.append(f"{op}: called with keywords {sorted(kwargs)}, documented "
                       f"{sorted(doc.keyword)}")
        for (name, ann), value in zip(doc.positional, args):
            if not conforms(value, ann):
                bad.append(f"{op}: argument {name} was a {type(value).__name__}, documented {ann}")
        for name, value in kwargs.items():
            if name in doc.keyword and not conforms(value, doc.keyword[name]):
                bad.append(f"{op}: {name}= was a {type(value).__name__}, documented "
                           f"{doc.keyword[name]}")
        if not conforms(result, doc.returns):
            bad.append(f"{op}: torch's implementation returned {type(result).__name__}, "
                       f"documented {doc.returns}")
        if params is not None and set(params) != params_doc:
            bad.append(f"{op}: params {sorted(params)}, documented {sorted(params_doc)}")
    return sorted(set(bad))


# ---- the tests -----------------------------------------------------------------------------
def test_every_registered_op_is_documented_once():
    sigs, params = documented_signatures(), documented_params()
    ops = registry_ops()
    assert set(sigs) == ops, (f"undocumented: {sorted(ops - set(sigs))}; documented but not "
                              f"registered: {sorted(set(sigs) - ops)}")
    assert set(params) == ops, (f"params undocumented: {sorted(ops - set(params))}; "
                                f"stale: {sorted(set(params) - ops)}")


def test_documented_signatures_are_what_the_front_ends_pass(recorded):
    sigs, params = documented_signatures(), documented_params()
    bad = []
    for op in sorted(registry_ops()):
        assert recorded[op], f"no smoke case of {op} reached the implementation"
        bad += mismatches(op, sigs[op], recorded[op], params[op])
    assert not bad, "docs/plugins.md disagrees with the front-ends:\n" + "\n".join(bad)


def test_every_recorded_call_saw_its_params(recorded):
    missing = [op for op, calls in recorded.items() if any(c[3] is None for c in calls)]
    assert not missing, f"no dispatch record for some calls of {missing}"


def test_documented_signatures_match_the_torch_backend():
    """The reference implementations' own signatures say the same (names of the keywords,
    number of positional arguments)."""
    torch_impls = registry.get_backend("torch").impls
    for op, doc in documented_signatures().items():
        ps = inspect.signature(torch_impls[op].fn).parameters.values()
        positional = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keyword = {p.name for p in ps if p.kind == p.KEYWORD_ONLY}
        assert len(positional) == len(doc.positional), (op, positional, doc.positional)
        assert keyword == set(doc.keyword), (op, keyword, doc.keyword)


@pytest.mark.parametrize("edit", [
    ("(w: Tensor, layout: tuple[int, int], *, inverse: bool)",
     "(w: Tensor, layout: tuple[int, int])", "keywords"),            # a keyword dropped
    ("`tuple[Tensor, dict]` (D, meta)", "`Tensor` (D, meta)", "returned"),  # wrong return
    ("(x: Tensor, *, kind: str)", "(x: Tensor, y: Tensor, *, kind: str)", "positional"),
    ("(q: QuantizedTensor, *, out_dtype: torch.dtype", "(q: Tensor, *, out_dtype: torch.dtype",
     "argument q"),                                                   # wrong type
    ("| `amax` | `dtype, numel, device` |", "| `amax` | `dtype, device` |", "params"),
])
def test_a_stale_doc_is_caught(recorded, edit):
    """The check has power: each kind of drift in the doc is reported."""
    old, new, word = edit
    text = DOC.read_text()
    assert text.count(old) == 1, f"the doc no longer contains {old!r}"
    text = text.replace(old, new)
    sigs, params = documented_signatures(text), documented_params(text)
    bad = [m for op in sigs for m in mismatches(op, sigs[op], recorded[op], params[op])]
    assert any(word in m for m in bad), bad


# ---- the complete example ------------------------------------------------------------------
EXAMPLE_START = "# my_kernels/tealite_plugin.py"


def _example(text: str) -> str:
    start = text.index(EXAMPLE_START)
    return text[start:text.index("```", start)]


@pytest.fixture
def example_backend():
    code = _example(README.read_text())
    module = types.ModuleType("doc_example_plugin")
    try:
        exec(compile(code, "README.md example", "exec"), module.__dict__)  # noqa: S102
        yield module.BACKEND
    finally:
        unregister_backend("mykernels")


def test_readme_and_doc_show_the_same_example():
    assert _example(README.read_text()) == _example(DOC.read_text())


def test_the_example_plugin_passes_the_harness(example_backend):
    assert example_backend.origin == "doc_example_plugin"
    assert example_backend.impls["rmsnorm_fwd"].support is \
        registry.get_backend("torch").impls["rmsnorm_fwd"].support
    gemm = get_spec("gemm")
    ran = refused = 0
    for base in gemm.smoke_cases:
        for layout in ("TN", "NN"):
            for out_dtype in ("float32", "bfloat16"):
                case = dict(base, dtype="float32", out_dtype=out_dtype, layout=layout)
                rep = run_case(gemm, case, backends=["mykernels"])
                assert rep.verdict != "fail", rep.describe()
                status = rep.outcomes["mykernels"].status
                ran += status == "ok"
                refused += status == "unsupported"
    assert ran >= 4, f"the example ran only {ran} gemm case(s)"
    epilogue = dict(gemm.smoke_cases[0], dtype="float32", out_dtype="float32", bias=True)
    out = run_case(gemm, epilogue, backends=["mykernels"]).outcomes["mykernels"]
    assert out.status == "unsupported" and "no epilogue" in out.reason
    norm = get_spec("rmsnorm_fwd")
    for case in norm.smoke_cases:
        rep = run_case(norm, case, backends=["mykernels"])
        assert rep.verdict == "pass", rep.describe()
