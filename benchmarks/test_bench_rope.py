"""RoPE forward and backward against the in-run device copy (issue 15 target: 80 % of copy):
tealite's triton backend, the torch backend as a fallback reference, and AITER's Triton
``rope_fwd`` / ``rope_bwd`` (NEOX: TE's non-interleaved halves) side by side, on the same
sbhd bf16 tensor and TE-style float32 freqs."""
from __future__ import annotations

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter

ROPE = C.TARGETS["rope"][1]
NEOX = 0  # AITER's RotateStyle.NEOX


@pytest.fixture(scope="module")
def rope_inputs(bench_config):
    s, b, h, d = C.ROPE_SHAPES[bench_config.size]
    t = _bf16_randn((s, b, h, d), bench_config.device, 4)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    freqs = torch.cat((ang, ang), dim=-1).reshape(s, 1, 1, d).to(bench_config.device)
    return t, freqs


def _nbytes(t, freqs):
    return C.rope_bytes(tuple(t.shape), freqs.shape[-1], t.element_size())


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_rope(bench, rope_inputs, copy_reference, direction, backend):
    t, freqs = rope_inputs
    fn = tealite.rope_fwd if direction == "fwd" else tealite.rope_bwd
    bench.run(lambda: fn(t, freqs, backend=backend), group="rope",
              kernel=f"rope_{direction} sbhd", backend=backend, shape=t.shape, dtype=t.dtype,
              nbytes=_nbytes(t, freqs), reference=copy_reference,
              target_pct=ROPE if backend == "triton" else None)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_rope_aiter(bench, aiter, rope_inputs, copy_reference, direction):
    name = f"rope_{direction}"
    need_aiter(aiter, name)
    t, freqs = rope_inputs
    fn = getattr(aiter, name)
    bench.run(lambda: fn(t, freqs, NEOX, False, False), group="rope",
              kernel=f"rope_{direction} sbhd", backend=f"aiter {name}", shape=t.shape,
              dtype=t.dtype, nbytes=_nbytes(t, freqs), reference=copy_reference, foreign=True)
