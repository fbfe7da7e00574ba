"""Contracts observed by probing: per FIELD, which convention an AITER entry point's output
actually follows, each field read from its own probe blocks (built to tell that field's
conventions apart and no other), with a witness.

A declared contract is what tealite's code says; the observed one is what the loaded AITER
does.  A release that switches, say, its MXFP4 element rounding from ties-away to RNE changes
exactly ``element_rounding`` (``ties_away -> rne``), and :func:`diff_observations` names the
change with the smallest input block on which the two outputs differ.

Every declared contract with a quantizing output is probed (plain quantizers and the fused
norm / activation ones), through tealite's own calls (:mod:`probes_fused`; the given-scale
``static_per_tensor_quant_fp8_i8``, which tealite does not wire, is called directly).  Fields:

* MX (:mod:`probes_mx`): ``scale_rule`` (list of floor/ceil/even/rceil reproducing every
  scale byte, or "none"), ``element_rounding`` (rne / ties_away / ties_to_zero / rtz, or
  "other: ..."), ``nan``, ``inf``, ``zero_block``, ``subnormal_block``, ``amax_pow2``;
* FP8 (:mod:`probes_fp8`): ``scale_rule`` (dynamic: fmax/amax, amax/fmax, amax*rcp(fmax),
  "amax/fmax, codes y/scale"; given scale: x * scale, x * fl32(1/scale_inv), x / scale_inv),
  ``element_rounding``, ``subnormal_rounding``, ``zero_row`` (dynamic), ``nan``, ``inf``,
  ``saturation`` (given scale).

An observation (JSON-safe, deterministic: the same AITER gives the identical dict)::

    {"probe": "mx e2m1 via quantize (y as x)",
     "fields": {"scale_rule": ["even"], "element_rounding": "ties_away",
                "nan": "NaN: scale 0x7F, NaN -> 0x7(+6), others exact", ...},
     "witness": {"element_rounding": {"input": [[32 floats], ...],      # one probe row each
                                      "output": {"codes": [[32 ints], ...],
                                                 "scale": [byte or scale_inv per row]}}},
     "unprobed": {"field": "why"},
     "error": "..."}   # only when the probe itself crashed

Non-finite floats are the strings "nan", "-nan", "inf", "-inf".  A field whose kernel call
crashed has the value "error: ..." (and a witness with output None).
"""
from __future__ import annotations

from dataclasses import dataclass

from tealite.backends.aiter_common import contracts as aiter_contracts
from tealite_verify.gate import probes_common as pc
from tealite_verify.gate import probes_fp8, probes_fused, probes_mx


@dataclass(frozen=True)
class FieldChange:
    """One observed field that differs between two observations, with its witness: the
    first probe row on which the two outputs differ (the whole probe input when the probes
    themselves differ)."""

    where: str            # "backend:entry_point" ("" for two single observations)
    field: str
    old: object
    new: object
    witness_input: list | None
    old_output: dict | None
    new_output: dict | None

    def describe(self) -> str:
        head = f"{self.where + ' ' if self.where else ''}{self.field}: {self.old} -> {self.new}"
        if self.witness_input is None:
            return head
        return (f"{head}; input {self.witness_input} -> old {self.old_output} / "
                f"new {self.new_output}")


def _probe_text(route: probes_fused.Route) -> str:
    """The route, and a warning where the codes are the Triton interpreter's casts."""
    text = route.describe()
    if route.family == "fp8" and route.backend == "aiter_triton":
        from tealite.backends.aiter_triton import INTERPRET
        if INTERPRET:
            text += "; interpreted: fp32 -> fp8 casts are the Triton interpreter's (NUMERICS.md)"
    return text


def _all_unprobed(route: probes_fused.Route) -> dict:
    fields = probes_mx.FIELDS if route.family == "mx" else probes_fp8.FIELDS
    return pc.observation(_probe_text(route), {f: pc.Skipped(route.why_not) for f in fields})


def observe_contract(c: aiter_contracts.Contract, device: str) -> dict | None:
    """What probing shows for one declared contract, or None when it has no quantizing
    output."""
    try:
        route = probes_fused.route_for(c)
    except Exception as exc:  # e.g. AITER fails to load: no FP8 format to probe with
        return {"probe": "-", "fields": {}, "witness": {}, "unprobed": {},
                "error": pc.error_text(exc)}
    if route is None:
        return None
    if route.why_not:
        return _all_unprobed(route)
    try:
        run = probes_fused.make_runner(route, device)
        outcomes = probes_mx.observe_mx(run, route.fmt) if route.family == "mx" else \
            probes_fp8.observe_fp8(run, route.fp8)
    except Exception as exc:
        return {"probe": _probe_text(route), "fields": {}, "witness": {}, "unprobed": {},
                "error": pc.error_text(exc)}
    return pc.observation(_probe_text(route), outcomes)


def observe_all(device: str) -> dict:
    """``{"backend:entry_point": observation}`` for every probeable declared contract of an
    available backend."""
    from tealite import registry
    available = registry.backends()  # importing the backends declares their contracts
    out = {}
    for c in aiter_contracts.contracts():
        b = available.get(c.backend)
        if b is None or b.unavailable_reason() is not None:
            continue
        obs = observe_contract(c, device)
        if obs is not None:
            out[f"{c.backend}:{c.entry_point}"] = obs
    return out


def exercised_fields(observation: dict) -> set[str]:
    """The fields whose probe blocks actually went through the entry point (a crash on its
    block included); unprobed fields and a probe that crashed as a whole exercise none."""
    return set(observation.get("fields", {}))


# ---- diff ----------------------------------------------------------------------------------------

def _value(obs: dict, field: str):
    if field in obs.get("fields", {}):
        return obs["fields"][field]
    if field in obs.get("unprobed", {}):
        return f"unprobed: {obs['unprobed'][field]}"
    return None


def _row_output(w: dict, i: int) -> dict | None:
    out = w.get("output")
    if out is None:
        return None
    scale = out["scale"]
    return {"codes": out["codes"][i], "scale": scale[i] if len(scale) > 1 else scale[0]}


def _has_rows(w: dict | None) -> bool:
    """A witness of probe rows (lists); a flat list is one block, shown whole."""
    return bool(w and w.get("input") and isinstance(w["input"][0], list))


def _witness(old: dict | None, new: dict | None):
    """(input, old output, new output): the first row whose outputs differ when both probes
    had the same input rows, else the whole probes."""
    if _has_rows(old) and _has_rows(new) and old["input"] == new["input"]:
        for i, row in enumerate(old["input"]):
            o, n = _row_output(old, i), _row_output(new, i)
            if o != n:
                return row, o, n
        return old["input"], old.get("output"), new.get("output")
    w = new or old
    return (w.get("input") if w else None), (old or {}).get("output"), (new or {}).get("output")


LEGACY_KEYS = ("matches",)  # tealite-aiter-gate/1's whole-output observation


def _diff_one(where: str, old: dict, new: dict) -> list[FieldChange]:
    changes = []
    for key in ("error",) + LEGACY_KEYS:
        if old.get(key) != new.get(key):
            changes.append(FieldChange(where, key, old.get(key), new.get(key), None, None, None))
    names = list(old.get("fields", {})) + list(old.get("unprobed", {}))
    names += [f for f in list(new.get("fields", {})) + list(new.get("unprobed", {}))
              if f not in names]
    for f in names:
        a, b = _value(old, f), _value(new, f)
        if a != b:
            inp, o, n = _witness(old.get("witness", {}).get(f), new.get("witness", {}).get(f))
            changes.append(FieldChange(where, f, a, b, inp, o, n))
    return changes


def _is_single(d: dict) -> bool:
    return any(k in d for k in ("fields", "probe", "error"))


def diff_observations(old: dict, new: dict) -> list[FieldChange]:
    """Field changes between two ``observe_all`` maps (``where`` = "backend:entry_point"; an
    entry point observed on one side only is field "(observation)"), or between two single
    observations (``where`` = "").  Pure: no AITER is run."""
    if _is_single(old) or _is_single(new):
        return _diff_one("", old, new)
    changes = []
    for where in sorted(set(old) | set(new)):
        if where not in old or where not in new:
            changes.append(FieldChange(where, "(observation)",
                                       "observed" if where in old else "absent",
                                       "observed" if where in new else "absent",
                                       None, None, None))
            continue
        changes += _diff_one(where, old[where], new[where])
    return changes
