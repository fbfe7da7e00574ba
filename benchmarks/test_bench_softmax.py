"""TE's fused softmax kinds, forward and backward, against the in-run device copy (issue 15:
>= 80 % of copy bandwidth): tealite's triton backend (the torch backend as a fallback
reference) and AITER's Triton ``softmax`` (a plain row softmax: the ``scaled`` kind with
scale 1) side by side, on bf16 scores (b, h, sq, sk)."""
from __future__ import annotations

import math

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter

TARGET = C.TARGETS["softmax"][1]
FWD_KINDS = ("scaled", "scaled_masked", "scaled_upper_triang", "scaled_aligned_causal")


@pytest.fixture(scope="module")
def scores(bench_config):
    return _bf16_randn(C.SOFTMAX_SHAPES[bench_config.size], bench_config.device, 4)


def _inputs(kind, x):
    """(x as the kind takes it, mask): the upper-triangular kind takes (b * h, sq, sk) and
    needs sq == sk (the benchmark shapes are square); the masked kind a shared padding-like
    mask (1, 1, sq, sk)."""
    if kind == "scaled_upper_triang":
        return x.reshape(-1, *x.shape[-2:]), None
    if kind == "scaled_masked":
        sq, sk = x.shape[-2:]
        keys = torch.arange(sk, device=x.device)
        return x, (keys >= sk - sk // 8).expand(1, 1, sq, sk).contiguous()
    return x, None


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kind", FWD_KINDS)
def test_softmax_fwd(bench, scores, copy_reference, kind, backend):
    x, mask = _inputs(kind, scores)
    scale = 1.0 / math.sqrt(128.0)
    bench.run(lambda: tealite.softmax_fwd(x, kind, scale=scale, mask=mask, backend=backend),
              group="softmax", kernel=f"softmax_fwd {kind}", backend=backend, shape=x.shape,
              dtype=x.dtype, nbytes=C.softmax_bytes(kind, x.shape, x.element_size()),
              reference=copy_reference, target_pct=TARGET if backend == "triton" else None)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_softmax_bwd(bench, scores, copy_reference, backend):
    y = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
    dy = torch.randn_like(scores)
    bench.run(lambda: tealite.softmax_bwd(dy, y, "scaled", scale=0.125, backend=backend),
              group="softmax", kernel="softmax_bwd scaled", backend=backend, shape=y.shape,
              dtype=y.dtype, nbytes=C.softmax_bytes("scaled", y.shape, y.element_size(),
                                                     bwd=True),
              reference=copy_reference, target_pct=TARGET if backend == "triton" else None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_softmax_fwd_aiter(bench, aiter, scores, copy_reference, dtype):
    """AITER's row softmax on the same scores (bf16, and fp32: the dtype its kernel compiles
    for under the installed Triton, see tealite/backends/aiter_triton/softmax.py)."""
    need_aiter(aiter, "softmax")
    x = scores.to(getattr(torch, dtype)).reshape(-1, scores.shape[-1])
    bench.run(lambda: aiter.softmax(x), group="softmax", kernel="softmax_fwd scaled (scale 1)",
              backend="aiter softmax", shape=scores.shape, dtype=x.dtype,
              nbytes=C.softmax_bytes("scaled", scores.shape, x.element_size()),
              reference=copy_reference, foreign=True)
