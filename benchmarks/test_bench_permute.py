"""MoE token permutation against the in-run device copy (issue 16 target: permute / unpermute
at 70 % of copy bandwidth): tealite's triton backend, the torch backend as a fallback
reference, and aiter_triton (AITER's ``moe_align_block_size`` row order, index maps) side by
side, on one bf16 token batch routed top-k by indices and as a mask."""
from __future__ import annotations

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn

PERMUTE = C.TARGETS["permute"][1]


@pytest.fixture(scope="module")
def permute_inputs(bench_config):
    tokens, hidden, experts, topk = C.PERMUTE_SHAPES[bench_config.size]
    dev = bench_config.device
    x = _bf16_randn((tokens, hidden), dev, 5)
    g = torch.Generator().manual_seed(6)
    idx = torch.rand((tokens, experts), generator=g).argsort(dim=1)[:, :topk]
    mask = torch.zeros((tokens, experts), dtype=torch.bool).scatter_(1, idx, True)
    probs = torch.rand((tokens, topk), generator=g)
    return x, idx.to(torch.int32).to(dev), mask.to(dev), probs.to(dev), experts


def _routing(inputs, map_type):
    x, idx, mask, probs, experts = inputs
    return (idx, probs) if map_type == "index" else \
        (mask, torch.zeros(mask.shape, device=x.device).masked_scatter_(mask, probs))


@pytest.mark.parametrize("backend", ["triton", "torch", "aiter_triton"])
@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_permute(bench, permute_inputs, copy_reference, map_type, backend):
    x, experts = permute_inputs[0], permute_inputs[4]
    routing, _ = _routing(permute_inputs, map_type)
    if backend == "aiter_triton":
        why = tealite.get_backend(backend).unavailable_reason()
        if why or map_type == "mask":
            pytest.skip(why or "AITER's moe_align_block_size takes top-k ids, not a mask")
    out = tealite.moe_permute(x, routing, map_type=map_type, num_experts=experts,
                              backend=backend)
    bench.run(lambda: tealite.moe_permute(x, routing, map_type=map_type, num_experts=experts,
                                          backend=backend),
              group="permute", kernel=f"moe_permute {map_type}", backend=backend,
              shape=tuple(x.shape), dtype=x.dtype,
              nbytes=C.permute_bytes(x, routing, out.out, out.row_id_map.rows),
              reference=copy_reference,
              target_pct=PERMUTE if backend == "triton" else None)


@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_permute_unchecked(bench, permute_inputs, copy_reference, map_type):
    """TE's calling convention: the caller gives num_out_tokens and vouches for the routing
    (check_values=False), and nobody reads tokens_per_expert: triton's call syncs nowhere,
    so the host runs ahead as for any async op (the checked row above syncs once a call)."""
    x, experts = permute_inputs[0], permute_inputs[4]
    routing, _ = _routing(permute_inputs, map_type)
    num_out = int((routing != 0).sum()) if map_type == "mask" else routing.numel()

    def fn():
        return tealite.moe_permute(x, routing, map_type=map_type, num_experts=experts,
                                   num_out_tokens=num_out, check_values=False,
                                   backend="triton")
    out = fn()
    bench.run(fn, group="permute", kernel=f"moe_permute {map_type} unchecked",
              backend="triton", shape=tuple(x.shape), dtype=x.dtype,
              nbytes=C.permute_bytes(x, routing, out.out, out.row_id_map.rows),
              reference=copy_reference, target_pct=PERMUTE)


@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_permute_num_out(bench, permute_inputs, copy_reference, map_type):
    """The checked call with num_out_tokens given: triton's one read-back (the checks) comes
    after every launch, for a mask too (without num_out_tokens a mask's count must be read
    before its rows move: the count sizes the output; the test_permute row)."""
    x, experts = permute_inputs[0], permute_inputs[4]
    routing, _ = _routing(permute_inputs, map_type)
    num_out = int((routing != 0).sum()) if map_type == "mask" else routing.numel()

    def fn():
        return tealite.moe_permute(x, routing, map_type=map_type, num_experts=experts,
                                   num_out_tokens=num_out, backend="triton")
    out = fn()
    bench.run(fn, group="permute", kernel=f"moe_permute {map_type} num_out",
              backend="triton", shape=tuple(x.shape), dtype=x.dtype,
              nbytes=C.permute_bytes(x, routing, out.out, out.row_id_map.rows),
              reference=copy_reference, target_pct=PERMUTE)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("with_probs", [True, False], ids=["probs", "plain"])
def test_unpermute(bench, permute_inputs, copy_reference, with_probs, backend):
    x, experts = permute_inputs[0], permute_inputs[4]
    routing, probs = _routing(permute_inputs, "index")
    p = tealite.moe_permute(x, routing, map_type="index", num_experts=experts, backend="torch")
    merging = probs if with_probs else None
    y = tealite.moe_unpermute(p.out, p.row_id_map, merging_probs=merging, backend=backend)
    bench.run(lambda: tealite.moe_unpermute(p.out, p.row_id_map, merging_probs=merging,
                                            backend=backend),
              group="permute", kernel="moe_unpermute" + (" probs" if with_probs else ""),
              backend=backend, shape=tuple(p.out.shape), dtype=x.dtype,
              nbytes=C.unpermute_bytes(p.out, p.row_id_map.rows, y, merging),
              reference=copy_reference,
              target_pct=PERMUTE if backend == "triton" else None)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_unpermute_fp8_top1(bench, permute_inputs, copy_reference, backend):
    """Unpermuting FP8 rows with 1x128 block scales, top-1 routing, no probs: a move of the
    codes and their scales (each token's one row), held to the same copy-bandwidth target."""
    x, idx, experts = permute_inputs[0], permute_inputs[1], permute_inputs[4]
    tokens, hidden = x.shape
    q = tealite.QuantizedTensor(tealite.recipes.Float8BlockScaling(fmt="e4m3"), (tokens, hidden),
                                data=x.to(torch.float8_e4m3fn),
                                scale_inv=torch.ones((tokens, -(-hidden // 128)),
                                                     device=x.device))
    p = tealite.moe_permute(q, idx[:, :1].contiguous(), map_type="index", num_experts=experts,
                            backend="torch")
    y = tealite.moe_unpermute(p.out, p.row_id_map, backend=backend)
    bench.run(lambda: tealite.moe_unpermute(p.out, p.row_id_map, backend=backend),
              group="permute", kernel="moe_unpermute fp8 top-1", backend=backend,
              shape=tuple(p.out.shape), dtype=p.out.data.dtype,
              nbytes=C.unpermute_bytes(p.out.data, p.row_id_map.rows, y.data)
              + p.out.scale_inv.nbytes + y.scale_inv.nbytes,
              reference=copy_reference,
              target_pct=PERMUTE if backend == "triton" else None)
