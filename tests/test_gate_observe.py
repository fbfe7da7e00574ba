"""The gate's contract probes (tealite_verify/gate/observe.py) tell every candidate convention
apart: a quantizer following one convention is observed as exactly that one, so a release
that switches conventions shows up as a changed observation.  Run on the torch backend (no
AITER needed); the real AITER is probed in test_aiter_gate.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tealite.backends.aiter.contracts import Contract
from tealite.formats import ElementRounding, ScaleRounding
from tealite_verify.gate import observe
from tealite_verify.references import quantize as qref


@pytest.mark.parametrize("sr,er", list(itertools.product(ScaleRounding, ElementRounding)),
                         ids=lambda v: v.value)
def test_mx_probe_observes_exactly_the_convention_followed(sr, er):
    c = Contract(backend="torch", entry_point="probe", op="quantize", family="mxfp4",
                 scale_rule=f"e8m0-{sr.value}", element_rounding=er.value.replace("_", "-"))
    obs = observe.observe_contract(c, "cpu")
    assert obs["matches"] == [f"{sr.value}/{er.value}"], obs


def test_a_kernel_matching_no_convention_is_observed_as_none(monkeypatch):
    real = observe._run_mx

    def off_by_one_scale(backend, recipe, x, device):
        bits, scales = real(backend, recipe, x, device)
        return bits, np.where(scales < 254, scales + 1, scales).astype(np.uint8)

    monkeypatch.setattr(observe, "_run_mx", off_by_one_scale)
    c = Contract(backend="torch", entry_point="probe", op="quantize", family="mxfp4",
                 scale_rule="e8m0-even", element_rounding="ties-away")
    assert observe.observe_contract(c, "cpu")["matches"] == []


@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("rule", ["fmax/amax", "amax/fmax"])
def test_fp8_probe_tells_the_scale_rules_apart(rule, granularity):
    x = observe.fp8_probe_input()
    bits, scale_inv, _ = qref.fp8_quantize(x, "e4m3", granularity, scale_rule=rule)
    found = observe._fp8_matches(bits, scale_inv, x, "e4m3", granularity)
    assert found and {f.rsplit("/", 1)[0] for f in found} == {rule}, found


def test_unprobed_contracts_give_no_observation():
    c = Contract(backend="torch", entry_point="probe", op="gemm")
    assert observe.observe_contract(c, "cpu") is None
