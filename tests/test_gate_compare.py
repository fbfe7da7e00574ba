"""The gate's judgement (tealite_verify/gate/compare.py, verdicts.py) on synthetic baseline /
candidate documents: every finding lands in its class (AITER regression: exit 1; the harness
could not drive it: exit 2; notes and improvements never fail), every entry point gets its
verdict, and legitimate small changes do not fail.  No AITER needed (the end-to-end proofs
with real, modified and historical AITER trees are test_aiter_gate.py and
test_aiter_gate_history.py)."""
from __future__ import annotations

import copy
import json

import pytest

from tealite_verify import cli
from tealite_verify.gate import capture, report
from tealite_verify.gate.compare import Severity, compare
from tealite_verify.gate.record import aggregate
from tealite_verify.gate.verdicts import EntryStatus, entry_verdicts

MX = "dynamic_mxfp4_quant"
GEMM = "gemm_a8w8"
LOC = {MX: "aiter.ops.triton.quant:dynamic_mxfp4_quant",
       GEMM: "aiter.ops.triton.gemm_a8w8:gemm_a8w8"}


def _case(index, key, verdict="pass", ratio=0.1, status="ok", ep=MX):
    return {"index": index, "op": "quantize", "backend": "aiter_triton", "key": key,
            "case": {"shape": [32, 64], "dist": {"kind": "normal", "scale": 1.0}},
            "status": status, "reason": None if status == "ok" else "why",
            "entry_point": ep if status == "ok" else None,
            "verdict": verdict if status == "ok" else "n/a",
            "peers": {"torch": "pass"}, "max_ratio": ratio, "max_abs_err": ratio / 10,
            "mismatches": 0 if verdict == "pass" else 3, "excused": 0,
            "failures": [] if verdict == "pass" else ["data: 3 mismatched"]}


def _ep(name, sig="(x, scaling_mode='even')"):
    return {"state": "available", "location": LOC[name], "signature": sig}


def _observation(rounding="ties_away", output=(7, 7)):
    return {"probe": "mx e2m1", "fields": {"element_rounding": rounding, "scale_rule": "even"},
            "witness": {"element_rounding": {"input": [2.5, 5.0],
                                             "output": {"codes": list(output), "scale": 127}},
                        "scale_rule": {"input": [6.0], "output": {"codes": [7], "scale": 127}}}}


def _doc(cases, execution="interpreter"):
    return {"schema": capture.SCHEMA, "created": "now",
            "settings": {"device": "cpu", "execution": execution},
            "aiter": {"found": True, "version": "x", "root": "/r",
                      "entry_points": {MX: _ep(MX), GEMM: _ep(GEMM)}},
            "contracts": {f"aiter_triton:{MX}": {"scale_rule": "e8m0-even", "family": "mxfp4",
                                                 "entry_point": MX}},
            "observed": {f"aiter_triton:{MX}": _observation()},
            "interpreter_gaps": {}, "contract_differences": [], "entries": aggregate(cases),
            "cases": cases}


KEY_A = "quantize | aiter_triton | mx e2m1 | bfloat16 | aligned"
KEY_B = "quantize | aiter_triton | mx e2m1 | float32 | ragged"


@pytest.fixture
def base():
    return _doc([_case(0, KEY_A, ratio=0.0), _case(1, KEY_A, ratio=0.0),
                 _case(2, KEY_B, ratio=0.2), _case(3, KEY_B, verdict="fail", ratio=3.0)])


def _kinds(res, severity=Severity.REGRESSION):
    return sorted({f.kind for f in res.findings if f.severity is severity})


def _status(base, cand, res, ep=MX):
    return {v.entry_point: v.status for v in entry_verdicts(base, cand, res)}[ep]


def _recase(cand, index, **kw):
    cand["cases"][index] = _case(index, cand["cases"][index]["key"], **kw)
    cand["entries"] = aggregate(cand["cases"])
    return cand


def test_an_identical_candidate_passes(base):
    res = compare(base, copy.deepcopy(base))
    assert res.passed and res.exit_code == 0 and not res.improvements
    assert {v.status for v in entry_verdicts(base, base, res)} == {EntryStatus.UNCHANGED}
    md = report.markdown(base, base, res)
    assert "AITER gate: PASS (exit 0)" in md and "### Per entry point" in md


def test_a_removed_entry_point_is_an_aiter_regression(base):
    cand = copy.deepcopy(base)
    cand["aiter"]["entry_points"][GEMM] = {"state": "missing", "missing_kind": "removed",
                                           "reason": "no def gemm_a8w8 in the tree"}
    res = compare(base, cand)
    assert _kinds(res) == ["removed"] and res.exit_code == 1
    assert _status(base, cand, res, GEMM) is EntryStatus.REMOVED


@pytest.mark.parametrize("kind", ["import-error", "moved-unknown"])
def test_an_entry_point_the_loader_cannot_reach_is_a_harness_problem(base, kind):
    cand = copy.deepcopy(base)
    cand["aiter"]["entry_points"][GEMM] = {"state": "missing", "missing_kind": kind,
                                           "reason": "ModuleNotFoundError: aiter.ops.enum"}
    res = compare(base, cand)
    assert _kinds(res) == [] and _kinds(res, Severity.HARNESS) == [kind]
    assert res.exit_code == 2
    assert _status(base, cand, res, GEMM) is EntryStatus.UNVERIFIABLE


def test_a_moved_entry_point_that_still_verifies_passes(base):
    cand = copy.deepcopy(base)
    cand["aiter"]["entry_points"][MX]["location"] = "aiter.ops.triton.quant.quant:" + MX
    res = compare(base, cand)
    assert res.exit_code == 0 and _kinds(res, Severity.INFO) == ["moved"]
    assert _status(base, cand, res) is EntryStatus.MOVED
    assert "aiter.ops.triton.quant:dynamic_mxfp4_quant -> aiter.ops.triton.quant.quant" in \
        report.markdown(base, cand, res)


def test_a_changed_signature_is_reported_and_does_not_fail_alone(base):
    cand = copy.deepcopy(base)
    cand["aiter"]["entry_points"][MX]["signature"] = "(x, scaling_mode='even', shuffle=False)"
    res = compare(base, cand)
    assert res.exit_code == 0 and _status(base, cand, res) is EntryStatus.SIGNATURE


def test_a_case_the_adapter_now_refuses_or_that_raises_is_a_harness_problem(base):
    cand = _recase(copy.deepcopy(base), 0, status="unsupported")
    res = compare(base, cand)
    assert _kinds(res, Severity.HARNESS) == ["refused"] and res.exit_code == 2
    cand = _recase(copy.deepcopy(base), 0, status="error")
    assert _kinds(compare(base, cand), Severity.HARNESS) == ["case-error"]


def test_a_new_failure_is_a_numerics_change_and_a_known_failure_is_not(base):
    cand = _recase(copy.deepcopy(base), 1, verdict="fail", ratio=0.0)
    res = compare(base, cand)
    assert _kinds(res) == ["new-failure"] and res.exit_code == 1
    assert _status(base, cand, res) is EntryStatus.NUMERICS
    assert compare(base, copy.deepcopy(base)).passed  # case 3 failed in the baseline too


def test_a_peer_disagreement_is_a_new_failure(base):
    cand = copy.deepcopy(base)
    cand["cases"][0]["peers"]["torch"] = "fail"
    assert "new-failure" in _kinds(compare(base, cand))


def test_a_declared_contract_change_fails(base):
    cand = copy.deepcopy(base)
    cand["contracts"][f"aiter_triton:{MX}"]["scale_rule"] = "e8m0-rceil"
    assert _kinds(compare(base, cand)) == ["contract"]


def test_an_observed_field_change_names_the_field_and_shows_the_witness(base):
    cand = copy.deepcopy(base)
    cand["observed"][f"aiter_triton:{MX}"] = _observation("rne", output=(6, 6))
    res = compare(base, cand)
    assert _kinds(res) == ["contract"]
    (f,) = res.regressions
    assert f.where.endswith("element_rounding")
    assert "ties_away" in f.detail and "rne" in f.detail
    assert "[2.5, 5.0]" in f.detail and "[7, 7]" in f.detail and "[6, 6]" in f.detail


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


def test_a_new_interpreter_gap_excuses_its_results_and_cannot_be_verified(base):
    cand = _recase(copy.deepcopy(base), 1, verdict="fail", ratio=9.0)
    cand["interpreter_gaps"] = {MX: [{"kind": "python-bool-op-on-tensor", "path": "q.py",
                                      "line": 145, "function": "_mxfp4_quant_op",
                                      "code": "not saturate_mask"}]}
    res = compare(base, cand)
    assert _kinds(res) == [] and _kinds(res, Severity.HARNESS) == ["interpreter-gap"]
    assert res.exit_code == 2 and _status(base, cand, res) is EntryStatus.UNVERIFIABLE
    assert any("excused: interpreter gap" in f.detail for f in res.notes)
    # The same gap in the baseline too: noted, not failing.
    base2 = copy.deepcopy(base)
    base2["interpreter_gaps"] = cand["interpreter_gaps"]
    res2 = compare(base2, cand)
    assert res2.exit_code == 0 and "interpreter-gap" in _kinds(res2, Severity.INFO)


def test_a_gap_is_not_excused_in_a_compiled_run(base):
    cand = _recase(copy.deepcopy(base), 1, verdict="fail", ratio=9.0)
    cand["settings"]["execution"] = "compiled"
    cand["interpreter_gaps"] = {MX: [{"kind": "k", "path": "q.py", "line": 1,
                                      "function": "f", "code": "not m"}]}
    assert compare(base, cand).exit_code == 1


def test_a_cross_check_against_the_compiled_run_classifies_interpreter_gaps(base):
    interpreted = _recase(copy.deepcopy(base), 1, verdict="fail", ratio=9.0)
    compiled = copy.deepcopy(base)
    compiled["settings"]["execution"] = "compiled"
    res = compare(base, interpreted, cross=compiled)
    assert res.exit_code == 0
    assert "interpreter-gap" in _kinds(res, Severity.INFO)
    # The compiled run judged with the interpreted one beside it: the gap is noted there too.
    res_c = compare(base, compiled, cross=interpreted)
    assert res_c.exit_code == 0 and "interpreter-gap" in _kinds(res_c, Severity.INFO)
    # The compiled run is authoritative: its own change is never excused by the cross-check.
    changed = _recase(copy.deepcopy(compiled), 1, verdict="fail", ratio=9.0)
    assert compare(base, changed, cross=copy.deepcopy(base)).exit_code == 1
    # A real regression shows in both runs: no excuse.
    both = _recase(copy.deepcopy(compiled), 1, verdict="fail", ratio=9.0)
    assert compare(base, interpreted, cross=both).exit_code == 1
    with pytest.raises(ValueError, match="one interpreted and one compiled"):
        compare(base, interpreted, cross=interpreted)


def test_an_observed_field_that_differs_between_interpreted_and_compiled_is_excused(base):
    """The interpreter's fp32 -> fp8 cast rounds ties away: an observed field read in the
    interpreter differs from the compiled one with AITER unchanged."""
    interpreted = copy.deepcopy(base)
    interpreted["observed"][f"aiter_triton:{MX}"] = _observation("ties_away")
    compiled = copy.deepcopy(base)
    compiled["settings"]["execution"] = "compiled"
    compiled["observed"][f"aiter_triton:{MX}"] = _observation("rne", output=(6, 6))
    base_c = copy.deepcopy(compiled)  # a baseline captured compiled
    res = compare(base_c, compiled, cross=interpreted)
    assert res.exit_code == 0
    assert any(f.kind == "interpreter-gap" and "element_rounding" in f.where
               for f in res.notes)
    # The interpreted run judged against the compiled baseline: its field change is excused.
    res_i = compare(base_c, interpreted, cross=compiled)
    assert res_i.exit_code == 0 and not res_i.regressions
    assert any("excused: interpreter gap" in f.detail and "element_rounding" in f.where
               for f in res_i.notes)
    assert compare(base_c, interpreted).exit_code == 1  # without the compiled run: a change


def test_a_candidate_that_does_not_load_cannot_be_verified(base):
    cand = copy.deepcopy(base)
    cand["aiter"] = {"found": False, "reason": "importing aiter.ops.triton failed: X",
                     "entry_points": {}}
    cand["cases"], cand["entries"] = [], {}
    res = compare(base, cand)
    assert res.exit_code == 2 and _kinds(res, Severity.HARNESS) == ["load-failure"]
    assert "CANNOT VERIFY" in report.markdown(base, cand, res)


def test_a_proven_regression_wins_over_a_harness_problem(base):
    cand = _recase(copy.deepcopy(base), 1, verdict="fail", ratio=0.0)
    cand["aiter"]["entry_points"][GEMM] = {"state": "missing", "missing_kind": "import-error",
                                           "reason": "x"}
    res = compare(base, cand)
    assert res.exit_code == 1 and res.harness_problems
    md = report.markdown(base, cand, res)
    assert "### Regressions" in md and "### Harness problems" in md


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


def test_json_report_carries_verdicts_and_classes(base):
    cand = copy.deepcopy(base)
    cand["contracts"][f"aiter_triton:{MX}"]["scale_rule"] = "e8m0-rceil"
    res = compare(base, cand)
    js = json.loads(json.dumps(report.to_json(base, cand, res)))
    assert js["passed"] is False and js["exit_code"] == 1
    assert js["regressions"][0]["kind"] == "contract"
    assert js["regressions"][0]["severity"] == "regression"
    assert {e["entry_point"]: e["verdict"] for e in js["entry_points"]}[MX] == \
        "numerics changed"


def test_factor_below_one_is_rejected(base):
    with pytest.raises(ValueError, match="factor must be >= 1"):
        compare(base, base, factor=0.5)


# ---- bad input: one clear error naming it, exit 2, a report, the baseline untouched ----------

def test_cli_rejects_a_missing_or_foreign_baseline(tmp_path, capsys):
    assert cli.main(["gate", "compare", "--baseline", str(tmp_path / "nope.json")]) == 2
    assert "--baseline: cannot read" in capsys.readouterr().err
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"schema": "tealite-aiter-gate/1", "cases": []}))
    md = tmp_path / "r.md"
    assert cli.main(["gate", "compare", "--baseline", str(p), "--markdown", str(md)]) == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and "'tealite-aiter-gate/1'" in err and capture.SCHEMA in err
    assert "CANNOT VERIFY" in md.read_text() and "schema" in md.read_text()


def test_cli_rejects_a_path_that_is_not_aiter(tmp_path, capsys, base):
    bl = tmp_path / "base.json"
    bl.write_text(json.dumps(base))
    before = bl.read_text()
    (tmp_path / "notaiter").mkdir()
    js = tmp_path / "r.json"
    assert cli.main(["gate", "compare", "--baseline", str(bl), "--aiter",
                     str(tmp_path / "notaiter"), "--json", str(js)]) == 2
    assert "--aiter" in capsys.readouterr().err and "notaiter" in js.read_text()
    wheel = tmp_path / "amd_aiter-9.9-py3-none-any.whl"
    wheel.write_bytes(b"not a zip file")
    assert cli.main(["gate", "compare", "--baseline", str(bl), "--aiter", str(wheel)]) == 2
    assert str(wheel) in capsys.readouterr().err
    assert cli.main(["gate", "capture", "--out", str(tmp_path / "b.json"),
                     "--aiter", str(tmp_path / "no-such-aiter")]) == 2
    assert "--aiter: no such file" in capsys.readouterr().err
    assert bl.read_text() == before


def test_cli_never_writes_over_the_baseline(tmp_path, capsys, base):
    bl = tmp_path / "base.json"
    bl.write_text(json.dumps(base))
    before = bl.read_text()
    for flag in ("--markdown", "--json", "--candidate-out"):
        assert cli.main(["gate", "compare", "--baseline", str(bl), flag, str(bl)]) == 2
        assert "never writes over it" in capsys.readouterr().err
    assert bl.read_text() == before
