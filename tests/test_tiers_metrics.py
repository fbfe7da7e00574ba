"""The tier package's shared contract (tealite_verify/tiers/metrics.py): tier labels are an enum
whose values are the strings findings and baselines store, a misspelled label is an error, and
one builder turns a tier's per-element verdict into Metrics."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tealite_verify.specs import Expected
from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair, from_mask

# The labels stored in findings/ and the committed verdicts baselines: never renamed.
STORED = ("exact", "exact-pair", "ulp", "ulp-pair", "gemm", "gemm-pair", "e8m0-adjusted",
          "e8m0-adjusted-pair", "fp4-ties", "shuffle", "dequantized", "dequantized-pair",
          "dequantized-cross-recipe", "code-interval", "code-interval-pair", "e8m0-interval",
          "e8m0-interval-pair", "scale-interval", "amax-interval", "amax-interval-pair",
          "absent", "malformed", "fp32-div-pair", "div-2ulp", "recip-2ulp")


@pytest.mark.parametrize("label", STORED)
def test_stored_labels_read_back_and_serialize_unchanged(label):
    m = Metrics(label, 1, 0, 0.0, 0.0)
    assert isinstance(m.tier, Tier) and m.tier == label
    assert m.to_dict()["tier"] == label and type(m.to_dict()["tier"]) is str
    assert json.loads(json.dumps(m.to_dict()))["tier"] == label
    assert f"{m.tier}" == str(m.tier) == label and m.summary().startswith(f"[{label}]")


@pytest.mark.parametrize("label", ["ulp-pairr", "Exact", "div-0ulp", "div-ulp", "recip-2"])
def test_a_misspelled_label_is_an_error(label):
    with pytest.raises(ValueError, match="not a valid Tier"):
        Metrics(label, 1, 0, 0.0, 0.0)
    with pytest.raises(ValueError):
        Expected(None, torch.float32, label)


def test_division_labels_are_one_member_each():
    assert Tier("div-2ulp") is Tier.div_ulps("div", 2) and Tier("div-2ulp").name == "DIV_2ULP"
    assert Tier.div_ulps("recip", 3).value == "recip-3ulp"


def test_pair_labels():
    assert Tier.ULP.pair is Tier.ULP_PAIR and Tier.CODE_INTERVAL.pair is Tier.CODE_INTERVAL_PAIR
    with pytest.raises(ValueError, match="no pair rule"):
        Tier.FP4_TIES.pair


def test_in_or_out_builder_reports_the_first_rejected_element():
    ok = np.array([[True, False, True, False]])
    got, want = np.array([[1, 5, 3, 90]]), np.array([[1, 4, 3, 4]])
    m = from_mask(Tier.E8M0_ADJUSTED, ok, got, want, err=got - want, excused=2)
    assert (m.mismatches, m.worst_index, m.max_abs_err, m.worst_tol) == (2, (0, 1), 86.0, 0.0)
    assert m.max_ratio == math.inf and m.excused == 2 and not m.passed
    assert from_mask(Tier.EXACT, ok | True, got, want).worst_index is None  # nothing to report


def test_interval_builder_reports_the_farthest_element_and_its_interval():
    ok = np.array([False, True, False])
    got, centre = np.array([2.0, 0.0, 9.0]), np.array([1.0, 0.0, 1.0])
    lo, hi = np.array([0.5, 0.0, 0.0]), np.array([1.5, 0.0, 3.0])
    m = from_mask(Tier.AMAX_INTERVAL, ok, got, centre, err=got - centre, allowed=(lo, hi))
    assert (m.worst_index, m.max_abs_err, m.worst_tol) == ((2,), 8.0, 2.0)
    assert m.note == "allowed [0.0, 3.0]"


def test_bounded_builder_reports_the_worst_ratio_even_when_all_pass():
    ok = np.ones(3, bool)
    err, tol = np.array([0.1, 0.4, 0.2]), np.array([1.0, 1.0, 0.25])
    m = from_mask(Tier.ULP, ok, err, np.zeros(3), err=err, tol=tol)
    assert m.passed and m.worst_index == (2,) and m.max_ratio == pytest.approx(0.8)
    assert m.max_abs_err == pytest.approx(0.4)


def test_pair_rule_adds_the_sides_up():
    a = Metrics(Tier.CODE_INTERVAL, 4, 1, 2.0, math.inf, (0,), 1.0, 0.0, 0.5, excused=1)
    b = Metrics(Tier.CODE_INTERVAL, 4, 0, 0.0, 0.0, excused=2)
    m = combine_pair(a, b)
    assert (m.tier, m.mismatches, m.excused, m.worst_index) == (Tier.CODE_INTERVAL_PAIR, 1, 3,
                                                                 (0,))
