"""No backend silently computes a recipe it was not written for (issue 14, part 2).

Backends branch on a recipe's typed facts (tealite.recipes: family, scale_granularity,
scale_given, scale_rule, ...), never on its class, and refuse facts they were not written for
with ``tealite.recipe_facts.outside``.  Here recipe classes no backend has heard of are
registered for one test and run through the harness on every backend: each backend either
computes the recipe correctly (every comparison passes) or refuses it with a reason naming the
fact; never a wrong result and never a crash.  A backend of the kind issue 14 found (an
``isinstance`` chain whose ``else`` arm assumed per-tensor scales) is caught by the same check.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.formats import FP8ScaleRule, Saturation
from tealite.recipe_facts import outside, qgemm_kind
from tealite.recipes import Family, Granularity
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs, get_spec

from _helpers_quant import FLOATS, NORMAL, TORCH_Q, qcase

TRITON_RUNS = tealite.get_backend("triton").unavailable_reason() is None


@dataclass(frozen=True)
class _Local:
    """A test-local FP8 recipe (no built-in class): fields fmt and saturation; every other fact
    is a class attribute a subclass sets."""

    fmt: str = "e4m3"
    saturation: Saturation = Saturation.SATURATE
    family = Family.FP8
    scale_given = False
    scale_exponent_slack = False
    scale_rule = FP8ScaleRule.FMAX_OVER_AMAX
    force_pow2_scales = False
    amax_epsilon = 0.0

    def to_json(self) -> dict:
        return {"kind": self.kind, "fmt": self.fmt, "saturation": self.saturation.value}

    @classmethod
    def from_json(cls, d: dict):
        return cls(d["fmt"], Saturation(d["saturation"]))

    def describe(self) -> str:
        return f"{self.kind}[{self.fmt}]"


class _TokenPow2(_Local):
    """Per-token TE scales, always a power of two: the facts of
    Float8CurrentScaling(granularity="row", force_pow2_scales=True)."""

    kind = "test_token_pow2"
    scale_granularity = amax_granularity = Granularity.ROW
    force_pow2_scales = True


class _Tiles2x64(_Local):
    """Known facts, a block shape only some kernels take: 2x64 TE-rule blocks."""

    kind = "test_tiles_2x64"
    scale_granularity = Granularity.BLOCK
    amax_granularity = None
    block = (2, 64)


class _AiterBlocks(_Local):
    """Facts no backend was written for: AITER's scale rule over 1x128 blocks."""

    kind = "test_aiter_blocks"
    scale_granularity = Granularity.BLOCK
    amax_granularity = None
    block = (1, 128)
    scale_rule = FP8ScaleRule.AMAX_OVER_FMAX


@pytest.fixture
def register(monkeypatch):
    """Registers a recipe class for this test only: its JSON kind and the recipe list."""
    all_specs()  # built before the class joins R.RECIPES: the specs' coverage stays built-in

    def reg(cls):
        monkeypatch.setitem(R.BY_KIND, cls.kind, cls)
        monkeypatch.setattr(R, "RECIPES", R.RECIPES + (cls,))
        return cls().to_json()
    return reg


def computed_or_refused(report) -> dict[str, str]:
    """Asserts the property on one case report; returns each backend's status."""
    info = report.describe()
    for name, o in report.outcomes.items():
        assert o.status in ("ok", "unsupported", "unavailable"), f"{name} crashed:\n{info}"
        assert o.status == "ok" or o.reason, f"{name} refused without a reason:\n{info}"
    failed = [f"{c.lhs} vs {c.rhs}: {c.output}" for c in report.comparisons
              if not c.metrics.passed]
    assert not failed, f"a backend computed the recipe wrongly: {failed}\n{info}"
    return {n: o.status for n, o in report.outcomes.items()}


def _ran(statuses, *names):
    want = [n for n in names if n != "triton" or TRITON_RUNS]
    assert all(statuses[n] == "ok" for n in want), statuses


def _qgemm_case(ra, rb, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "m": 16, "n": 24, "k": 96, "layout": "TN",
            "dtype": "bfloat16", "out_dtype": "float32", "bias": False, "dist_a": NORMAL,
            "dist_b": NORMAL, "seed": 3}
    return dict(case, **kw)


# ---- a new recipe with known facts just works -----------------------------------------------

@pytest.mark.parametrize("columnwise", [False, True])
def test_a_new_recipe_with_known_facts_is_quantized_by_its_facts(register, columnwise):
    entry = register(_TokenPow2)
    report = run_case(get_spec("quantize"), qcase(entry, "float32", [33, 70],
                                                  columnwise=columnwise, dist=NORMAL, seed=4))
    statuses = computed_or_refused(report)
    _ran(statuses, "torch", "triton")
    aiter = report.outcomes["aiter_triton"]
    assert aiter.status == "unavailable" or "scale_rule" in aiter.reason  # AITER's rule only


def test_a_new_recipe_with_known_facts_is_dequantized_and_multiplied(register):
    entry = register(_TokenPow2)
    dq = dict(qcase(entry, "bfloat16", [20, 96], dist=NORMAL, seed=5), columnwise=False)
    _ran(computed_or_refused(run_case(get_spec("dequantize"), dq)), "torch", "triton")
    current = R.Float8CurrentScaling("e4m3", "tensor").to_json()
    for ra, rb in ((entry, current), (current, entry), (entry, entry)):
        statuses = computed_or_refused(run_case(get_spec("qgemm"), _qgemm_case(ra, rb)))
        _ran(statuses, "torch", "triton", "scaled_mm")


# ---- facts a kernel was not written for are refused, with the fact named ---------------------

def test_a_block_shape_outside_a_kernel_is_refused_there_and_computed_elsewhere(register):
    entry = register(_Tiles2x64)
    report = run_case(get_spec("quantize"), qcase(entry, "float32", [9, 130], dist=NORMAL,
                                                  seed=6))
    statuses = computed_or_refused(report)
    _ran(statuses, "torch")  # its block quantizer takes any block shape
    if TRITON_RUNS:
        assert statuses["triton"] == "unsupported"
        assert "block 1x128 or 128x128; the recipe's is 2x64" in \
            report.outcomes["triton"].reason
    dq = dict(qcase(entry, "float32", [9, 130], dist=NORMAL, seed=6), columnwise=False)
    _ran(computed_or_refused(run_case(get_spec("dequantize"), dq)), "torch", "triton")


def test_facts_no_backend_was_written_for_are_refused_everywhere(register):
    entry = register(_AiterBlocks)
    report = run_case(get_spec("quantize"), qcase(entry, "float32", [4, 128], dist=NORMAL,
                                                  seed=7))
    statuses = computed_or_refused(report)
    assert "ok" not in statuses.values() and report.verdict == "skip", statuses
    assert "scale_granularity tensor or row; the recipe's is block" in \
        report.outcomes["torch"].reason


# ---- the check can fail: the bug issue 14 found is caught -------------------------------------

def test_an_else_arm_computing_another_recipe_is_caught(register, make_backend):
    entry = register(_TokenPow2)

    def per_tensor_else_arm(x, recipe, *, rowwise, columnwise, scale):
        """An isinstance chain's else arm: any unknown recipe taken as per-tensor."""
        as_tensor = R.Float8CurrentScaling(recipe.fmt, "tensor", force_pow2_scales=True)
        q = TORCH_Q(x, as_tensor, rowwise=rowwise, columnwise=columnwise, scale=scale)
        q.recipe = recipe
        return q

    wrong = make_backend("else_arm")
    wrong.implements("quantize", dtypes=FLOATS)(per_tensor_else_arm)
    report = run_case(get_spec("quantize"), qcase(entry, "float32", [33, 70], dist=NORMAL,
                                                  seed=4), backends=["torch", wrong.name])
    with pytest.raises(AssertionError, match="computed the recipe wrongly"):
        computed_or_refused(report)


# ---- the helpers ------------------------------------------------------------------------------

def test_outside_names_the_fact_what_the_kernel_takes_and_what_the_recipe_has():
    r = R.Float8BlockScaling("e4m3", (128, 128))
    assert outside(r, "k", scale_granularity=(Granularity.BLOCK,), block=((128, 128),)) is None
    assert outside(r, "k", block=((1, 128),)) == "k takes block 1x128; the recipe's is 128x128"
    assert outside(r, "k", scale_rule=(FP8ScaleRule.AMAX_OVER_FMAX,)) == \
        "k takes scale_rule amax/fmax; the recipe's is fmax/amax"
    assert outside(R.MXFP8BlockScaling(), "k", scale_rule=tuple(FP8ScaleRule)) == \
        "k takes scale_rule fmax/amax or amax/fmax; the recipe's is none"


def test_qgemm_kind_reads_the_scale_layout():
    assert [qgemm_kind(r) for r in (R.DelayedScaling(), R.Float8CurrentScaling(granularity="row"),
                                    R.Float8BlockScaling(), R.MXFP4BlockScaling())] == \
        ["fp8", "fp8", "block", "mx"]
    assert qgemm_kind(object()) is None
    with pytest.raises(tealite.TealiteArgumentError, match="scale_granularity None; qgemm takes scales per"):
        bad = tealite.quantize(torch.ones(2, 32), R.Float8CurrentScaling())
        bad.recipe = _Local()  # scales per nothing qgemm knows
        tealite.qgemm(bad, bad, layout="TN")
