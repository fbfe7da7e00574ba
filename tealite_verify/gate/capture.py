"""Run the gate's case set and build the baseline / candidate document (a JSON-able dict)."""
from __future__ import annotations

import datetime

from tealite import registry
from tealite.backends.aiter import contracts as aiter_contracts
from tealite_verify.fuzz import versions
from tealite_verify.gate import observe
from tealite_verify.gate.caseset import aiter_backends, select
from tealite_verify.gate.record import aggregate, case_record
from tealite_verify.runner import run_case
from tealite_verify.specs import all_specs, get_spec

SCHEMA = "tealite-aiter-gate/1"


def aiter_info() -> dict:
    """Which AITER was loaded, and which of its entry points exist (``missing``: why not)."""
    from tealite.backends.aiter import _triton_loader as loader
    why = loader.why_unavailable()
    if why is not None:
        return {"found": False, "reason": why, "entry_points": {}}
    at = loader.load()
    eps = {name: "available" for name in at.functions}
    eps.update({name: f"missing: {why}" for name, why in at.missing.items()})
    return {"found": True, "version": at.version, "root": at.root, "found_via": at.found_via,
            "arch": at.arch, "arch_pinned": at.arch_pinned, "notes": list(at.notes),
            "entry_points": dict(sorted(eps.items()))}


def _backends_info() -> dict:
    out = {}
    for name in aiter_backends():
        b = registry.get_backend(name)
        out[name] = {"available": b.unavailable_reason() is None,
                     "reason": b.unavailable_reason(), "ops": sorted(b.impls)}
    return out


def _document(records: list[dict], settings: dict, device: str) -> dict:
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions.collect(with_cuda=str(device).startswith("cuda")),
        "aiter": aiter_info(),
        "settings": settings,
        "backends": _backends_info(),
        "contracts": {f"{c.backend}:{c.entry_point}": c.as_dict()
                      for c in aiter_contracts.contracts()},
        "contract_differences": aiter_contracts.differences_from_te(),
        "observed": observe.observe_all(device),
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
            records.append(case_record(len(records), sel.op, backend, sel.key, sel.report))
            if progress:
                progress(records[-1])
    return _document(records, settings, device)


def rerun(baseline: dict, *, device: str | None = None, progress=None) -> dict:
    """Run the baseline's stored cases against the AITER loaded now."""
    settings = dict(baseline["settings"])
    device = device or settings["device"]
    settings["device"] = device
    peers = list(settings.get("peers", []))
    records: list[dict] = []
    for old in baseline["cases"]:
        spec = get_spec(old["op"])
        rep = run_case(spec, old["case"], backends=[old["backend"]] + peers, device=device)
        records.append(case_record(old["index"], old["op"], old["backend"], old["key"], rep))
        if progress:
            progress(records[-1])
    return _document(records, settings, device)
