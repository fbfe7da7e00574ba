"""Declared numerics that depend on the device, for ``python -m tealite_verify list``.

A backend's ``numerics`` may be a function of the case's params, so what the tolerance tiers
assume about a kernel can change with the device: torch's GEMM declares split-K partial sums
in bf16 on CUDA when torch allows reduced-precision reductions, and a probed CPU subnormal
flush only where the probe found one.  Reading the code does not tell a user which of these
are in force on the machine at hand, so ``list`` evaluates every implementation's declaration
for representative params on each device its support names and prints the keys whose value
differs between cpu and cuda.  Without a GPU the cuda column is what the declaration says for
cuda; a declaration that needs the device to be evaluated (a probe that runs a kernel there)
is reported as such, never guessed.

Representative params are the ones the op front-ends build for each spec's smoke cases on the
CPU (captured at dispatch by a stand-in backend that stops before any kernel runs, so ``list``
stays quick), each also in every float dtype.
"""
from __future__ import annotations

from typing import Any

import torch

from tealite import registry
from tealite.registry import Backend

DEVICES = ("cpu", "cuda")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_CAPTURE = "_list_params_capture"


class _Captured(Exception):
    """Raised by the stand-in backend once the front-end has dispatched to it."""


def representative_params() -> dict[str, list[dict]]:
    """op -> params the front-end built for the op spec's smoke cases (CPU), then each of
    them in every float dtype (with ``out_dtype`` following ``dtype`` where it did)."""
    from tealite_verify.specs import all_specs
    ops = sorted({op for b in registry.backends().values() for op in b.impls})
    stand_in = Backend(name=_CAPTURE, auto_dispatch=False, description="list: params capture")

    def stop(*args, **kwargs):
        raise _Captured

    for op in ops:
        stand_in.implements(op)(stop)
    registry.register_backend(stand_in, replace=True)
    captured: dict[str, list[dict]] = {}
    try:
        specs = all_specs()
        for op in ops:
            spec = specs.get(op)
            for case in spec.smoke_cases if spec is not None else ():
                with registry.trace() as records:
                    try:
                        spec.call(spec.make_inputs(case, "cpu"), case, _CAPTURE)
                    except Exception:  # _Captured, or a case this machine cannot build
                        pass
                captured.setdefault(op, []).extend(
                    dict(r.params) for r in records if r.backend == _CAPTURE and r.op == op)
    finally:
        registry.unregister_backend(_CAPTURE)
    return {op: _with_each_float_dtype(ps) for op, ps in captured.items()}


def _with_each_float_dtype(params: list[dict]) -> list[dict]:
    out, seen = [], set()
    for p in params:
        variants = [p]
        if p.get("dtype") in _FLOATS:
            for d in _FLOATS:
                v = dict(p, dtype=d)
                if p.get("out_dtype") == p["dtype"]:
                    v["out_dtype"] = d
                variants.append(v)
        for v in variants:
            key = repr(sorted((k, str(x)) for k, x in v.items()))
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


def _evaluate(impl, params: dict, device: str) -> tuple[dict | None, str | None]:
    """(declared numerics, None), (None, None) when the case is unsupported there, or
    (None, why the declaration could not be evaluated)."""
    if device not in impl.support.devices:
        return None, None
    p = dict(params, device=device)
    try:
        if impl.support.why_not(p) is not None:
            return None, None
        return impl.numerics(p).declared(), None
    except Exception as exc:  # a probe that needs the device, or a broken declaration
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _text(value: Any) -> str:
    return "-" if value is None else str(value).removeprefix("torch.")


def differences(backends: dict[str, Backend] | None = None,
                params: dict[str, list[dict]] | None = None):
    """(rows, notes): rows [backend, op, key, cpu value, cuda value, dtypes] for every declared
    key that differs between the devices; notes for declarations not evaluable here."""
    backends = registry.backends() if backends is None else backends
    params = representative_params() if params is None else params
    found: dict[tuple, set] = {}
    notes: dict[tuple, str] = {}
    # Only what is in force here: an unavailable backend's cases never run on this machine
    # (and evaluating its declarations may need what it lacks).
    usable = [n for n in sorted(backends) if backends[n].unavailable_reason() is None]
    for name in usable:
        for op, impl in sorted(backends[name].impls.items()):
            for p in params.get(op, ()):
                declared = {}
                for device in DEVICES:
                    declared[device], err = _evaluate(impl, p, device)
                    if err is not None:
                        notes.setdefault((name, op, device), err)
                if any(declared[d] is None for d in DEVICES):
                    continue
                cpu, cuda = declared["cpu"], declared["cuda"]
                for key in sorted(set(cpu) | set(cuda), key=str):
                    if _text(cpu.get(key)) != _text(cuda.get(key)):
                        row = (name, op, str(key), _text(cpu.get(key)), _text(cuda.get(key)))
                        found.setdefault(row, set()).add(_text(p.get("dtype")))
    rows = [[*row, ",".join(sorted(dtypes))] for row, dtypes in sorted(found.items())]
    by_error: dict[tuple, list[str]] = {}
    for (b, op, device), err in sorted(notes.items()):
        by_error.setdefault((b, device, err), []).append(op)
    note_lines = [f"{b} {', '.join(ops)}: the {device} declaration cannot be evaluated here "
                  f"({err})" for (b, device, err), ops in sorted(by_error.items())]
    return rows, note_lines
