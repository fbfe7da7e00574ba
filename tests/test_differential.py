"""Op x backend x dtype checks: every available backend against the float64 reference and
against every other backend.  Run with ``pytest -m differential``.

Each test runs the spec's smoke cases, then the stratified drawn cases of
``tealite_verify.suite.plan``: one case per cell of the op's coverage matrix that this
backend accepts (recipe families and roundings, formats, layouts, edge classes), then plain
draws.  It computes only what it reports: this backend against the reference, and against the
peers that sort before it (each pair is judged once, in the later backend's test).  The cells
the cases that ran exercised are recorded for ``python -m tealite_verify list --coverage``.
"""
from __future__ import annotations

import os

import pytest

from tealite import registry
from tealite_verify import coverage, profiles, suite
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs

pytestmark = pytest.mark.differential

DEVICE = os.environ.get("TEALITE_VERIFY_DEVICE", "cpu")
SPECS = all_specs()
BACKENDS = sorted(registry.backends())
# Only ops a backend implements (`python -m tealite_verify list` shows the rest as "-");
# unavailable backends and unsupported cases still appear, skipped with their reason.
PARAMS = [(op, b, dt) for op, spec in SPECS.items() for b in BACKENDS for dt in spec.dtypes
          if spec.implemented_by(registry.get_backend(b))]


@pytest.mark.parametrize("op,backend,dtype", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_backend_matches_reference_and_peers(op, backend, dtype):
    reason = registry.get_backend(backend).unavailable_reason()
    if reason:
        pytest.skip(f"backend {backend} unavailable: {reason}")
    spec = SPECS[op]
    plan = suite.plan(spec, backend, dtype, device=DEVICE, size=profiles.shape_size())
    cases = suite.smoke_cases(spec, dtype) + plan.cases
    known_cells = [None] * (len(cases) - len(plan.cases)) + plan.case_cells
    others = suite.peers(spec, backend)
    failures, unsupported, exercised = [], [], set()
    for case, cells in zip(cases, known_cells):
        report = run_case(spec, case, backends=[backend] + others, device=DEVICE, focus=backend)
        outcome = report.outcomes[backend]
        if outcome.status in ("unsupported", "unavailable"):
            unsupported.append(outcome.reason)
            continue
        if cells is None:  # a smoke case: classify it too
            cells = coverage.cells_of(case, spec.make_inputs(case, "cpu"))
        exercised |= cells
        if outcome.status == "error" or report.failures:
            failures.append(report.describe())
    suite.record_coverage(op, backend, dtype, exercised)
    if failures:
        pytest.fail(f"{len(failures)} of {len(cases)} cases failed; first:\n{failures[0]}",
                    pytrace=False)
    if not exercised:
        why = sorted(set(unsupported))[:2] or sorted(set(plan.unreached.values()))[:2]
        pytest.skip(f"{backend} accepts none of the {op} cases in {dtype}: " + "; ".join(why))
