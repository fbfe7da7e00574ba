"""The gate's case set: seeded draws from each op's own Hypothesis strategy, kept only where
an AITER backend runs them, a few per op x backend x recipe x dtype x shape class.

The set is drawn once, at capture, and stored in the baseline with every case in full; a
compare re-runs those stored cases, so both sides see the same inputs whatever the strategies
do later.

Random draws rarely hold what separates conventions, so every entry point also gets its
first kept case re-run under each *edge class* (:data:`EDGE_DISTS`): exact element ties and
scale boundaries, NaN / +-Inf / -0, all-zero rows (zero blocks), subnormal-only values.  A
variant the backend refuses (e.g. NaN for an entry point that declares none), or one that its
tier cannot judge at capture (it would fail in the baseline and so see no change), is dropped
and that field is left to the probes (:mod:`observe`); :func:`exercised` says per entry point
which classes its kept cases hold and which contract fields those exercise.

An entry point that no case field reaches, only a backend's switch (AITER's fused attention
backward: ``aiter_triton``'s ``BWD_KERNEL``), is in the set through :data:`SWITCHES`: the
op's selection (draws and edge variants) is made once more under the switch, keeping what
runs there, and each record names the switch (``"switch"``) so that a compare re-runs it
the same way.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Callable, ContextManager

from tealite import registry
from tealite_verify import coverage
from tealite_verify.suite import draw_cases
from tealite_verify.runner import CaseReport, run_case
from tealite_verify.specs import OpSpec

AITER_BACKENDS = ("aiter", "aiter_triton")

# Edge class -> the distribution replacing every ``dist*`` of a case (tensors.generate), and
# the contract fields it exercises.
EDGE_DISTS: dict[str, dict] = {
    "ties": {"kind": "quant_edges", "block": 32},
    "nonfinite": {"kind": "specials", "frac": 0.05},
    "zero-rows": {"kind": "zero_rows", "scale": 1.0, "frac": 0.25},
    "subnormal": {"kind": "tiny"},
}
EDGE_FIELDS: dict[str, tuple[str, ...]] = {
    "ordinary": ("scale_rule",),
    "ties": ("element_rounding", "scale_rule", "saturation"),
    "nonfinite": ("nan", "inf"),
    "zero-rows": ("zero_block",),
    "subnormal": ("subnormal_block",),
}
_DIST_EDGE = {"quant_edges": "ties", "integers": "ties", "specials": "nonfinite",
              "zero_rows": "zero-rows", "tiny": "subnormal"}


def _aiter_fused_attention_bwd() -> ContextManager:
    from tealite.backends.aiter_triton import attention_fused_bwd as fb
    return fb.BWD_KERNEL.override(kernel=fb.BwdKernel.FUSED)


# (op, backend) -> {switch name: a context manager factory that selects it}.
SWITCHES: dict[tuple[str, str], dict[str, Callable[[], ContextManager]]] = {
    ("attention_bwd", "aiter_triton"): {"fused-bwd": _aiter_fused_attention_bwd},
    # FP8: refused in the interpreter (its fp8 cast), so records come from compiled captures
    ("attention_bwd_fp8", "aiter_triton"): {"fused-bwd": _aiter_fused_attention_bwd},
}


def switch_context(name: str | None) -> ContextManager:
    """The context a record's ``switch`` names (none: a null context)."""
    if name is None:
        return contextlib.nullcontext()
    for table in SWITCHES.values():
        if name in table:
            return table[name]()
    raise ValueError(f"gate record names an unknown switch {name!r}; known: "
                     f"{sorted(n for t in SWITCHES.values() for n in t)}")


def aiter_backends() -> list[str]:
    """Registered AITER backends (available or not: the baseline records why not)."""
    return [b for b in AITER_BACKENDS if b in registry.backends()]


def shape_class(case: dict) -> str:
    """``empty`` (a zero dim), ``aligned`` (every dim a multiple of 32), ``ragged``
    (some dim is not: masked tails, partial blocks)."""
    dims = coverage.dims_of(case)
    if any(d == 0 for d in dims):
        return "empty"
    return "aligned" if all(d % 32 == 0 for d in dims) else "ragged"


def _recipe_text(r) -> str:
    if not isinstance(r, dict):
        return "-"
    return ",".join(f"{k}={r[k]}" for k in sorted(r) if k != "scale")


def recipe_key(case: dict) -> str:
    if "recipe" in case:
        return _recipe_text(case["recipe"])
    if "recipe_a" in case:
        return f"a:{_recipe_text(case['recipe_a'])};b:{_recipe_text(case.get('recipe_b'))}"
    return case.get("kind", "-") if isinstance(case.get("kind"), str) else "-"


def dtype_key(case: dict) -> str:
    return str(case.get("dtype", case.get("in_dtype", "-")))


def _fmt_of(case: dict) -> str:
    for key in ("recipe", "recipe_a"):
        r = case.get(key)
        if isinstance(r, dict) and r.get("fmt"):
            return r["fmt"]
    return "e4m3"


def edge_class(case: dict) -> str:
    """The edge class a case's value distributions put it in (``ordinary`` when none)."""
    kinds = [v.get("kind") for k, v in case.items() if k.startswith("dist") and
             isinstance(v, dict)]
    for kind in kinds:
        if kind in _DIST_EDGE:
            return _DIST_EDGE[kind]
    return "ordinary"


def edge_variants(case: dict) -> list[tuple[str, dict]]:
    """``case`` with every value distribution replaced by each edge class's (same shapes,
    recipes and seed)."""
    if not any(k.startswith("dist") for k in case):
        return []
    out = []
    for name, dist in EDGE_DISTS.items():
        d = dict(dist, fmt=_fmt_of(case)) if dist["kind"] == "quant_edges" else dict(dist)
        out.append((name, {k: (dict(d) if k.startswith("dist") else v)
                           for k, v in case.items()}))
    return out


QUANT_FAMILIES = ("mxfp4", "mxfp8", "fp8-current", "fp8-given")


def quantizing_entry_points(doc: dict) -> set[str]:
    """Entry points whose declared contract quantizes (the ones with contract fields)."""
    return {c["entry_point"] for c in doc.get("contracts", {}).values()
            if c.get("family") in QUANT_FAMILIES}


def exercised(records: list[dict], quantizing: set[str] = frozenset()) -> dict[str, dict]:
    """Per entry point: the edge classes its cases that ran hold, and (for ``quantizing``
    entry points) the quantization contract fields those classes exercise."""
    out: dict[str, dict] = {}
    for r in records:
        ep = r.get("entry_point")
        if not ep or r.get("status") != "ok":
            continue
        e = out.setdefault(ep, {"cases": 0, "edges": set(), "fields": set()})
        e["cases"] += 1
        cls = edge_class(r["case"])
        e["edges"].add(cls)
        if ep in quantizing:
            e["fields"].update(EDGE_FIELDS[cls])
    return {ep: {"cases": e["cases"], "edges": sorted(e["edges"]),
                 "fields": sorted(e["fields"])} for ep, e in sorted(out.items())}


def key_of(op: str, backend: str, case: dict) -> str:
    return " | ".join([op, backend, recipe_key(case), dtype_key(case), shape_class(case)])


@dataclass
class Selected:
    op: str
    backend: str
    case: dict
    key: str
    report: CaseReport
    switch: str | None = None


def _run(spec, case, backend, peers, device) -> CaseReport | None:
    rep = run_case(spec, case, backends=[backend] + peers, device=device)
    if rep.outcomes[backend].status in ("unsupported", "unavailable"):
        return None
    return rep


def select(specs: dict[str, OpSpec], backend: str, *, peers: list[str], device: str,
           seed: int, per_key: int, per_op: int, draws: int, size: str = "ci"):
    """Yield :class:`Selected` cases (run once while selecting; the capture keeps the run):
    up to ``per_op`` drawn / smoke cases per op, then each entry point's first case under
    every edge class; then the same selection under each of the op's :data:`SWITCHES`."""
    impls = registry.get_backend(backend).impls
    for op, spec in specs.items():
        if op not in impls:
            continue
        args = (op, spec, backend, peers, device, seed, per_op, per_key, draws, size)
        yield from _select_op(*args)
        for switch, enter in SWITCHES.get((op, backend), {}).items():
            with enter():  # the whole selection under the switch: what it runs is kept
                selected = list(_select_op(*args))
            for sel in selected:
                yield Selected(op, backend, sel.case, f"{sel.key} | switch {switch}",
                               sel.report, switch)


def _select_op(op, spec, backend, peers, device, seed, per_op, per_key, draws, size):
    """The kept cases of one op (see :func:`select`), before any switch."""
    kept: dict[str, int] = {}
    n_op = 0
    seen: set[str] = set()
    first_per_entry: dict[str, dict] = {}
    for case in list(spec.smoke_cases) + draw_cases(spec, None, draws, size, seed):
        if n_op >= per_op:
            break
        text = json.dumps(case, sort_keys=True)
        key = key_of(op, backend, case)
        if text in seen or kept.get(key, 0) >= per_key:
            continue
        seen.add(text)
        rep = _run(spec, case, backend, peers, device)
        if rep is None:
            continue
        kept[key] = kept.get(key, 0) + 1
        n_op += 1
        ep = rep.outcomes[backend].numerics.entry_point
        if ep and shape_class(case) != "empty":
            first_per_entry.setdefault(ep, case)
        yield Selected(op, backend, case, key, rep)
    for ep, case in first_per_entry.items():
        for edge, variant in edge_variants(case):
            rep = _run(spec, variant, backend, peers, device)
            if rep is None or rep.outcomes[backend].numerics.entry_point != ep \
                    or not all(c.metrics.passed for c in rep.comparisons):
                continue
            yield Selected(op, backend, variant, f"{key_of(op, backend, variant)} | "
                                                 f"edge {edge}", rep)
