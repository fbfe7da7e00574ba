"""CUDA-graph replay check, usable for any op (issue 16 part 6; docs/graph-replay.md).

The bug class: NVIDIA TE PR 3171 found that the grouped GEMM's dgrad and wgrad shared one
cuBLAS workspace, so under CUDA-graph replay the last expert's wgrad came out corrupted.  An op
is graph-safe when every output it returns lives in memory that nothing after the call writes:
not a module-level workspace, not a cache the next call reuses, not memory it read without
writing (a graph's private pool hands out memory with another history on every replay).

The check, for one op call ``call(inputs) -> {name: tensor}`` on one backend:

1. eager: run once on a private copy of the inputs; snapshot every output tensor at once.
2. disturb: allocate and free tensors of assorted sizes filled with NaN (a new allocation
   history), run other work: the same op on perturbed inputs and an unrelated matmul.
3. eager again: the outputs of step 1, as returned, must still equal their snapshot
   (stage "eager": an output aliases memory later work writes).
4. capture the same call on static inputs with the :class:`CaptureEngine`; a capture that
   raises is a failure of stage "capture" (e.g. a host synchronization inside the op).
5. ``replays`` times: disturb, copy the inputs into the static input buffers (as a graph's
   caller does; an op accumulating into an input starts afresh), replay, disturb again, then
   compare every static output with the eager snapshot, bitwise (stage "replay", naming the replay index and the tensor).  Equality
   to the eager snapshot on every replay is also bit-identity across replays.

Comparisons are of bit patterns (NaN payloads included), never of values with a tolerance:
replay runs the very kernels eager ran, on the same inputs.

Engines (injectable): :class:`CudaGraphEngine` captures with ``torch.cuda.CUDAGraph`` after a
warm-up on a side stream, as torch requires; :class:`StaticBufferEngine` is the CPU emulation:
capture records the call and its outputs (the static buffers), replay re-runs the call and
copies its results into those buffers unless they are the same memory.  The emulation catches
outputs that alias memory reused later (the PR 3171 class), not host-side state a real graph
bakes in at capture (it re-runs Python); it is what ``--graph-replay`` uses off the GPU.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

ENV_VAR = "TEALITE_VERIFY_GRAPH_REPLAY"  # replays per case, e.g. 3; unset or empty: off
DEFAULT_REPLAYS = 3
STAGES = ("eager", "capture", "replay")

Call = Callable[[dict], dict]


@dataclass(frozen=True)
class GraphReplayPolicy:
    """An op spec's graph-replay option (``OpSpec.graph_replay``).

    ``capturable``: False for an op that cannot be captured by design (host synchronization,
    data-dependent output shapes); ``reason`` says why, and the check reports it instead of
    running.  ``by_default``: run the check on every case on a CUDA device even when the run did
    not ask for it (the grouped GEMM's forward and backward: issue 16)."""

    capturable: bool = True
    reason: str = ""
    by_default: bool = False

    def __post_init__(self):
        if not self.capturable and not self.reason:
            raise ValueError("GraphReplayPolicy(capturable=False) needs the reason")


@dataclass(frozen=True)
class ReplayFailure:
    """One graph-replay finding: ``stage`` in STAGES; ``replay`` the 0-based replay index
    (stage "replay" only); ``tensor`` the output's name (None for a capture failure)."""

    backend: str
    stage: str
    replay: int | None
    tensor: str | None
    detail: str

    def summary(self) -> str:
        where = {"eager": "eager output", "capture": "capture",
                 "replay": f"replay {self.replay}"}[self.stage]
        what = f", tensor {self.tensor!r}" if self.tensor else ""
        return f"graph-replay {self.backend}: {where}{what}: {self.detail}"

    def to_dict(self) -> dict:
        return {"backend": self.backend, "stage": self.stage, "replay": self.replay,
                "tensor": self.tensor, "detail": self.detail}


class Captured(Protocol):
    outputs: dict  # name -> static output tensor

    def replay(self) -> None: ...


class CaptureEngine(Protocol):
    name: str

    def unavailable_reason(self, device: str) -> str | None: ...

    def capture(self, fn: Callable[[], dict]) -> Captured: ...


class _Emulated:
    def __init__(self, fn: Callable[[], dict], outputs: dict):
        self._fn = fn
        self.outputs = outputs

    def replay(self) -> None:
        fresh = _tensors(self._fn())
        if set(fresh) != set(self.outputs):
            raise RuntimeError(f"replay returned outputs {sorted(fresh)}, the capture "
                               f"{sorted(self.outputs)}")
        for name, buf in self.outputs.items():
            new = fresh[name]
            if new.shape != buf.shape or new.dtype != buf.dtype:
                raise RuntimeError(f"replay output {name!r} is {tuple(new.shape)} {new.dtype}, "
                                   f"the captured one {tuple(buf.shape)} {buf.dtype}")
            if new.data_ptr() != buf.data_ptr():  # a graph writes where capture wrote
                buf.copy_(new)


class StaticBufferEngine:
    """CPU emulation of a graph: replay re-runs the recorded call into static buffers."""

    name = "static-buffer emulation"

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def capture(self, fn: Callable[[], dict]) -> Captured:
        return _Emulated(fn, _tensors(fn()))


class _CudaCaptured:
    def __init__(self, graph, outputs: dict):
        self._graph = graph
        self.outputs = outputs

    def replay(self) -> None:
        self._graph.replay()
        torch.cuda.synchronize()


class CudaGraphEngine:
    """``torch.cuda.CUDAGraph`` capture, after ``warmup`` calls on a side stream (lazy
    initialisation, Triton compilation and cuBLAS workspace creation must not be captured)."""

    name = "torch.cuda.CUDAGraph"

    def __init__(self, warmup: int = 2):
        self.warmup = warmup

    def unavailable_reason(self, device: str) -> str | None:
        if not str(device).startswith("cuda"):
            return f"CUDA graphs need a CUDA device, the case runs on {device}"
        if not torch.cuda.is_available():
            return "torch.cuda is not available on this machine"
        return None

    def capture(self, fn: Callable[[], dict]) -> Captured:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = _tensors(fn())
        torch.cuda.synchronize()
        return _CudaCaptured(graph, outputs)


def engine_for(device: str) -> CaptureEngine:
    """The real graph engine on a CUDA device, the emulation elsewhere."""
    return CudaGraphEngine() if str(device).startswith("cuda") else StaticBufferEngine()


def replays_from_env(environ=None) -> int | None:
    """Replays per case asked for through $TEALITE_VERIFY_GRAPH_REPLAY (how ``fuzz
    --graph-replay`` reaches its workers), None when unset or empty."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    return check_replays(raw, ENV_VAR) if raw else None


def check_replays(n, name: str = "replays") -> int:
    """``n`` as a positive int, or a ValueError naming ``name``."""
    try:
        v = int(n)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {n!r}") from None
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return v


def _tensors(outputs) -> dict:
    """The tensor outputs of a call (None and non-tensor entries carry no memory)."""
    return {k: v for k, v in dict(outputs).items() if isinstance(v, torch.Tensor)}


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _refill(static: dict, inputs: dict) -> None:
    """Copy the case's inputs into the static input buffers, as a graph's caller does before
    each replay."""
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)


def perturbed(inputs: dict) -> dict:
    """Other inputs of the same shapes: floating tensors of 2+ bytes rolled by one along their
    first axis and halved (exact), the rest copied.  Used only as other work between replays:
    an op that writes shared memory then writes different values there."""
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.element_size() >= 2 \
                and v.dim() > 0 and v.numel() > 0:
            out[k] = torch.roll(v, 1, 0) * 0.5
        else:
            out[k] = v.clone() if isinstance(v, torch.Tensor) else v
    return out


class Disturbance:
    """Allocation churn and other work between replays, reproducible from ``seed``.

    Each call allocates tensors of assorted sizes filled with NaN (bytes of every size class
    the caching allocators keep), keeps every other one alive until the next call (so the free
    lists differ each time), and runs ``other_work``."""

    def __init__(self, device: str, other_work: Callable[[], None], seed: int = 0,
                 max_elements: int = 1 << 16):
        self.device = device
        self.other_work = other_work
        self.rng = random.Random(seed)
        self.max_elements = max_elements
        self._held: list[torch.Tensor] = []

    def __call__(self) -> None:
        self._held = []
        for i in range(6):
            n = self.rng.randint(1, self.max_elements)
            t = torch.full((n,), float("nan"), dtype=torch.float32, device=self.device)
            if i % 2:
                self._held.append(t)
        try:
            self.other_work()
        except Exception:  # other work only moves memory around: its own errors do not count
            pass


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of ``t`` as integers (NaN payloads and signed zeros compared too)."""
    t = t.detach()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point() or t.is_complex():
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        t = t.contiguous()
        if t.is_complex():
            t = torch.view_as_real(t)
        return t.view(width[t.element_size()])
    return t


def differs(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when ``got`` is bit-identical to ``want``, else what differs."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{tuple(got.shape)} {got.dtype}, eager gave {tuple(want.shape)} {want.dtype}"
    a, b = _bits(got).cpu(), _bits(want).cpu()
    bad = (a != b)
    n = int(bad.sum())
    if n == 0:
        return None
    idx = tuple(int(i) for i in bad.nonzero()[0])
    return (f"{n} of {got.numel()} elements differ from eager, first at {idx}: "
            f"{got[idx].item()!r} vs {want[idx].item()!r}")


def check(call: Call, inputs: dict, *, backend: str, device: str = "cpu",
          engine: CaptureEngine | None = None, replays: int = DEFAULT_REPLAYS,
          seed: int = 0) -> list[ReplayFailure]:
    """The graph-replay check of one call (the steps are in the module docstring); an empty
    list is a pass."""
    replays = check_replays(replays)
    engine = engine or engine_for(device)
    why = engine.unavailable_reason(device)
    if why:
        raise RuntimeError(f"graph replay on {device} with {engine.name}: {why}")
    failures: list[ReplayFailure] = []

    def other_work():
        call(perturbed(inputs))
        a = torch.ones(17, 33, device=device)
        (a @ a.T).sum()

    disturb = Disturbance(device, other_work, seed)
    eager = _tensors(call(_clone(inputs)))
    snapshot = {k: v.clone() for k, v in eager.items()}
    disturb()
    for name in sorted(eager):
        d = differs(eager[name], snapshot[name])
        if d:
            failures.append(ReplayFailure(backend, "eager", None, name,
                                          f"changed after other work ran: it aliases memory "
                                          f"the op reuses ({d})"))
    static = _clone(inputs)
    try:
        captured = engine.capture(lambda: call(static))
    except Exception as exc:
        failures.append(ReplayFailure(backend, "capture", None, None,
                                      f"{type(exc).__name__}: {exc}"))
        return failures
    if set(captured.outputs) != set(snapshot):
        failures.append(ReplayFailure(backend, "capture", None, None,
                                      f"captured outputs {sorted(captured.outputs)}, eager "
                                      f"{sorted(snapshot)}"))
        return failures
    for i in range(replays):
        disturb()
        _refill(static, inputs)  # an op that writes an input (accumulate=True) starts afresh
        try:
            captured.replay()
        except Exception as exc:
            failures.append(ReplayFailure(backend, "replay", i, None,
                                          f"{type(exc).__name__}: {exc}"))
            return failures
        disturb()
        for name in sorted(snapshot):
            d = differs(captured.outputs[name], snapshot[name])
            if d:
                failures.append(ReplayFailure(backend, "replay", i, name, d))
        if failures:
            return failures  # the first replay that breaks names the bug; later ones add noise
    return failures
