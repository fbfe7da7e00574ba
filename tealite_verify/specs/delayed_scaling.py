"""Spec for ``delayed_scaling_update`` (DelayedScaling's amax-history roll + new scale):
bit-exact against the float32 reference."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite import recipes as R
from tealite.formats import FP8_FORMATS
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import quantize as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import generate
from tealite_verify.tiers.metrics import Tier


@st.composite
def cases(draw, dtype=None, size="ci"):
    h = draw(pick(1, 2, 3, 16, 1024))
    return {"history_len": h, "fmt": draw(pick(*FP8_FORMATS)),
            "margin": draw(pick(0, 1, 3)),
            "algo": draw(pick("max", "most_recent")),
            "dist": draw(distributions("float32")), "seed": draw(seeds()),
            # Slot 0 is the newest amax: sometimes 0 (a skipped step), NaN or Inf.
            "newest": draw(pick("drawn", "drawn", "zero", "nan", "inf")),
            "scale": draw(pick(1.0, 0.5, 3.0, 448.0))}


def make_inputs(case, device):
    hist = generate(case["dist"], (case["history_len"],), torch.float32, case["seed"]).abs()
    if case["newest"] != "drawn":
        hist[0] = {"zero": 0.0, "nan": float("nan"), "inf": float("inf")}[case["newest"]]
    return {"amax_history": hist.to(device),
            "scale": torch.tensor([case["scale"]], dtype=torch.float32, device=device)}


def _recipe(case):
    return R.DelayedScaling(case["fmt"], margin=case["margin"],
                            amax_history_len=case["history_len"], amax_compute_algo=case["algo"])


def call(inputs, case, backend):
    history, scale = tealite.delayed_scaling_update(inputs["amax_history"].clone(),
                                                    inputs["scale"], _recipe(case),
                                                    backend=backend)
    return {"amax_history": history, "scale": scale}


def reference(inputs, case):
    history, scale = ref.delayed_scaling_update(
        inputs["amax_history"].astype(np.float32), inputs["scale"].astype(np.float32),
        case["fmt"], case["margin"], case["algo"])
    return {"amax_history": Expected(history, torch.float32, Tier.EXACT),
            "scale": Expected(scale, torch.float32, Tier.EXACT)}


register(OpSpec(
    name=Op.DELAYED_SCALING_UPDATE, family="quantize", cases=cases, make_inputs=make_inputs,
    call=call, reference=reference, dtypes=("float32",),
    coverage=(cov.layout_cells("fmt", FP8_FORMATS) + cov.layout_cells("algo", ("max", "most_recent"))
              + cov.layout_cells("newest", ("drawn", "zero", "nan", "inf"))
              + cov.edge_cells((cov.ONE_ELEMENT, cov.MAX_LAST, cov.ZERO_BLOCK))),
    smoke_cases=tuple(
        {"history_len": h, "fmt": f, "margin": m, "algo": a, "newest": n, "scale": 2.0,
         "dist": {"kind": "wide", "log2_lo": -12, "log2_hi": 6}, "seed": 4}
        for h, f, m, a, n in ((16, "e4m3", 0, "max", "drawn"),
                              (1, "e5m2fnuz", 1, "most_recent", "zero"),
                              (3, "e4m3fnuz", 3, "max", "nan"),
                              (1024, "e5m2", 0, "most_recent", "inf")))))
