"""The differential suite's cases for one (op, backend, dtype): what ``pytest -m differential``
runs, and what ``mutate`` counts as "killed by the suite".

``suite_cases`` = the spec's smoke cases plus drawn cases, reproducible from (op, dtype, size)
alone, so a plug-in declared like another backend is judged on the same cases.
"""
from __future__ import annotations

import zlib

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from tealite_verify.specs import OpSpec

DRAWN_PER_TEST = 12


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


def suite_cases(spec: OpSpec, backend: str, dtype: str, *, device: str = "cpu",
                size: str = "ci") -> list[dict]:
    """The cases the suite runs for ``backend`` on ``spec`` in ``dtype``."""
    drawn = draw_cases(spec, dtype, DRAWN_PER_TEST, size, stable_seed(spec.name, dtype, size))
    # A smoke case runs in the test of its own dtype (one without a dtype, in the first).
    smoke = [c for c in spec.smoke_cases if c.get("dtype", spec.dtypes[0]) == dtype]
    return smoke + drawn
