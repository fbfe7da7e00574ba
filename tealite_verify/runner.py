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
from tealite.numerics import Numerics
from tealite_verify import graph_replay as graph
from tealite_verify.references import _device as reference_device
from tealite_verify.specs import Expected, OpSpec
from tealite_verify.tiers import bounded
from tealite_verify.tiers import probabilistic as prob
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier


@dataclass
class Outcome:
    backend: str
    status: str  # "ok" | "unsupported" | "unavailable" | "error"
    reason: str | None = None
    numerics: Numerics = field(default_factory=Numerics)
    outputs: dict = field(default_factory=dict, repr=False)


@dataclass
class Comparison:
    lhs: str
    rhs: str  # "reference" or a backend name
    output: str
    metrics: Metrics


@dataclass
class CaseReport:
    op: str
    case: dict
    device: str
    outcomes: dict[str, Outcome]
    comparisons: list[Comparison]
    timings: dict[str, float] = field(default_factory=dict)
    # The per-case false-alarm probability of the opt-in probabilistic check, None when off.
    probabilistic: float | None = None
    # The graph-replay check (tealite_verify/graph_replay.py): replays per backend (None:
    # not run), its failures, and notes (an op the spec declares not capturable).
    graph_replay: int | None = None
    replay_failures: list = field(default_factory=list)
    replay_notes: list = field(default_factory=list)

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.metrics.passed]

    @property
    def suspicious(self) -> list[Comparison]:
        """Comparisons with the reference within the deterministic bound but beyond the
        probabilistic one (tiers/probabilistic.py); empty unless the check was asked for."""
        return [c for c in self.comparisons if c.rhs == "reference" and c.metrics.suspicious]

    @property
    def graded_verdict(self) -> str:
        """``verdict``, with a passing case that is suspicious graded "suspicious"."""
        v = self.verdict
        return "suspicious" if v == "pass" and self.suspicious else v

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if o.status == "error"]

    @property
    def verdict(self) -> str:
        if self.failures or self.errors or self.replay_failures:
            return "fail"
        if not any(o.status == "ok" for o in self.outcomes.values()):
            return "skip"
        return "pass"

    def max_ratio(self) -> float:
        ratios = [c.metrics.max_ratio for c in self.comparisons if c.rhs == "reference"]
        return max(ratios, default=0.0)

    def repro(self, backend: str | None = None) -> str:
        cmd = repro_command(self.op, self.case, self.device, backend)
        if self.probabilistic is not None:
            cmd = f"{prob.ENV_VAR}={self.probabilistic:g} {cmd}"
        if self.graph_replay is not None:
            cmd = f"{graph.ENV_VAR}={self.graph_replay} {cmd}"
        return cmd

    def describe(self) -> str:
        lines = [f"{self.op} on {self.device}: {self.graded_verdict}",
                 f"  case: {json.dumps(self.case, sort_keys=True)}"]
        for o in self.outcomes.values():
            extra = f" ({o.reason})" if o.reason else ""
            lines.append(f"  backend {o.backend}: {o.status}{extra}")
        for c in self.comparisons:
            mark = "ok  " if c.metrics.passed else "FAIL"
            mark = "SUSP" if c.metrics.suspicious else mark
            # A parity verdict compares the backend with its own split path (tiers/parity.py).
            rhs = "its split path" if c.metrics.tier is Tier.PARITY else c.rhs
            lines.append(f"  {mark} {c.lhs} vs {rhs} [{c.output}]: {c.metrics.summary()}")
        lines += [f"  FAIL {f.summary()}" for f in self.replay_failures]
        lines += [f"  note: {n}" for n in self.replay_notes]
        bad = sorted({c.lhs for c in self.failures} | {o.backend for o in self.errors}
                     | {f.backend for f in self.replay_failures}
                     or {c.lhs for c in self.suspicious})
        lines.append(f"  repro: {self.repro(bad[0] if len(bad) == 1 else None)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = self._to_dict()
        if self.graph_replay is not None:  # keys only where the check ran: reports stay as
            d.update(graph_replay=self.graph_replay,  # they were without it
                     replay_failures=[f.to_dict() for f in self.replay_failures],
                     replay_notes=list(self.replay_notes))
        return d

    def _to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "case": self.case, "device": self.device, "verdict": self.verdict,
            "outcomes": {k: {"status": o.status, "reason": o.reason,
                             "numerics": o.numerics.to_json()}
                         for k, o in self.outcomes.items()},
            "comparisons": [{"lhs": c.lhs, "rhs": c.rhs, "output": c.output,
                             "metrics": c.metrics.to_dict()} for c in self.comparisons],
            "repro": self.repro(),
            "timings": dict(self.timings),
            "probabilistic": self.probabilistic, "graded_verdict": self.graded_verdict,
        }


def repro_command(op: str, case: dict, device: str, backend=None) -> str:
    """One shell line re-running ``case``; ``backend``: a name, a list of names, or None
    (every registered backend).  It carries what a fresh process needs for the plug-in
    backends among them (:func:`plugin_setup`): the modules to import, in
    $TEALITE_BACKEND_MODULES, and a trailing ``# needs: ...`` comment for what must be
    installed first."""
    names = [backend] if isinstance(backend, str) else list(backend or [])
    modules, needs = plugin_setup(names or None)
    cmd = (f"{plugin_env_prefix(modules)}python -m tealite_verify repro --op {op} "
           f"--device {device} --case {shlex.quote(json.dumps(case, sort_keys=True))}")
    cmd += "".join(f" --backend {b}" for b in names)
    return cmd + needs_comment(needs)


def plugin_setup(backends=None) -> tuple[list[str], list[str]]:
    """(modules for $TEALITE_BACKEND_MODULES, what to install first) so that ``backends``
    (default: every registered one) exist in a fresh process.

    The modules named in this process's $TEALITE_BACKEND_MODULES are kept.  A built-in
    backend needs nothing.  One registered by the module of a ``tealite.backends`` entry
    point needs that distribution installed: entry points are read from installed metadata,
    an import path alone does not bring them.  Any other plug-in needs the module that called
    ``register_backend`` (``Backend.origin``) imported; a backend registered by a script
    (``__main__``) cannot be imported by name, so the note says so.
    """
    modules = [m.strip() for m in os.environ.get(registry.PLUGIN_ENV_VAR, "").split(",")
               if m.strip()]
    known = registry.backends()
    names = list(known) if backends is None else [n for n in backends if n in known]
    needs: list[str] = []
    dists = None
    for name in names:
        origin = known[name].origin
        if not origin or origin.split(".")[0] == "tealite":
            continue
        if dists is None:
            dists = _entry_point_dists()
        dist = next((d for m, d in dists.items() if _within(origin, m)), None)
        if dist is not None:
            needs.append(f"pip install {dist}")
        elif origin == "__main__":
            needs.append(f"the script that registered backend {name} (run it instead)")
        elif not any(_within(origin, m.split(":")[0]) for m in modules):
            modules.append(origin)
    return modules, sorted(set(needs))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _entry_point_dists() -> dict[str, str]:
    """module of each ``tealite.backends`` entry point -> its distribution's name."""
    from importlib import metadata
    out = {}
    for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        out[ep.value.split(":")[0].strip()] = dist.name if dist is not None else ep.value
    return out


def plugin_env_prefix(modules) -> str:
    mods = ",".join(modules)
    return f"{registry.PLUGIN_ENV_VAR}={shlex.quote(mods)} " if mods else ""


def needs_comment(needs) -> str:
    # A shell comment: the line stays runnable as pasted, and says what it cannot carry.
    return f"  # needs: {'; '.join(needs)}" if needs else ""


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
    # The numerics are the dispatched op's: the spec's own, or the one op it drives under
    # another name (attention_fwd_fp8 drives attention_fwd).
    op = spec.ops[0] if len(spec.ops) == 1 else spec.name
    ran = [r for r in records if r.op == op]
    numerics = ran[-1].numerics if ran else Numerics()
    if ran and ran[-1].backend != name:
        return Outcome(name, "error", f"dispatch ran backend {ran[-1].backend}, not {name}")
    return Outcome(name, "ok", numerics=numerics, outputs=outputs)


def _compare_to_reference(out, exp: Expected, numerics, outputs) -> Metrics:
    if exp.check is not None:
        return exp.check(outputs, numerics)
    if exp.bound is None:
        return compare_exact(out, exp.value)
    return bounded.judge(out, exp.value, exp.bound(numerics), exp.out_dtype, exp.tier)


def _with_probabilistic(m, out, exp: Expected, numerics, p_case) -> Metrics:
    """``m`` with the opt-in probabilistic ratio and the FlashAttention-style ratio (only for
    a deterministic pass or an ordinary mismatch: a dtype or shape error has nothing to
    measure)."""
    if m.shape_error is not None or out.dtype != exp.out_dtype:
        return m
    baseline = exp.same_precision() if exp.same_precision is not None else None
    return prob.with_probabilistic(m, out, exp.value, exp.prob_bound(numerics, p_case),
                                   baseline)


def _compare_pair(x, y, exp: Expected, num_x, num_y) -> Metrics:
    if exp.bound is None:
        return compare_exact(x, y)
    return bounded.compare_pair(x, y, exp.value, exp.bound(num_x), exp.bound(num_y),
                                exp.out_dtype, exp.tier.pair)


def run_case(spec: OpSpec, case: dict, *, backends: list[str] | None = None,
             device: str = "cpu", pairwise: bool = True, focus: str | None = None,
             prepared_inputs: Callable[[], dict] | None = None,
             probabilistic: float | None | str = "env",
             graph_replay: int | None | str = "env") -> CaseReport:
    """``prepared_inputs``: returns ``spec.make_inputs(case, device)`` built elsewhere (the
    fuzzer builds the next case's inputs on a thread while this one runs); "inputs" then
    times the wait for them.  ``focus``: compute only the comparisons of that backend (it
    against the reference and against each other backend that ran), as a test judging one
    backend reports.  ``probabilistic``: the per-case false-alarm probability of the
    opt-in probabilistic check (tiers/probabilistic.py), None for off, "env" (default) for
    $TEALITE_VERIFY_PROBABILISTIC (unset: off).  ``graph_replay``: replays of the graph-replay
    check per backend that ran (tealite_verify/graph_replay.py), None for not asked, "env"
    (default) for $TEALITE_VERIFY_GRAPH_REPLAY; not asked, it runs only where the spec's
    policy runs it by default (on a CUDA device)."""
    graph_replay = _replays(spec, device, graph_replay)
    probabilistic = (prob.target_from_env() if probabilistic == "env" else
                     None if probabilistic is None else
                     prob.check_probability(probabilistic, "probabilistic"))
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
            comparisons = _comparisons(ran, expected, pairwise, probabilistic, focus)
            timings["compare"] = time.perf_counter() - t
    report = CaseReport(spec.name, case, device, outcomes, comparisons, timings,
                        probabilistic=probabilistic, graph_replay=graph_replay)
    if graph_replay is not None:
        t = time.perf_counter()
        _graph_replay(report, spec, inputs, case, ran, graph_replay)
        timings["graph_replay"] = time.perf_counter() - t
    return report


def _replays(spec: OpSpec, device: str, asked) -> int | None:
    """The replays of the graph-replay check this case runs, or None."""
    n = graph.replays_from_env() if asked == "env" else \
        None if asked is None else graph.check_replays(asked, "graph_replay")
    if n is None and spec.graph_replay.by_default and str(device).startswith("cuda"):
        n = graph.DEFAULT_REPLAYS
    return n


def _graph_replay(report: CaseReport, spec: OpSpec, inputs: dict, case: dict,
                  ran: list[Outcome], replays: int) -> None:
    """The graph-replay check of every backend that ran the case."""
    policy = spec.graph_replay
    if not policy.capturable:
        report.replay_notes.append(f"graph replay not run: {spec.name} is not capturable "
                                   f"({policy.reason})")
        return
    engine = graph.engine_for(report.device)
    for o in ran:
        if o.numerics.not_capturable:
            report.replay_notes.append(f"graph replay not run for {o.backend}: "
                                       f"{o.numerics.not_capturable}")
            continue

        def call(inp, name=o.backend):
            return spec.call(_clone(inp), case, name)
        report.replay_failures += graph.check(call, inputs, backend=o.backend,
                                              device=report.device, engine=engine,
                                              replays=replays)
    if not str(report.device).startswith("cuda"):
        report.replay_notes.append(f"graph replay emulated on {report.device} "
                                   f"({engine.name}): no CUDA graph was captured")


def _comparisons(ran: list[Outcome], expected: dict[str, Expected],
                 pairwise: bool, probabilistic: float | None = None,
                 focus: str | None = None) -> list[Comparison]:
    """Each backend against the reference, then (``pairwise``) every pair of backends; with
    ``focus``, only the comparisons that involve that backend."""
    comparisons: list[Comparison] = []
    for o in ran:
        if focus is not None and o.backend != focus:
            continue
        for out_name, exp in expected.items():
            got = o.outputs.get(out_name)
            if got is None and exp.check is None:
                m = Metrics(exp.tier, 0, 0, np.inf, np.inf,
                            shape_error=f"output {out_name!r} missing")
            else:
                m = _compare_to_reference(got, exp, o.numerics, o.outputs)
                if probabilistic is not None and exp.prob_bound is not None:
                    m = _with_probabilistic(m, got, exp, o.numerics, probabilistic)
            comparisons.append(Comparison(o.backend, "reference", out_name, m))
    if pairwise:
        for i, x in enumerate(ran):
            for y in ran[i + 1:]:
                if focus is not None and focus not in (x.backend, y.backend):
                    continue
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
