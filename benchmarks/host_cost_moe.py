"""Host cost of an op's front end without a GPU (issue 16: moe_permute and grouped_quantize
were host-bound at op level on the H100, docs/benchmarks.md).

    TRITON_INTERPRET=1 python benchmarks/host_cost_moe.py [--op permute grouped_quantize]
        [--reps 100] [--batches 7]

For every case: the host time of one call with the Triton launches stubbed out (the kernels
do nothing, so what is timed is Python, torch's op dispatch and allocation: the work a GPU
waits on whenever the call syncs), and what one call asks of the device: its torch ops that
launch a kernel (torch.profiler, CPU), its Triton launches, and its host read-backs
(``tolist`` / ``item`` / ``int()`` ...; each is a device sync on a GPU).  The read-backs are
counted from the Python side, so they include the ones that are syncs only on a GPU.  CPU
numbers: the host here is not the GPU machine's, and torch ops that compute (a mask's sum)
run for real on the CPU; compare before / after on one machine.  Standalone: not collected by
pytest (tests/test_permute_checks.py uses :func:`counting`).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch

# Reading a tensor's value on the host: a device sync on a GPU.
READS = ("tolist", "item", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy")
# The profiler scope of a stubbed kernel's stand-in (its torch ops are not the call's).
FAKE = "host_cost_moe.fake_kernel"
# Top-level aten ops that launch no kernel (allocation, views, metadata).
NO_KERNEL = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view",
             "aten::reshape", "aten::expand", "aten::resolve_conj", "aten::resolve_neg",
             "aten::as_strided", "aten::unsqueeze", "aten::item", "aten::_local_scalar_dense",
             "aten::contiguous", "aten::alias", "aten::lift_fresh", "aten::detach_",
             "aten::t", "aten::select", "aten::slice", "aten::split", "aten::narrow",
             "aten::split_with_sizes", "aten::_unsafe_view"}


@dataclass
class Counts:
    """What the calls inside :func:`counting` asked of the device."""

    reads: collections.Counter = field(default_factory=collections.Counter)
    launches: collections.Counter = field(default_factory=collections.Counter)
    # reads ("read") and launches (the kernel's name) in call order: where a sync sits
    order: list = field(default_factory=list)


class _Launcher:
    """A kernel's ``kernel[grid]``: counts the launch, and runs it unless stubbed."""

    def __init__(self, name: str, kernel, counts: Counts, stub: bool, fake=None):
        self.name, self.kernel, self.counts, self.stub = name, kernel, counts, stub
        self.fake = fake

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counts.launches[self.name] += 1
            self.counts.order.append(self.name)
            if not self.stub:
                return self.kernel[grid](*args, **kwargs)
            if self.fake is not None:
                # named for the profiler only: a record_function costs microseconds a call
                with torch.autograd.profiler.record_function(FAKE) if \
                        torch.autograd.profiler._is_profiler_enabled else \
                        contextlib.nullcontext():
                    self.fake(*args, **kwargs)
        return launch


@contextlib.contextmanager
def counting(modules=(), *, stub: bool = False, fakes=None):
    """Count host read-backs, and the launches of the ``*_kernel`` functions of ``modules``
    (stubbed to no-ops with ``stub``, or to ``fakes[name]`` where the call reads a kernel's
    output back), while inside; yields the :class:`Counts`."""
    counts = Counts()
    with contextlib.ExitStack() as undo:
        for name in READS:
            original = getattr(torch.Tensor, name)

            def read(self, *args, _original=original, _name=name, **kwargs):
                counts.reads[_name] += 1
                counts.order.append("read")
                return _original(self, *args, **kwargs)
            setattr(torch.Tensor, name, read)
            undo.callback(setattr, torch.Tensor, name, original)
        for module in modules:
            for name in [n for n in vars(module) if n.endswith("_kernel")]:
                kernel = getattr(module, name)
                setattr(module, name, _Launcher(name, kernel, counts, stub,
                                                (fakes or {}).get(name)))
                undo.callback(setattr, module, name, kernel)
        yield counts


def torch_kernel_ops(fn) -> collections.Counter:
    """The top-level aten ops of one call of ``fn`` that launch a kernel (on a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(
        e.name for e in prof.events() if e.name.startswith("aten::")
        and e.name not in NO_KERNEL
        and (e.cpu_parent is None or not (e.cpu_parent.name.startswith("aten::")
                                          or e.cpu_parent.name == FAKE)))


def host_us(fn, reps: int, batches: int) -> tuple[float, float]:
    """(median, min) over ``batches`` of the mean host microseconds of one call: this
    process's CPU time, which other jobs on a shared box inflate far less than the wall
    clock (one torch thread: the two agree on an idle box)."""
    fn()
    per_call = []
    for _ in range(batches):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        per_call.append((time.process_time() - t0) / reps * 1e6)
    return statistics.median(per_call), min(per_call)


# benchmarks/test_bench_permute.py's routing: tokens, experts, top-k
PERMUTE_ROUTING = (16384, 8, 2)


def _permute_counts(routing, counts, *args, **kwargs):
    """A stubbed map kernel's counts as the bench's routing has them (an even split; an index
    map's bounds (0, 0)): the checked call reads them back (its range check, a mask's output
    size), so they may not be left uninitialized."""
    tokens, experts, topk = PERMUTE_ROUTING
    counts[:experts].fill_(tokens * topk // experts)
    counts[experts:].zero_()


# A stub's stand-in for kernels whose output the host reads within the call.
FAKES = {"permute": {"_count_kernel": _permute_counts, "_rows_kernel": _permute_counts}}


def permute_cases():
    """benchmarks/test_bench_permute.py's routing (16384 tokens, top-2 of 8) with hidden 64:
    the host cost does not depend on the hidden size on a GPU, while a CPU allocation of
    the bench's 4096 columns would dominate it."""
    import tealite
    import tealite.backends.triton.permute as module
    g = torch.Generator().manual_seed(6)
    tokens, experts, topk = PERMUTE_ROUTING
    x = torch.randn((tokens, 64), generator=g).to(torch.bfloat16)
    idx = torch.rand((tokens, experts), generator=g).argsort(dim=1)[:, :topk]
    mask = torch.zeros((tokens, experts), dtype=torch.bool).scatter_(1, idx, True)
    for map_type, routing in (("index", idx.to(torch.int32)), ("mask", mask)):
        yield f"moe_permute {map_type}", module, \
            lambda r=routing, m=map_type: tealite.moe_permute(
                x, r, map_type=m, num_experts=experts, backend="triton")
    for map_type, routing in (("index", idx.to(torch.int32)), ("mask", mask)):
        # checked, num_out_tokens given: a mask's count need not size the output
        yield f"moe_permute {map_type} num_out", module, \
            lambda r=routing, m=map_type: tealite.moe_permute(
                x, r, map_type=m, num_experts=experts, num_out_tokens=tokens * topk,
                backend="triton")
    for map_type, routing in (("index", idx.to(torch.int32)), ("mask", mask)):
        # what an MoE layer does: the checked call, then the grouped GEMM's m_splits
        yield f"moe_permute {map_type} + tokens_per_expert", module, \
            lambda r=routing, m=map_type: tealite.moe_permute(
                x, r, map_type=m, num_experts=experts, backend="triton"
            ).row_id_map.tokens_per_expert
    for map_type, routing in (("index", idx.to(torch.int32)), ("mask", mask)):
        # TE's convention (check_values=False, num_out_tokens given): no read-back at all
        yield f"moe_permute {map_type} unchecked", module, \
            lambda r=routing, m=map_type: tealite.moe_permute(
                x, r, map_type=m, num_experts=experts, num_out_tokens=tokens * topk,
                check_values=False, backend="triton")


def grouped_quantize_cases():
    """benchmarks/test_bench_grouped_quantize.py's variants and splits (8192 rows) with K = 128
    (the tile tables are the bench's; the CPU allocation stays small)."""
    import tealite
    import tealite.backends.triton.grouped_quantize as module
    import tealite.recipes as R
    splits = {"even": [1024] * 8, "skewed": [4096, 0, 1024, 1024, 0, 1024, 512, 512]}
    variants = {"fp8-tensor-row": (R.Float8CurrentScaling(), False, False),
                "fp8-tensor-ct-dbias": (R.Float8CurrentScaling(), True, True),
                "fp8-block1x128-row": (R.Float8BlockScaling(), False, False),
                "fp8-block1x128-ct-dbias": (R.Float8BlockScaling(), True, True)}
    x = torch.randn((8192, 128)).to(torch.bfloat16)
    for vname, (recipe, columnwise, dbias) in variants.items():
        for sname, s in splits.items():
            yield f"grouped_quantize {vname} {sname}", module, \
                lambda s=s, r=recipe, c=columnwise, d=dbias: tealite.grouped_quantize(
                    x, s, r, rowwise=True, columnwise=c, dbias=d, backend="triton")


CASES = {"permute": permute_cases, "grouped_quantize": grouped_quantize_cases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--batches", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared box: one thread keeps the timings steadier
    print("| call | host us/call (median / min) | torch kernel ops | Triton launches | "
          "host reads |\n|---|---|---|---|---|")
    for op in args.op:
        for name, module, fn in CASES[op]():
            with counting([module], stub=True, fakes=FAKES.get(op)) as counts:
                fn()  # first-call work (cached host tables) is not per-call cost
                ops = torch_kernel_ops(fn)
                counts.reads.clear(), counts.launches.clear()
                fn()
                reads, launches = dict(counts.reads), dict(counts.launches)
                median, least = host_us(fn, args.reps, args.batches)
            print(f"| {name} | {median:.0f} / {least:.0f} | {sum(ops.values())} "
                  f"{dict(ops) or ''} | {sum(launches.values())} | "
                  f"{sum(reads.values())} {reads or ''} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
