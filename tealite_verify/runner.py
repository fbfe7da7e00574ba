"""Differential runner: one case, every backend, against the reference and each other.

``run_case`` builds the inputs once, runs each requested backend on its own copy through the
tealite front-end (so validation is identical), evaluates the float64 reference once, and
compares: each backend with the reference under its own declared numerics, and every pair of
backends with the sum of their two bounds.

Each report carries ``timings`` (``time.perf_counter`` seconds): "inputs", "backend:<name>"
per backend, "reference" (float64 view + reference) and "compare" (tolerances + metrics).
On CUDA the device is synchronized at each boundary so asynchronous kernels are charged to
the backend that launched them, not to whatever synchronizes next.  When the case runs on
CUDA, the float64 reference products run there too (see ``references._device``); for a spec
with ``device_reference`` the whole reference, its bounds and the comparison do (only a
comparison that is not all finite and within leaves the device, for the general rules).
"""
from __future__ import annotations

import json
import os
import shlex
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from tealite import registry
from tealite.errors import BackendUnavailable, UnsupportedCase
from tealite_verify import tolerance
from tealite_verify.references import _device as reference_device
from tealite_verify.specs import Expected, OpSpec


@dataclass
class Outcome:
    backend: str
    status: str  # "ok" | "unsupported" | "unavailable" | "error"
    reason: str | None = None
    numerics: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict, repr=False)


@dataclass
class Comparison:
    lhs: str
    rhs: str  # "reference" or a backend name
    output: str
    metrics: tolerance.Metrics


@dataclass
class CaseReport:
    op: str
    case: dict
    device: str
    outcomes: dict[str, Outcome]
    comparisons: list[Comparison]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.metrics.passed]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.status == "error"]

    @property
    def verdict(self) -> str:
        if self.failures or self.errors:
            return "fail"
        if not any(o.status == "ok" for o in self.outcomes.values()):
            return "skip"
        return "pass"

    def max_ratio(self) -> float:
        ratios = [c.metrics.max_ratio for c in self.comparisons if c.rhs == "reference"]
        return max(ratios, default=0.0)

    def repro(self, backend: str | None = None) -> str:
        return repro_command(self.op, self.case, self.device, backend)

    def describe(self) -> str:
        lines = [f"{self.op} on {self.device}: {self.verdict}",
                 f"  case: {json.dumps(self.case, sort_keys=True)}"]
        for o in self.outcomes.values():
            extra = f" ({o.reason})" if o.reason else ""
            lines.append(f"  backend {o.backend}: {o.status}{extra}")
        for c in self.comparisons:
            mark = "ok  " if c.metrics.passed else "FAIL"
            lines.append(f"  {mark} {c.lhs} vs {c.rhs} [{c.output}]: {c.metrics.summary()}")
        bad = sorted({c.lhs for c in self.failures} | {o.backend for o in self.errors})
        lines.append(f"  repro: {self.repro(bad[0] if len(bad) == 1 else None)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "case": self.case, "device": self.device, "verdict": self.verdict,
            "outcomes": {k: {"status": o.status, "reason": o.reason,
                             "numerics": {nk: str(nv) for nk, nv in o.numerics.items()}}
                         for k, o in self.outcomes.items()},
            "comparisons": [{"lhs": c.lhs, "rhs": c.rhs, "output": c.output,
                             "metrics": c.metrics.to_dict()} for c in self.comparisons],
            "repro": self.repro(),
            "timings": dict(self.timings),
        }


def repro_command(op: str, case: dict, device: str, backend: str | None = None) -> str:
    env = os.environ.get(registry.PLUGIN_ENV_VAR)
    prefix = f"{registry.PLUGIN_ENV_VAR}={shlex.quote(env)} " if env else ""
    cmd = (f"{prefix}python -m tealite_verify repro --op {op} --device {device} "
           f"--case {shlex.quote(json.dumps(case, sort_keys=True))}")
    if backend:
        cmd += f" --backend {backend}"
    return cmd


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _reference_view(inputs: dict, device: str | None = None) -> dict:
    """float64 copies of the tensor inputs (non-tensors pass through): numpy arrays, or with
    ``device`` torch tensors there."""
    if device is not None:
        return {k: v.detach().to(device, torch.float64, copy=True)
                if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return {k: v.detach().to("cpu", torch.float64).numpy() if isinstance(v, torch.Tensor) else v
            for k, v in inputs.items()}


# A device_reference spec's case moves wholesale to the GPU (reference, bounds, comparison)
# from this many elements in its largest input: below it the few dozen kernel launches of a
# bound cost more than numpy on the host (H100, see docs/fuzzing.md).
DEVICE_REFERENCE_MIN_ELEMENTS = 1 << 16


def _largest(inputs: dict) -> int:
    return max((v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)), default=0)


def _synchronize(device: str) -> None:
    """Wait for queued kernels on ``device`` (no-op off CUDA)."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def _run_backend(spec: OpSpec, name: str, inputs: dict, case: dict,
                 device: str = "cpu") -> Outcome:
    try:
        with registry.trace() as records:
            outputs = spec.call(_clone(inputs), case, name)
            # Inside the try: an asynchronous kernel fault surfaces here, as this backend's.
            _synchronize(device)
    except BackendUnavailable as exc:
        return Outcome(name, "unavailable", str(exc))
    except UnsupportedCase as exc:
        return Outcome(name, "unsupported", str(exc))
    except Exception as exc:  # a crashing kernel is a finding, not a harness crash
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Outcome(name, "error", tb)
    ran = [r for r in records if r.op == spec.name]
    numerics = dict(ran[-1].numerics) if ran else {}
    if ran and ran[-1].backend != name:
        return Outcome(name, "error", f"dispatch ran backend {ran[-1].backend}, not {name}")
    return Outcome(name, "ok", numerics=numerics, outputs=outputs)


def _compare_to_reference(out, exp: Expected, numerics, outputs) -> tolerance.Metrics:
    if exp.check is not None:
        return exp.check(outputs, numerics)
    if exp.bound is None:
        return tolerance.compare_exact(out, exp.value)
    if out.dtype != exp.out_dtype:
        return tolerance.Metrics(exp.tier, 0, 0, np.inf, np.inf,
                                 shape_error=f"dtype {out.dtype} != expected {exp.out_dtype}")
    return tolerance.compare_bounded(out, exp.value, exp.bound(numerics), exp.out_dtype,
                                     tier=exp.tier)


def _compare_pair(x, y, exp: Expected, num_x, num_y) -> tolerance.Metrics:
    if exp.bound is None:
        return tolerance.compare_exact(x, y)
    bound = exp.bound(num_x) + exp.bound(num_y)
    m = tolerance.compare_bounded(x, y.detach().cpu().double().numpy(), bound, exp.out_dtype,
                                  tier=f"{exp.tier}-pair")
    if m.passed or m.shape_error:
        return m
    # Both may legitimately disagree on overflow where the reference straddles it.
    ref_x = tolerance.compare_bounded(x, exp.value, exp.bound(num_x), exp.out_dtype)
    ref_y = tolerance.compare_bounded(y, exp.value, exp.bound(num_y), exp.out_dtype)
    if ref_x.passed and ref_y.passed and m.nonfinite_mismatches == m.mismatches:
        return tolerance.Metrics(m.tier, m.numel, 0, m.max_abs_err, 1.0)
    return m


def run_case(spec: OpSpec, case: dict, *, backends: list[str] | None = None,
             device: str = "cpu", pairwise: bool = True,
             prepared_inputs: Callable[[], dict] | None = None) -> CaseReport:
    """``prepared_inputs``: returns ``spec.make_inputs(case, device)`` built elsewhere (the
    fuzzer builds the next case's inputs on a thread while this one runs); "inputs" then
    times the wait for them."""
    names = list(backends) if backends is not None else sorted(registry.backends())
    timings: dict[str, float] = {}
    t = time.perf_counter()
    inputs = prepared_inputs() if prepared_inputs else spec.make_inputs(case, device)
    _synchronize(device)
    timings["inputs"] = time.perf_counter() - t
    outcomes: dict[str, Outcome] = {}
    for n in names:
        t = time.perf_counter()
        outcomes[n] = _run_backend(spec, n, inputs, case, device)
        timings[f"backend:{n}"] = time.perf_counter() - t
    comparisons: list[Comparison] = []
    ran = [o for o in outcomes.values() if o.status == "ok"]
    if ran:
        ref_device = reference_device.for_case(device)
        whole = ref_device is not None and spec.device_reference and \
            _largest(inputs) >= DEVICE_REFERENCE_MIN_ELEMENTS
        with reference_device.reference_device(ref_device):
            t = time.perf_counter()
            view = _reference_view(inputs, ref_device if whole else None)
            expected = spec.reference(view, case)
            timings["reference"] = time.perf_counter() - t
            t = time.perf_counter()
            comparisons = _comparisons(ran, expected, pairwise)
            timings["compare"] = time.perf_counter() - t
    return CaseReport(spec.name, case, device, outcomes, comparisons, timings)


def _comparisons(ran: list[Outcome], expected: dict[str, Expected],
                 pairwise: bool) -> list[Comparison]:
    """Each backend against the reference, then (``pairwise``) every pair of backends."""
    comparisons: list[Comparison] = []
    for o in ran:
        for out_name, exp in expected.items():
            got = o.outputs.get(out_name)
            if got is None and exp.check is None:
                m = tolerance.Metrics(exp.tier, 0, 0, np.inf, np.inf,
                                      shape_error=f"output {out_name!r} missing")
            else:
                m = _compare_to_reference(got, exp, o.numerics, o.outputs)
            comparisons.append(Comparison(o.backend, "reference", out_name, m))
    if pairwise:
        for i, x in enumerate(ran):
            for y in ran[i + 1:]:
                for out_name, exp in expected.items():
                    if out_name in x.outputs and out_name in y.outputs:
                        if exp.check_pair is not None:
                            m = exp.check_pair(x.outputs, y.outputs, x.numerics,
                                               y.numerics)
                        else:
                            m = _compare_pair(x.outputs[out_name], y.outputs[out_name],
                                              exp, x.numerics, y.numerics)
                        comparisons.append(Comparison(x.backend, y.backend, out_name, m))
    return comparisons
