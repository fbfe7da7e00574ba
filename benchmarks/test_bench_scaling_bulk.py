"""Bulk delayed-scaling update (issue 17): 2000 FP8 tensors' amax histories (TE's default
length 1024) and scales updated by one launch of tealite's Triton kernel, against the
per-tensor loop it replaces (``delayed_scaling_update`` once per tensor, several small
launches each, timed in the same run).  Target: >= 20x the loop (2000 % of its rate).  Bytes:
every history and scale read once and written once.

The rows are GPU-only: the speed-up is launches saved, which the CPU smoke run has none of
(the smoke run records the skip with its reason)."""
from __future__ import annotations

import pytest
import torch

import tealite
import tealite.recipes as R
from benchmarks import _cases as C
from benchmarks import _timing as T

TARGET = C.TARGETS["scaling_bulk"][1]
# Tensors updated per call (TE: a few per layer, thousands per model).
COUNTS = {"large": 2000, "tiny": 8}
HISTORY = 1024


def _state(count: int, device):
    """count histories cycling through the four FP8 formats and both algorithms."""
    g = torch.Generator(device=device).manual_seed(7)
    fmts = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")
    recipes = [R.DelayedScaling(fmts[i % 4], margin=i % 2, amax_history_len=HISTORY,
                                amax_compute_algo=("max", "most_recent")[i % 2])
               for i in range(count)]
    hs = [torch.rand(HISTORY, generator=g, device=device) * 100 for _ in range(count)]
    ss = [torch.ones(1, device=device) for _ in range(count)]
    return hs, ss, recipes


def state_bytes(hs, ss) -> int:
    return 2 * sum(h.nbytes + s.nbytes for h, s in zip(hs, ss))


@pytest.fixture(scope="module")
def bulk_state(bench_config):
    if not bench_config.gpu:
        pytest.skip("GPU only: the bulk update's gain is the launches it saves, which a CPU "
                    "run (the interpreter) does not measure")
    return _state(COUNTS[bench_config.size], bench_config.device)


@pytest.fixture(scope="module")
def per_tensor_loop(bench_config, flusher, bulk_state) -> dict:
    """The loop the bulk op replaces, timed once: its rate is the row's reference."""
    hs, ss, recipes = bulk_state

    def loop():
        return [tealite.delayed_scaling_update(h, s, r) for h, s, r in zip(hs, ss, recipes)]

    timing = T.measure(loop, bench_config.device, reps=bench_config.reps,
                       warmup=bench_config.warmup, flush=flusher)
    return {"name": "per-tensor delayed_scaling_update loop",
            "gbps": T.gbps(state_bytes(hs, ss), timing.median_ms), "ms": timing.median_ms}


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_delayed_scaling_update_bulk(bench, bulk_state, per_tensor_loop, backend):
    hs, ss, recipes = bulk_state

    def fn():
        return tealite.delayed_scaling_update_bulk(hs, ss, recipes, backend=backend)

    bench.run(fn, group="scaling_bulk", kernel=f"delayed_scaling_update_bulk x{len(hs)}",
              backend=backend, shape=(len(hs), HISTORY), dtype=torch.float32,
              nbytes=state_bytes(hs, ss), reference=per_tensor_loop,
              target_pct=TARGET if backend == "triton" else None, tensors=len(hs))
