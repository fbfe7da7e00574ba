"""Run the gate's case set and build the baseline / candidate document (a JSON-able dict)."""
from __future__ import annotations

import datetime
import os

from tealite import registry
from tealite.backends.aiter_common import contracts as aiter_contracts
from tealite_verify.fuzz import versions
from tealite_verify.gate import interpreter_gaps, observe
from tealite_verify.gate.caseset import aiter_backends, select, switch_context
from tealite_verify.gate.record import aggregate, case_record
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs, get_spec

# 2: entry points as records (state, location, signature, missing kind), execution mode,
# interpreter gaps, per-field observed contracts.
SCHEMA = "tealite-aiter-gate/2"


def execution_mode(device: str) -> str:
    """``interpreter`` (Triton's CPU interpreter) or ``compiled`` (a GPU)."""
    return "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" and \
        not str(device).startswith("cuda") else "compiled"


def _entry_point_records(at) -> dict[str, dict]:
    eps = {}
    for name in at.functions:
        eps[name] = {"state": "available",
                     "location": getattr(at, "locations", {}).get(name),
                     "signature": getattr(at, "signatures", {}).get(name)}
    for name, why in at.missing.items():
        eps[name] = {"state": "missing", "reason": why,
                     "missing_kind": getattr(at, "missing_kind", {}).get(name, "import-error")}
    return dict(sorted(eps.items()))


def aiter_info() -> dict:
    """Which AITER was loaded, and where each of its entry points was found (or why not)."""
    from tealite.backends.aiter_common import loader as loader
    why = loader.why_unavailable()
    if why is not None:
        return {"found": False, "reason": why, "entry_points": {}}
    try:
        at = loader.load()
    except Exception as exc:  # the tree is AITER's but did not load: the harness's problem
        return {"found": False, "reason": f"{type(exc).__name__}: {exc}", "entry_points": {}}
    return {"found": True, "version": at.version, "root": at.root, "found_via": at.found_via,
            "arch": at.arch, "arch_pinned": at.arch_pinned, "notes": list(at.notes),
            "load_errors": list(getattr(at, "load_errors", []) or []),
            "entry_points": _entry_point_records(at)}


def _interpreter_gaps(info: dict, mode: str) -> dict:
    if not info.get("found") or mode != "interpreter":
        return {}
    eps = [n for n, e in info["entry_points"].items() if e["state"] == "available"]
    return interpreter_gaps.scan(info["root"], eps)


def _backends_info() -> dict:
    out = {}
    for name in aiter_backends():
        b = registry.get_backend(name)
        out[name] = {"available": b.unavailable_reason() is None,
                     "reason": b.unavailable_reason(), "ops": sorted(b.impls)}
    return out


def _observed(info: dict, device: str) -> dict:
    if not info.get("found"):
        return {}
    try:
        return observe.observe_all(device)
    except Exception as exc:  # a probe that cannot run at all is recorded, never a crash
        return {"*": {"error": f"{type(exc).__name__}: {exc}", "fields": {}}}


def _document(records: list[dict], settings: dict, device: str) -> dict:
    info = aiter_info()
    settings = dict(settings, execution=execution_mode(device))
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions.collect(with_cuda=str(device).startswith("cuda")),
        "aiter": info,
        "settings": settings,
        "backends": _backends_info(),
        "contracts": {f"{c.backend}:{c.entry_point}": c.as_dict()
                      for c in aiter_contracts.contracts()},
        "contract_differences": aiter_contracts.differences_from_te(),
        "interpreter_gaps": _interpreter_gaps(info, settings["execution"]),
        "observed": _observed(info, device),
        "entries": aggregate(records),
        "cases": records,
    }


def capture(*, ops: list[str] | None = None, device: str = "cpu", seed: int = 0,
            per_key: int = 2, per_op: int = 12, draws: int = 300, peers=("torch",),
            progress=None) -> dict:
    specs = all_specs()
    if ops:
        specs = {op: specs[op] for op in ops}
    settings = {"ops": sorted(specs), "device": device, "seed": seed, "per_key": per_key,
                "per_op": per_op, "draws": draws, "peers": list(peers), "size": "ci"}
    records: list[dict] = []
    for backend in aiter_backends():
        if registry.get_backend(backend).unavailable_reason() is not None:
            continue  # recorded in "backends" with the reason
        for sel in select(specs, backend, peers=list(peers), device=device, seed=seed,
                          per_key=per_key, per_op=per_op, draws=draws):
            records.append(case_record(len(records), sel.op, backend, sel.key, sel.report,
                                       sel.switch))
            if progress:
                progress(records[-1])
    return _document(records, settings, device)


def _error_record(old: dict, exc: Exception) -> dict:
    rec = {"index": old["index"], "op": old["op"], "backend": old["backend"],
           "key": old["key"], "case": old["case"], "status": "error",
           "reason": f"harness: {type(exc).__name__}: {exc}", "entry_point": None,
           "verdict": "error", "peers": {}, "max_ratio": 0.0, "max_abs_err": 0.0,
           "mismatches": 0, "excused": 0, "failures": []}
    if old.get("switch") is not None:
        rec["switch"] = old["switch"]
    return rec


def rerun(baseline: dict, *, device: str | None = None, progress=None) -> dict:
    """Run the baseline's stored cases against the AITER loaded now.  A candidate that does
    not load runs no case (the document says why); a case that crashes the harness is
    recorded as an error with the exception, never raised."""
    settings = dict(baseline["settings"])
    device = device or settings["device"]
    settings["device"] = device
    peers = list(settings.get("peers", []))
    records: list[dict] = []
    if not aiter_info().get("found"):
        return _document(records, settings, device)
    for old in baseline["cases"]:
        try:
            spec = get_spec(old["op"])
            with switch_context(old.get("switch")):
                rep = run_case(spec, old["case"], backends=[old["backend"]] + peers,
                               device=device)
            rec = case_record(old["index"], old["op"], old["backend"], old["key"], rep,
                              old.get("switch"))
        except Exception as exc:  # the harness's own failure on this case: exit-2 class
            rec = _error_record(old, exc)
        records.append(rec)
        if progress:
            progress(records[-1])
    return _document(records, settings, device)
