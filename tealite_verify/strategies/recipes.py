"""Recipe strategies: every recipe x format x rounding mode, as JSON-able dicts.

``recipe_from_json`` turns a drawn dict into the tealite recipe object.
"""
from __future__ import annotations

from hypothesis import strategies as st

from tealite import recipes as R
from tealite.formats import FP8_FORMATS, ElementRounding, Saturation, ScaleRounding

SCALE_MODES = tuple(m.value for m in ScaleRounding)
ELEMENT_ROUNDINGS = tuple(r.value for r in ElementRounding)
RECIPE_KINDS = ("current", "block", "delayed", "mx")


def recipes(kinds=RECIPE_KINDS) -> st.SearchStrategy[dict]:
    fp8 = st.sampled_from(FP8_FORMATS)
    saturation = st.sampled_from(["saturate", "saturate", "nonfinite"])
    options = {
        "current": st.fixed_dictionaries({
            "kind": st.just("current"), "fmt": fp8,
            "granularity": st.sampled_from(["tensor", "row"]),
            "force_pow2_scales": st.booleans(),
            "amax_epsilon": st.sampled_from([0.0, 0.0, 1e-4]), "saturation": saturation}),
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


def recipe_from_json(d: dict):
    kind = d["kind"]
    sat = Saturation(d.get("saturation", "saturate"))
    if kind == "current":
        return R.Float8CurrentScaling(d["fmt"], d["granularity"], d["force_pow2_scales"],
                                      d["amax_epsilon"], sat)
    if kind == "block":
        return R.Float8BlockScaling(d["fmt"], tuple(d["block"]), d["force_pow2_scales"],
                                    d["amax_epsilon"], sat)
    if kind == "delayed":
        return R.DelayedScaling(d["fmt"], saturation=sat)
    if kind == "mx":
        return R.MXBlockScaling(d["fmt"], ScaleRounding(d["scale_rounding"]),
                                ElementRounding(d["element_rounding"]))
    raise ValueError(f"unknown recipe kind {kind!r}")
