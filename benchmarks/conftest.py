"""pytest-benchmark suite for tealite's kernels (run explicitly; CI's `pytest` collects tests/).

    pytest benchmarks/ --benchmark-json bench.json      # then: python benchmarks/report.py bench.json

Each benchmark row times its op twice:

* device time (the numbers the targets use): ``_timing.device_times`` -- device events around
  each repetition, L2 flushed between repetitions, no host sync in between; the median goes to
  ``benchmark.extra_info`` with GB/s or TFLOP/s and the percentage of the in-run reference
  (device copy bandwidth, or the torch baseline measured in the same session);
* wall time (pytest-benchmark's own statistics): ``benchmark.pedantic`` around the op followed
  by a device synchronisation, i.e. the latency a synchronous caller sees, host overhead
  included.

On a machine without a GPU the suite runs at tiny shapes with wall-clock timing (smoke mode;
``tests/test_benchmarks_smoke.py`` runs it that way so it cannot rot).  ``--bench-size``
(or ``$TEALITE_BENCH_SIZE``) = large | tiny forces a size.  A backend that rejects a case, or
an op not implemented yet, is skipped with the registry's reason; skip reasons and failures
are written into the JSON (key ``tealite``) for ``report.py``.
"""
from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass

import pytest
import torch

from benchmarks import _cases as C
from benchmarks import _timing as T
from tealite.errors import BackendUnavailable, UnsupportedCase

_OUTCOMES: dict[str, list] = {"skipped": [], "failed": []}


def pytest_addoption(parser):
    group = parser.getgroup("tealite benchmarks")
    group.addoption("--bench-size", choices=("auto", "large", "tiny"),
                    default=os.environ.get("TEALITE_BENCH_SIZE", "auto"),
                    help="shapes: large on a GPU, tiny without one (auto)")
    group.addoption("--bench-reps", type=int, default=None,
                    help="device-timed repetitions per row (default 30 on a GPU, 2 on a CPU)")
    group.addoption("--bench-wall-reps", type=int, default=None,
                    help="wall-clock (pytest-benchmark) rounds per row on a GPU (default 5; "
                         "without a GPU the timed loop itself is the wall clock)")
    group.addoption("--bench-warmup", type=int, default=None,
                    help="untimed calls before timing (default 3 / 1)")


@dataclass(frozen=True)
class BenchConfig:
    device: torch.device
    size: str
    sizes: C.Sizes
    reps: int
    wall_reps: int
    warmup: int

    @property
    def gpu(self) -> bool:
        return T.is_gpu(self.device)


@pytest.fixture(scope="session")
def bench_config(request) -> BenchConfig:
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    size = request.config.getoption("--bench-size")
    if size == "auto":
        size = "large" if gpu else "tiny"
    opt = request.config.getoption

    def pick(name, on_gpu, on_cpu):
        value = opt(name)
        return value if value is not None else (on_gpu if gpu else on_cpu)

    return BenchConfig(device=device, size=size, sizes=C.SIZES[size],
                       reps=pick("--bench-reps", 30, 2),
                       wall_reps=pick("--bench-wall-reps", 5, 1),
                       warmup=pick("--bench-warmup", 3, 1))


@pytest.fixture(scope="session")
def flusher(bench_config) -> T.L2Flusher:
    return T.L2Flusher(bench_config.device)


def _bf16_randn(shape, device, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)


@pytest.fixture(scope="session")
def copy_reference(bench_config, flusher) -> dict:
    """The device copy bandwidth of this run: dst.copy_(src) of a large bf16 tensor, bytes
    read + bytes written."""
    cfg = bench_config
    src = _bf16_randn((cfg.sizes.copy_elems,), cfg.device, 0)
    dst = torch.empty_like(src)
    timing = T.measure(lambda: dst.copy_(src), cfg.device, reps=cfg.reps, warmup=cfg.warmup,
                       flush=flusher)
    nbytes = 2 * src.nbytes
    return {"name": "device copy", "gbps": T.gbps(nbytes, timing.median_ms),
            "ms": timing.median_ms, "bytes": nbytes, "timer": timing.timer}


class Baselines:
    """torch baselines (torch.matmul, torch._scaled_mm), each measured once per session."""

    def __init__(self, cfg: BenchConfig, flush: T.L2Flusher):
        self.cfg, self.flush, self._cache = cfg, flush, {}

    def get(self, name: str, fn, flops: int) -> dict:
        if name not in self._cache:
            try:
                timing = T.measure(fn, self.cfg.device, reps=self.cfg.reps,
                                   warmup=self.cfg.warmup, flush=self.flush)
            except Exception as exc:  # e.g. _scaled_mm mode missing on this device/build
                self._cache[name] = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            else:
                self._cache[name] = {"name": name, "tflops": T.tflops(flops, timing.median_ms),
                                     "ms": timing.median_ms}
        return self._cache[name]


@pytest.fixture(scope="session")
def baselines(bench_config, flusher) -> Baselines:
    return Baselines(bench_config, flusher)


@pytest.fixture(scope="session")
def aiter():
    """AITER's Triton kernels (loaded without ROCm), or a skip naming why not."""
    from tealite.backends.aiter_common import loader
    try:
        return loader.load()
    except loader.AiterNotFound as exc:
        pytest.skip(f"AITER side-by-side rows: {exc}")


def need_aiter(at, name: str) -> None:
    if not at.has(name):
        pytest.skip(f"AITER {name} not loaded: {at.missing.get(name, 'unknown entry point')}")


def _call_or_skip(fn, foreign: bool):
    """First call: a backend rejecting the case (or an op not implemented yet) is a skip with
    the registry's reason; a failing AITER kernel (not ours) is a skip with its error."""
    try:
        return fn()
    except (UnsupportedCase, BackendUnavailable, NotImplementedError) as exc:
        pytest.skip(f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        if foreign:
            pytest.skip(f"AITER kernel failed here: {type(exc).__name__}: {str(exc)[:300]}")
        raise


@dataclass
class Bench:
    benchmark: object
    cfg: BenchConfig
    flush: T.L2Flusher

    def run(self, fn, *, group: str, kernel: str, backend: str, shape, dtype,
            nbytes: int | None = None, flops: int | None = None, reference: dict | None = None,
            target_pct: float | None = None, check=None, foreign: bool = False, **extra):
        """Benchmark ``fn``; ``reference`` is the copy reference (for ``nbytes`` rows) or a
        :class:`Baselines` entry (for ``flops`` rows).  ``check(first_output)`` returns a dict
        of sanity numbers for extra_info (it may assert)."""
        cfg = self.cfg
        first = _call_or_skip(fn, foreign)  # also the first warm-up call (JIT compilation)
        info = dict(check(first)) if check is not None else {}
        T.warm_up(fn, cfg.device, max(0, cfg.warmup - 1))
        self.benchmark.group = group
        timing = self._time(fn)
        ms = timing.median_ms
        ei = self.benchmark.extra_info
        ei.update(kernel=kernel, backend=backend, group=group, size=cfg.size,
                  shape="x".join(str(s) for s in shape), dtype=str(dtype).replace("torch.", ""),
                  device=_device_name(cfg.device), **timing.as_dict(), **info, **extra)
        value = ref_value = None
        if nbytes is not None:
            value = T.gbps(nbytes, ms)
            ei.update(bytes=nbytes, gbps=value)
            if reference is not None:
                ref_value = reference["gbps"]
        if flops is not None:
            value = T.tflops(flops, ms)
            ei.update(flops=flops, tflops=value)
            if reference is not None and "tflops" in reference:
                ref_value = reference["tflops"]
        if reference is not None:
            ei.update(reference=reference["name"], reference_value=ref_value,
                      reference_ms=reference.get("ms"))
            if "error" in reference:
                ei["reference_error"] = reference["error"]
        pct = 100.0 * value / ref_value if value is not None and ref_value else None
        # Targets are for a GPU at the large sizes; smoke numbers are recorded, not judged.
        judged = cfg.gpu and cfg.size == "large"
        ei.update(pct_of_reference=pct, target_pct=target_pct, judged=judged,
                  met=None if target_pct is None or pct is None or not judged
                  else pct >= target_pct)
        return first

    def _time(self, fn) -> T.Timing:
        cfg = self.cfg

        def setup():
            self.flush()
            T.synchronize(cfg.device)

        if not cfg.gpu:
            # No device: the device timer is the wall clock, so one loop serves both.
            wall = []

            def timed():
                t0 = time.perf_counter()
                fn()
                wall.append((time.perf_counter() - t0) * 1e3)

            self.benchmark.pedantic(timed, setup=setup, rounds=cfg.reps, iterations=1)
            return T.Timing(tuple(wall), "wall")
        timing = T.device_times(fn, cfg.device, reps=cfg.reps, flush=self.flush)
        self.benchmark.pedantic(T.synced(fn, cfg.device), setup=setup, rounds=cfg.wall_reps,
                                iterations=1, warmup_rounds=0)
        if os.environ.get("TEALITE_BENCH_PROFILE"):
            self._profile(fn)
        return timing

    def _profile(self, fn) -> None:
        """$TEALITE_BENCH_PROFILE=FILE: the row's kernels per call and their busy time into
        extra_info, the top-kernel table appended to FILE (where a row's time goes)."""
        prof = T.kernel_profile(fn, self.cfg.device)
        self.benchmark.extra_info.update(kernel_busy_ms=prof.busy_ms,
                                         kernels_per_call=prof.kernels)
        with open(os.environ["TEALITE_BENCH_PROFILE"], "a") as f:
            f.write(f"\n=== {self.benchmark.name}: {prof.kernels:.0f} kernels, "
                    f"{prof.busy_ms:.4f} ms busy per call\n{prof.table}\n")


@pytest.fixture
def bench(benchmark, bench_config, flusher) -> Bench:
    return Bench(benchmark, bench_config, flusher)


# ---- environment and outcomes into the JSON ------------------------------------------------

def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if T.is_gpu(device) else platform.processor() \
        or "cpu"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def environment() -> dict:
    import triton
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   l2_bytes=getattr(props, "L2_cache_size", None),
                   memory_bytes=props.total_memory, driver=_driver_version())
    else:
        env.update(gpu=None, cpu=platform.processor() or platform.machine())
    from tealite.backends.aiter_common import loader
    env["aiter"] = [at.describe() for at in loader._loaded.values()] or None
    env["aiter_notes"] = [n for at in loader._loaded.values() for n in at.notes]
    return env


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else \
            str(report.longrepr)
        _OUTCOMES["skipped"].append({"test": report.nodeid,
                                     "reason": reason.removeprefix("Skipped: ")})
    elif report.failed:
        text = report.longreprtext.strip().splitlines()
        _OUTCOMES["failed"].append({"test": report.nodeid, "phase": report.when,
                                    "error": text[-1] if text else ""})


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["tealite"] = {"environment": environment(), **_OUTCOMES}
