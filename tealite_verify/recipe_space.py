"""The finite space of a recipe class: every combination of the field values its ``domains()``
declares, the names (``taxonomy()``) those combinations reach, and which fields choose a name.

Coverage cells (``coverage.recipe_cells`` / ``family_cells``) and an op's operand groups
(``specs/qgemm.py``) are read from here, so a recipe class that declares ``domains()`` and
``taxonomy()`` gets its cells and its place in them with no edit to either.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, fields
from typing import Iterable, Mapping

from tealite.formats import get_format
from tealite.recipes import Granularity

FMT = "fmt"  # the format: an axis of its own; only whether it is packed can name a cell


@dataclass(frozen=True)
class Point:
    """One combination of a domain's values (field -> value, the domain's field order) and
    the recipe it builds."""

    domain: int      # which of the class's domains() it comes from
    values: Mapping
    recipe: object

    @property
    def packed(self) -> bool:
        return get_format(self.values[FMT]).packed


def label(recipe, *, family_only: bool = False) -> str:
    """The recipe's name as cells and finding classes spell it ("current/row/te"), or its
    family alone ("current/row")."""
    family, variant = recipe.taxonomy()
    return "/".join(family if family_only else family + variant)


@functools.lru_cache(maxsize=None)
def points(cls) -> tuple[Point, ...]:
    """Every combination of every domain of ``cls``, domain by domain, in the order
    ``itertools.product`` walks the domain's fields."""
    out = []
    for i, domain in enumerate(cls.domains()):
        names = tuple(domain)
        for combo in itertools.product(*(domain[n] for n in names)):
            values = dict(zip(names, combo))
            out.append(Point(i, values, cls(**values)))
    return tuple(out)


def narrowed(cls, narrow: Mapping[str, Iterable]) -> tuple[Point, ...]:
    """The points of ``cls`` whose fields take only the values ``narrow`` allows (a field a
    domain does not vary is not narrowed: the strategies' rule)."""
    narrow = {k: tuple(v) for k, v in narrow.items()}
    out = tuple(p for p in points(cls)
                if all(v in narrow[n] for n, v in p.values.items() if n in narrow))
    if not out:
        raise ValueError(f"no {cls.__name__} recipe has field values {narrow}")
    return out


@functools.lru_cache(maxsize=None)
def choosing_fields(cls, *, family_only: bool = False) -> tuple[str, ...]:
    """The fields (besides the format) whose value changes the name of some point, in the
    class's field order: the fields a cell sets to move a case to its name.  Two points that
    differ in one field may come from different domains (TE's and AITER's scale rules)."""
    named = {_key(p.values): label(p.recipe, family_only=family_only) for p in points(cls)}
    taken: dict[str, set] = {}
    for p in points(cls):
        for n, v in p.values.items():
            taken.setdefault(n, set()).add(v)
    found = set()
    for p in points(cls):
        for n in p.values:
            if n == FMT or n in found:
                continue
            for alt in taken[n]:
                other = named.get(_key(dict(p.values, **{n: alt})))
                if other is not None and other != named[_key(p.values)]:
                    found.add(n)
                    break
    return tuple(f.name for f in fields(cls) if f.name in found)


def _key(values: Mapping) -> tuple:
    return tuple(sorted(values.items(), key=lambda item: item[0]))


def splits_packing(cls) -> bool:
    """Whether ``cls`` takes packed and unpacked formats (MX: e2m1 and FP8).  A cell never
    moves a case across that line (a packed format changes the shapes a case may have): a
    cell whose name depends on it needs it instead."""
    return len({p.packed for p in points(cls)}) > 1


def granularities(cls) -> frozenset[Granularity]:
    """The scale granularities the recipes of ``cls`` can have."""
    return frozenset(p.recipe.scale_granularity for p in points(cls))


def coarse_to_fine(classes: Iterable[type]) -> tuple[type, ...]:
    """``classes`` ordered by the finest scale granularity each can have (a given or per-
    tensor scale, then per row, then 2-D blocks, then MX blocks); ties keep their order."""
    rank = {g: i for i, g in enumerate(Granularity)}
    return tuple(sorted(classes, key=lambda c: max(rank[g] for g in granularities(c))))
