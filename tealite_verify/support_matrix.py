"""``list``'s ops x backends matrix: what each backend supports on this machine, or why not.

The matrix is built once as typed objects (:class:`Matrix`, :class:`Cell`) from the registry
and the op specs; the terminal text (:func:`render`) and the JSON for tools
(:meth:`Matrix.to_dict`, schema ``SCHEMA``) are two views of it.  The text keeps every fact
the old one-sentence-per-cell table carried, but says each one once: a backend's
unavailability reason and its usual dtypes / devices go below the matrix, and a cell that
differs from its backend's usual support carries a numbered note.
"""
from __future__ import annotations

import difflib
import enum
import textwrap
from collections import Counter
from dataclasses import dataclass

SCHEMA = "tealite_verify.list/1"


class Status(enum.Enum):
    """One cell's verdict.  The values are the JSON form."""

    SUPPORTED = "supported"              # implemented, available, every dtype the op's cases use
    PARTIAL = "partial"                  # implemented and available, but refuses some of them
    NOT_IMPLEMENTED = "not_implemented"  # the backend has no implementation of the op
    UNAVAILABLE = "unavailable"          # implemented, but the backend cannot run here


# (unicode, ascii): the ascii column is for a stdout that cannot encode the first.
SYMBOLS = {
    Status.SUPPORTED: ("✓", "+"),
    Status.PARTIAL: ("~", "~"),
    Status.NOT_IMPLEMENTED: ("·", "."),
    Status.UNAVAILABLE: ("✗", "x"),
}
LEGEND = {
    Status.SUPPORTED: "supported (every dtype the op's cases use, on this machine)",
    Status.PARTIAL: "partly supported (its note says what is refused)",
    Status.NOT_IMPLEMENTED: "not implemented",
    Status.UNAVAILABLE: "backend unavailable here (reason below)",
}


@dataclass(frozen=True)
class OpInfo:
    name: str
    drives: tuple[str, ...]   # the registry ops a composite spec runs through; () otherwise
    dtypes: tuple[str, ...]   # the dtypes the op's cases are drawn in


@dataclass(frozen=True)
class BackendInfo:
    name: str
    description: str
    reason: str | None        # why the backend cannot run on this machine; None: it can


@dataclass(frozen=True)
class Cell:
    op: str
    backend: str
    status: Status
    # What the implementation declares: dtypes (None: any the op accepts; also None for a
    # composite op, whose driven ops each declare their own), layouts (None: any), devices.
    # All None when the op is not implemented.
    dtypes: tuple[str, ...] | None = None
    layouts: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None
    # Why not SUPPORTED: the ops without an implementation, the backend's reason when
    # UNAVAILABLE, what a PARTIAL cell refuses.
    reason: str | None = None


@dataclass(frozen=True)
class Matrix:
    machine_devices: tuple[str, ...]
    ops: tuple[OpInfo, ...]
    backends: tuple[BackendInfo, ...]
    cells: tuple[Cell, ...]       # ops-major, in the order of ``ops`` and ``backends``

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "machine_devices": list(self.machine_devices),
            "ops": [{"name": o.name, "drives": list(o.drives), "dtypes": list(o.dtypes)}
                    for o in self.ops],
            "backends": [{"name": b.name, "description": b.description,
                          "available": b.reason is None, "reason": b.reason}
                         for b in self.backends],
            "cells": [{"op": c.op, "backend": c.backend, "status": c.status.value,
                       "reason": c.reason, "dtypes": _list_or_none(c.dtypes),
                       "layouts": _list_or_none(c.layouts), "devices": _list_or_none(c.devices)}
                      for c in self.cells],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Matrix":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema: expected {SCHEMA!r}, got {d.get('schema')!r}")
        return cls(
            machine_devices=tuple(d["machine_devices"]),
            ops=tuple(OpInfo(o["name"], tuple(o["drives"]), tuple(o["dtypes"]))
                      for o in d["ops"]),
            backends=tuple(BackendInfo(b["name"], b["description"], b["reason"])
                           for b in d["backends"]),
            cells=tuple(Cell(c["op"], c["backend"], Status(c["status"]),
                             _tuple_or_none(c["dtypes"]), _tuple_or_none(c["layouts"]),
                             _tuple_or_none(c["devices"]), c["reason"])
                        for c in d["cells"]))


def _list_or_none(t):
    return None if t is None else list(t)


def _tuple_or_none(t):
    return None if t is None else tuple(t)


# ---- building it ---------------------------------------------------------------------------

def _names(values) -> tuple[str, ...] | None:
    return None if values is None else tuple(sorted(str(v).removeprefix("torch.")
                                                    for v in values))


def _partial_reason(op: OpInfo, dtypes, devices, machine_devices) -> str | None:
    """What an available implementation refuses of the op's cases on this machine."""
    why = []
    if dtypes is not None:
        missing = [d for d in op.dtypes if d not in dtypes]
        if missing:
            why.append(f"refuses {', '.join(missing)}")
    if not set(devices) & set(machine_devices):
        why.append(f"runs on {'/'.join(devices)} only; this machine: {'/'.join(machine_devices)}")
    return "; ".join(why) or None


def cell_of(spec, op: OpInfo, backend, reason: str | None, machine_devices) -> Cell:
    """One (op, backend) cell; ``reason`` is the backend's unavailability reason."""
    if not spec.implemented_by(backend):
        missing = [f"{o}" for o in spec.ops if o not in backend.impls]
        return Cell(op.name, backend.name, Status.NOT_IMPLEMENTED,
                    reason=f"no implementation of {', '.join(missing)}")
    devices = tuple(sorted(spec.devices_of(backend)))
    if op.drives:
        dtypes = layouts = None
    else:
        support = backend.impls[op.name].support
        dtypes, layouts = _names(support.dtypes), _names(support.layouts)
    if reason is not None:
        return Cell(op.name, backend.name, Status.UNAVAILABLE, dtypes, layouts, devices, reason)
    partial = _partial_reason(op, dtypes, devices, machine_devices)
    return Cell(op.name, backend.name, Status.PARTIAL if partial else Status.SUPPORTED,
                dtypes, layouts, devices, partial)


def build(specs: dict, backends: dict, machine_devices: tuple[str, ...]) -> Matrix:
    """The matrix of ``specs`` (name -> OpSpec) x ``backends`` (name -> registry Backend)."""
    binfo = tuple(BackendInfo(n, backends[n].description, backends[n].unavailable_reason())
                  for n in sorted(backends))
    ops, cells = [], []
    for name, spec in specs.items():
        op = OpInfo(f"{name}", tuple(f"{o}" for o in spec.ops) if spec.ops != (name,) else (),
                    tuple(spec.dtypes))
        ops.append(op)
        cells += [cell_of(spec, op, backends[b.name], b.reason, machine_devices)
                  for b in binfo]
    return Matrix(tuple(machine_devices), tuple(ops), binfo, tuple(cells))


def check_filter(argument: str, asked: list[str] | None, valid) -> list[str] | None:
    """``asked`` (a repeatable option's values) when each is one of ``valid``; otherwise a
    ValueError naming the option, the unknown value and the valid ones."""
    if not asked:
        return None
    valid = sorted(f"{v}" for v in valid)  # plain names (op specs are keyed by Op members)
    for name in asked:
        if name not in valid:
            near = difflib.get_close_matches(name, valid, n=1)
            raise ValueError(f"{argument}: unknown name {name!r}"
                             + (f" (did you mean {near[0]!r}?)" if near else "")
                             + f"; valid: {', '.join(valid)}")
    return list(dict.fromkeys(asked))


def select(m: Matrix, ops: list[str] | None, backends: list[str] | None) -> Matrix:
    """The sub-matrix of the named ops and backends (None: all), in the matrix's order."""
    keep_o = [o for o in m.ops if ops is None or o.name in ops]
    keep_b = [b for b in m.backends if backends is None or b.name in backends]
    names_o, names_b = {o.name for o in keep_o}, {b.name for b in keep_b}
    return Matrix(m.machine_devices, tuple(keep_o), tuple(keep_b),
                  tuple(c for c in m.cells if c.op in names_o and c.backend in names_b))


# ---- the text view -------------------------------------------------------------------------

HEADER_WIDTH = 6   # backend columns: names longer than this are abbreviated (key below)
WIDTH = 80         # the text wraps here: the matrix fits an 80-column terminal


def abbreviations(names, width: int = HEADER_WIDTH) -> dict[str, str]:
    """A unique column header of at most ``width`` characters per backend name: the name
    itself when it fits, else the initials of its leading ``_`` parts and its last part
    (``aiter_triton`` -> ``a_trit``), a digit replacing the last character on a clash."""
    out: dict[str, str] = {}
    for name in names:
        short = name
        if len(name) > width:
            *lead, last = name.split("_")
            short = (("".join(p[:1] for p in lead) + "_") if lead else "") + last
            short = short[:width]
        base, k = short, 1
        while short in out.values():
            short = base[:width - len(str(k))] + str(k)
            k += 1
        out[name] = short
    return out


def signature(c: Cell, composite: bool = False) -> str:
    """An implemented cell's declared support in words (a composite op's dtypes are its
    driven ops' own: only its devices are said)."""
    what = [] if composite else [", ".join(c.dtypes) if c.dtypes is not None else "any dtype"]
    if c.layouts is not None:
        what.append(f"layouts {', '.join(c.layouts)}")
    if c.devices:
        what.append(f"on {'/'.join(c.devices)}")
    return "; ".join(what)


def _facts(c: Cell) -> tuple:
    return c.dtypes, c.layouts, c.devices


def _usual(m: Matrix, backend: str) -> Cell | None:
    """The support most of an available backend's fully supported (non-composite) ops share:
    said once on the backend's line.  A cell standing for it (status, reason: unused)."""
    composite = {o.name for o in m.ops if o.drives}
    facts = Counter(_facts(c) for c in m.cells if c.backend == backend
                    and c.status is Status.SUPPORTED and c.op not in composite)
    if not facts:
        return None
    dtypes, layouts, devices = facts.most_common(1)[0][0]
    return Cell("", backend, Status.SUPPORTED, dtypes, layouts, devices)


def _said_by_backend_line(c: Cell, usual: Cell | None, composite: bool) -> bool:
    if c.status is not Status.SUPPORTED or usual is None:
        return False
    return c.devices == usual.devices if composite else _facts(c) == _facts(usual)


def _notes(m: Matrix) -> tuple[dict[tuple[str, str], int], list[str]]:
    """A numbered note for each implemented, available cell whose facts its backend's line
    does not give: a partial cell's refusal, or support other than the backend's usual;
    equal notes share a number."""
    usual = {b.name: _usual(m, b.name) for b in m.backends}
    composite = {o.name for o in m.ops if o.drives}
    texts: list[str] = []
    marks: dict[tuple[str, str], int] = {}
    for c in m.cells:
        if c.status not in (Status.SUPPORTED, Status.PARTIAL) or \
                _said_by_backend_line(c, usual[c.backend], c.op in composite):
            continue
        text = f"{c.backend}: {signature(c, c.op in composite)}" + \
            (f"; {c.reason}" if c.reason else "")
        if text not in texts:
            texts.append(text)
        marks[(c.op, c.backend)] = texts.index(text) + 1
    return marks, texts


def can_encode(encoding: str | None) -> bool:
    """Whether a stream of this encoding can print the matrix's symbols."""
    try:
        "".join(s for s, _ in SYMBOLS.values()).encode(encoding or "ascii")
    except (LookupError, UnicodeEncodeError):
        return False
    return True


def _wrap(text: str, indent: int, width: int) -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=" " * indent,
                         break_on_hyphens=False) or [""]


def _blocks(cols: list[int], op_w: int, width: int) -> list[range]:
    """Consecutive backend columns in groups that fit ``width`` beside the op column (one
    group unless there are many backends: each later group repeats the op column)."""
    out, start, used = [], 0, op_w
    for i, w in enumerate(cols):
        if i > start and used + 2 + w > width:
            out.append(range(start, i))
            start, used = i, op_w
        used += 2 + w
    return out + [range(start, len(cols))]


def _grid(m: Matrix, short: dict[str, str], marks: dict, sym: dict, width: int) -> list[str]:
    """The matrix: a row per op, a column per backend (its abbreviation), a symbol per cell
    with its note's number."""
    labels = {o.name: o.name + ("*" if o.drives else "") for o in m.ops}
    op_w = max([len("op")] + [len(v) for v in labels.values()])
    cols = [max(len(short[b.name]), 3) for b in m.backends]
    cells = {(c.op, c.backend): c for c in m.cells}
    lines: list[str] = []
    for block in _blocks(cols, op_w, width):
        if lines:
            lines.append("")
        lines.append("  ".join(["op".ljust(op_w)] + [short[m.backends[i].name].ljust(cols[i])
                                                      for i in block]).rstrip())
        lines.append("  ".join(["-" * op_w] + ["-" * cols[i] for i in block]))
        for o in m.ops:
            row = [labels[o.name].ljust(op_w)]
            for i in block:
                c = cells[(o.name, m.backends[i].name)]
                mark = marks.get((c.op, c.backend))
                row.append((" " + sym[c.status] + (str(mark) if mark else "")).ljust(cols[i]))
            lines.append("  ".join(row).rstrip())
    return lines


def render(m: Matrix, *, ascii_only: bool = False, width: int = WIDTH) -> str:
    """The matrix, its legend, each backend's facts once, the numbered notes and the composite
    ops' driven ops, wrapped at ``width``."""
    sym = {s: pair[1 if ascii_only else 0] for s, pair in SYMBOLS.items()}
    short = abbreviations(b.name for b in m.backends)
    marks, notes = _notes(m)
    lines = _grid(m, short, marks, sym, width)
    legend = "  ".join(f"{sym[s]} {LEGEND[s]}" for s in Status) + \
        "  N: see note N" + ("  *: composite op (below)" if any(o.drives for o in m.ops) else "")
    lines += _wrap("legend: " + legend, 8, width)
    lines.append("backends:")
    key_w = max([0] + [len(_key(b.name, short)) for b in m.backends])
    first_with: dict[str, str] = {}  # reason -> the first backend it was given for
    for b in m.backends:
        lines += _wrap(f"  {_key(b.name, short).ljust(key_w)}  "
                       f"{_backend_facts(m, b, first_with)}", key_w + 4, width)
    if notes:
        lines.append("notes:")
        num_w = len(str(len(notes)))
        for i, text in enumerate(notes, 1):
            lines += _wrap(f"  {str(i).rjust(num_w)}  {text}", num_w + 4, width)
    composites = [o for o in m.ops if o.drives]
    if composites:
        lines += _wrap("composite ops (a backend takes part where it implements every op "
                       "they drive; their dtypes: each driven op's):", 2, width)
        name_w = max(len(o.name) + 1 for o in composites)
        for o in composites:
            lines += _wrap(f"  {(o.name + '*').ljust(name_w)}  {' + '.join(o.drives)}",
                           name_w + 4, width)
    return "\n".join(lines)


def _key(name: str, short: dict[str, str]) -> str:
    return name if short[name] == name else f"{short[name]} = {name}"


def _backend_facts(m: Matrix, b: BackendInfo, first_with: dict[str, str]) -> str:
    """A backend's line below the matrix: its unavailability reason (a reason already given
    for another backend is referred to, not repeated), or its usual support."""
    if b.reason is not None:
        if b.reason in first_with:
            return f"unavailable: the reason given for {first_with[b.reason]}"
        first_with[b.reason] = b.name
        return f"unavailable: {b.reason}"
    usual = _usual(m, b.name)
    if usual is None:
        return "available; no op fully supported here (see the notes)"
    return f"{signature(usual)}, unless a note says otherwise"
