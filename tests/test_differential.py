"""Op x backend x dtype checks: every available backend against the float64 reference and
against every other backend.  Run with ``pytest -m differential``.

Each test runs the spec's smoke cases, then the stratified drawn cases of
``tealite_verify.suite.plan``: one case per cell of the op's coverage matrix that this
backend accepts (recipe families and roundings, formats, layouts, edge classes), then plain
draws.  It computes only what it reports: this backend against the reference, and against the
peers that sort before it (each pair is judged once, in the later backend's test).  The cells
the cases that ran exercised are recorded for ``python -m tealite_verify list --coverage``.
The check itself is ``tealite_verify.differential.check_suite``, which the pytest plug-in
(tealite_verify/pytest_plugin.py) runs for a backend from another repository.
"""
from __future__ import annotations

import os

import pytest

from tealite import registry
from tealite_verify import differential, profiles, suite
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
    spec = SPECS[op]
    verdict = differential.check_suite(spec, backend, dtype, device=DEVICE,
                                       size=profiles.shape_size(),
                                       peers=suite.peers(spec, backend))
    if verdict.status is differential.Status.FAIL:
        pytest.fail(verdict.message, pytrace=False)
    if verdict.status is differential.Status.SKIP:
        pytest.skip(verdict.message)
