"""The differential suite's cases for one (op, backend, dtype): what ``pytest -m differential``
and ``run`` execute, and what ``mutate`` counts as "killed by the suite".

``suite_cases`` = the spec's smoke cases, then a **stratified** set of drawn cases: for each
cell of the op's coverage matrix (``OpSpec.coverage``, see :mod:`tealite_verify.coverage`)
one case in that cell that *this backend accepts* (checked by a dry run through the
front-end: its validation and the backend's declared support, no kernel), then plain draws
up to :data:`MIN_DRAWN`.  Cases come from a pool the spec's Hypothesis strategy draws from a
seed of (op, dtype, size) alone, so two backends declared alike are judged on the same cases,
and the draws differ per dtype.  A cell no drawn case could be moved into is reported with the
reason (``Plan.unreached``), never silently dropped.
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from tealite import registry
from tealite.errors import BackendUnavailable, DryRunStop, UnsupportedCase
from tealite_verify import coverage
from tealite_verify.specs import OpSpec

POOL = 300        # drawn cases the stratifier picks from, per (op, dtype, size)
MIN_DRAWN = 12    # drawn cases per test at least (the cover, then plain draws)
TRIES = 80        # base cases tried per cell before the cell counts as unreached
COVERAGE_ENV = "TEALITE_COVERAGE_FILE"


def stable_seed(*parts: str) -> int:
    """A seed from names, equal on every machine and Python (``hash`` of str is salted)."""
    return zlib.crc32("/".join(parts).encode())


def draw_cases(spec: OpSpec, dtype: str | None, n: int, size: str, seed: int) -> list[dict]:
    """``n`` cases from ``spec.cases(dtype, size)``, reproducible from ``seed``."""
    cases: list[dict] = []
    if n <= 0:
        return cases

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=spec.cases(dtype, size))
    def collect(case):
        cases.append(case)

    collect()
    return cases


_POOLS: dict[tuple[str, str, str], tuple[dict, ...]] = {}


def _pool(spec: OpSpec, dtype: str, size: str) -> tuple[dict, ...]:
    key = (spec.name, dtype, size)
    if key not in _POOLS:
        drawn = draw_cases(spec, dtype, POOL, size, stable_seed(*key))
        # Empty cases stay a minority: they are bases only for the "empty" cell.
        _POOLS[key] = tuple(c for c in drawn if 0 not in coverage.dims_of(c))
    return _POOLS[key]


@dataclass
class Plan:
    cases: list[dict]
    # The (axis, label) cells of each planned case, in order, and their union.
    case_cells: list = field(default_factory=list)
    cells: set = field(default_factory=set)
    # str(cell) -> why no case of this backend could be put in it.
    unreached: dict = field(default_factory=dict)

    def add(self, case: dict, cells: frozenset) -> None:
        self.cases.append(case)
        self.case_cells.append(cells)
        self.cells |= cells


def admissible(spec: OpSpec, case: dict, backend: str, device: str = "cpu"):
    """(inputs, None) when ``backend`` accepts ``case`` (front-end validation and declared
    support, by a dry run), else (None, reason)."""
    try:
        inputs = spec.make_inputs(case, device)
        with registry.dry_run(spec.name):
            spec.call({k: v.clone() if isinstance(v, torch.Tensor) else v
                       for k, v in inputs.items()}, case, backend)
    except DryRunStop:
        return inputs, None
    except (UnsupportedCase, BackendUnavailable) as exc:
        return None, str(exc)
    except Exception as exc:  # the front-end refused the moved case: not a case of this op
        return None, f"invalid: {type(exc).__name__}: {exc}"
    return inputs, None  # the front-end answered without dispatching (e.g. an empty input)


def plan(spec: OpSpec, backend: str, dtype: str, *, device: str = "cpu",
         size: str = "ci") -> Plan:
    """Stratified drawn cases for ``backend`` (see the module docstring)."""
    pool = _pool(spec, dtype, size)
    out = Plan([])
    start = 0
    for cell in spec.coverage:
        if (cell.axis, cell.label) in out.cells:
            continue
        found, reason, start = _case_in(spec, cell, pool, start, backend, dtype, device)
        if found is None:
            out.unreached[str(cell)] = reason
            continue
        out.add(*found)
    for j in range(len(pool)):
        if len(out.cases) >= MIN_DRAWN:
            break
        case = pool[(start + j) % len(pool)]
        if case in out.cases:
            continue
        inputs, _ = admissible(spec, case, backend, device)
        if inputs is not None:
            out.add(case, coverage.cells_of(case, inputs))
    return out


def _case_in(spec, cell, pool, start, backend, dtype, device):
    """((case, its cells), None, next start) for the first pool case (from ``start``) that can
    be moved into ``cell`` and is accepted; (None, why not, start) when none within TRIES."""
    want = (cell.axis, cell.label)
    reasons: list[str] = []
    tried = 0
    for j in range(len(pool)):
        base = pool[(start + j) % len(pool)]
        case = coverage.force(base, cell)
        if case is None:
            continue
        tried += 1
        inputs, why = admissible(spec, case, backend, device)
        if inputs is None:
            reasons.append(why)
        else:
            cells = coverage.cells_of(case, inputs)
            if want in cells:
                return (case, cells), None, start + j + 1
            reasons.append("the moved case's inputs are not in the cell")
        if tried >= TRIES:
            break
    if not tried:
        return None, f"no drawn {spec.name} case in {dtype} has what the cell needs", start
    common = max(set(reasons), key=reasons.count)
    return None, f"{len(reasons)} tried, e.g. {common}", start


_ACCEPTED: dict[tuple[str, str, str, str, str], tuple[int, ...]] = {}


def fit_for(spec: OpSpec, case: dict, backend: str, *, device: str = "cpu",
            size: str = "ci", offset: int = 0, dtypes: tuple[str, ...] | None = None):
    """(case, its inputs) with ``case`` itself when ``backend`` accepts it; else the case moved
    into a coverage cell the backend accepts, else a pool case it accepts (in the case's
    dtype, else in another of ``dtypes``, default the spec's) carrying this draw's seed (and
    its value distributions within the same dtype); (case, None) when the backend accepts none.  The inputs are
    the dry run's, so the caller need not build them again.  The fuzzer gives each backend of
    a target its turn with this, so a backend that runs a narrow slice of the op (AITER's
    kernels) gets runnable cases instead of skipping most draws."""
    cells = spec.coverage
    moves = (coverage.force(case, cells[(offset + j) % len(cells)])
             for j in range(min(len(cells), TRIES)))
    for candidate in itertools.chain([case], moves):
        if candidate is not None:
            inputs, _ = admissible(spec, candidate, backend, device)
            if inputs is not None:
                return candidate, inputs
    first = str(case.get("dtype", spec.dtypes[0]))
    for dtype in [first] + [d for d in (dtypes or spec.dtypes) if d != first]:
        accepted = _accepted(spec, dtype, size, backend, device)
        if accepted:
            break
    else:
        return case, None
    base = _pool(spec, dtype, size)[accepted[offset % len(accepted)]]
    # The value distributions are drawn per dtype (an fp16 GEMM's are capped so that its sums
    # stay in range): they travel only within the dtype, the seed always.
    data = {k: v for k, v in case.items() if k in base and (
        k == "seed" or (k.startswith("dist") and dtype == first))}
    moved = dict(base, **data)
    inputs, _ = admissible(spec, moved, backend, device)
    return (moved, inputs) if inputs is not None else (dict(base), None)


def _accepted(spec: OpSpec, dtype: str, size: str, backend: str, device: str) -> tuple:
    """Indices of the (op, dtype, size) pool's cases ``backend`` accepts (cached)."""
    key = (spec.name, dtype, size, backend, device)
    if key not in _ACCEPTED:
        pool = _pool(spec, dtype, size)
        _ACCEPTED[key] = tuple(i for i, c in enumerate(pool)
                               if admissible(spec, c, backend, device)[0] is not None)
    return _ACCEPTED[key]


def smoke_cases(spec: OpSpec, dtype: str) -> list[dict]:
    """A smoke case runs in the test of its own dtype (one without a dtype, in the first)."""
    return [c for c in spec.smoke_cases if c.get("dtype", spec.dtypes[0]) == dtype]


def suite_cases(spec: OpSpec, backend: str, dtype: str, *, device: str = "cpu",
                size: str = "ci") -> list[dict]:
    """The cases the suite runs for ``backend`` on ``spec`` in ``dtype``."""
    return smoke_cases(spec, dtype) + plan(spec, backend, dtype, device=device, size=size).cases


def peers(spec: OpSpec, backend: str) -> list[str]:
    """The backends ``backend`` is compared with in its test: the available ones implementing
    the op that sort before it, so each pair is judged once, in the later backend's test."""
    out = []
    for name, b in sorted(registry.backends().items()):
        if name >= backend:
            break
        if spec.implemented_by(b) and b.unavailable_reason() is None:
            out.append(name)
    return out


# ---- the record of what ran: read by `list --coverage` ----------------------------------

def coverage_file() -> Path:
    return Path(os.environ.get(COVERAGE_ENV) or ".tealite-coverage.json")


def record_coverage(op: str, backend: str, dtype: str, cells, path: Path | None = None,
                    ) -> None:
    """Merge the cells a run exercised for (op, backend, dtype) into the coverage file."""
    path = path or coverage_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    key = f"{op}|{backend}|{dtype}"
    data[key] = sorted({f"{a}={lab}" for a, lab in cells} | set(data.get(key, [])))
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def load_coverage(path: Path | None = None) -> dict[tuple[str, str, str], set[str]]:
    path = path or coverage_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {tuple(k.split("|")): set(v) for k, v in data.items()}
