"""Recipe coverage cells are generated from the recipe classes (``domains()``, ``taxonomy()``,
``recipe_space``): the built-in recipes give the cells, order and moves the hand-written
cells had, and a new recipe class gets its cells with no coverage edit."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from tealite import recipes as R
from tealite.formats import FP8_FORMATS, Saturation
from tealite.recipes import Family, Granularity
from tealite_verify import coverage as cov
from tealite_verify import recipe_space as space
from tealite_verify.specs import get_spec


def _labels(cells, axis):
    return [c.label for c in cells if c.axis == axis]


def test_builtin_cells_keep_their_names_order_and_moves():
    cells = get_spec("quantize").coverage
    mx8 = [f"mxfp8/{s}" for s in ("floor", "ceil", "even", "rceil")]
    mx4 = [f"mxfp4/{s}/{e}" for s in ("floor", "ceil", "even", "rceil")
           for e in ("rne", "ties_away")]
    assert _labels(cells, "recipe") == [
        "delayed", "current/tensor/te", "current/tensor/aiter", "current/row/te",
        "current/row/aiter", "block/1x128/pow2", "block/1x128/fp32", "block/128x128/pow2",
        "block/128x128/fp32"] + mx8 + mx4
    assert _labels(cells, "recipe.format") == list(FP8_FORMATS) + ["e2m1"]
    assert _labels(cells, "recipe.saturation") == ["saturate", "nonfinite"]
    by_name = {str(c): c for c in cells}
    row = by_name["recipe=current/row/aiter"]
    assert row.needs == (("recipe.kind", "current"),)
    assert row.sets == (("recipe.granularity", "row"), ("recipe.scale_rule", "amax/fmax"))
    mx = by_name["recipe=mxfp8/even"]
    assert mx.needs == (("recipe.kind", "mx"), ("recipe.fp4", False))
    assert mx.sets == (("recipe.scale_rounding", "even"), ("recipe.element_rounding", "rne"))
    assert by_name["recipe=block/128x128/fp32"].sets == (
        ("recipe.block", (128, 128)), ("recipe.force_pow2_scales", False))
    assert by_name["recipe.saturation=nonfinite"].needs == (("recipe.fp8", True),)
    families = cov.family_cells("recipe")
    assert [c.label for c in families] == ["delayed", "current/tensor", "current/row",
                                          "block/1x128", "block/128x128", "mxfp8", "mxfp4"]
    assert families[3].sets == (("recipe.block", (1, 128)),)


def test_per_op_narrowing_restricts_the_cells():
    fused = _labels(get_spec("rmsnorm_fwd_quantize").coverage, "recipe")
    assert [n for n in fused if n.startswith(("current", "block"))] == [
        "current/row/te", "current/row/aiter"]
    b = _labels(get_spec("qgemm").coverage, "recipe_b")
    assert [n for n in b if not n.startswith("mx")] == [
        "delayed", "current/tensor/te", "current/row/te", "block/1x128/pow2",
        "block/1x128/fp32"]
    with pytest.raises(ValueError, match="no Float8BlockScaling recipe"):
        cov.recipe_cells("recipe", (R.Float8BlockScaling,), block=[(2, 2)])


def test_choosing_fields_are_read_from_the_names():
    assert space.choosing_fields(R.Float8CurrentScaling) == ("granularity", "scale_rule")
    assert space.choosing_fields(R.Float8CurrentScaling, family_only=True) == ("granularity",)
    assert space.choosing_fields(R.MXBlockScaling, family_only=True) == ()
    assert space.splits_packing(R.MXBlockScaling)
    assert not space.splits_packing(R.Float8BlockScaling)


@dataclass(frozen=True)
class _Tiled:
    """A test-local recipe of the FP8 family: 1xN tiles, a switchable pow2 scale."""

    fmt: str = "e4m3"
    tile: int = 64
    pow2: bool = True
    saturation: Saturation = Saturation.SATURATE
    kind = "tiled"
    family = Family.FP8
    scale_granularity = Granularity.BLOCK

    def taxonomy(self):
        return ("tiled", str(self.tile)), ("pow2" if self.pow2 else "fp32",)

    @classmethod
    def domains(cls):
        return ({"fmt": FP8_FORMATS, "tile": (64, 16), "pow2": (False, True),
                 "saturation": tuple(Saturation)},)


@dataclass(frozen=True)
class _OtherFamily(_Tiled):
    kind = "other"
    family = Family.MX


def test_a_new_recipe_class_gets_cells_without_a_coverage_edit(monkeypatch):
    cells = cov.recipe_cells("recipe", (R.MXBlockScaling, _Tiled, R.DelayedScaling))
    names = _labels(cells, "recipe")
    # Coarse to fine: the given scale, the tiles (blocks), then MX blocks.
    assert names[:5] == ["delayed", "tiled/64/pow2", "tiled/64/fp32", "tiled/16/pow2",
                         "tiled/16/fp32"] and names[5].startswith("mxfp8/")
    cell = next(c for c in cells if c.label == "tiled/16/pow2")
    assert cell.needs == (("recipe.kind", "tiled"),)
    assert cell.sets == (("recipe.tile", 16), ("recipe.pow2", True))
    assert _labels(cov.family_cells("recipe", (_Tiled,)), "recipe.family") == [
        "tiled/64", "tiled/16"]

    monkeypatch.setitem(R.BY_KIND, "tiled", _Tiled)  # registered for this test only
    case = {"recipe": {"kind": "tiled", "fmt": "e5m2", "tile": 64, "pow2": False,
                       "saturation": "nonfinite"}}
    moved = cov.force(case, cell)
    assert moved["recipe"] == dict(case["recipe"], tile=16, pow2=True)
    saturate = next(c for c in cells if str(c) == "recipe.saturation=saturate")
    assert cov.force(case, saturate)["recipe"]["saturation"] == "saturate"
    mx_cell = next(c for c in cells if c.label == "mxfp8/floor")
    assert cov.force(case, mx_cell) is None  # not an MX recipe: refused


def test_saturation_cells_need_one_family():
    with pytest.raises(ValueError, match="span families"):
        cov.recipe_cells("recipe", (_Tiled, _OtherFamily))
