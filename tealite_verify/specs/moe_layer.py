"""Spec ``moe_layer``: the composed MoE layer (issue 16 part 5), forward and backward, through
tealite's router, permute, grouped GEMM, activation and unpermute front-ends on one backend,
against the float64 composition (references/moe_layer.py) under the propagated bound
(tiers/moe_layer.py; the stages and the driver are tealite_verify/moe_layer.py).

Logits are drawn distinct per row (no top-k tie: the router spec judges ties), so the
reference's routing map is the exact top-k and the map is judged exactly.  A backend takes
part where it implements every stage's op (``drives``).  Not capturable in a CUDA graph: the
permutation's group sizes are host values read from device tensors.
"""
from __future__ import annotations

from hypothesis import strategies as st

from tealite.types import Op
from tealite_verify import moe_layer as ml
from tealite_verify.graph_replay import GraphReplayPolicy
from tealite_verify.references import moe_layer as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.values import seeds
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.moe_layer import bounds

# (max tokens, max hidden, max ffn, max experts) per size; ci stays tiny: each case runs
# eight ops forward and backward (interpreted Triton where a backend has kernels).
_LIMITS = {"ci": (16, 16, 8, 4), "local": (256, 256, 128, 32), "large": (2048, 1024, 512, 64)}


@st.composite
def cases(draw, dtype=None, size="ci"):
    t, h, f, e = _LIMITS[size]
    experts = draw(st.integers(1, e))
    return {"tokens": draw(st.one_of(pick(1, t), st.integers(1, t))),
            "hidden": draw(st.one_of(pick(8, h), st.integers(1, h))),
            "ffn": draw(st.one_of(pick(4, f), st.integers(1, f))),
            "experts": experts, "topk": draw(st.integers(1, min(4, experts))),
            "dtype": dtype or draw(float_dtypes()), "seed": draw(seeds()), "kind": "swiglu"}


def _case(case: dict) -> ml.LayerCase:
    return ml.LayerCase(**case)


def make_inputs(case, device):
    return ml.make_inputs(_case(case), device)


def call(inputs, case, backend):
    c = _case(case)
    out = ml.run_layer(ml.tealite_stages(backend), inputs, c)
    return out


def reference(inputs, case):
    c = _case(case)
    dt = c.torch_dtype
    rmap = ref.topk_map(inputs["logits"], c.topk)
    r = ref.layer(inputs["x"], inputs["logits"], inputs["w1"], inputs["w2"], inputs["dy"], rmap,
                  c.kind)
    num = ml.tealite_stages().numerics(dt)
    tol = bounds(r, inputs["x"], inputs["logits"], inputs["w1"], inputs["w2"], inputs["dy"],
                 c.topk, num)
    out = {"routing_map": Expected(rmap, None, Tier.EXACT)}
    for name in ml.OUTPUTS:
        out[name] = Expected(r[name], dt, Tier.MOE_LAYER, bound=lambda n, t=tol[name]: t)
    return out


register(OpSpec(
    name="moe_layer", family="moe", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    # fp16 of every stage is judged by the stage's own spec and in tests/test_moe_layer.py:
    # the interpreted Triton layer (eight ops forward and backward) runs in bf16 and fp32.
    dtypes=("bfloat16", "float32"),
    drives=(Op.ROUTER_FWD, Op.ROUTER_BWD, Op.MOE_PERMUTE, Op.MOE_UNPERMUTE,
            Op.MOE_UNPERMUTE_BWD, Op.GROUPED_GEMM, Op.ACT_FWD, Op.ACT_BWD),
    smoke_cases=({"tokens": 12, "hidden": 16, "ffn": 8, "experts": 4, "topk": 2,
                  "dtype": "bfloat16", "seed": 1, "kind": "swiglu"},
                 {"tokens": 5, "hidden": 8, "ffn": 4, "experts": 8, "topk": 2,
                  "dtype": "float16", "seed": 2, "kind": "swiglu"}),
    graph_replay=GraphReplayPolicy(
        capturable=False, reason="moe_permute reads the routing map's per-expert counts on "
                                 "the host (data-dependent shapes), as TE's permute does")))
