"""Recipe strategies: every recipe x format x rounding mode, as JSON-able dicts.

``recipe_from_json`` turns a drawn dict into the tealite recipe object.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite import recipes as R
from tealite.formats import (FP8_FORMATS, ElementRounding, FP8ScaleRule, Saturation,
                             ScaleRounding)

SCALE_MODES = tuple(m.value for m in ScaleRounding)
ELEMENT_ROUNDINGS = tuple(r.value for r in ElementRounding)
RECIPE_KINDS = ("current", "block", "delayed", "mx")
TE_RULE = FP8ScaleRule.FMAX_OVER_AMAX.value
AITER_RULE = FP8ScaleRule.AMAX_OVER_FMAX.value
FP8_SCALE_RULES = (TE_RULE, AITER_RULE)
_SATURATION = st.sampled_from(["saturate", "saturate", "nonfinite"])


def _aiter_rule_current(fmts) -> st.SearchStrategy[dict]:
    """Current scaling under AITER's rule.  Only such dicts carry "scale_rule": a dict without
    it is TE's rule, so stored cases drawn before the rule existed keep their meaning."""
    return st.fixed_dictionaries({
        "kind": st.just("current"), "fmt": st.sampled_from(fmts),
        "granularity": st.sampled_from(["tensor", "row"]),
        "force_pow2_scales": st.just(False), "amax_epsilon": st.just(0.0),
        "saturation": _SATURATION, "scale_rule": st.just(AITER_RULE)})


def recipes(kinds=RECIPE_KINDS, *, scale_rules=(TE_RULE,)) -> st.SearchStrategy[dict]:
    """Recipes of ``kinds``; current scaling under each of ``scale_rules`` (TE's only by
    default: ops whose kernels have no other rule keep drawing what they run)."""
    # Built once per argument set: specs call this inside composites, on every draw.
    return _recipes(tuple(kinds), tuple(scale_rules))


@functools.lru_cache(maxsize=None)
def _recipes(kinds: tuple, scale_rules: tuple) -> st.SearchStrategy[dict]:
    fp8 = st.sampled_from(FP8_FORMATS)
    saturation = _SATURATION
    te_current = st.fixed_dictionaries({
        "kind": st.just("current"), "fmt": fp8,
        "granularity": st.sampled_from(["tensor", "row"]),
        "force_pow2_scales": st.booleans(),
        "amax_epsilon": st.sampled_from([0.0, 0.0, 1e-4]), "saturation": saturation})
    unknown = set(scale_rules) - set(FP8_SCALE_RULES)
    if unknown or not scale_rules:
        raise ValueError(f"scale_rules must be a non-empty subset of {FP8_SCALE_RULES}, "
                         f"got {scale_rules!r}")
    current = [te_current] * (TE_RULE in scale_rules) + \
        [_aiter_rule_current(FP8_FORMATS)] * (AITER_RULE in scale_rules)
    options = {
        "current": st.one_of(*current),
        "block": st.fixed_dictionaries({
            "kind": st.just("block"), "fmt": fp8,
            "block": st.sampled_from([[1, 128], [128, 128]]),
            "force_pow2_scales": st.booleans(),
            "amax_epsilon": st.sampled_from([0.0, 1e-4]), "saturation": saturation}),
        "delayed": st.fixed_dictionaries({
            "kind": st.just("delayed"), "fmt": fp8,
            # The scale a previous step's amax history produced: a drawn power of two times a
            # drawn mantissa, so it is rarely the "right" scale for this tensor.
            "scale": st.builds(lambda e, m: m * 2.0**e, st.integers(-8, 12),
                               st.sampled_from([1.0, 1.5, 1.171875, 0.9990234375])),
            "saturation": saturation}),
        "mx": st.fixed_dictionaries({
            "kind": st.just("mx"), "fmt": st.sampled_from(FP8_FORMATS + ("e2m1",)),
            "scale_rounding": st.sampled_from(SCALE_MODES),
            "element_rounding": st.sampled_from(ELEMENT_ROUNDINGS)}),
    }
    return st.one_of(*(options[k] for k in kinds))


@functools.lru_cache(maxsize=None)
def aiter_recipes() -> st.SearchStrategy[dict]:
    """The conventions AITER's Triton quant entry points follow (so a differential run draws
    cases they accept): AITER-rule current scaling in E4M3 (OCP on gfx950 / NVIDIA, FNUZ on
    gfx942; the other is rejected by the FP8-variant check) and MXFP4 with EVEN scales and
    ties-away elements."""
    return st.one_of(
        _aiter_rule_current(("e4m3", "e4m3fnuz")),
        st.just({"kind": "mx", "fmt": "e2m1", "scale_rounding": ScaleRounding.EVEN.value,
                 "element_rounding": ElementRounding.TIES_AWAY.value}))


def recipe_from_json(d: dict):
    kind = d["kind"]
    sat = Saturation(d.get("saturation", "saturate"))
    if kind == "current":
        return R.Float8CurrentScaling(d["fmt"], d["granularity"], d["force_pow2_scales"],
                                      d["amax_epsilon"], sat,
                                      FP8ScaleRule(d.get("scale_rule", TE_RULE)))
    if kind == "block":
        return R.Float8BlockScaling(d["fmt"], tuple(d["block"]), d["force_pow2_scales"],
                                    d["amax_epsilon"], sat)
    if kind == "delayed":
        return R.DelayedScaling(d["fmt"], saturation=sat)
    if kind == "mx":
        return R.MXBlockScaling(d["fmt"], ScaleRounding(d["scale_rounding"]),
                                ElementRounding(d["element_rounding"]))
    raise ValueError(f"unknown recipe kind {kind!r}")
