"""Recipe strategies: every recipe x format x rounding mode, drawn from the values each recipe
class declares for its fields (``domains()``), as the JSON entries cases store.

A case's recipe entry is the recipe's JSON form (``tealite.recipes``) plus, for a recipe whose
scale is an input of the call (``scale_given``: DelayedScaling), that input, ``"scale"``.
:func:`recipe_from_json` and :func:`given_scale` read an entry back; specs convert it once.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite import recipes as R
from tealite.formats import ElementRounding, FP8ScaleRule, Saturation, ScaleRounding

TE_RULE = FP8ScaleRule.FMAX_OVER_AMAX.value
AITER_RULE = FP8ScaleRule.AMAX_OVER_FMAX.value
FP8_SCALE_RULES = (TE_RULE, AITER_RULE)
CASE_INPUTS = ("scale",)  # entry keys that are inputs of the case, not recipe fields

# Values drawn twice as often as the field's others: the setting most kernels run.
_EMPHASIS = {"saturation": Saturation.SATURATE, "amax_epsilon": 0.0}
# The scale a previous step's amax history produced: a drawn power of two times a drawn
# mantissa, so it is rarely the "right" scale for this tensor.
_GIVEN_SCALES = st.builds(lambda e, m: m * 2.0**e, st.integers(-8, 12),
                          st.sampled_from([1.0, 1.5, 1.171875, 0.9990234375]))


def recipe_from_json(entry: dict):
    """The recipe of a case's recipe entry (its case inputs set aside)."""
    recipe = R.from_json({k: v for k, v in entry.items() if k not in CASE_INPUTS})
    if recipe.scale_given != ("scale" in entry):
        need = "needs" if recipe.scale_given else "takes no"
        raise ValueError(f"a {recipe.kind!r} recipe entry {need} 'scale' (the given scale is "
                         f"a case input): {entry!r}")
    return recipe


def given_scale(entry: dict) -> float | None:
    """The given scale a case's recipe entry carries (None unless its recipe takes one)."""
    return entry.get("scale")


def recipe_entry(recipe, scale: float | None = None) -> dict:
    """A case's recipe entry: the recipe's JSON form plus the given scale it takes."""
    entry = recipe.to_json()
    if recipe.scale_given:
        entry["scale"] = scale
    return entry


def narrowing(scale_rules=(TE_RULE,), **fields) -> dict[str, tuple]:
    """The field values a draw (or a coverage cell) may take: ``fields`` narrows a field's
    values (e.g. ``granularity=("row",)``) in the recipes that have it; current scaling
    follows each of ``scale_rules`` (TE's only by default: ops whose kernels have no other
    rule keep to what they run)."""
    unknown = set(scale_rules) - set(FP8_SCALE_RULES)
    if unknown or not scale_rules:
        raise ValueError(f"scale_rules must be a non-empty subset of {FP8_SCALE_RULES}, "
                         f"got {scale_rules!r}")
    return {k: tuple(v) for k, v in dict(fields, scale_rule=tuple(scale_rules)).items()}


def recipes(classes=R.RECIPES, *, scale_rules=(TE_RULE,),
            **fields) -> st.SearchStrategy[dict]:
    """Recipe entries of the recipe ``classes``, narrowed as :func:`narrowing` says."""
    classes = tuple(classes)
    bad = [c for c in classes if c not in R.RECIPES]
    if bad or not classes:
        raise ValueError(f"classes must be a non-empty tuple of {[c.__name__ for c in R.RECIPES]}"
                         f", got {bad or classes!r}")
    narrow = narrowing(scale_rules, **fields)
    # Built once per argument set: specs call this inside composites, on every draw.
    return _recipes(classes, tuple(sorted(narrow.items())))


@functools.lru_cache(maxsize=None)
def _recipes(classes: tuple, narrow: tuple) -> st.SearchStrategy[dict]:
    per_class = []
    for cls in classes:
        variants = [st.fixed_dictionaries({k: _values(k, v) for k, v in domain.items()})
                    .map(lambda kw, cls=cls: cls(**kw))
                    for domain in (_narrowed(d, dict(narrow)) for d in cls.domains()) if domain]
        if not variants:
            raise ValueError(f"no {cls.__name__} recipe has field values {dict(narrow)}")
        per_class.append(st.one_of(*variants))  # the class first, then its variant
    return st.builds(recipe_entry, st.one_of(*per_class), _GIVEN_SCALES)


def _narrowed(domain: dict, narrow: dict) -> dict | None:
    out = {}
    for name, values in domain.items():
        out[name] = tuple(v for v in values if name not in narrow or v in narrow[name])
        if not out[name]:
            return None
    return out


def _values(name: str, values: tuple) -> st.SearchStrategy:
    favoured = tuple(v for v in values if name in _EMPHASIS and v == _EMPHASIS[name])
    return st.sampled_from(values + favoured)


@functools.lru_cache(maxsize=None)
def aiter_recipes() -> st.SearchStrategy[dict]:
    """The conventions AITER's Triton quant entry points follow (so a differential run draws
    cases they accept): AITER-rule current scaling in E4M3 (OCP on gfx950 / NVIDIA, FNUZ on
    gfx942; the other is rejected by the FP8-variant check) and MXFP4 with EVEN scales and
    ties-away elements."""
    return st.one_of(
        recipes((R.Float8CurrentScaling,), scale_rules=(AITER_RULE,),
                fmt=("e4m3", "e4m3fnuz")),
        recipes((R.MXBlockScaling,), fmt=("e2m1",), scale_rounding=(ScaleRounding.EVEN,),
                element_rounding=(ElementRounding.TIES_AWAY,)))
