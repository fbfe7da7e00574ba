"""Spec for ``delayed_scaling_update_bulk`` (issue 17): DelayedScaling's history roll and scale
update for many tensors in one call.

Outputs ``h<i>`` (tensor i's new history) and ``s<i>`` (its new scale).  Two oracles, both
bit-exact (the update is a roll, a max and two fp32 divisions: no rounding is left to a
backend's choice):

* **reference** (``exact`` tier): the float32 per-tensor reference of the single op
  (references/quantize.py's ``delayed_scaling_update``), tensor by tensor;
* **parity** (tiers/parity.py): the per-tensor ``delayed_scaling_update`` run tensor by tensor
  in ``call`` (``split.h<i>`` / ``split.s<i>``), on the backend itself where it implements
  the single op and on torch otherwise (the single op is verified there).  A bulk kernel that
  reads a neighbour's history, mixes up two tensors' formats or margins, or loses the last
  tensor fails this even where its values would pass some other tensor's reference.
"""
from __future__ import annotations

import numpy as np
import torch

import tealite
from tealite import recipes as R
from tealite import registry
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import quantize as ref
from tealite_verify.graph_replay import GraphReplayPolicy
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.training import BULK_KINDS, BULK_NEWEST, bulk_scaling_cases
from tealite_verify.tensors import generate
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.parity import judge_outputs

SPLIT = "split."
_NEWEST = {"zero": 0.0, "nan": float("nan"), "inf": float("inf")}


def cases(dtype=None, size="ci"):
    return bulk_scaling_cases(size)


def entries(case) -> list[dict]:
    """Each tensor's fields: with a shared recipe, entry 0's recipe fields for all (each keeps
    its own scale)."""
    keys = ("history_len", "fmt", "margin", "algo")
    first = case["entries"][0]
    if case["kind"] == "shared_recipe":
        return [dict(e, **{k: first[k] for k in keys}) for e in case["entries"]]
    return list(case["entries"])


def recipe_of(e: dict) -> R.DelayedScaling:
    return R.DelayedScaling(e["fmt"], margin=e["margin"], amax_history_len=e["history_len"],
                            amax_compute_algo=e["algo"])


def make_inputs(case, device):
    inputs = {}
    for i, e in enumerate(entries(case)):
        h = generate(case["dist"], (e["history_len"],), torch.float32, case["seed"] + i).abs()
        if i == 0 and case["newest"] in _NEWEST:
            h[0] = _NEWEST[case["newest"]]
        inputs[f"h{i}"] = h.to(device)
        inputs[f"s{i}"] = torch.tensor([e["scale"]], dtype=torch.float32, device=device)
    return inputs


def _split_backend(backend: str) -> str:
    impls = registry.get_backend(backend).impls
    return backend if Op.DELAYED_SCALING_UPDATE in impls else "torch"


def call(inputs, case, backend):
    es = entries(case)
    hs = [inputs[f"h{i}"] for i in range(len(es))]
    ss = [inputs[f"s{i}"] for i in range(len(es))]
    recipes = recipe_of(es[0]) if case["kind"] == "shared_recipe" else [recipe_of(e) for e in es]
    out = tealite.delayed_scaling_update_bulk(hs, ss, recipes, backend=backend)
    outputs = {}
    for i, (h, s) in enumerate(zip(out.amax_histories, out.scales)):
        outputs[f"h{i}"], outputs[f"s{i}"] = h, s
    split = _split_backend(backend)
    for i, e in enumerate(es):  # the split path: the single op, tensor by tensor
        h, s = tealite.delayed_scaling_update(hs[i], ss[i], recipe_of(e), backend=split)
        outputs[f"{SPLIT}h{i}"], outputs[f"{SPLIT}s{i}"] = h, s
    return outputs


def _parity_expected() -> Expected:
    def check(outs, numerics):
        split = {k[len(SPLIT):]: v for k, v in outs.items() if k.startswith(SPLIT)}
        fused = {k: v for k, v in outs.items() if not k.startswith(SPLIT)}
        return judge_outputs(fused, split)

    return Expected(None, None, Tier.PARITY, check=check)


def reference(inputs, case):
    expected = {}
    for i, e in enumerate(entries(case)):
        h, s = ref.delayed_scaling_update(inputs[f"h{i}"].astype(np.float32),
                                          inputs[f"s{i}"].astype(np.float32),
                                          e["fmt"], e["margin"], e["algo"])
        expected[f"h{i}"] = Expected(h, torch.float32, Tier.EXACT)
        expected[f"s{i}"] = Expected(s, torch.float32, Tier.EXACT)
    expected["parity"] = _parity_expected()
    return expected


def _entry(h, fmt, margin, algo, scale=2.0):
    return {"history_len": h, "fmt": fmt, "margin": margin, "algo": algo, "scale": scale}


_WIDE = {"kind": "wide", "log2_lo": -12, "log2_hi": 6}
SMOKE = (
    {"count": 4, "kind": "per_tensor_recipes", "newest": "drawn", "dist": _WIDE, "seed": 4,
     "entries": [_entry(16, "e4m3", 0, "max"), _entry(1, "e5m2fnuz", 1, "most_recent"),
                 _entry(3, "e4m3fnuz", 3, "max", 0.5), _entry(1024, "e5m2", 0, "most_recent")]},
    {"count": 3, "kind": "shared_recipe", "newest": "nan", "dist": _WIDE, "seed": 5,
     "entries": [_entry(37, "e4m3", 1, "max"), _entry(2, "e5m2", 0, "most_recent", 448.0),
                 _entry(1, "e4m3", 0, "max", 3.0)]},
    {"count": 2, "kind": "per_tensor_recipes", "newest": "zero", "dist": _WIDE, "seed": 6,
     "entries": [_entry(1, "e4m3", 0, "most_recent"), _entry(2, "e4m3", 0, "max")]},
)

register(OpSpec(
    name=Op.DELAYED_SCALING_UPDATE_BULK, family="training", cases=cases,
    make_inputs=make_inputs, call=call, reference=reference, dtypes=("float32",),
    smoke_cases=SMOKE, drives=(Op.DELAYED_SCALING_UPDATE_BULK,),
    graph_replay=GraphReplayPolicy(capturable=False, reason=(
        "the Triton path copies its per-tensor tables (addresses, lengths, fp8 max, 2^margin) "
        "from host lists to the device on every call, and the torch path builds its constants "
        "the same way: host-to-device copies a graph cannot replay with new inputs")),
    coverage=(cov.layout_cells("kind", BULK_KINDS)
              + cov.layout_cells("newest", BULK_NEWEST))))
