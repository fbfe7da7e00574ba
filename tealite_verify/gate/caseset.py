"""The gate's case set: seeded draws from each op's own Hypothesis strategy, kept only where
an AITER backend runs them, a few per op x backend x recipe x dtype x shape class.

The set is drawn once, at capture, and stored in the baseline with every case in full; a
compare re-runs those stored cases, so both sides see the same inputs whatever the strategies
do later.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from tealite import registry
from tealite_verify.cli import drawn_cases
from tealite_verify.runner import CaseReport, run_case
from tealite_verify.specs import OpSpec

AITER_BACKENDS = ("aiter", "aiter_triton")
_SHAPE_KEYS = ("shape", "m", "n", "k")


def aiter_backends() -> list[str]:
    """Registered AITER backends (available or not: the baseline records why not)."""
    return [b for b in AITER_BACKENDS if b in registry.backends()]


def case_dims(case: dict) -> list[int]:
    dims: list[int] = []
    for key in _SHAPE_KEYS:
        v = case.get(key)
        if isinstance(v, int):
            dims.append(v)
        elif isinstance(v, (list, tuple)):
            dims.extend(int(d) for d in v)
    return dims


def shape_class(case: dict) -> str:
    """``empty`` (a zero dim), ``aligned`` (every dim a multiple of 32), ``ragged``
    (some dim is not: masked tails, partial blocks)."""
    dims = case_dims(case)
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


def key_of(op: str, backend: str, case: dict) -> str:
    return " | ".join([op, backend, recipe_key(case), dtype_key(case), shape_class(case)])


@dataclass
class Selected:
    op: str
    backend: str
    case: dict
    key: str
    report: CaseReport


def select(specs: dict[str, OpSpec], backend: str, *, peers: list[str], device: str,
           seed: int, per_key: int, per_op: int, draws: int, size: str = "ci"):
    """Yield :class:`Selected` cases (run once while selecting; the capture keeps the run)."""
    impls = registry.get_backend(backend).impls
    for op, spec in specs.items():
        if op not in impls:
            continue
        kept: dict[str, int] = {}
        n_op = 0
        seen: set[str] = set()
        for case in list(spec.smoke_cases) + drawn_cases(spec, draws, size, seed):
            if n_op >= per_op:
                break
            text = json.dumps(case, sort_keys=True)
            key = key_of(op, backend, case)
            if text in seen or kept.get(key, 0) >= per_key:
                continue
            seen.add(text)
            rep = run_case(spec, case, backends=[backend] + peers, device=device)
            if rep.outcomes[backend].status in ("unsupported", "unavailable"):
                continue
            kept[key] = kept.get(key, 0) + 1
            n_op += 1
            yield Selected(op, backend, case, key, rep)
