"""The MoE router (TE's fused top-k router, issue 16 target: 50 % of copy) forward and
backward against the in-run device copy, at TE's regime of 16384 tokens x 256 experts (bf16
logits, softmax after the top-k and sigmoid with groups and an expert bias, top-8):
tealite's triton backend and the torch backend as a fallback reference, and AITER's Triton
``moe_routing`` top-k (softmax after the top-k, the one configuration it computes:
tealite/backends/aiter_triton/router.py) side by side; it writes (T, k) values and indices
and a bitmatrix instead of the dense probs and map, and is charged the same bytes."""
from __future__ import annotations

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter

ROUTER = C.TARGETS["router"][1]
# (name, router options): DeepSeek-V3-style sigmoid with 8 groups, 4 kept, and a bias; and
# plain post-top-k softmax.
CONFIGS = {"softmax": dict(score_function="softmax"),
           "sigmoid-groups": dict(score_function="sigmoid", num_groups=8, group_topk=4)}


@pytest.fixture(scope="module")
def router_inputs(bench_config):
    tokens, experts = C.ROUTER_SHAPES[bench_config.size]
    logits = _bf16_randn((tokens, experts), bench_config.device, 5)
    bias = (torch.randn(experts) * 0.1).to(bench_config.device)
    grad = _bf16_randn((tokens, experts), bench_config.device, 6)
    return logits, bias, grad


def _options(name: str, bias) -> dict:
    kw = dict(CONFIGS[name])
    if kw["score_function"] == "sigmoid":
        kw["expert_bias"] = bias
    return kw


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_router(bench, router_inputs, copy_reference, direction, config, backend):
    logits, bias, grad = router_inputs
    tokens, experts = logits.shape
    topk = 8
    kw = _options(config, bias)
    if direction == "fwd":
        def run():
            return tealite.router_fwd(logits, topk, backend=backend, **kw)
    else:
        _, routing_map = tealite.router_fwd(logits, topk, backend="torch", **kw)
        bwd_kw = {"score_function": kw["score_function"]}

        def run():
            return tealite.router_bwd(grad, logits, routing_map, topk, backend=backend,
                                      **bwd_kw)
    bench.run(run, group="router", kernel=f"router_{direction} {config} top{topk}",
              backend=backend, shape=logits.shape, dtype=logits.dtype,
              nbytes=C.router_bytes(tokens, experts, logits.element_size(),
                                    bwd=direction == "bwd"),
              reference=copy_reference, target_pct=ROUTER if backend == "triton" else None)


def test_router_aiter(bench, aiter, router_inputs, copy_reference):
    need_aiter(aiter, "topk")
    logits, _, _ = router_inputs
    tokens, experts = logits.shape
    bench.run(lambda: aiter.topk(logits, 8, apply_softmax=True), group="router",
              kernel="router_fwd softmax top8", backend="aiter moe_routing topk",
              shape=logits.shape, dtype=logits.dtype,
              nbytes=C.router_bytes(tokens, experts, logits.element_size()),
              reference=copy_reference, foreign=True)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_router_bwd_unchecked(bench, router_inputs, copy_reference, config):
    """The backward with ``check_values=False`` (TE's convention, as moe_permute's: the caller
    vouches for the map): no read back to the host, so the host runs ahead of the device."""
    logits, bias, grad = router_inputs
    tokens, experts = logits.shape
    kw = _options(config, bias)
    _, routing_map = tealite.router_fwd(logits, 8, backend="torch", **kw)
    bench.run(lambda: tealite.router_bwd(grad, logits, routing_map, 8, backend="triton",
                                         score_function=kw["score_function"],
                                         check_values=False),
              group="router", kernel=f"router_bwd {config} top8 check_values=False",
              backend="triton", shape=logits.shape, dtype=logits.dtype,
              nbytes=C.router_bytes(tokens, experts, logits.element_size(), bwd=True),
              reference=copy_reference, target_pct=ROUTER)
