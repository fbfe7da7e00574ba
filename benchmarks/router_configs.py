"""Time the Triton router kernels' program shapes on a GPU (picks ``Tile`` in
tealite/backends/triton/router.py).

    python benchmarks/router_configs.py [--tokens 16384 --experts 256] [--section all]

For the forward (softmax after the top-k; sigmoid with 8 groups, 4 kept, and an expert bias)
and the backward (softmax; normalised sigmoid), each (elements, rows, warps) config: the
kernel alone in microseconds (the backend entry point, no front end, replayed from a CUDA
graph so that launch overhead does not count; L2 flushed before each call and the flush's
own time subtracted), its bandwidth as % of a device copy of the same bytes (the benchmark
rows' count: benchmarks/_cases.py ``router_bytes``), and whether it gives the default
config's bits (a config that does not is not a drop-in default: see ``Tile``).

``--section variants`` (~1 minute on an H100; ``tiles`` the program shapes, ``all`` both):
each of ``VARIANTS``' settings (tealite/backends/triton/router.py: the forward's
``distinct_first`` and ``fast_sigmoid``, the backward's ``map_check_in_kernel``), one at a
time, the others at their defaults, at the default tile: kernel alone
as above (the map check's flag fill and kernel included: while a graph is captured the flag
is set, not read), op level (the public ``tealite.router_fwd`` / ``router_bwd`` with
``backend="triton"``, device events around each call after an L2 flush, no host sync between
calls: the benchmark rows' timing, benchmarks/_timing.py), the kernels per op call
(torch.profiler), and whether the bits equal the default's.

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
from benchmarks._timing import L2Flusher, device_times, kernel_profile, warm_up  # noqa: E402
from tealite.backends.triton import router as R  # noqa: E402
import tealite  # noqa: E402
from tealite.ops.router import router_config  # noqa: E402

# (elements, rows, warps); Tile() is the default.
CONFIGS = [(4096, 16, 4), (2048, 8, 4), (2048, 8, 2), (1024, 4, 1), (2048, 8, 1),
           (4096, 16, 2), (4096, 16, 8), (8192, 32, 4), (8192, 32, 8), (16384, 64, 8)]
CALLS = 20  # calls per graph replay
OP_REPS = 100  # op-level repetitions (device events)
# direction -> the VARIANTS fields that direction reads; each is swept with the others at their
# defaults, the default setting first.
VARIANT_FIELDS = {"fwd": ("distinct_first", "fast_sigmoid"), "bwd": ("map_check_in_kernel",)}


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


def _cases(tokens: int, experts: int, device="cuda"):
    """(backend entry points, public ops) per (direction, name)."""
    g = torch.Generator(device=device).manual_seed(5)
    x = torch.randn(tokens, experts, generator=g, device=device).to(torch.bfloat16)
    grad = torch.randn(tokens, experts, generator=g, device=device).to(torch.bfloat16)
    bias = torch.randn(experts, generator=g, device=device) * 0.1
    soft = router_config(8, experts)
    sig = router_config(8, experts, score_function="sigmoid", num_groups=8, group_topk=4)
    _, soft_map = R.router_fwd(x, soft, expert_bias=None)
    _, sig_map = R.router_fwd(x, sig, expert_bias=bias)
    return {
        ("fwd", "softmax"): lambda: R.router_fwd(x, soft, expert_bias=None),
        ("fwd", "sigmoid-groups"): lambda: R.router_fwd(x, sig, expert_bias=bias),
        ("bwd", "softmax"): lambda: R.router_bwd(grad, x, soft_map, soft),
        ("bwd", "sigmoid"): lambda: R.router_bwd(grad, x, sig_map, sig),
    }, {
        ("fwd", "softmax"): lambda: tealite.router_fwd(x, 8, backend="triton"),
        ("fwd", "sigmoid-groups"): lambda: tealite.router_fwd(
            x, 8, backend="triton", score_function="sigmoid", num_groups=8, group_topk=4,
            expert_bias=bias),
        ("bwd", "softmax"): lambda: tealite.router_bwd(grad, x, soft_map, 8, backend="triton"),
        ("bwd", "sigmoid"): lambda: tealite.router_bwd(grad, x, sig_map, 8, backend="triton",
                                                       score_function="sigmoid"),
    }


def _same(got, want) -> bool:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return all(torch.equal(a, b) for a, b in zip(got, want))


def _tiles(cases, flush, copy_gbps, t, e, configs=CONFIGS, only=None) -> None:
    for (direction, name), fn in cases.items():
        if only and name not in only:
            continue
        nbytes = C.router_bytes(t, e, 2, bwd=direction == "bwd")
        want = fn()
        for elements, rows, warps in configs:
            tile = R.Tile(elements, rows, warps)
            with R.TILES.override(**{direction: tile}):
                try:
                    same = _same(fn(), want)
                    ms = _graph_ms(fn, flush)
                    pct = 100 * nbytes / ms / 1e6 / copy_gbps
                    print(f"{direction} {name:15s} {elements:6d} x {rows:3d} rows, {warps} warps:"
                          f" {ms * 1e3:7.1f} us {pct:6.1f} % of copy  same bits: {same}")
                except Exception as exc:  # out of resources etc.
                    print(f"{direction} {name:15s} {tile}: FAILED {type(exc).__name__}: "
                          f"{exc}"[:160])


def _variants(cases, ops, flush, copy_gbps, t, e, device=torch.device("cuda")) -> None:
    for (direction, name), fn in cases.items():
        nbytes = C.router_bytes(t, e, 2, bwd=direction == "bwd")
        op = ops[(direction, name)]
        want = op()
        for field, value in ((f, v) for f in VARIANT_FIELDS[direction]
                             for v in (getattr(R.VARIANTS.get(), f),
                                       not getattr(R.VARIANTS.get(), f))):
            with R.VARIANTS.override(**{field: value}):
                try:
                    same = _same(op(), want)
                    kernel_ms = _graph_ms(fn, flush)
                    warm_up(op, device, 3)
                    op_ms = device_times(op, device, reps=OP_REPS, flush=flush).median_ms
                    launches = kernel_profile(op, device).kernels
                    pct = [100 * nbytes / ms / 1e6 / copy_gbps for ms in (kernel_ms, op_ms)]
                    print(f"{direction} {name:15s} {field}={value!s:5s}: kernel alone "
                          f"{kernel_ms * 1e3:6.1f} us {pct[0]:5.1f} %, op level "
                          f"{op_ms * 1e3:6.1f} us {pct[1]:5.1f} % of copy, {launches:.0f} "
                          f"kernels per call, same bits: {same}")
                except Exception as exc:  # the other rows still run
                    print(f"{direction} {name:15s} {field}={value}: FAILED "
                          f"{type(exc).__name__}: {exc}"[:160])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--section", choices=("all", "tiles", "variants"), default="all")
    ap.add_argument("--configs", default=None, metavar="E:R:W,...",
                    help="tiles: (elements, rows, warps) to sweep instead of CONFIGS")
    ap.add_argument("--only", default=None, metavar="NAME,...",
                    help="cases to run (softmax, sigmoid-groups, sigmoid)")
    ap.add_argument("--variant", action="append", default=[], metavar="FIELD=true|false",
                    help="a VARIANTS setting for the whole run (e.g. the tiles under "
                         "distinct_first=true)")
    args = ap.parse_args(argv)
    fields = {}
    for item in args.variant:
        field, _, value = item.partition("=")
        if value.lower() not in ("true", "false"):
            ap.error(f"--variant takes FIELD=true|false, got {item!r}")
        fields[field] = value.lower() == "true"
    with R.VARIANTS.override(**fields):
        _run(args)


def _run(args) -> None:
    t, e = args.tokens, args.experts
    flush = L2Flusher(torch.device("cuda"))
    src = torch.empty(C.router_bytes(t, e, 2, bwd=True) // 2, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / _graph_ms(lambda: dst.copy_(src), flush) / 1e6
    print(f"tokens {t} experts {e} bf16 top-8; device copy {copy_gbps:.0f} GB/s")
    cases, ops = _cases(t, e)
    if args.section in ("all", "variants"):
        _variants(cases, ops, flush, copy_gbps, t, e)
    if args.section in ("all", "tiles"):
        configs = CONFIGS if args.configs is None else [
            tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
        _tiles(cases, flush, copy_gbps, t, e, configs,
               None if args.only is None else set(args.only.split(",")))


if __name__ == "__main__":
    main()
