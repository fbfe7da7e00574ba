"""Dropout forward and backward (issue 17 target: 80 % of copy bandwidth) against the in-run
device copy, bf16 (16384 x 8192, p = 0.1): tealite's triton backend (Philox in the kernel,
fused with the scaling) and the torch backend (torch.rand, then the scaling) as a fallback
reference.  Bytes: x (or dy) read, y (or dx) written, the bool mask written (or read)."""
from __future__ import annotations

import pytest

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn

DROPOUT = C.TARGETS["dropout"][1]


@pytest.fixture(scope="module")
def dropout_inputs(bench_config):
    shape = C.DROPOUT_SHAPES[bench_config.size]
    return _bf16_randn(shape, bench_config.device, 5), _bf16_randn(shape, bench_config.device, 6)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_dropout(bench, dropout_inputs, copy_reference, direction, backend):
    x, dy = dropout_inputs
    if direction == "fwd":
        def run():
            return tealite.dropout_fwd(x, 0.1, seed=1, offset=0, backend=backend)
    else:
        mask = tealite.dropout_fwd(x, 0.1, seed=1, offset=0, backend="torch").mask

        def run():
            return tealite.dropout_bwd(dy, mask, 0.1, backend=backend)
    bench.run(run, group="dropout", kernel=f"dropout_{direction} p=0.1", backend=backend,
              shape=tuple(x.shape), dtype=x.dtype,
              nbytes=C.dropout_bytes(x.numel(), x.element_size()),
              reference=copy_reference, target_pct=DROPOUT if backend == "triton" else None)
