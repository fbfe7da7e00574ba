"""Shared pieces of the gate's contract probes (:mod:`tealite_verify.gate.observe`).

A probe hands an entry point small blocks of *intermediate* values ``y`` (the values its
quantizer sees: x for a plain quantizer, the exact norm / activation output for a fused one),
reads the codes and scales back (:class:`RunOutput`), and turns each field's output into a
short canonical value (a string, or a list of convention names).  Everything here is numpy on
float32 / uint8; the only JSON is built at the edge (:func:`observation`).

Element rounding is judged against four rules, from the codes of the target format
(``ml_dtypes`` via the references): RNE and ties-away come from the bit-exact reference
(:func:`tealite_verify.references.quantize.round_elements`); ties-toward-zero and truncation
(``rtz``) are written here because no reference names them, so that a kernel following one
of them is named instead of reported as "other".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tealite.errors import BackendUnavailable, UnsupportedCase
from tealite_verify.references import quantize as qref

F32 = np.float32
ELEMENT_RULES = ("rne", "ties_away", "ties_to_zero", "rtz")
MAX_ERROR_CHARS = 240


@dataclass(frozen=True)
class RunOutput:
    """What an entry point returned for one probe call."""

    codes: np.ndarray   # uint8 (R, N): element code bits, E2M1 unpacked (low nibble)
    scales: np.ndarray  # MX: uint8 E8M0 bytes (R, N/32); FP8: float32 scale_inv (R,) or (1,)


# (y float32 (R, N), the given scale for a static FP8 entry point or None) -> RunOutput
Runner = Callable[[np.ndarray, "float | None"], RunOutput]


class NotConstructible(Exception):
    """A fused entry point cannot be handed this intermediate exactly (the field is unprobed)."""


@dataclass(frozen=True)
class FieldResult:
    """One field observed: its value and its witness (every probe row and its output)."""

    value: object              # str, or list[str] of convention names
    rows: np.ndarray           # float32 (R, N): the probe rows (MX: one 32-block per row)
    codes: np.ndarray | None   # uint8 (R, N), None when the call crashed
    scales: list | None        # one scale per row (MX bytes, FP8 scale_inv), or [one] per tensor


@dataclass(frozen=True)
class Skipped:
    reason: str


FieldOutcome = FieldResult | Skipped


# ---- canonical descriptions ---------------------------------------------------------------

def _f32_text(v: float) -> str:
    """|v| as float32, shortest round-trip form without a trailing ".0" (deterministic)."""
    s = str(F32(abs(v)))
    return s[:-2] if s.endswith(".0") else s


def value_str(v: float) -> str:
    """A float32 value as a short signed string: +6, -0, +0.5, NaN, +inf."""
    v = float(v)
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+inf" if v > 0 else "-inf"
    return ("-" if np.signbit(v) else "+") + _f32_text(v)


def scale_inv_str(v: float) -> str:
    """An fp32 scale_inv, unsigned unless negative: 0.5, 2.2321428e-13, nan, inf."""
    v = float(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return ("-" if np.signbit(v) else "") + _f32_text(v)


def code_str(code: int, fmt: str) -> str:
    """One code with its value, e.g. ``0x7(+6)`` (E2M1) or ``0x7F(NaN)`` (E4M3)."""
    width = 1 if fmt == "e2m1" else 2
    val = qref.decode(np.array([code], np.uint8), fmt)[0]
    return f"0x{int(code):0{width}X}({value_str(val)})"


def codes_summary(codes, fmt: str) -> str:
    """``all 0x7(+6)``, ``all +-0`` (one magnitude, both signs), else :func:`codes_rle`."""
    codes = np.asarray(codes, np.uint8).reshape(-1)
    if codes.size and (codes == codes[0]).all():
        return f"all {code_str(codes[0], fmt)}"
    mags = np.abs(qref.decode(codes, fmt))
    if codes.size and not np.isnan(mags).any() and (mags == mags[0]).all():
        return f"all +-{value_str(mags[0])[1:]}"
    return codes_rle(codes, fmt)


def codes_rle(codes, fmt: str) -> str:
    """Codes run-length encoded: ``[0x0(+0)*31 0x7(+6)]``."""
    codes = [int(c) for c in np.asarray(codes).reshape(-1)]
    parts, i = [], 0
    while i < len(codes):
        j = i
        while j < len(codes) and codes[j] == codes[i]:
            j += 1
        parts.append(code_str(codes[i], fmt) + (f"*{j - i}" if j - i > 1 else ""))
        i = j
    return "[" + " ".join(parts) + "]"


# ---- element rounding ------------------------------------------------------------------------

def _grid(fmt: str) -> np.ndarray:
    """Sorted non-negative finite magnitudes of ``fmt`` (float64)."""
    return np.unique(np.abs(qref.codes_table(fmt)))


def encode_exact(values: np.ndarray, fmt: str) -> np.ndarray:
    """Code bits of values that are exactly representable (or NaN)."""
    return qref.codes_to_bits(np.asarray(values, F32).astype(qref.ML_DTYPES[fmt]))


def round_codes(v, fmt: str, rule: str) -> np.ndarray:
    """Code bits of float32 values ``v`` (already scaled) rounded to ``fmt`` under ``rule``,
    saturating at +-max (the probes keep their rounding blocks inside the range)."""
    v = np.asarray(v, F32)
    if rule in ("rne", "ties_away"):
        return qref.codes_to_bits(qref.round_elements(v, fmt, rounding=rule, saturate=True))
    grid = _grid(fmt)
    a = np.minimum(np.abs(v.astype(np.float64)), grid[-1])
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    lo_i = np.clip(np.searchsorted(grid, safe, side="right") - 1, 0, len(grid) - 1)
    lo = grid[lo_i]
    hi = grid[np.minimum(lo_i + 1, len(grid) - 1)]
    if rule == "rtz":
        mag = lo
    elif rule == "ties_to_zero":
        mag = np.where(safe - lo <= hi - safe, lo, hi)
    else:
        raise ValueError(f"unknown element rounding {rule!r}")
    out = np.where(np.signbit(v), -mag, mag)
    return np.where(finite, encode_exact(out, fmt), encode_exact(v, fmt)).astype(np.uint8)


def classify_rounding(v: np.ndarray, codes: np.ndarray, fmt: str) -> str:
    """Which element rule reproduces ``codes`` from the exact scaled values ``v``: one name,
    several joined by ``|`` (the block has no case telling them apart), or ``other: ...``."""
    codes = np.asarray(codes, np.uint8)
    hits = [r for r in ELEMENT_RULES if np.array_equal(round_codes(v, fmt, r), codes)]
    if hits:
        return "|".join(hits)
    want = round_codes(v, fmt, "rne")
    bad = np.flatnonzero((want != codes).reshape(-1))
    flat_v, flat_c = np.asarray(v, F32).reshape(-1), codes.reshape(-1)
    eg = " ".join(f"{value_str(flat_v[i])}->{code_str(flat_c[i], fmt)}" for i in bad[:3])
    return f"other: {bad.size} of {codes.size} codes differ from rne, e.g. {eg}"


# ---- probe values ----------------------------------------------------------------------------

def fill_pattern(n: int, unit: float) -> np.ndarray:
    """``n`` ordinary values below ``0.45 * unit`` in magnitude, mixed signs, short decimals
    (multiples of unit/64): filler that never sets a block's amax."""
    p = (np.arange(1, n + 1) * 29) % 57 - 28
    return (p.astype(np.float64) * (unit / 64.0)).astype(F32)


def midpoints(fmt: str, lo: float, hi: float, *,
              avoid_carry: bool) -> tuple[np.ndarray, np.ndarray]:
    """Exact midpoints between neighbouring magnitudes g_j < g_j+1 with lo <= g_j and
    g_j+1 <= hi, split into (lower neighbour's code even, odd).  ``avoid_carry`` leaves out
    midpoints whose upper neighbour is a power of two: rounding up there carries into the
    exponent, which the Triton interpreter's fp8 cast gets wrong (NUMERICS.md) -- a cast
    bug, not a tie rule, so the FP8 tie rows keep clear of it."""
    g = _grid(fmt)
    low, up = g[:-1], g[1:]
    keep = (low >= lo) & (up <= hi)
    if avoid_carry:
        keep &= np.frexp(up)[0] != 0.5
    lower_code = encode_exact(low, fmt).astype(np.int64)
    mids = ((low + up) / 2).astype(F32)
    return mids[keep & (lower_code % 2 == 0)], mids[keep & (lower_code % 2 == 1)]


def spread(values: np.ndarray, k: int) -> np.ndarray:
    """``k`` entries of ``values`` evenly spread (all when there are fewer)."""
    if len(values) <= k:
        return values
    return values[np.linspace(0, len(values) - 1, k).round().astype(int)]


def alternate_signs(values: np.ndarray) -> np.ndarray:
    return (values * (-1.0) ** np.arange(len(values))).astype(F32)


def row_of(n: int, *parts, fill: np.ndarray) -> np.ndarray:
    """A float32 row of length ``n``: the given values in order, then ``fill`` (cycled)."""
    head = np.concatenate([np.asarray(p, F32).reshape(-1) for p in parts])
    if head.size > n:
        raise ValueError(f"probe row needs {head.size} slots, has {n}")
    return np.concatenate([head, np.resize(np.asarray(fill, F32), n - head.size)]).astype(F32)


# ---- the JSON edge -----------------------------------------------------------------------------

def json_float(v) -> float | str:
    """JSON-safe float: non-finite values as "nan" / "-nan" / "inf" / "-inf"."""
    v = float(v)
    if np.isnan(v):
        return "-nan" if np.signbit(v) else "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _json_scale(s):
    return int(s) if isinstance(s, (int, np.integer)) else json_float(s)


def _witness(r: FieldResult) -> dict:
    out = None
    if r.codes is not None:
        out = {"codes": [[int(c) for c in row] for row in r.codes],
               "scale": [_json_scale(s) for s in r.scales]}
    return {"input": [[json_float(v) for v in row] for row in r.rows], "output": out}


def observation(probe: str, outcomes: dict[str, FieldOutcome]) -> dict:
    """The JSON-safe observation of one entry point (see observe.py for the format)."""
    fields, witness, unprobed = {}, {}, {}
    for name, o in outcomes.items():
        if isinstance(o, Skipped):
            unprobed[name] = o.reason
        else:
            fields[name] = o.value
            witness[name] = _witness(o)
    return {"probe": probe, "fields": fields, "witness": witness, "unprobed": unprobed}


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def above_midpoints(fmt: str, lo: float, hi: float, *, avoid_carry: bool) -> np.ndarray:
    """g_j + 3/4 (g_j+1 - g_j) for neighbours inside [lo, hi]: nearest rounding goes up,
    truncation down (tells ``rtz`` from the nearest rules); same carry rule as midpoints."""
    g = _grid(fmt)
    low, up = g[:-1], g[1:]
    keep = (low >= lo) & (up <= hi)
    if avoid_carry:
        keep &= np.frexp(up)[0] != 0.5
    return (low + 0.75 * (up - low))[keep].astype(F32)


def exact_values(fmt: str, top: float, n: int) -> np.ndarray:
    """``n`` representable non-zero magnitudes <= top, cycled, alternating signs: values
    whose codes no rounding rule changes at scale 1."""
    g = _grid(fmt)
    g = g[(g > 0) & (g <= top)]
    return alternate_signs(np.resize(g[::-1], n).astype(F32))


def probe_field(rows: np.ndarray, call: Callable[[], tuple], read: Callable) -> FieldOutcome:
    """Run one field's probe: ``call()`` -> (codes (R, N), per-row scales list); ``read(codes,
    scales)`` -> the field value.  A fused entry point that cannot take the block exactly, or
    a backend that rejects it, leaves the field unprobed; a crash is the field's value."""
    try:
        with np.errstate(all="ignore"):  # the interpreter computes log2(0), 0 * inf, ...
            codes, scales = call()
    except NotConstructible as exc:
        return Skipped(str(exc))
    except (UnsupportedCase, BackendUnavailable) as exc:
        return Skipped(error_text(exc))
    except Exception as exc:  # a crashing kernel is an observation too
        return FieldResult("error: " + error_text(exc), rows, None, None)
    with np.errstate(all="ignore"):
        value = read(codes, scales)
    return FieldResult(value, rows, codes, list(scales))
