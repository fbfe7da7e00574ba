"""Spec ``layernorm_mlp``: the compound modules LayerNormLinear / LayerNormMLP (issue 17 part
5), forward and backward through tealite.modules with every sub-op on one backend, against the
float64 composition (references/modules.py) under the propagated bound (tiers/modules.py; the
driver is tealite_verify/module_chain.py).  Recipes: none (high precision), FP8 current and
delayed scaling, MXFP8 (tokens and features multiples of 32).  A backend takes part where it
implements every op the module calls (``drives``).
"""
from __future__ import annotations

from hypothesis import strategies as st

from tealite.types import Op
from tealite_verify import module_chain as mc
from tealite_verify.graph_replay import GraphReplayPolicy
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.values import seeds
from tealite_verify.tiers.metrics import Tier

# (max tokens, max features) per size; ci stays tiny: a case runs about fifteen ops (more
# than twenty kernels under a recipe), interpreted where a backend has Triton kernels.
_LIMITS = {"ci": (32, 32), "local": (256, 256), "large": (2048, 1024)}


@st.composite
def cases(draw, dtype=None, size="ci"):
    t, f = _LIMITS[size]
    recipe = draw(st.sampled_from(sorted(mc.RECIPES)))
    if recipe == "mxfp8":  # MX blocks of 32 along every GEMM's K
        dims = [32 * draw(st.integers(1, max(1, n // 32))) for n in (t, f, f, f)]
    else:
        dims = [draw(st.integers(1, t))] + [draw(st.sampled_from((8, 16, f))) for _ in "hff"]
    module = draw(st.sampled_from(("linear", "mlp")))
    return {"module": module, "tokens": dims[0], "hidden": dims[1],
            "ffn": dims[2], "dtype": dtype or draw(st.sampled_from(("bfloat16", "float32"))),
            "normalization": draw(st.sampled_from(("LayerNorm", "RMSNorm"))),
            "activation": draw(st.sampled_from(("gelu", "swiglu"))), "recipe": recipe,
            "zero_centered_gamma": draw(st.booleans()), "bias": draw(st.booleans()),
            "return_layernorm_output": draw(st.booleans()), "seed": draw(seeds())}


def make_inputs(case, device):
    return mc.make_inputs(mc.ModuleCase(**case), device)


def call(inputs, case, backend):
    c = mc.ModuleCase(**case)
    return mc.run_module(mc.make_module(c, inputs, mc.ModuleBackends.every(backend)), inputs)


def reference(inputs, case):
    c = mc.ModuleCase(**case)
    r, tol = mc.expected(c, inputs)
    names = [n for n in tol if n != "z" or c.return_layernorm_output]
    return {n: Expected(r[n], c.torch_dtype, Tier.MODULE_CHAIN, bound=lambda _, t=tol[n]: t)
            for n in names}


register(OpSpec(
    name="layernorm_mlp", family="modules", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    # bf16, the training dtype, within CI's budget (a case runs about fifteen interpreted
    # ops); fp32 (where the FP8 steps' bound is sharp) and fp16 run in tests/test_modules.py.
    dtypes=("bfloat16",),
    drives=(Op.LAYERNORM_FWD, Op.LAYERNORM_BWD, Op.RMSNORM_FWD, Op.RMSNORM_BWD, Op.GEMM,
            Op.ACT_FWD, Op.ACT_BWD, Op.QUANTIZE, Op.QGEMM),
    smoke_cases=({"module": "mlp", "tokens": 32, "hidden": 32, "ffn": 32,
                  "dtype": "bfloat16", "activation": "swiglu", "recipe": "mxfp8", "seed": 1},
                 {"module": "linear", "tokens": 7, "hidden": 16, "ffn": 24,
                  "dtype": "bfloat16", "recipe": "current", "normalization": "RMSNorm",
                  "return_layernorm_output": True, "seed": 2}),
    graph_replay=GraphReplayPolicy(
        capturable=False, reason="the module's backward runs through torch.autograd; a graph "
                                 "of the whole training step is the training loop's to capture")))
