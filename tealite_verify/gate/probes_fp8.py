"""FP8 (per-tensor / per-row, dynamic or given scale) probe rows and what each field reads.

A row is 32 values (a power of two: ``act_mul_and_fp8_group_quant`` takes one group per
row).  Fields and their rows:

* ``scale_rule`` (dynamic): one row whose amax makes TE's ``fmax/amax`` (scale_inv =
  fl(1/fl(fmax/amax))), AITER Triton's ``amax/fmax``, AITER HIP's ``amax*rcp(fmax)`` give
  three different fp32 scale_inv, plus values on or beside code boundaries where the four
  candidates' multipliers (the three, and ck_tile's division ``amax/fmax, codes y/scale``)
  give different codes under every element rounding.  Given scale: the three ways of
  applying TE's scale s (``x * scale``, or the kernel's ``x * fl32(1/scale_inv)`` /
  ``x / scale_inv`` of scale_inv = fl(1/s)), with an s where they differ.  The rows are
  searched once per format, deterministically; no value is cast to a subnormal or rounds up
  into a power of two.  A rule matches when its scale_inv and, under some element rounding,
  its codes are reproduced (the rounding itself is the next field's business).
* ``element_rounding``: amax = fmax (scale_inv 1 under every rule) and exact midpoints of
  normal-range neighbours (lower code even and odd), values 3/4 up a gap;
  ``subnormal_rounding``: the same inside the FP8 subnormal range.  Codes are judged at the
  observed scale_inv.  Midpoints below a power of two are left out (a carry, which the
  Triton interpreter's cast gets wrong: a cast bug, not a tie rule).
* ``nan`` / ``inf``: one NaN (+Inf; and the negated row) among representable values with
  amax fmax; ``zero_row`` (dynamic): an all-zero input; ``saturation`` (given scale 1):
  values above fmax, the midpoint to the step past it included.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tealite_verify.gate import probes_common as pc
from tealite_verify.references import quantize as qref

F32 = np.float32
ROW = 32
SPECIAL_SLOT = 5
MAX_SEPARATORS = 24
DYNAMIC_RULES = ("fmax/amax", "amax/fmax", "amax*rcp(fmax)", "amax/fmax, codes y/scale")
GIVEN_RULES = ("x * fl32(1/scale_inv)", "x / scale_inv", "x * scale")


@dataclass(frozen=True)
class Fp8Spec:
    fmt: str
    granularity: str  # "row": one scale per row; "tensor": one for the call
    given_scale: bool  # the entry point takes DelayedScaling's scale (static quant)


def _fl(v) -> np.ndarray:
    return np.asarray(v, F32)


def _min_normal(fmt: str) -> float:
    return float(ml_dtypes.finfo(qref.ML_DTYPES[fmt]).smallest_normal)


# ---- candidate conventions: (scale_inv, scaled values) in fp32 -----------------------------------

def dynamic_candidate(rule: str, amax, x, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale_inv (R, 1), fp32 values cast (R, N)) under ``rule`` for row amaxes (R, 1)."""
    a, x, fmax = _fl(amax), _fl(x), F32(qref.fmt_max(fmt))
    if rule == "fmax/amax":
        s = _fl(fmax / a)
        return _fl(F32(1) / s), _fl(x * s)
    if rule == "amax*rcp(fmax)":
        si = _fl(a * _fl(F32(1) / fmax))
    else:
        si = _fl(a / fmax)
    if rule == "amax/fmax, codes y/scale":
        return si, _fl(x / si)
    return si, _fl(x * _fl(F32(1) / si))


def given_candidate(rule: str, s: float, x) -> tuple[np.ndarray, np.ndarray]:
    """(scale_inv (1, 1), values cast) when DelayedScaling's scale ``s`` is given: every
    AITER path hands its kernel scale_inv = fl(1/s) (its kernels take the dequant scale)."""
    s, x = F32(s), _fl(x)
    si = _fl([[F32(1) / s]])
    if rule == "x * scale":
        return si, _fl(x * s)
    if rule == "x / scale_inv":
        return si, _fl(x / si)
    return si, _fl(x * _fl(F32(1) / si))


# ---- the rule-separating row (searched once per format) -----------------------------------------
# Two candidate multipliers are often only an ulp apart, so their products straddle a code
# boundary only by one of them landing ON it: codes then depend on the tie rule too.  The
# search therefore separates (rule, element rounding) combinations: a rule matches when ANY
# element rounding reproduces the codes, and no other rule can then match under any.

def _near(fmt: str, centre_of) -> np.ndarray:
    """fp32 candidates within 8 ulp of centre_of(t) for every carry-free code midpoint and
    every non-power-of-two code t of the normal range (boundaries of the nearest rules and
    of truncation)."""
    fmax, lo = qref.fmt_max(fmt), 2 * _min_normal(fmt)
    even, odd = pc.midpoints(fmt, lo, fmax, avoid_carry=True)
    grid = np.unique(np.abs(qref.codes_table(fmt)))
    grid = grid[(grid >= lo) & (grid <= fmax) & (np.frexp(grid)[0] != 0.5)]
    out = []
    for t in np.sort(np.concatenate([even, odd, grid.astype(F32)])):
        x = F32(centre_of(float(t)))
        for _ in range(8):
            x = np.nextafter(x, F32(0))
        for _ in range(17):
            out.append(x)
            x = np.nextafter(x, F32(np.inf))
    return np.unique(np.array(out, F32))


def _in_range(v: np.ndarray, fmt: str) -> np.ndarray:
    """Normal range and at most fmax: no subnormal output, no overflow."""
    return (np.abs(v) >= _min_normal(fmt)) & (np.abs(v) <= qref.fmt_max(fmt))


def _pair_splits(cands: np.ndarray, values: dict[str, np.ndarray], scale_invs: dict,
                 fmt: str):
    """(candidates kept, split matrix (pairs, candidates)): which candidate's codes tell apart
    which pair of (rule, element rounding) combinations.  Pairs of rules with different
    scale_inv are left out: the scale tells them apart already."""
    ok = np.logical_and.reduce([_in_range(v, fmt) for v in values.values()])
    combos = [(r, e) for r in values for e in pc.ELEMENT_RULES]
    codes = {(r, e): pc.round_codes(values[r][ok], fmt, e) for r, e in combos}
    pairs = [(p, q) for p, q in itertools.combinations(combos, 2)
             if p[0] != q[0] and scale_invs[p[0]] == scale_invs[q[0]]]
    split = np.array([codes[p] != codes[q] for p, q in pairs]).reshape(len(pairs), ok.sum())
    return cands[ok], split


def _separating(cands: np.ndarray, split: np.ndarray, room: int) -> np.ndarray:
    """``room`` values: greedily the candidates splitting the most pairs still unsplit (at
    most ``MAX_SEPARATORS``), then the other candidates spread out as filler."""
    todo, chosen = split.any(axis=1), []
    while todo.any() and len(chosen) < min(MAX_SEPARATORS, room):
        best = int(np.argmax(split[todo].sum(axis=0)))
        chosen.append(best)
        todo &= ~split[:, best]
    rest = np.setdiff1d(np.arange(len(cands)), chosen)
    return np.concatenate([cands[chosen], pc.spread(cands[rest], room - len(chosen))]).astype(F32)


def _search(params, evaluate, tries: int = 200):
    """The first parameter whose candidates split every pair (else the one leaving fewest):
    evaluate(p) -> (candidates, split matrix)."""
    best = None
    for p in itertools.islice(params, tries):
        cands, split = evaluate(p)
        left = int((~split.any(axis=1)).sum()) if split.size else 0
        if best is None or left < best[0]:
            best = (left, p, cands, split)
        if left == 0:
            break
    return best[1:]


@functools.lru_cache(maxsize=None)
def _dynamic_rule_row(fmt: str) -> tuple[float, ...]:
    fmax = qref.fmt_max(fmt)

    def evaluate(a):
        cands = _near(fmt, lambda t: t * float(a) / fmax)
        values = {r: dynamic_candidate(r, [[a]], cands[None], fmt)[1][0] for r in DYNAMIC_RULES}
        sis = {r: dynamic_candidate(r, [[a]], [[1.0]], fmt)[0].tobytes() for r in DYNAMIC_RULES}
        return _pair_splits(cands, values, sis, fmt)

    # amaxes where TE's, AITER Triton's and AITER HIP's scale_inv all differ, 4.75 up
    amaxes = (F32(4.75 + i / 64) for i in itertools.count())
    amaxes = (a for a in amaxes if len({dynamic_candidate(r, [[a]], [[1.0]], fmt)[0].tobytes()
                                        for r in DYNAMIC_RULES[:3]}) == 3)
    a, cands, split = _search(amaxes, evaluate)
    return tuple(pc.row_of(ROW, [a], _separating(cands, split, ROW - 1), fill=[a]))


@functools.lru_cache(maxsize=None)
def _given_rule(fmt: str) -> tuple[float, tuple[float, ...]]:
    def evaluate(s):
        cands = _near(fmt, lambda t: t / float(s))
        values = {r: given_candidate(r, s, cands[None])[1][0] for r in GIVEN_RULES}
        return _pair_splits(cands, values, {r: 0 for r in GIVEN_RULES}, fmt)

    # scales s with fl(1/fl(1/s)) != s: there x * s differs from the kernels' x * fl(1/si)
    scales = (F32(1 + i / 97) for i in itertools.count(1))
    scales = (s for s in scales if F32(1) / (F32(1) / s) != s)
    s, cands, split = _search(scales, evaluate)
    return float(s), tuple(pc.row_of(ROW, _separating(cands, split, ROW), fill=[1.0]))


# ---- rows ------------------------------------------------------------------------------------

def scale_rule_rows(spec: Fp8Spec) -> tuple[np.ndarray, float | None]:
    if spec.given_scale:
        s, row = _given_rule(spec.fmt)
        return np.array([row], F32), s
    return np.array([_dynamic_rule_row(spec.fmt)], F32), None


def _rounding_row(fmt: str, lo: float, hi: float, fill: np.ndarray) -> np.ndarray:
    even, odd = pc.midpoints(fmt, lo, hi, avoid_carry=True)
    ties = np.concatenate([pc.spread(even, 6), pc.spread(odd, 6)])
    ups = pc.spread(pc.above_midpoints(fmt, lo, hi, avoid_carry=True), 3)
    return pc.row_of(ROW, [qref.fmt_max(fmt)], ties, -ties, ups, -ups, fill=fill)[None]


def element_rounding_rows(spec: Fp8Spec):
    fmax = qref.fmt_max(spec.fmt)
    return _rounding_row(spec.fmt, _min_normal(spec.fmt), fmax,
                         pc.exact_values(spec.fmt, fmax, ROW)), 1.0


def subnormal_rounding_rows(spec: Fp8Spec):
    mn = _min_normal(spec.fmt)
    return _rounding_row(spec.fmt, 0.0, mn, pc.exact_values(spec.fmt, mn / 2, ROW)), 1.0


def _special_row(fmt: str, special: float) -> np.ndarray:
    fmax = qref.fmt_max(fmt)
    row = np.concatenate([[F32(fmax)], pc.exact_values(fmt, fmax, ROW - 1)]).astype(F32)
    row[SPECIAL_SLOT] = F32(special)
    return row


def nan_rows(spec: Fp8Spec):
    return _special_row(spec.fmt, np.nan)[None], 1.0


def inf_rows(spec: Fp8Spec):
    row = _special_row(spec.fmt, np.inf)
    return np.stack([row, -row]), 1.0  # a norm can give y and -y from one gamma


def zero_rows(spec: Fp8Spec):
    return np.zeros((1, ROW), F32), None


def _over_max(fmt: str) -> np.ndarray:
    g = np.unique(np.abs(qref.codes_table(fmt)))
    step = g[-1] - g[-2]
    return np.array([np.nextafter(F32(g[-1]), F32(np.inf)), g[-1] + step / 2, g[-1] + step,
                     2 * g[-1], np.finfo(F32).max], F32)


def saturation_rows(spec: Fp8Spec):
    over = _over_max(spec.fmt)
    fmax = qref.fmt_max(spec.fmt)
    return pc.row_of(ROW, over, -over, fill=pc.exact_values(spec.fmt, fmax, ROW))[None], 1.0


# ---- readers: (rows, codes (R, N), scales list, spec) -> value ---------------------------------

def _per_row(scales, rows: np.ndarray) -> np.ndarray:
    s = _fl(scales).reshape(-1)
    return np.broadcast_to(s[:, None] if s.size > 1 else s[None, :1], (len(rows), 1))


def _at_observed_scale(rows, scales) -> np.ndarray:
    """fl32(x * fl32(1 / scale_inv)): the values cast (exact where scale_inv is 1)."""
    si = _per_row(scales, rows)
    return _fl(_fl(rows) * _fl(F32(1) / si))


def _row_amax(rows: np.ndarray, spec: Fp8Spec) -> np.ndarray:
    a = np.max(np.abs(rows), axis=1, keepdims=True).astype(F32)
    return a if spec.granularity == "row" else np.full_like(a, a.max())


def read_scale_rule(rows, codes, scales, spec, given=None):
    got = _per_row(scales, rows)
    hits = []
    for rule in (GIVEN_RULES if spec.given_scale else DYNAMIC_RULES):
        if spec.given_scale:
            si, v = given_candidate(rule, given, rows)
        else:
            si, v = dynamic_candidate(rule, _row_amax(rows, spec), rows, spec.fmt)
        if np.array_equal(np.broadcast_to(si, got.shape), got) and any(
                np.array_equal(pc.round_codes(v, spec.fmt, e), codes) for e in pc.ELEMENT_RULES):
            hits.append(rule)
    return hits or "none"


def read_rounding(rows, codes, scales, spec, given=None):
    return pc.classify_rounding(_at_observed_scale(rows, scales), codes, spec.fmt)


def _others(row, codes, si, spec, skip) -> str:
    if np.isfinite(si) and si != 0:
        v = _fl(row * _fl(F32(1) / F32(si)))
        if np.array_equal(pc.round_codes(v[~skip], spec.fmt, "rne"), codes[~skip]):
            return "exact"
    return pc.codes_summary(codes[~skip], spec.fmt)


def _special_desc(row, codes, si, spec, label) -> str:
    special = ~np.isfinite(row)
    i = int(np.flatnonzero(special)[0])
    alone = "" if si == 1 else " (finite part alone 1)"  # amax = fmax: 1 under every rule
    return (f"scale_inv {pc.scale_inv_str(si)}{alone}, {label} -> "
            f"{pc.code_str(codes[i], spec.fmt)}, others {_others(row, codes, si, spec, special)}")


def read_nan(rows, codes, scales, spec, given=None):
    return "NaN: " + _special_desc(rows[0], codes[0], _per_row(scales, rows)[0, 0], spec, "NaN")


def read_inf(rows, codes, scales, spec, given=None):
    si = _per_row(scales, rows)[:, 0]
    return "; ".join(f"{lbl}: " + _special_desc(rows[i], codes[i], si[i], spec, lbl)
                     for i, lbl in enumerate(("+Inf", "-Inf")))


def read_zero_row(rows, codes, scales, spec, given=None):
    si = _per_row(scales, rows)[0, 0]
    return f"scale_inv {pc.scale_inv_str(si)}, codes {pc.codes_summary(codes[0], spec.fmt)}"


def read_saturation(rows, codes, scales, spec, given=None):
    over = _over_max(spec.fmt)
    n = 2 * len(over)
    x, c = rows[0, :n], codes[0, :n]
    fmax = qref.fmt_max(spec.fmt)
    clamp = pc.encode_exact(np.where(x > 0, fmax, -fmax), spec.fmt)
    vals = qref.decode(c, spec.fmt)
    if np.array_equal(c, clamp):
        return f"clamp to +-{pc.value_str(fmax)[1:]}"
    if np.isnan(vals).all():
        return "NaN"
    if np.array_equal(vals, np.where(x > 0, np.inf, -np.inf)):
        return "+-inf"
    return " ".join(f"{pc.value_str(v)}->{pc.code_str(k, spec.fmt)}" for v, k in zip(x, c))


UNPROBED_WITH_GIVEN_SCALE = {
    "zero_row": "the scale is given: an all-zero input has no amax to degenerate"}
UNPROBED_WITH_DYNAMIC_SCALE = {
    "saturation": "a dynamic scale maps the amax to the format max: no value exceeds it after "
                  "scaling"}
FIELDS = {
    "scale_rule": (scale_rule_rows, read_scale_rule),
    "element_rounding": (element_rounding_rows, read_rounding),
    "subnormal_rounding": (subnormal_rounding_rows, read_rounding),
    "zero_row": (zero_rows, read_zero_row),
    "nan": (nan_rows, read_nan),
    "inf": (inf_rows, read_inf),
    "saturation": (saturation_rows, read_saturation),
}


def _call(run: pc.Runner, rows: np.ndarray, given: float | None):
    out = run(rows, given)
    codes = np.asarray(out.codes, np.uint8).reshape(rows.shape)
    return codes, [float(s) for s in np.asarray(out.scales, F32).reshape(-1)]


def observe_fp8(run: pc.Runner, spec: Fp8Spec) -> dict[str, pc.FieldOutcome]:
    """Every FP8 field of one entry point (``run`` quantizes rows of intermediates)."""
    out = {}
    for name, (build, read) in FIELDS.items():
        why = (UNPROBED_WITH_GIVEN_SCALE if spec.given_scale
               else UNPROBED_WITH_DYNAMIC_SCALE).get(name)
        if why:
            out[name] = pc.Skipped(why)
            continue
        rows, given = build(spec)
        given = given if spec.given_scale else None
        out[name] = pc.probe_field(
            rows, lambda r=rows, g=given: _call(run, r, g),
            lambda codes, scales, r=rows, g=given, rd=read: rd(r, codes, scales, spec, g))
    return out
