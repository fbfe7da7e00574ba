"""Host cost of the multi-tensor ops' Triton path: the front end's checks, the registry's
dispatch and the backend's launch preparation (tables, alignment), with the kernel launch
itself replaced by a no-op, so that what is timed is the Python a training step pays per call
on top of its kernel (issue 17: an Adam step over 1000 tensors took 12.1 ms at op level on an
H100 where its kernel takes 3.5 ms).

    python -m benchmarks.host_cost_multi_tensor [--tensors 1000] [--max-log2 18]
        [--device cpu|cuda] [--reps 100] [--reads]

Runs without a GPU (CPU tensors under TRITON_INTERPRET=1, set here for ``--device cpu``; the
launch never happens, so the interpreter does not run).
Prints one line per op: the median and minimum host milliseconds per call (``perf_counter``
around the call; the minimum is the least disturbed by other processes on a shared box).
``--reads`` also prints what one pass over the five Adam lists costs per tensor attribute
(dtype, device, shape, contiguity, data_ptr, numel, and the identity and version counter a
cache keyed on tensor identity would read): the floor of any Python host path on that machine.
The tensors are TE-like: ``--tensors`` log-uniform sizes in [1, 2^max_log2] (the benchmark's
``mixed_sizes``), bf16 params and grads, fp32 Adam states and master weights.
"""
from __future__ import annotations

import argparse
import contextlib
import operator
import os
import statistics
import time

import torch

KERNELS = ("_adam_kernel", "_sgd_kernel", "_scale_kernel", "_sumsq_kernel")


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args)`` counts and returns."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        self.launches += 1


@contextlib.contextmanager
def launches_stubbed():
    """The Triton multi-tensor kernels replaced by :class:`_NoLaunch` inside the block."""
    from tealite.backends.triton import multi_tensor as module
    saved = {k: getattr(module, k) for k in KERNELS}
    stubs = {k: _NoLaunch() for k in KERNELS}
    for k, stub in stubs.items():
        setattr(module, k, stub)
    try:
        yield stubs
    finally:
        for k, kernel in saved.items():
            setattr(module, k, kernel)


def make_lists(count: int, max_log2: int, device) -> dict[str, list[torch.Tensor]]:
    """Adam's five lists (and SGD's momenta) over ``count`` TE-like tensors."""
    from benchmarks.test_bench_multi_tensor import mixed_sizes
    sizes = mixed_sizes(count, max_log2)
    masters = [torch.randn(n, device=device) for n in sizes]
    params = [w.to(torch.bfloat16) for w in masters]
    return dict(grads=[torch.randn(n, device=device).to(torch.bfloat16) for n in sizes],
                params=params, ms=[torch.zeros(n, device=device) for n in sizes],
                vs=[torch.zeros(n, device=device) for n in sizes], masters=masters,
                moms=[torch.zeros_like(p) for p in params])


def make_calls(lists: dict[str, list[torch.Tensor]]) -> dict:
    """The op calls to time, by name, over :func:`make_lists`'s lists."""
    import tealite
    from tealite.training_types import AdamOptions, SGDOptions
    grads, params, ms, vs, masters, moms = (lists[k] for k in ("grads", "params", "ms", "vs",
                                                               "masters", "moms"))
    adam = AdamOptions(lr=1e-4, weight_decay=0.01, step=10)
    sgd = SGDOptions(lr=1e-4, momentum=0.9)
    return {
        "multi_tensor_adam": lambda: tealite.multi_tensor_adam(
            grads, params, ms, vs, adam, master_params=masters, backend="triton"),
        "multi_tensor_sgd": lambda: tealite.multi_tensor_sgd(grads, params, moms, sgd,
                                                             backend="triton"),
        "multi_tensor_l2norm": lambda: tealite.multi_tensor_l2norm(grads, backend="triton"),
    }


T = torch.Tensor
# One C-level pass per attribute, as the host path reads them (tealite/ops/multi_tensor.py,
# tealite/_checks.py, tealite/backends/triton/multi_tensor.py).
READS = {"dtype": lambda ts: set(map(operator.attrgetter("dtype"), ts)),
         "device": lambda ts: set(map(operator.attrgetter("device"), ts)),
         "shape": lambda ts: all(map(operator.eq, map(operator.attrgetter("shape"), ts),
                                     map(operator.attrgetter("shape"), ts))),
         "is_contiguous": lambda ts: all(map(T.is_contiguous, ts)),
         "data_ptr": lambda ts: sum(map(T.data_ptr, ts)),
         "numel": lambda ts: sum(map(T.numel, ts)),
         "id": lambda ts: sum(map(id, ts)),
         "_version": lambda ts: sum(map(operator.attrgetter("_version"), ts))}


def read_costs(lists: dict[str, list[torch.Tensor]], reps: int) -> dict[str, float]:
    """Microseconds per tensor of one pass reading each attribute over Adam's five lists (the
    minimum over ``reps`` rounds; "shape" reads two sizes per tensor, as a partner check)."""
    five = [lists[k] for k in ("grads", "params", "ms", "vs", "masters")]
    n = sum(map(len, five))
    out = {}
    for name, read in READS.items():
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for ts in five:
                read(ts)
            best = min(best, time.perf_counter() - t0)
        out[name] = best / n * 1e6
    return out


def host_ms(fn, reps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--max-log2", type=int, default=18)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--reads", action="store_true",
                    help="also print the cost of one pass per tensor attribute")
    args = ap.parse_args(argv)
    if torch.device(args.device).type == "cpu":  # the Triton backend serves CPU tensors only
        os.environ.setdefault("TRITON_INTERPRET", "1")  # in the interpreter (never launched)
    lists = make_lists(args.tensors, args.max_log2, args.device)
    with launches_stubbed():
        for name, fn in make_calls(lists).items():
            t = host_ms(fn, args.reps)
            print(f"{name:22s} {args.tensors} tensors: host {statistics.median(t):7.3f} ms "
                  f"median, {min(t):7.3f} ms min per call ({args.reps} calls, {args.device})")
    if args.reads:
        costs = read_costs(lists, args.reps)
        print("one pass per attribute, us per tensor: "
              + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))


if __name__ == "__main__":
    main()
