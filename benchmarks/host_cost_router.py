"""Host cost of the router ops' Triton path: the front end's checks, the registry's dispatch
and the backend's launch preparation, with the kernel launch replaced by a no-op, and the
torch operators one call runs besides its kernel (each is a device kernel or a copy on a GPU).

    python -m benchmarks.host_cost_router [--tokens 16384 --experts 256] [--reps 200]

Runs without a GPU (CPU tensors under TRITON_INTERPRET=1, set here; the launch never happens,
so the interpreter does not run).  Per op (forward softmax, forward sigmoid with groups and a
bias, backward softmax / sigmoid): the median and minimum host microseconds per call
(``perf_counter``; the minimum is the least disturbed on a shared box), the kernel launches,
and the torch operators run outside the kernel (``torch.profiler``, CPU), the reads back to
the host (``item`` / ``_local_scalar_dense``: a device sync each on a GPU) among them.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

KERNELS = ("_router_fwd_kernel", "_router_bwd_kernel")


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args)`` counts and returns."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
        return launch


@contextlib.contextmanager
def _stubbed():
    from tealite.backends.triton import router as R
    saved = {name: getattr(R, name) for name in KERNELS}
    stub = _NoLaunch()
    try:
        for name in KERNELS:
            setattr(R, name, stub)
        yield stub
    finally:
        for name, kernel in saved.items():
            setattr(R, name, kernel)


def _calls(tokens: int, experts: int) -> dict:
    import tealite
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, experts, generator=g).to(torch.bfloat16)
    grad = torch.randn(tokens, experts, generator=g).to(torch.bfloat16)
    bias = torch.randn(experts, generator=g) * 0.1
    sig = dict(score_function="sigmoid", num_groups=8, group_topk=4)
    _, soft_map = tealite.router_fwd(x, 8, backend="torch")
    _, sig_map = tealite.router_fwd(x, 8, backend="torch", expert_bias=bias, **sig)
    return {
        "fwd softmax": lambda: tealite.router_fwd(x, 8, backend="triton"),
        "fwd sigmoid-groups": lambda: tealite.router_fwd(x, 8, backend="triton",
                                                         expert_bias=bias, **sig),
        "bwd softmax": lambda: tealite.router_bwd(grad, x, soft_map, 8, backend="triton"),
        "bwd sigmoid": lambda: tealite.router_bwd(grad, x, sig_map, 8, backend="triton",
                                                  score_function="sigmoid"),
    }


def _torch_ops(fn) -> list[str]:
    """The aten operators ``fn`` runs at the top level (their callees not listed twice)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    top = []
    for e in events:  # keep the events no other aten event encloses
        if not any(o is not e and o.time_range.start <= e.time_range.start and
                   e.time_range.end <= o.time_range.end for o in events):
            top.append(e.name[len("aten::"):])
    return top


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    calls = _calls(args.tokens, args.experts)
    with _stubbed() as stub:
        for name, fn in calls.items():
            fn()  # caches warm
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            stub.launches = 0
            ops = _torch_ops(fn)
            reads = sum(op in ("item", "_local_scalar_dense", "is_nonzero") for op in ops)
            print(f"{name:19s} host {statistics.median(times):6.1f} us (min {min(times):6.1f})"
                  f"  launches {stub.launches}  reads {reads}  torch ops {len(ops)}: "
                  f"{' '.join(ops)}")


if __name__ == "__main__":
    main()
