"""The differential suite's stratified cases (tealite_verify/suite.py) cover each op's
coverage matrix (tealite_verify/coverage.py), and the matrix's classification can fail."""
from __future__ import annotations

import json

import pytest
import torch

from tealite import registry
from tealite_verify import coverage, suite
from tealite_verify.specs import all_specs

SPECS = all_specs()
# torch is the PyTorch fallback: it accepts every case the op's front-end accepts, so its
# plan must reach every declared cell (a cell it cannot reach is a matrix the op refuses).
TORCH_OPS = [op for op in SPECS if op in registry.get_backend("torch").impls]


@pytest.mark.parametrize("op", TORCH_OPS)
def test_torch_plan_reaches_every_cell(op):
    spec = SPECS[op]
    assert spec.coverage, f"{op} declares no coverage matrix"
    for dtype in spec.dtypes:
        plan = suite.plan(spec, "torch", dtype)
        assert not plan.unreached, (dtype, plan.unreached)
        missing = coverage.describe_missing(spec.coverage, plan.cells)
        assert not missing, (dtype, missing)
        empty = sum(1 for c in plan.cases if 0 in coverage.dims_of(c))
        assert empty <= max(1, len(plan.cases) // 8), "empty cases must stay a minority"


def test_issue_13_cells_are_in_the_quantize_matrix():
    cells = {str(c) for c in SPECS["quantize"].coverage}
    for want in ("recipe=mxfp4/floor/rne", "recipe=mxfp4/even/ties_away", "recipe=mxfp8/rceil",
                 "recipe=block/128x128/fp32", "recipe=block/1x128/pow2",
                 "recipe.family*direction=current/row+columnwise", "recipe.format=e5m2fnuz",
                 "recipe.saturation=nonfinite", "edge=one-element", "edge=max-last",
                 "edge=overflow", "edge=subnormal-block", "edge=nonfinite", "edge=ties"):
        assert want in cells, want
    amax = {str(c) for c in SPECS["amax"].coverage}
    assert {"edge=one-element", "edge=max-last"} <= amax
    qgemm = {str(c) for c in SPECS["qgemm"].coverage}
    assert "recipe_a.family*layout=current/row+TN" in qgemm


def test_draws_differ_per_dtype():
    spec = SPECS["gemm"]
    skeleton = [{k: v for k, v in c.items() if k not in ("dtype", "out_dtype")}
                for c in suite.plan(spec, "torch", "float32").cases]
    other = [{k: v for k, v in c.items() if k not in ("dtype", "out_dtype")}
             for c in suite.plan(spec, "torch", "float16").cases]
    assert skeleton != other


def test_plan_respects_a_constrained_backend(make_backend):
    # A backend that accepts only MXFP4 quantization gets MXFP4 cases, not skips.
    b = make_backend("mxfp4_only")
    torch_impl = registry.get_backend("torch").impls["quantize"]
    b.implements("quantize", check=lambda p: None if getattr(p.get("recipe"), "fmt", "")
                 == "e2m1" else "only MXFP4")(torch_impl.fn)
    plan = suite.plan(SPECS["quantize"], b.name, "bfloat16")
    assert len(plan.cases) >= suite.MIN_DRAWN
    assert all(c["recipe"]["fmt"] == "e2m1" for c in plan.cases)
    assert {"recipe=mxfp4/floor/rne", "recipe=mxfp4/rceil/ties_away"} <= {
        f"{a}={lab}" for a, lab in plan.cells}
    assert any("only MXFP4" in why for why in plan.unreached.values())


def test_edge_classes_are_judged_from_the_values():
    case = {"shape": [2, 40], "dtype": "float32", "dist": {"kind": "normal", "scale": 1.0}}
    x = torch.ones(2, 40)
    assert coverage.edge_classes(case, {"x": x}) == {coverage.MISALIGNED, coverage.MAX_LAST}
    x[0, :32] = 0.0
    x[1, 5] = float("nan")
    got = coverage.edge_classes(case, {"x": x})
    assert coverage.ZERO_BLOCK in got and coverage.NONFINITE in got
    tiny = torch.full((1, 32), 1e-40)
    assert coverage.SUBNORMAL_BLOCK in coverage.edge_classes(case, {"x": tiny})
    assert coverage.ONE_ELEMENT in coverage.edge_classes(case, {"x": torch.ones(1, 1)})


def test_force_moves_a_case_and_refuses_what_it_lacks():
    mx = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
    case = {"recipe": mx, "shape": [4, 64], "dist": {"kind": "normal", "scale": 1.0}}
    cell = next(c for c in SPECS["quantize"].coverage if str(c) == "recipe=mxfp4/even/ties_away")
    moved = coverage.force(case, cell)
    assert moved["recipe"]["scale_rounding"] == "even" and case["recipe"] is mx
    assert mx["scale_rounding"] == "floor"  # the pool case is not mutated
    fp8 = next(c for c in SPECS["quantize"].coverage if str(c) == "recipe=mxfp8/ceil")
    assert coverage.force(case, fp8) is None  # an e2m1 case cannot become MXFP8 by a field


def test_coverage_record_and_list(tmp_path, monkeypatch, capsys):
    from tealite_verify.cli import main
    path = tmp_path / "cov.json"
    monkeypatch.setenv(suite.COVERAGE_ENV, str(path))
    assert main(["list", "--coverage"]) == 1  # nothing recorded: says so
    suite.record_coverage("amax", "torch", "float32", {("edge", "max-last")})
    suite.record_coverage("amax", "torch", "float32", {("edge", "one-element")})
    assert json.loads(path.read_text())["amax|torch|float32"] == [
        "edge=max-last", "edge=one-element"]
    assert main(["list", "--coverage"]) == 0
    out = capsys.readouterr().out
    total = len(SPECS["amax"].coverage)
    assert f"2/{total}" in out and "edge=empty" in out


def test_fit_for_gives_a_constrained_backend_a_runnable_case(make_backend):
    b = make_backend("mxfp4_only")
    torch_impl = registry.get_backend("torch").impls["quantize"]
    b.implements("quantize", check=lambda p: None if getattr(p.get("recipe"), "fmt", "")
                 == "e2m1" else "only MXFP4")(torch_impl.fn)
    spec = SPECS["quantize"]
    fp8 = next(c for c in suite.draw_cases(spec, "float32", 40, "ci", 3)
               if c["recipe"]["fmt"] != "e2m1" and 0 not in coverage.dims_of(c))
    fitted, inputs = suite.fit_for(spec, fp8, b.name)
    assert fitted["recipe"]["fmt"] == "e2m1" and inputs is not None
    assert suite.admissible(spec, fitted, b.name)[0] is not None
    # The inputs are the fitted case's own (the fuzzer runs them without building again).
    again = spec.make_inputs(fitted, "cpu")
    assert all(torch.equal(inputs[k], again[k]) for k in again)
    # A case the backend accepts comes back as is; one no backend accepts, with no inputs.
    assert suite.fit_for(spec, fitted, b.name)[0] is fitted
    assert suite.fit_for(spec, fp8, "no_such_backend") == (fp8, None)


def test_fit_for_keeps_value_distributions_within_their_dtype(make_backend):
    """A float32 gemm draw fitted to a half-precision-only backend takes the fp16 pool case's
    own distributions (capped so that fp16 sums stay in range), not the float32 draw's: a
    transplanted 1024x outlier distribution overflowed torch's fp16 accumulator (a false
    alarm the fuzzer found)."""
    b = make_backend("half_only")
    impl = registry.get_backend("torch").impls["gemm"]
    b.implements("gemm", dtypes=(torch.float16,), layouts=("TN", "NN", "NT", "TT"),
                 numerics=impl.numerics)(impl.fn)
    spec = SPECS["gemm"]
    wide = {"kind": "outliers", "scale": 1.0, "frac": 0.1, "factor": 1024.0}
    draw = dict(suite.draw_cases(spec, "float32", 1, "ci", 1)[0], dist_a=wide, dist_b=wide)
    fitted, inputs = suite.fit_for(spec, draw, b.name)
    assert fitted["dtype"] == "float16" and inputs is not None
    assert fitted["seed"] == draw["seed"] and fitted["dist_a"] != wide
