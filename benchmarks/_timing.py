"""Device-event timing for the benchmark suite (usable without pytest).

On CUDA/ROCm each repetition is ``flush L2; record start; fn(); record end`` with no host
synchronisation between repetitions (as ``triton.testing.do_bench`` does): the host runs ahead,
so Python front-end overhead hides behind the previous repetition's device work and the events
measure the device.  The L2 flush (zeroing a buffer twice the L2 size) keeps one repetition's
outputs from serving the next one's reads; the inputs at the "large" sizes are also several
times the L2.  Without a GPU the same loop runs with ``time.perf_counter`` (smoke mode).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

_MIN_FLUSH_BYTES = 64 << 20


@dataclass(frozen=True)
class Timing:
    """Per-repetition times of one function, in milliseconds."""

    times_ms: tuple[float, ...]
    timer: str  # "device-event" or "wall"

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    def as_dict(self) -> dict:
        return {"timer": self.timer, "reps": len(self.times_ms),
                "device_ms_median": self.median_ms, "device_ms_min": self.min_ms,
                "device_ms_max": self.max_ms}


def is_gpu(device: torch.device) -> bool:
    return torch.device(device).type == "cuda"  # ROCm devices are "cuda" in torch too


def synchronize(device: torch.device) -> None:
    if is_gpu(device):
        torch.cuda.synchronize(device)


class L2Flusher:
    """Evicts the device's L2 by writing a buffer twice its size (no-op on a CPU)."""

    def __init__(self, device: torch.device):
        self.buffer = None
        if is_gpu(device):
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
            nbytes = max(2 * l2, _MIN_FLUSH_BYTES)
            self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()


def warm_up(fn: Callable[[], object], device: torch.device, calls: int) -> None:
    """Run ``fn`` (JIT compilation, autotuning, allocator growth) outside the timed region."""
    for _ in range(calls):
        fn()
    synchronize(device)


def device_times(fn: Callable[[], object], device: torch.device, *, reps: int,
                 flush: L2Flusher | None = None) -> Timing:
    """Per-repetition device time of ``fn`` (already warmed up)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not is_gpu(device):
        times = []
        for _ in range(reps):
            if flush is not None:
                flush()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return Timing(tuple(times), "wall")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return Timing(tuple(s.elapsed_time(e) for s, e in zip(starts, ends)), "device-event")


def measure(fn: Callable[[], object], device: torch.device, *, reps: int, warmup: int,
            flush: L2Flusher | None = None) -> Timing:
    warm_up(fn, device, warmup)
    return device_times(fn, device, reps=reps, flush=flush)


def synced(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """``fn`` followed by a device synchronisation: what a wall clock around it measures is
    the op's latency as a synchronous caller sees it (host overhead included)."""
    def run() -> None:
        fn()
        synchronize(device)
    return run


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def tflops(flops: int, ms: float) -> float:
    return flops / ms / 1e9


@dataclass(frozen=True)
class KernelProfile:
    """What one call runs on the device (torch.profiler over a few calls, per call):
    the kernels' summed busy time and their count; ``table`` the top kernels.  A busy time far
    below the event-timed median says the device waits on the host (a sync in the front end,
    launch overhead)."""

    busy_ms: float
    kernels: float
    table: str


def kernel_profile(fn: Callable[[], object], device: torch.device, calls: int = 3,
                   rows: int = 8) -> KernelProfile:
    from torch.profiler import ProfilerActivity, profile
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(_device_us(e) for e in kernels)
    try:
        table = prof.key_averages().table(sort_by="device_time_total", row_limit=rows)
    except (AttributeError, KeyError, ValueError):  # older torch names it cuda_time_total
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows)
    return KernelProfile(busy_us / 1e3 / calls, len(kernels) / calls, table)


def _device_us(event) -> float:
    """A device event's duration (``device_time`` in torch >= 2.4, ``cuda_time`` before)."""
    t = getattr(event, "device_time", None)
    return float(t if t is not None else event.cuda_time)
