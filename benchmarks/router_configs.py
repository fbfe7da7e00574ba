"""Time the Triton router kernels' program shapes on a GPU (picks ``Tile`` in
tealite/backends/triton/router.py).

    python benchmarks/router_configs.py [--tokens 16384 --experts 256]

For the forward (softmax after the top-k; sigmoid with 8 groups, 4 kept, and an expert bias)
and the backward (softmax; normalised sigmoid), each (elements, rows, warps) config: the
kernel alone in microseconds (the backend entry point, no front end, replayed from a CUDA
graph so that launch overhead does not count; L2 flushed before each call and the flush's
own time subtracted), its bandwidth as % of a device copy of the same bytes (the benchmark
rows' count: benchmarks/_cases.py ``router_bytes``), and whether it gives the default
config's bits (a config that does not is not a drop-in default: see ``Tile``).

Every config listed keeps the default's row layout at 256 experts (16 contiguous experts per
thread, 16 threads per row, warps along the tokens: read from the sm_90 TTGIR), so the rows'
sums should keep their order and bits.  Registers per thread at 16384 x 256, bf16 (sm_90
cross-compile): default 88 (softmax fwd) / 128 (sigmoid-groups fwd) / 146 (bwd); 4096 x 16
rows with 8 warps 64 / 79 / 75; 2048 x 8 rows with 4 warps 61 / 83 / 71: fewer registers,
more programs per SM for kernels that wait on their reductions' latency.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _cases as C  # noqa: E402
from benchmarks._timing import L2Flusher  # noqa: E402
from tealite.backends.triton import router as R  # noqa: E402
from tealite.ops.router import router_config  # noqa: E402

# (elements, rows, warps); the first is the default.
CONFIGS = [(4096, 16, 4), (2048, 8, 4), (2048, 8, 2), (1024, 4, 1), (2048, 8, 1),
           (4096, 16, 2), (4096, 16, 8), (8192, 32, 4), (8192, 32, 8), (16384, 64, 8)]
CALLS = 20  # calls per graph replay


def _graph_ms(fn, flush) -> float:
    """Per-call device time of ``fn`` after an L2 flush, minus the flush alone."""
    def per_call(body) -> float:
        body()  # compile / allocate outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS):
                body()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / CALLS)
        return sorted(times)[len(times) // 2]

    return per_call(lambda: (flush(), fn())) - per_call(flush)


def _cases(tokens: int, experts: int):
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(tokens, experts, generator=g, device="cuda").to(torch.bfloat16)
    grad = torch.randn(tokens, experts, generator=g, device="cuda").to(torch.bfloat16)
    bias = torch.randn(experts, generator=g, device="cuda") * 0.1
    soft = router_config(8, experts)
    sig = router_config(8, experts, score_function="sigmoid", num_groups=8, group_topk=4)
    _, soft_map = R.router_fwd(x, soft, expert_bias=None)
    _, sig_map = R.router_fwd(x, sig, expert_bias=bias)
    return {
        ("fwd", "softmax"): lambda: R.router_fwd(x, soft, expert_bias=None),
        ("fwd", "sigmoid-groups"): lambda: R.router_fwd(x, sig, expert_bias=bias),
        ("bwd", "softmax"): lambda: R.router_bwd(grad, x, soft_map, soft),
        ("bwd", "sigmoid"): lambda: R.router_bwd(grad, x, sig_map, sig),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=256)
    args = ap.parse_args(argv)
    t, e = args.tokens, args.experts
    flush = L2Flusher(torch.device("cuda"))
    src = torch.empty(C.router_bytes(t, e, 2, bwd=True) // 2, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / _graph_ms(lambda: dst.copy_(src), flush) / 1e6
    print(f"tokens {t} experts {e} bf16 top-8; device copy {copy_gbps:.0f} GB/s")
    for (direction, name), fn in _cases(t, e).items():
        nbytes = C.router_bytes(t, e, 2, bwd=direction == "bwd")
        want = fn()
        for elements, rows, warps in CONFIGS:
            tile = R.Tile(elements, rows, warps)
            with R.TILES.override(**{direction: tile}):
                try:
                    got = fn()
                    got = got if isinstance(got, tuple) else (got,)
                    ref = want if isinstance(want, tuple) else (want,)
                    same = all(torch.equal(a, b) for a, b in zip(got, ref))
                    ms = _graph_ms(fn, flush)
                    pct = 100 * nbytes / ms / 1e6 / copy_gbps
                    print(f"{direction} {name:15s} {elements:6d} x {rows:3d} rows, {warps} warps:"
                          f" {ms * 1e3:7.1f} us {pct:6.1f} % of copy  same bits: {same}")
                except Exception as exc:  # out of resources etc.
                    print(f"{direction} {name:15s} {tile}: FAILED {type(exc).__name__}: "
                          f"{exc}"[:160])


if __name__ == "__main__":
    main()
