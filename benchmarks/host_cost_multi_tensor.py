"""Host cost of the multi-tensor ops' Triton path: the front end's checks, the registry's
dispatch and the backend's launch preparation (tables, alignment), with the kernel launch
itself replaced by a no-op, so that what is timed is the Python a training step pays per call
on top of its kernel (issue 17: an Adam step over 1000 tensors took 12.1 ms at op level on an
H100 where its kernel takes 3.5 ms).

    python -m benchmarks.host_cost_multi_tensor [--tensors 1000] [--max-log2 18]
        [--device cpu|cuda] [--reps 100]

Runs without a GPU (CPU tensors under TRITON_INTERPRET=1, set here for ``--device cpu``; the
launch never happens, so the interpreter does not run).
Prints one line per op: the median and minimum host milliseconds per call (``perf_counter``
around the call; the minimum is the least disturbed by other processes on a shared box).
The tensors are TE-like: ``--tensors`` log-uniform sizes in [1, 2^max_log2] (the benchmark's
``mixed_sizes``), bf16 params and grads, fp32 Adam states and master weights.
"""
from __future__ import annotations

import argparse
import contextlib
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


def make_calls(count: int, max_log2: int, device) -> dict:
    """The op calls to time, by name, over one TE-like list of ``count`` tensors."""
    import tealite
    from benchmarks.test_bench_multi_tensor import mixed_sizes
    from tealite.training_types import AdamOptions, SGDOptions
    sizes = mixed_sizes(count, max_log2)
    masters = [torch.randn(n, device=device) for n in sizes]
    params = [w.to(torch.bfloat16) for w in masters]
    grads = [torch.randn(n, device=device).to(torch.bfloat16) for n in sizes]
    ms = [torch.zeros(n, device=device) for n in sizes]
    vs = [torch.zeros(n, device=device) for n in sizes]
    moms = [torch.zeros_like(p) for p in params]
    adam = AdamOptions(lr=1e-4, weight_decay=0.01, step=10)
    sgd = SGDOptions(lr=1e-4, momentum=0.9)
    return {
        "multi_tensor_adam": lambda: tealite.multi_tensor_adam(
            grads, params, ms, vs, adam, master_params=masters, backend="triton"),
        "multi_tensor_sgd": lambda: tealite.multi_tensor_sgd(grads, params, moms, sgd,
                                                             backend="triton"),
        "multi_tensor_l2norm": lambda: tealite.multi_tensor_l2norm(grads, backend="triton"),
    }


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
    args = ap.parse_args(argv)
    if torch.device(args.device).type == "cpu":  # the Triton backend serves CPU tensors only
        os.environ.setdefault("TRITON_INTERPRET", "1")  # in the interpreter (never launched)
    with launches_stubbed():
        for name, fn in make_calls(args.tensors, args.max_log2, args.device).items():
            t = host_ms(fn, args.reps)
            print(f"{name:22s} {args.tensors} tensors: host {statistics.median(t):7.3f} ms "
                  f"median, {min(t):7.3f} ms min per call ({args.reps} calls, {args.device})")


if __name__ == "__main__":
    main()
