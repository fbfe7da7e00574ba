"""LayerNormMLP forward + backward (issue 17 part 5) per recipe, beside the sum of its parts:
the module's whole step timed, and each sub-op it calls (norm, quantize, GEMM / qgemm,
activation, their backwards) timed alone on the same arguments and summed.  The gap is what
the composition costs over its ops (Python, autograd, allocation) or saves (overlap).  No
target: the issue asks for the numbers recorded.  GPU only: the interpreter's timings of a
fifteen-op step say nothing about a module's throughput.  FLOPs: the six GEMMs of the step
(fprop, dgrad, wgrad of fc1 and fc2), 2 M K N each."""
from __future__ import annotations

import contextlib

import pytest
import torch

import tealite.modules.layernorm_mlp as lm
import tealite.recipes as R
from benchmarks import _timing as T
from tealite.modules import LayerNormMLP, ModuleBackends

# (tokens, hidden, ffn) per size: a Llama-style block at "large", the smoke run's at "tiny".
SHAPES = {"large": (8192, 4096, 14336), "tiny": (32, 32, 32)}
RECIPES = {"bf16": None, "fp8-current": R.Float8CurrentScaling(),
           "fp8-delayed": R.DelayedScaling(), "mxfp8": R.MXFP8BlockScaling()}
# The ops the module calls (tealite/modules/layernorm_mlp.py imports them by name).
_SUB_OPS = ("layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "gemm", "qgemm",
            "quantize", "act_fwd", "act_bwd")


@contextlib.contextmanager
def recorded_sub_ops(calls: list):
    """Record (name, op, args, kwargs) of every sub-op call the module makes."""
    saved = {name: getattr(lm, name) for name in _SUB_OPS}

    def recorder(name, op):
        def call(*args, **kwargs):
            calls.append((name, op, args, kwargs))
            return op(*args, **kwargs)
        return call
    try:
        for name, op in saved.items():
            setattr(lm, name, recorder(name, op))
        yield calls
    finally:
        for name, op in saved.items():
            setattr(lm, name, op)


def step_flops(tokens: int, hidden: int, fc1_out: int, ffn: int) -> int:
    return 3 * 2 * tokens * (hidden * fc1_out + ffn * hidden)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_layernorm_mlp(bench, bench_config, backend, recipe, activation):
    cfg = bench_config
    if not cfg.gpu:
        pytest.skip("LayerNormMLP throughput is a GPU measurement (interpreted, a step of "
                    "fifteen ops times Python, not the module)")
    t, h, f = SHAPES["tiny" if cfg.size == "tiny" else "large"]
    mod = LayerNormMLP(h, f, activation=activation, recipe=RECIPES[recipe],
                       backends=ModuleBackends.every(backend), dtype=torch.bfloat16,
                       device=cfg.device)
    g = torch.Generator(device=cfg.device).manual_seed(0)
    x = torch.randn(t, h, generator=g, device=cfg.device).to(torch.bfloat16)
    dy = torch.randn(t, h, generator=g, device=cfg.device).to(torch.bfloat16)
    x.requires_grad_(True)

    def step():
        mod(x).backward(dy)

    calls: list = []
    with recorded_sub_ops(calls):
        step()
    parts = {}
    for name, op, args, kwargs in calls:
        timing = T.measure(lambda: op(*args, **kwargs), cfg.device, reps=cfg.reps,
                           warmup=cfg.warmup)
        parts[name] = parts.get(name, 0.0) + timing.median_ms
    bench.run(step, group="modules", kernel=f"layernorm_mlp {activation} {recipe}",
              backend=backend, shape=(t, h, f), dtype=torch.bfloat16,
              flops=step_flops(t, h, mod.fc1_weight.shape[0], f),
              sum_of_parts_ms=sum(parts.values()), parts_ms=parts, sub_op_calls=len(calls))
