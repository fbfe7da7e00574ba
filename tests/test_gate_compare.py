"""The gate's judgement (tealite_verify/gate/compare.py) on synthetic baseline / candidate
documents: every regression kind fails it, legitimate small changes and improvements do not.
No AITER needed (the end-to-end proof with a real, modified AITER is test_aiter_gate.py)."""
from __future__ import annotations

import copy
import json

import pytest

from tealite_verify import cli
from tealite_verify.gate import capture, report
from tealite_verify.gate.compare import compare
from tealite_verify.gate.record import aggregate


def _case(index, key, verdict="pass", ratio=0.1, status="ok", ep="dynamic_mxfp4_quant"):
    return {"index": index, "op": "quantize", "backend": "aiter_triton", "key": key,
            "case": {"shape": [32, 64]}, "status": status, "reason": None,
            "entry_point": ep, "verdict": verdict if status == "ok" else "n/a",
            "peers": {"torch": "pass"}, "max_ratio": ratio, "max_abs_err": ratio / 10,
            "mismatches": 0 if verdict == "pass" else 3, "excused": 0,
            "failures": [] if verdict == "pass" else ["data: 3 mismatched"]}


def _doc(cases):
    return {"schema": capture.SCHEMA, "created": "now", "settings": {"device": "cpu"},
            "aiter": {"found": True, "version": "x", "entry_points": {
                "dynamic_mxfp4_quant": "available", "gemm_a8w8": "available"}},
            "contracts": {"aiter_triton:dynamic_mxfp4_quant": {"scale_rule": "e8m0-even"}},
            "observed": {"aiter_triton:dynamic_mxfp4_quant": {"matches": ["even/ties_away"]}},
            "contract_differences": [], "entries": aggregate(cases), "cases": cases}


KEY_A = "quantize | aiter_triton | mx e2m1 | bfloat16 | aligned"
KEY_B = "quantize | aiter_triton | mx e2m1 | float32 | ragged"


@pytest.fixture
def base():
    return _doc([_case(0, KEY_A, ratio=0.0), _case(1, KEY_A, ratio=0.0),
                 _case(2, KEY_B, ratio=0.2), _case(3, KEY_B, verdict="fail", ratio=3.0)])


def _kinds(res):
    return sorted({f.kind for f in res.regressions})


def test_an_identical_candidate_passes(base):
    res = compare(base, copy.deepcopy(base))
    assert res.passed and not res.improvements
    assert "AITER gate: PASS" in report.markdown(base, base, res)


def test_a_vanished_entry_point_fails(base):
    cand = copy.deepcopy(base)
    cand["aiter"]["entry_points"]["gemm_a8w8"] = "missing: ModuleNotFoundError"
    assert _kinds(compare(base, cand)) == ["vanished"]


def test_a_case_that_becomes_unsupported_fails(base):
    cand = copy.deepcopy(base)
    cand["cases"][0] = _case(0, KEY_A, status="unsupported")
    cand["entries"] = aggregate(cand["cases"])
    assert "vanished" in _kinds(compare(base, cand))


def test_a_new_failure_fails_and_a_known_failure_does_not(base):
    cand = copy.deepcopy(base)
    cand["cases"][1] = _case(1, KEY_A, verdict="fail", ratio=0.0)
    cand["entries"] = aggregate(cand["cases"])
    assert _kinds(compare(base, cand)) == ["new-failure"]
    # case 3 failed in the baseline too: still failing is not new
    assert compare(base, copy.deepcopy(base)).passed


def test_a_peer_disagreement_is_a_new_failure(base):
    cand = copy.deepcopy(base)
    cand["cases"][0]["peers"]["torch"] = "fail"
    assert "new-failure" in _kinds(compare(base, cand))


@pytest.mark.parametrize("section,field,value", [
    ("contracts", "scale_rule", "e8m0-rceil"),
    ("observed", "matches", ["rceil/ties_away"]),
])
def test_a_contract_change_fails(base, section, field, value):
    cand = copy.deepcopy(base)
    cand[section]["aiter_triton:dynamic_mxfp4_quant"][field] = value
    assert _kinds(compare(base, cand)) == ["contract"]


def test_a_changed_entry_point_for_the_same_case_is_a_contract_change(base):
    cand = copy.deepcopy(base)
    cand["cases"][0]["entry_point"] = "dynamic_mxfp4_quant_v2"
    assert "contract" in _kinds(compare(base, cand))


@pytest.mark.parametrize("old,new,regressed", [
    (0.2, 0.3, False),    # legitimate wobble within the factor
    (0.2, 0.41, True),    # more than 2x
    (0.0, 0.04, False),   # bit-exact baseline, change below the floor
    (0.0, 0.2, True),     # bit-exact baseline, growth toward the tolerance
])
def test_error_growth_beyond_the_factor_fails(old, new, regressed):
    b = _doc([_case(0, KEY_A, ratio=old)])
    c = _doc([_case(0, KEY_A, ratio=new)])
    assert (_kinds(compare(b, c, factor=2.0)) == ["error-growth"]) is regressed


def test_improvements_are_reported_and_do_not_fail(base):
    cand = copy.deepcopy(base)
    cand["cases"][3] = _case(3, KEY_B, ratio=0.05)
    cand["cases"][2] = _case(2, KEY_B, ratio=0.05)
    cand["entries"] = aggregate(cand["cases"])
    res = compare(base, cand)
    assert res.passed
    assert {f.kind for f in res.improvements} >= {"fixed", "error-shrink"}
    md = report.markdown(base, cand, res)
    assert "### Improvements" in md and "AITER gate: PASS" in md


def test_report_of_a_regression(base):
    cand = copy.deepcopy(base)
    cand["observed"]["aiter_triton:dynamic_mxfp4_quant"]["matches"] = []
    res = compare(base, cand)
    md = report.markdown(base, cand, res)
    assert "AITER gate: FAIL" in md and "### Regressions" in md
    js = json.loads(json.dumps(report.to_json(base, cand, res)))
    assert js["passed"] is False and js["regressions"][0]["kind"] == "contract"


def test_factor_below_one_is_rejected(base):
    with pytest.raises(ValueError, match="factor must be >= 1"):
        compare(base, base, factor=0.5)


def test_cli_rejects_a_missing_or_foreign_baseline(tmp_path, capsys):
    assert cli.main(["gate", "compare", "--baseline", str(tmp_path / "nope.json")]) == 2
    assert "--baseline: cannot read" in capsys.readouterr().err
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"schema": "something-else"}))
    assert cli.main(["gate", "compare", "--baseline", str(p)]) == 2
    assert "schema" in capsys.readouterr().err


def test_cli_rejects_a_missing_aiter_path(tmp_path, capsys):
    assert cli.main(["gate", "capture", "--out", str(tmp_path / "b.json"),
                     "--aiter", str(tmp_path / "no-such-aiter")]) == 2
    assert "--aiter: no such file" in capsys.readouterr().err
