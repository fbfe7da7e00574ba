"""Shared by the aiter_triton test modules."""
from __future__ import annotations

import pytest

B = "aiter_triton"


def ran(report):
    """The backend's outcome; a skip (with AITER's reason) when its tuned config does not fit
    this GPU (AITER's MI350X configs can need more shared memory than an NVIDIA GPU has) or
    the kernel does not compile for NVIDIA (refused with the reason: aiter_triton/attention)."""
    outcome = report.outcomes[B]
    reason = outcome.reason or ""
    if outcome.status == "unsupported" and ("does not fit this device" in reason
                                            or "does not compile on NVIDIA" in reason):
        pytest.skip(reason)
    assert outcome.status == "ok", report.describe()
    return outcome


def seeded_variant_is_caught(run, functions: dict, entry: str, wrap, case, monkeypatch):
    """AITER's ``entry`` passes ``case`` through ``run``; replaced in ``functions`` by
    ``wrap(entry)`` (a seeded bug) it still runs, fails against the reference, and the torch
    peer does not.  Returns the correct run's outcome."""
    good = run(case)
    outcome = ran(good)
    assert good.verdict == "pass", good.describe()
    monkeypatch.setitem(functions, entry, wrap(functions[entry]))
    report = run(case)
    assert report.outcomes[B].status == "ok", report.describe()
    bad = [c for c in report.failures if c.lhs == B and c.rhs == "reference"]
    assert bad, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    return outcome


def mine_failed(report) -> bool:
    return any(B in (c.lhs, c.rhs) for c in report.failures)


def quant_case(recipe: dict, shape, dist, dtype="float32", seed=1) -> dict:
    """A rowwise quantize case of the quantize spec."""
    return {"recipe": recipe, "dtype": dtype, "shape": list(shape), "rowwise": True,
            "columnwise": False, "pad": False, "dist": dist, "seed": seed}


def aiter_fp8_recipe(fmt, gran) -> dict:
    """Float8CurrentScaling with AITER's amax/fmax rule, as a case's recipe JSON."""
    return {"kind": "current", "fmt": fmt, "granularity": gran, "force_pow2_scales": False,
            "amax_epsilon": 0.0, "saturation": "saturate", "scale_rule": "amax/fmax"}
