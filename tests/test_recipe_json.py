"""Recipes' JSON forms: every recipe round-trips with every field value; every stored case's
recipe entry reads as the pre-issue-14 reader read it, and its canonical form keeps every stored
key and value (adding only optional fields at their defaults); the strategies draw those forms."""
from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tealite import recipes as R
from tealite.formats import ElementRounding, FP8ScaleRule, Saturation, ScaleRounding
from tealite_verify import recipe_rules as rules
from tealite_verify.tiers.metrics import Tier
from tealite_verify.strategies.recipes import (FP8_SCALE_RULES, aiter_recipes, given_scale,
                                               recipe_entry, recipe_from_json, recipes)

ROOT = Path(__file__).resolve().parents[1]
STORED = sorted(ROOT.glob("findings/*.json")) + sorted(ROOT.glob("ci/baselines/*.json*"))
# Fields the domains leave out (they change no quantize), with values beyond their defaults.
EXTRA_VALUES = {"margin": (0, 3), "amax_history_len": (1, 1024),
                "amax_compute_algo": ("max", "most_recent")}


def _every_recipe():
    """Every combination of every declared field value (plus EXTRA_VALUES' fields)."""
    for cls in R.RECIPES:
        names = [f.name for f in dataclasses.fields(cls)]
        for domain in cls.domains():
            values = dict(domain, **{k: v for k, v in EXTRA_VALUES.items() if k in names})
            keys = list(values)
            for combo in itertools.product(*(values[k] for k in keys)):
                yield cls(**dict(zip(keys, combo)))


def test_every_recipe_round_trips_with_every_field_value():
    seen = 0
    for recipe in _every_recipe():
        d = recipe.to_json()
        assert json.loads(json.dumps(d)) == d  # plain JSON
        back = R.from_json(d)
        assert back == recipe and type(back) is type(recipe)
        assert back.to_json() == d
        seen += 1
    assert seen > 200


def _legacy_recipe_from_json(d: dict):
    """strategies.recipes.recipe_from_json before issue 14 (the reader every stored case was
    written for), kept here as the oracle."""
    kind = d["kind"]
    sat = Saturation(d.get("saturation", "saturate"))
    if kind == "current":
        return R.Float8CurrentScaling(d["fmt"], d["granularity"], d["force_pow2_scales"],
                                      d["amax_epsilon"], sat,
                                      FP8ScaleRule(d.get("scale_rule", "fmax/amax")))
    if kind == "block":
        return R.Float8BlockScaling(d["fmt"], tuple(d["block"]), d["force_pow2_scales"],
                                    d["amax_epsilon"], sat)
    if kind == "delayed":
        return R.DelayedScaling(d["fmt"], saturation=sat)
    return R.MXBlockScaling(d["fmt"], ScaleRounding(d["scale_rounding"]),
                            ElementRounding(d["element_rounding"]))


def _entries(o):
    if isinstance(o, dict):
        if o.get("kind") in R.BY_KIND and "fmt" in o:
            yield o
            return
        for v in o.values():
            yield from _entries(v)
    elif isinstance(o, list):
        for v in o:
            yield from _entries(v)


def _load(path: Path):
    text = (gzip.open if path.suffix == ".gz" else open)(path, "rt").read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_stored_recipe_entry_reads_as_before_and_keeps_its_values():
    forms = set()
    for path in STORED:
        for d in _entries(_load(path)):
            recipe = recipe_from_json(d)
            assert recipe == _legacy_recipe_from_json(d), (path.name, d)
            canonical = recipe_entry(recipe, given_scale(d))
            assert {k: canonical.get(k) for k in d} == d, (path.name, d)
            assert set(canonical) - set(d) <= set(type(recipe)._OPTIONAL), (path.name, d)
            assert recipe_from_json(canonical) == recipe
            forms.add((d["kind"], tuple(sorted(d))))
    # The legacy forms are all there: no saturation, no scale_rule, AITER's rule.
    assert ("current", ("amax_epsilon", "fmt", "force_pow2_scales", "granularity",
                        "kind")) in forms
    assert ("delayed", ("fmt", "kind", "scale")) in forms
    assert len(forms) >= 8


def test_the_given_scale_is_a_case_input_not_a_recipe_field():
    d = {"kind": "delayed", "fmt": "e5m2", "scale": 0.75, "saturation": "saturate"}
    recipe = recipe_from_json(d)
    assert "scale" not in recipe.to_json() and given_scale(d) == 0.75
    with pytest.raises(ValueError, match="unknown keys.*scale"):
        R.from_json(d)  # tealite's form has no scale
    with pytest.raises(ValueError, match="needs 'scale'"):
        recipe_from_json({"kind": "delayed", "fmt": "e5m2"})
    with pytest.raises(ValueError, match="takes no 'scale'"):
        recipe_from_json(dict(R.MXFP8BlockScaling().to_json(), scale=1.0))


@pytest.mark.parametrize("d, match", [
    ({"kind": "nvfp4", "fmt": "e2m1"}, "kind"),
    ({"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne",
      "scale_roundin": "floor"}, "unknown keys.*scale_roundin"),
    ({"kind": "block", "fmt": "e4m3", "block": [1, 128]}, "missing keys"),
    ({"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": True,
      "amax_epsilon": 0.0, "scale_rule": "amax/fmax"}, "force_pow2_scales"),
    ({"kind": "current", "fmt": "e2m1", "granularity": "row", "force_pow2_scales": False,
      "amax_epsilon": 0.0}, "FP8 format"),
])
def test_bad_json_is_refused_with_the_constraint_named(d, match):
    with pytest.raises(ValueError, match=match):
        R.from_json(d)


def test_optional_keys_read_as_their_defaults_and_the_form_is_canonical():
    full = R.Float8CurrentScaling("e4m3", "row").to_json()
    sparse = {k: v for k, v in full.items() if k != "saturation"}
    a, b = R.from_json(full), R.from_json(sparse)
    assert a == b and hash(a) == hash(b)
    assert a.to_json() == b.to_json() == full  # one canonical form
    # TE's rule at its default is left out (its historical form); a stated one reads the same.
    stated = dict(full, scale_rule="fmax/amax")
    assert "scale_rule" not in full and R.from_json(stated).to_json() == full
    aiter = dict(full, scale_rule="amax/fmax")
    assert R.from_json(aiter).to_json() == aiter


def _factory(role):
    return R.Float8CurrentScaling()


def test_custom_recipe_serializes_as_its_role_table():
    table = {R.Role("Linear", "weight", "layers.0.fc1"): R.MXFP8BlockScaling(),
             R.Role("Linear", "weight"): R.Float8BlockScaling(block=(128, 128)),
             R.Role("Linear", "input"): R.Float8CurrentScaling(granularity="row"),
             R.Role("Linear", "output"): None}
    custom = R.CustomRecipe.from_table(table)
    d = custom.to_json()
    assert json.loads(json.dumps(d)) == d
    back = R.from_json(d)
    assert back == custom and back.to_json() == d
    for role in (R.Role("Linear", "weight", "layers.0.fc1"), R.Role("Linear", "weight", "x"),
                 R.Role("Linear", "input", "x"), R.Role("Linear", "output", "x")):
        assert R.resolve(back, role) == R.resolve(custom, role)
    assert R.resolve(back, R.Role("Linear", "weight", "layers.0.fc1")) == R.MXFP8BlockScaling()
    with pytest.raises(LookupError, match="no entry"):
        R.resolve(back, R.Role("Linear", "grad_output", "x"))


def test_custom_recipe_with_a_plain_factory_cannot_serialize():
    with pytest.raises(TypeError, match="role table"):
        R.CustomRecipe(_factory).to_json()
    with pytest.raises(TypeError, match="built-in recipe"):
        R.CustomRecipe.from_table({R.Role("Linear", "input"): "e4m3"})


def test_every_recipe_declares_the_facts_the_harness_table_reads():
    for recipe in _every_recipe():
        assert isinstance(recipe.family, R.Family)
        assert isinstance(recipe.scale_granularity, R.Granularity)
        assert recipe.amax_granularity is None or isinstance(recipe.amax_granularity,
                                                             R.Granularity)
        assert isinstance(recipe.scale_given, bool)
        assert isinstance(recipe.scale_exponent_slack, bool)
        assert rules.code_tier(recipe) in (Tier.EXACT, Tier.E8M0_ADJUSTED)
        family, variant = recipe.taxonomy()
        assert family and all(isinstance(p, str) for p in family + variant)


def test_the_table_follows_the_declared_facts():
    """A recipe's declared facts, not its class, pick the reference and tier: one declaring
    the MX family is quantized and judged as MX (so a wrong declaration is caught)."""
    import numpy as np
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    mx = R.MXFP8BlockScaling()
    assert rules.code_tier(mx) is Tier.E8M0_ADJUSTED and rules.quantize(x, mx).amax is None
    assert rules.quantize(x, mx).scale_inv.dtype == np.uint8
    cur = R.Float8CurrentScaling(granularity="row")
    q = rules.quantize(x, cur)
    assert rules.code_tier(cur) is Tier.EXACT and q.scale_inv.shape == (2,) and q.amax.shape == (2,)
    aiter = R.Float8CurrentScaling(granularity="row", scale_rule=FP8ScaleRule.AMAX_OVER_FMAX)
    assert rules.quantize(x, aiter).amax is None and rules.divides_by_fmax(aiter)
    delayed = R.DelayedScaling()
    assert rules.quantize(x, delayed, 2.0).scale_inv[0] == np.float32(0.5)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.one_of(recipes(scale_rules=FP8_SCALE_RULES), aiter_recipes()))
def test_drawn_entries_are_the_stored_forms(d):
    recipe = recipe_from_json(d)
    assert recipe_entry(recipe, given_scale(d)) == d
    if d["kind"] in ("current", "block", "delayed", "mx"):  # the kinds stored cases have
        assert recipe == _legacy_recipe_from_json(d)
    # The historical key sets: TE's rule unstated, AITER's stated, a delayed scale.
    assert ("scale_rule" in d) == (d["kind"] == "current" and d.get("scale_rule") == "amax/fmax")
    assert ("scale" in d) == (d["kind"] == "delayed")
    assert "block" not in d or d["kind"] == "block"


def test_narrowing_a_field_no_recipe_can_take_is_an_error():
    with pytest.raises(ValueError, match="no Float8BlockScaling recipe"):
        recipes((R.Float8BlockScaling,), fmt=("e2m1",))
    with pytest.raises(ValueError, match="classes must be"):
        recipes(("block",))  # a kind string is not a recipe class
    with pytest.raises(ValueError, match="scale_rules"):
        recipes(scale_rules=("fmax/amax", "bogus"))
