"""Coverage matrix: the cells of an op's case space the differential suite must exercise.

A :class:`Cell` is one value of one axis ("recipe_a=current/row/te", "format=e2m1",
"edge=max-last", "layout=TN").  An op's matrix is the cells its spec declares
(``OpSpec.coverage``, built with the helpers below); :func:`cells_of` says which cells a case
is in, judged from the case description *and its input tensors* (an edge class is what the
values are, not what the distribution was meant to give).  A cell also knows how to move a
drawn case into it (:func:`force`): set a recipe field, a layout key, every value
distribution, or the dims; the suite (``tealite_verify/suite.py``) checks the result with the
front-end before using it, and re-classifies it.

The same classification names a finding's case class (``fuzz/findings.py``), so a different
bug in the same op and output is a different finding.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from tealite import recipes as R
from tealite.formats import get_format
from tealite_verify import recipe_space as space
from tealite_verify.strategies.recipes import (TE_RULE, given_scale, narrowing,
                                               recipe_from_json)

RECIPE_KEYS = ("recipe", "recipe_a", "recipe_b")
# Case keys that pick a kernel variant: each value is a layout cell (axis = the key).
LAYOUT_KEYS = ("layout", "kind", "out_dtype", "bias", "gelu", "zero_centered_gamma",
               "weight_dtype", "algo", "newest", "fmt", "wdtype", "pad", "return_amax",
               "tensor_format", "interleaved", "cp_size", "mask", "map_type", "slot_order",
               "p",  # p: dropout's drop probability (0 and 1 are cells of their own)
               "residual_dtype", "pad_to_multiple")  # add_rmsnorm_pad
BLOCK = 32  # the MX block, and the granularity of the block edge classes

# Edge classes (the issue-13 list).  Shape classes first, then value classes.
ONE_ELEMENT, EMPTY, MISALIGNED = "one-element", "empty", "misaligned-tail"
MAX_LAST, TIES, OVERFLOW, NONFINITE = "max-last", "ties", "overflow", "nonfinite"
ZERO_BLOCK, SUBNORMAL_BLOCK = "zero-block", "subnormal-block"
# A GEMM whose A operand is square (N == K): a transposed A is shape-correct only there.
SQUARE = "square-a"
SHAPE_EDGES = (ONE_ELEMENT, EMPTY, MISALIGNED)
VALUE_EDGES = (MAX_LAST, TIES, NONFINITE, ZERO_BLOCK, SUBNORMAL_BLOCK)

QUANT_EDGES = SHAPE_EDGES + VALUE_EDGES + (OVERFLOW,)
# NaN / Inf inputs are in the matrix of the quantizers only: their NaN policies are specified
# (OCP MX, TE) and modelled; how a norm, an activation's derivative or a GEMM epilogue
# propagates NaN is a library convention (torch's relu backward maps NaN to 0) the float64
# references do not model, so those ops do not draw them.
FINITE_EDGES = tuple(e for e in QUANT_EDGES if e != NONFINITE)
FLOAT_EDGES = tuple(e for e in FINITE_EDGES if e != OVERFLOW)  # no given scale to overflow

# The value distribution that puts a case in each value edge class (tensors.generate kinds).
EDGE_DISTS: Mapping[str, dict] = {
    MAX_LAST: {"kind": "max_last", "scale": 1.0, "sample_dtype": "float32"},
    TIES: {"kind": "integers", "hi": 3},
    NONFINITE: {"kind": "specials", "frac": 0.1, "sample_dtype": "float32"},
    ZERO_BLOCK: {"kind": "zero_rows", "scale": 1.0, "frac": 0.5, "sample_dtype": "float32"},
    SUBNORMAL_BLOCK: {"kind": "subnormal"},
}


@dataclass(frozen=True, order=True)
class Cell:
    """One value of one axis.  ``needs``: (field path, value) pairs a case must already have
    for :func:`force` to move it here; ``sets``: the (field path, value) pairs it sets.  Paths
    are case keys, "KEY.field" inside a recipe, "dist*" for every value distribution and
    "dims*" / "dim0" / "dim-1" for the shape (see :func:`force`)."""

    axis: str
    label: str
    needs: tuple = ()
    sets: tuple = ()

    def __str__(self) -> str:
        return f"{self.axis}={self.label}"


# ---- the matrix of an op: builders for OpSpec.coverage --------------------------------------

def recipe_cells(key: str, classes: Iterable[type] = R.RECIPES, *,
                 scale_rules=(TE_RULE,), **fields) -> tuple[Cell, ...]:
    """The cells of recipe key ``key``: one per name (``taxonomy()``) the recipe ``classes``
    reach, narrowed as a draw is (``strategies.recipes.narrowing``: ``scale_rules``, and
    ``fields`` such as ``granularity=("row",)`` or ``block=[(1, 128)]``), then one per format
    and one per saturation policy they take.

    A name's cell needs the recipe class (and the format's packing where the name depends on
    it) and sets the fields that choose the name (``recipe_space.choosing_fields``) to the
    first point that reaches it.  Classes run coarse to fine (``coarse_to_fine``); within a
    class, names in the order of the packing and then the choosing fields' values as the
    domains list them, except that a boolean lists True first: the order the hand-written
    cells had, so the suite keeps drawing the same cases."""
    classes = space.coarse_to_fine(classes)
    narrow = narrowing(scale_rules, **fields)
    pts = {cls: space.narrowed(cls, narrow) for cls in classes}
    cells = [c for cls in classes for c in _named_cells(key, key, cls, pts[cls])]
    fmts = dict.fromkeys(p.values[space.FMT] for cls in classes for p in pts[cls])
    cells += [Cell(f"{key}.format", fmt, ((f"{key}.fp4", get_format(fmt).packed),),
                   ((f"{key}.fmt", fmt),)) for fmt in fmts]
    saturating = [cls for cls in classes if any("saturation" in p.values for p in pts[cls])]
    if saturating:
        policies = dict.fromkeys(_plain(p.values["saturation"]) for cls in saturating
                                 for p in pts[cls])
        need = (f"{key}.{_one_family(saturating).value}", True)
        cells += [Cell(f"{key}.saturation", sat, (need,), ((f"{key}.saturation", sat),))
                  for sat in policies]
    return tuple(cells)


def family_cells(key: str, classes: Iterable[type] = R.RECIPES) -> tuple[Cell, ...]:
    """The coarse names (``taxonomy()``'s family: "current/row", "mxfp4") of ``key``, for
    product cells, in :func:`recipe_cells`' order."""
    return tuple(c for cls in space.coarse_to_fine(classes)
                 for c in _named_cells(f"{key}.family", key, cls, space.points(cls),
                                       family_only=True))


def _named_cells(axis: str, key: str, cls, points, *,
                 family_only: bool = False) -> list[Cell]:
    choosing = space.choosing_fields(cls, family_only=family_only)
    rank = [_first_seen(p.packed for p in points)] + [_rank(p.values[n] for p in points)
                                                      for n in choosing]

    def order(p):
        return (rank[0][p.packed],) + tuple(r[p.values[n]] for r, n in zip(rank[1:], choosing))

    cells: dict[str, Cell] = {}
    for p in sorted(points, key=order):  # stable: the first point of a name sets its cell
        name = space.label(p.recipe, family_only=family_only)
        if name not in cells:
            needs = ((f"{key}.kind", cls.kind),) + \
                (((f"{key}.fp4", p.packed),) if space.splits_packing(cls) else ())
            cells[name] = Cell(axis, name, needs,
                               tuple((f"{key}.{n}", _plain(p.values[n])) for n in choosing))
    return list(cells.values())


def _first_seen(values) -> dict:
    """Each value's place in order of first appearance."""
    return {v: i for i, v in enumerate(dict.fromkeys(values))}


def _rank(values) -> dict:
    """Each value of a choosing field's place: first appearance, but a switch (a boolean
    field) on first."""
    order = list(_first_seen(values))
    if all(isinstance(v, bool) for v in order):
        order.sort(reverse=True)
    return {v: i for i, v in enumerate(order)}


def _plain(v):
    """A cell holds what a case's JSON holds: enums as their values (tuples stay tuples:
    hashable; :func:`force` writes lists)."""
    return v.value if isinstance(v, enum.Enum) else v


def _one_family(classes) -> R.Family:
    families = {cls.family for cls in classes}
    if len(families) != 1:
        # A saturation cell needs what its recipe has; today that is "the FP8 family".
        raise ValueError("recipe_cells: the recipes with a saturation policy span families "
                         f"{sorted(f.value for f in families)}; a saturation cell needs one")
    return families.pop()


def product_cells(a: Iterable[Cell], b: Iterable[Cell]) -> tuple[Cell, ...]:
    """Every pair of a cell of ``a`` and one of ``b`` (e.g. per-row scaling with columnwise
    output): a marginal cover can miss exactly the pair a kernel gets wrong."""
    return tuple(Cell(f"{x.axis}*{y.axis}", f"{x.label}+{y.label}", x.needs + y.needs,
                      x.sets + y.sets) for x in a for y in b)


def layout_cells(key: str, values: Iterable) -> tuple[Cell, ...]:
    return tuple(Cell(key, _label(v), (), ((key, v),)) for v in values)


def direction_cells() -> tuple[Cell, ...]:
    """Quantize outputs: rowwise, columnwise, or both.  A case moved to a columnwise cell also
    gets ``pad=True``: its M was drawn for rowwise blocks, and an MX recipe refuses a partial
    columnwise block without it (pad changes nothing for the other recipes)."""
    return tuple(Cell("direction", name, (),
                      (("rowwise", r), ("columnwise", c)) + ((("pad", True),) if c else ()))
                 for name, r, c in (("rowwise", True, False), ("columnwise", False, True),
                                    ("both", True, True)))


def edge_cells(edges: Iterable[str]) -> tuple[Cell, ...]:
    out = []
    for e in edges:
        if e in EDGE_DISTS:
            # As items: a cell is hashable; force() rebuilds the dict.
            out.append(Cell("edge", e, (), (("dist*", tuple(sorted(EDGE_DISTS[e].items()))),)))
        elif e == ONE_ELEMENT:
            out.append(Cell("edge", e, (), (("dims*", 1),)))
        elif e == EMPTY:
            out.append(Cell("edge", e, (), (("dim0", 0),)))
        elif e == MISALIGNED:
            out.append(Cell("edge", e, (), (("dim-1", 67),)))
        elif e == SQUARE:
            out.append(Cell("edge", e, (), (("square", True),)))
        elif e == OVERFLOW:
            # Reached through a given (delayed) scale far above what the values allow:
            # 2^24 overflows every FP8 format for any amax above 2^-8 (4096 left drawn
            # values of amax < 14 in range, and the cell unreached for some pools).
            out.append(Cell("edge", e, (), (("*.scale", 2.0 ** 24),)))
        else:
            raise ValueError(f"unknown edge class {e!r}")
    return tuple(out)


def _label(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


# ---- classification ----------------------------------------------------------------------

def recipe_label(r: Mapping) -> str:
    return space.label(recipe_from_json(r))


def case_labels(case: Mapping) -> dict[str, str]:
    """The axis labels a case description alone decides (recipes, layouts, direction)."""
    out: dict[str, str] = {}
    for key in RECIPE_KEYS:
        r = case.get(key)
        if isinstance(r, Mapping) and "kind" in r:
            recipe = recipe_from_json(r)
            out[key] = space.label(recipe)
            out[f"{key}.family"] = space.label(recipe, family_only=True)
            out[f"{key}.format"] = recipe.fmt
            if hasattr(recipe, "saturation"):
                out[f"{key}.saturation"] = recipe.saturation.value
    for key in LAYOUT_KEYS:
        if key in case and not isinstance(case[key], (dict, list)):
            out[key] = _label(case[key])
    if "rowwise" in case and "columnwise" in case:
        out["direction"] = {(True, False): "rowwise", (False, True): "columnwise",
                            (True, True): "both"}.get((case["rowwise"], case["columnwise"]),
                                                      "none")
    return out


# Axes whose pairs are cells too (product_cells): recipe families, output direction, layout.
PRODUCT_AXES = ("recipe.family", "recipe_a.family", "recipe_b.family", "direction", "layout",
                "tensor_format", "interleaved", "mask")


def cells_of(case: Mapping, inputs: Mapping[str, Any] | None = None) -> frozenset[tuple]:
    """(axis, label) pairs of ``case``; the edge classes need its ``inputs``."""
    labels = case_labels(case)
    pairs = set(labels.items())
    axes = [a for a in PRODUCT_AXES if a in labels]
    pairs |= {(f"{x}*{y}", f"{labels[x]}+{labels[y]}")
              for i, x in enumerate(axes) for y in axes[i + 1:]}
    if inputs is not None:
        pairs |= {("edge", e) for e in edge_classes(case, inputs)}
    return frozenset(pairs)


def edge_classes(case: Mapping, inputs: Mapping[str, Any]) -> set[str]:
    """Which edge classes the case's inputs are in (the largest float input is "the" input:
    x for quantizers and norms, the bigger operand of a GEMM)."""
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    floats = [t for t in tensors if t.is_floating_point()]
    if not tensors:
        return set()
    main = max(floats or tensors, key=lambda t: t.numel())
    out: set[str] = set()
    if any(t.numel() == 0 for t in tensors) or dims_of(case).count(0):
        out.add(EMPTY)
    if main.numel() == 1:
        out.add(ONE_ELEMENT)
    if main.dim() and main.shape[-1] % BLOCK:
        out.add(MISALIGNED)
    if isinstance(case.get("n"), int) and case.get("n") == case.get("k") and case["n"] > 1:
        out.add(SQUARE)
    if TIES in _dist_edges(case):  # exact ties are put there by construction, not found
        out.add(TIES)
    if not main.is_floating_point() or main.numel() == 0:
        return out
    x = main.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()):
        out.add(NONFINITE)
    out |= _block_classes(x, main.dtype)
    flat = x.reshape(-1).abs().nan_to_num(nan=-1.0)
    if flat.numel() > 1 and bool(flat[-1] >= flat.max()) and bool(flat[-1] > 0):
        out.add(MAX_LAST)
    if _overflows(case, x):
        out.add(OVERFLOW)
    return out


def _block_classes(x: torch.Tensor, dtype: torch.dtype) -> set[str]:
    """All-zero and subnormal-only blocks of BLOCK along the last dim (rows when shorter)."""
    rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    n = rows.shape[-1]
    pad = (-n) % BLOCK
    padded = torch.nn.functional.pad(rows.abs(), (0, pad), value=0.0)
    blocks = padded.reshape(rows.shape[0], -1, BLOCK)
    out: set[str] = set()
    amax = blocks.nan_to_num(nan=1.0).amax(-1)
    if bool((amax == 0).any()):
        out.add(ZERO_BLOCK)
    tiny = torch.finfo(dtype).tiny
    if bool(((amax > 0) & (amax < tiny)).any()):
        out.add(SUBNORMAL_BLOCK)
    return out


def _overflows(case: Mapping, x: torch.Tensor) -> bool:
    """A given (delayed) scale that pushes the input past its format's largest value."""
    for key in RECIPE_KEYS:
        r = case.get(key)
        scale = given_scale(r) if isinstance(r, Mapping) else None
        if scale is not None:
            amax = float(x.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max())
            if amax * float(scale) > get_format(recipe_from_json(r).fmt).max:
                return True
    return False


def dims_of(case: Mapping) -> list[int]:
    if isinstance(case.get("shape"), list):
        return list(case["shape"])
    return [case[k] for k in ("m", "n", "k", "s") if isinstance(case.get(k), int)]


# ---- moving a case into a cell ------------------------------------------------------------

def force(case: Mapping, cell: Cell) -> dict | None:
    """``case`` moved into ``cell`` (a new dict), or None when the case lacks what the cell
    needs.  The caller validates the result (the front-end may refuse it)."""
    for path, want in cell.needs:
        if _get(case, path) != want:
            return None
    out = _copy(case)
    for path, value in cell.sets:
        if not _set(out, path, value):
            return None
    return out


def _copy(case: Mapping) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in case.items()}


def _get(case: Mapping, path: str):
    key, _, field = path.partition(".")
    r = case.get(key)
    if not field:
        return r
    if not isinstance(r, Mapping):
        return None
    if field == "fp4":  # the format's packing
        return get_format(r["fmt"]).packed if "fmt" in r else None
    if field in _FAMILIES:  # whether the recipe is of that family ("fp8")
        family = getattr(R.BY_KIND.get(r.get("kind")), "family", None)
        return None if family is None else family.value == field
    return r.get(field)


_FAMILIES = {f.value for f in R.Family}


def _set(case: dict, path: str, value) -> bool:
    if path == "dist*":
        value = dict(value)
        keys = [k for k in case if k.startswith("dist")]
        for k in keys:
            case[k] = dict(value, fmt=_fmt_of(case)) if value.get("kind") == "quant_edges" \
                else dict(value)
        return bool(keys)
    if path in ("dims*", "dim0", "dim-1"):
        return _set_dims(case, path, value)
    if path == "square":
        if not (isinstance(case.get("n"), int) and isinstance(case.get("k"), int)):
            return False
        case["k"] = case["n"]
        return True
    key, _, field = path.partition(".")
    if key == "*":  # a field of whichever recipe has it (the delayed scale)
        hit = [k for k in RECIPE_KEYS if isinstance(case.get(k), dict) and field in case[k]]
        for k in hit:
            case[k][field] = value
        return bool(hit)
    if not field:
        case[key] = value
        return True
    if not isinstance(case.get(key), dict):
        return False
    # Cells hold tuples (hashable); a case is JSON, with lists.
    case[key][field] = list(value) if isinstance(value, tuple) else value
    return True


def _fmt_of(case: Mapping) -> str:
    for key in RECIPE_KEYS:
        if isinstance(case.get(key), Mapping):
            return case[key]["fmt"]
    return "e4m3"


def _set_dims(case: dict, path: str, value: int) -> bool:
    if isinstance(case.get("shape"), list) and case["shape"]:
        shape = case["shape"]
        if path == "dims*":
            case["shape"] = [value] * len(shape)
        elif path == "dim0":
            case["shape"] = [value] + shape[1:]
        else:
            case["shape"] = shape[:-1] + [value]
        return True
    keys = [k for k in ("m", "n", "k", "s") if isinstance(case.get(k), int)]
    if not keys:
        return False
    targets = {"dims*": keys, "dim0": keys[:1], "dim-1": keys[-1:]}[path]
    for k in targets:
        case[k] = value
    return True


def describe_missing(universe: Iterable[Cell], seen: Iterable[tuple]) -> list[str]:
    seen = set(seen)
    return [str(c) for c in universe if (c.axis, c.label) not in seen]


def ratio(seen: Iterable[tuple], universe: Iterable[Cell]) -> tuple[int, int]:
    universe = list(universe)
    got = {(c.axis, c.label) for c in universe} & set(seen)
    return len(got), len(universe)



# ---- the case class of a finding --------------------------------------------------------

# Value distributions (tensors.generate kinds) -> the edge class they put a case in.
_DIST_EDGE = {"quant_edges": TIES, "integers": TIES, "specials": NONFINITE,
              "zero_rows": ZERO_BLOCK, "tiny": SUBNORMAL_BLOCK, "subnormal": SUBNORMAL_BLOCK,
              "max_last": MAX_LAST}


def case_class(case: Mapping, tier: str | None = None) -> dict[str, str]:
    """What names a bug besides its op and output: recipe family with its roundings, formats
    and saturation, dtype, the tier that judged it and the edge class, read from the case
    description alone (a finding is named before and without re-running it)."""
    labels = case_labels(case)
    out = {k: v for k, v in labels.items()
           if k.split(".")[0] in RECIPE_KEYS}
    if "dtype" in case:
        out["dtype"] = str(case["dtype"])
    out["edge"] = described_edge(case)
    if tier:
        out["tier"] = tier
    return out


def described_edge(case: Mapping) -> str:
    """The edge class the description asks for: a shape class (empty, one element) first, then
    the value distributions' classes ("ordinary" when none)."""
    dims = dims_of(case)
    if dims and 0 in dims:
        return EMPTY
    if dims and all(d == 1 for d in dims):
        return ONE_ELEMENT
    return "+".join(sorted(_dist_edges(case))) or "ordinary"


def _dist_edges(case: Mapping) -> set[str]:
    """The edge classes the case's value distributions ask for (_DIST_EDGE)."""
    return {_DIST_EDGE[v["kind"]] for k, v in case.items()
            if k.startswith("dist") and isinstance(v, Mapping) and v.get("kind") in _DIST_EDGE}
