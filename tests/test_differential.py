"""Hypothesis-driven op x backend x dtype checks: every available backend against the float64
reference and against every other backend.  Run with ``pytest -m differential``."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, note, settings

from tealite import registry
from tealite_verify import profiles
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs

pytestmark = pytest.mark.differential

DEVICE = os.environ.get("TEALITE_VERIFY_DEVICE", "cpu")
SPECS = all_specs()
BACKENDS = sorted(registry.backends())
# Only ops a backend implements (`python -m tealite_verify list` shows the rest as "-");
# unavailable backends and unsupported cases still appear, skipped with their reason.
PARAMS = [(op, b, dt) for op, spec in SPECS.items() for b in BACKENDS for dt in spec.dtypes
          if op in registry.get_backend(b).impls]


@pytest.mark.parametrize("op,backend,dtype", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_backend_matches_reference_and_peers(op, backend, dtype):
    reason = registry.get_backend(backend).unavailable_reason()
    if reason:
        pytest.skip(f"backend {backend} unavailable: {reason}")
    if op not in registry.get_backend(backend).impls:
        pytest.skip(f"backend {backend} does not implement {op}")
    spec = SPECS[op]
    unsupported: list[str] = []
    ran = []

    @given(case=spec.cases(dtype, profiles.shape_size()))
    @settings(settings())
    def check(case):
        report = run_case(spec, case, device=DEVICE)
        outcome = report.outcomes[backend]
        if outcome.status in ("unsupported", "unavailable"):
            unsupported.append(outcome.reason)
            return
        ran.append(case)
        note(report.describe())
        # Judge this backend: its reference comparisons, its pairwise ones, its own errors.
        mine = [c for c in report.failures if backend in (c.lhs, c.rhs)]
        if outcome.status == "error" or mine:
            pytest.fail(report.describe(), pytrace=False)

    check()
    if not ran:
        pytest.skip(f"{backend} supported none of the drawn {op} cases: "
                    + "; ".join(sorted(set(unsupported))[:3]))
