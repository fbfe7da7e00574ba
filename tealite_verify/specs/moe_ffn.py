"""Spec ``moe_ffn_fwd``: the expert FFN forward with the routing folded in
(tealite/ops/moe_ffn.py), the op AITER's fused MoE kernels implement.

Inputs are the composed layer's (tealite_verify/moe_layer.py): x, w1 (E, 2F, H), w2 (E, H, F)
and, from distinct logits, the top-k expert ids (in score order, or ascending: case key
``slot_order``) with their softmax weights in float32.  The reference is the forward of the
float64 composition (references/moe_layer.py) with those weights given; the bound is the
composed layer's (tiers/moe_layer.py) with exact weights, under the backend's declared merge
(``numerics.moe_merge``: AITER rounds each weighted row before the sum).  swiglu only: the
fused kernels' activation (the op takes every kind; the torch backend runs them all).
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import moe_layer as ml
from tealite_verify.references import moe_layer as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs.moe_layer import cases as layer_cases
from tealite_verify.strategies.choices import pick
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.moe_layer import bounds, numerics_of

SLOT_ORDERS = ("score", "ascending")


@st.composite
def cases(draw, dtype=None, size="ci"):
    case = draw(layer_cases(dtype, size))
    case["slot_order"] = draw(pick(*SLOT_ORDERS))
    return case


def make_inputs(case, device):
    layer = ml.make_inputs(ml.LayerCase(**{k: v for k, v in case.items() if k != "slot_order"}),
                           device)
    logits = layer["logits"].float()
    top = torch.topk(logits, case["topk"], dim=1, sorted=True)
    ids = top.indices
    if case["slot_order"] == "ascending":
        ids = torch.sort(ids, dim=1).values
    weights = torch.softmax(torch.gather(logits, 1, ids), dim=1)
    return {"x": layer["x"], "w1": layer["w1"], "w2": layer["w2"],
            "topk_weights": weights.contiguous(), "topk_ids": ids.to(torch.int32).contiguous()}


def call(inputs, case, backend):
    import tealite
    return {"y": tealite.moe_ffn_fwd(inputs["x"], inputs["w1"], inputs["w2"],
                                     inputs["topk_weights"], inputs["topk_ids"],
                                     kind=case["kind"], backend=backend)}


def reference(inputs, case):
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    ids = inputs["topk_ids"].astype(np.int64)
    t, experts = x.shape[0], w1.shape[0]
    rmap = np.zeros((t, experts), bool)
    probs = np.zeros((t, experts))
    rows = np.arange(t)[:, None]
    rmap[rows, ids] = True
    probs[rows, ids] = inputs["topk_weights"]
    dy = np.zeros_like(x)
    r = ref.layer(x, None, w1, w2, dy, rmap, case["kind"], probs=probs)
    dt = ml.LayerCase(**{k: v for k, v in case.items() if k != "slot_order"}).torch_dtype

    def bound(numerics):
        num = numerics_of(dt, numerics.moe_merge,
                          input_rounding=numerics.matmul_input_rounding)
        return bounds(r, x, None, w1, w2, dy, case["topk"], num, probs_given=True)["y"]
    return {"y": Expected(r["y"], dt, Tier.MOE_LAYER, bound=bound)}


register(OpSpec(
    name=Op.MOE_FFN_FWD, family="moe", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, coverage=cov.layout_cells("slot_order", SLOT_ORDERS),
    smoke_cases=({"tokens": 12, "hidden": 16, "ffn": 8, "experts": 4, "topk": 2,
                  "dtype": "float16", "seed": 1, "kind": "swiglu", "slot_order": "score"},
                 {"tokens": 5, "hidden": 8, "ffn": 8, "experts": 8, "topk": 3,
                  "dtype": "bfloat16", "seed": 2, "kind": "swiglu", "slot_order": "ascending"},
                 {"tokens": 9, "hidden": 32, "ffn": 16, "experts": 6, "topk": 1,
                  "dtype": "float32", "seed": 3, "kind": "swiglu", "slot_order": "score"})))
