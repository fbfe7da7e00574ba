"""Multi-tensor Adam (issue 17) against the in-run device copy: tealite's Triton kernel (one
launch over the whole list, TE's 65536-element chunks) and the torch backend's per-tensor loop,
over 1000 tensors of mixed sizes (a model's parameter list: many small biases and norms, a few
large matrices).  AdamW with fp32 master weights and bf16 params / grads: per element it reads
the bf16 grad and the fp32 master, m and v, and writes the bf16 param and the fp32 master, m and
v, 28 bytes (``adam_bytes``).  Target: 70 % of copy bandwidth for those bytes (issue 17)."""
from __future__ import annotations

import pytest
import torch

import tealite
from benchmarks import _cases as C
from tealite.training_types import AdamOptions

TARGET = C.TARGETS["multi_tensor_adam"][1]
# (tensors, largest size): 1000 tensors log-uniform in [1, 2^22] on a GPU (about 0.3 G
# elements in all); tiny: the smoke run's interpreter list, chunk edges included.
LISTS = {"large": (1000, 22), "tiny": (5, 7)}


def mixed_sizes(count: int, max_log2: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    logs = torch.rand(count, generator=g) * max_log2
    return [int(2.0 ** float(e)) for e in logs]


def adam_bytes(sizes, param_itemsize: int, grad_itemsize: int, master: bool) -> int:
    """Bytes one step must move: read grad, param source (master or param), m, v; write param,
    m, v (and master)."""
    n = sum(sizes)
    src = 4 if master else param_itemsize
    reads = grad_itemsize + src + 8
    writes = param_itemsize + 8 + (4 if master else 0)
    return n * (reads + writes)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_multi_tensor_adam(bench, bench_config, copy_reference, backend):
    count, max_log2 = LISTS["tiny" if bench_config.size == "tiny" else "large"]
    sizes = mixed_sizes(count, max_log2)
    dev = bench_config.device
    masters = [torch.randn(n, device=dev) for n in sizes]
    params = [w.to(torch.bfloat16) for w in masters]
    grads = [torch.randn(n, device=dev).to(torch.bfloat16) for n in sizes]
    ms = [torch.zeros(n, device=dev) for n in sizes]
    vs = [torch.zeros(n, device=dev) for n in sizes]
    options = AdamOptions(lr=1e-4, weight_decay=0.01, step=10)

    def fn():
        return tealite.multi_tensor_adam(grads, params, ms, vs, options, master_params=masters,
                                         backend=backend)
    bench.run(fn, group="multi_tensor", kernel=f"multi_tensor_adam {count} tensors",
              backend=backend, shape=(count, sum(sizes)), dtype=torch.bfloat16,
              nbytes=adam_bytes(sizes, 2, 2, True), reference=copy_reference,
              target_pct=TARGET if backend == "triton" else None)
