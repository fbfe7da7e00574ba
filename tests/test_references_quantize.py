"""Unit tests of the harness's bit-exact quantization references
(tealite_verify.references.quantize): encodings, element rounding at every boundary, and the
E8M0 scale rules.  The oracles are independent of the reference: a bit-level decoder written
from the format definitions, a brute-force nearest-value search over that decoded table, exact
``fractions.Fraction`` arithmetic for the scale exponents, and ml_dtypes used directly.

MX block and FP8 scaled-recipe contracts are in test_references_quantize_contract.py, which
imports the oracles below (underscore names, so pytest collects nothing twice).
"""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tealite.formats import FORMATS
from tealite_verify.references import quantize as ref

F32 = np.float32
ALL_FMTS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1")
FP8_FMTS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")
MODES = ("floor", "ceil", "even", "rceil")
ROUNDINGS = ("rne", "ties_away")

# Format facts written down by hand from the OCP / FNUZ definitions (not read from ml_dtypes):
# name -> (ml_dtype, exponent bits, mantissa bits, bias, special-value kind, max, emax_elem)
FACTS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 4, 3, 7, "fn", 448.0, 8),
    "e5m2": (ml_dtypes.float8_e5m2, 5, 2, 15, "ieee", 57344.0, 15),
    "e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 4, 3, 8, "fnuz", 240.0, 7),
    "e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, 5, 2, 16, "fnuz", 57344.0, 15),
    "e2m1": (ml_dtypes.float4_e2m1fn, 2, 1, 1, "finite", 6.0, 2),
}


def _nbits(fmt):
    return 1 + FACTS[fmt][1] + FACTS[fmt][2]


def _sign_bit(fmt):
    return 1 << (_nbits(fmt) - 1)


def _decode_by_hand(code: int, fmt: str) -> float:
    _, ebits, mbits, bias, kind, _, _ = FACTS[fmt]
    sign = (code >> (ebits + mbits)) & 1
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    top_e, top_m = (1 << ebits) - 1, (1 << mbits) - 1
    if kind == "fnuz" and code == _sign_bit(fmt):
        return math.nan  # the single NaN takes the place of -0
    if kind == "ieee" and e == top_e:
        return math.nan if m else (-math.inf if sign else math.inf)
    if kind == "fn" and e == top_e and m == top_m:
        return math.nan
    mag = math.ldexp(m, 1 - bias - mbits) if e == 0 else math.ldexp((1 << mbits) + m,
                                                                     e - bias - mbits)
    return -mag if sign else mag  # -0.0 for the code 1000...0 of non-fnuz formats


def _table(fmt):
    """(codes, float64 values) of every code of ``fmt``, hand-decoded."""
    codes = np.arange(1 << _nbits(fmt), dtype=np.uint8)
    return codes, np.array([_decode_by_hand(int(c), fmt) for c in codes])


def _positive_table(fmt):
    """Sorted non-negative finite values and their codes."""
    codes, vals = _table(fmt)
    keep = np.isfinite(vals) & ~np.signbit(vals)
    order = np.argsort(vals[keep], kind="stable")
    return codes[keep][order], vals[keep][order]


def _oracle_codes(v, fmt, rounding="rne", saturate=True):
    """Brute-force nearest-value rounding of exact float64 values ``v`` to codes of ``fmt``.

    Returns (codes uint8, kind) with kind 0 = finite code, 1 = NaN expected, 2 = overflow
    expected (saturate=False only: NaN, or +-inf for e5m2).  Ties go to the even code (rne)
    or to the larger magnitude (ties_away).  Beyond max, a virtual next code (max + its gap)
    takes part in the search, so ties at the top behave as they would with a wider exponent.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    pcodes, pvals = _positive_table(fmt)
    fmax = FACTS[fmt][5]
    if not saturate:
        pcodes = np.append(pcodes, pcodes[-1] + 1)  # parity of the virtual overflow code
        pvals = np.append(pvals, 2 * pvals[-1] - pvals[-2])
    codes = np.zeros(v.shape, np.uint8)
    kind = np.zeros(v.shape, np.int8)
    for lo in range(0, v.size, 2048):
        a = np.abs(v[lo:lo + 2048])
        a = np.minimum(a, fmax if saturate else 2 * pvals[-1])  # no absorption far beyond max
        d = np.abs(a[:, None] - pvals[None, :])
        cand = d == np.nanmin(np.where(np.isnan(d), np.inf, d), axis=1)[:, None]
        if rounding == "rne":
            pick = np.argmax(cand & (pcodes[None, :] % 2 == 0), axis=1)
            pick = np.where(cand.sum(1) == 1, np.argmax(cand, axis=1), pick)
        else:  # the largest candidate
            pick = cand.shape[1] - 1 - np.argmax(cand[:, ::-1], axis=1)
        c = pcodes[pick]
        neg = np.signbit(v[lo:lo + 2048])
        if FACTS[fmt][4] == "fnuz":
            neg &= c != 0  # no -0: a negative value rounding to zero gives +0
        codes[lo:lo + 2048] = np.where(neg, c | _sign_bit(fmt), c)
        over = (not saturate) & (pick == len(pvals) - 1)
        kind[lo:lo + 2048] = np.where(np.isnan(a), 1, np.where(over, 2, 0))
    return codes, kind


def _assert_codes(actual_bits, v, fmt, rounding, saturate=True):
    """ref bits == oracle bits, with NaN / overflow results checked by value."""
    actual_bits = np.asarray(actual_bits, np.uint8).ravel()
    exp, kind = _oracle_codes(v, fmt, rounding, saturate)
    got = ref.decode(actual_bits, fmt)
    v = np.asarray(v, np.float64).ravel()
    finite = kind == 0
    bad = np.flatnonzero(finite & (actual_bits != exp))
    assert bad.size == 0, (f"{fmt} {rounding} sat={saturate}: v={v[bad][:6].tolist()} got "
                           f"{[hex(b) for b in actual_bits[bad][:6]]} want "
                           f"{[hex(b) for b in exp[bad][:6]]}")
    if fmt != "e2m1":
        assert np.isnan(got[kind == 1]).all()
    over = kind == 2
    if fmt == "e5m2":
        np.testing.assert_array_equal(got[over], np.copysign(np.inf, v[over]))
    else:
        assert np.isnan(got[over]).all()


def _pow2(k: int) -> Fraction:
    return Fraction(2) ** k


def _floor_log2(x: Fraction) -> int:
    k = x.numerator.bit_length() - x.denominator.bit_length()
    while _pow2(k) > x:
        k -= 1
    while _pow2(k + 1) <= x:
        k += 1
    return k


def _ceil_log2(x: Fraction) -> int:
    k = _floor_log2(x)
    return k if _pow2(k) == x else k + 1


def _oracle_e8m0(amax, fmt, mode, emax=None) -> int:
    """Biased E8M0 byte of one float32 amax, straight from the written definitions."""
    a = float(F32(amax))
    if math.isnan(a) or math.isinf(a):
        return 0xFF
    if a == 0:
        return 0
    _, _, mbits, _, _, fmax, fmt_emax = FACTS[fmt]
    emax = fmt_emax if emax is None else emax
    A = Fraction(a)
    if mode == "floor":
        e = _floor_log2(A) - emax
    elif mode == "ceil":
        e = _ceil_log2(A) - emax
    elif mode == "even":  # round half up to mbits mantissa bits, then FLOOR
        ulp = _pow2(_floor_log2(A) - mbits)
        e = _floor_log2(math.floor(A / ulp + Fraction(1, 2)) * ulp) - emax
    else:  # rceil: ceil(log2(amax * (1/max))) with both steps in fp32; log2(0) = -inf
        ratio = np.float32(a) * (np.float32(1) / np.float32(fmax))
        e = -10**6 if ratio == 0 else _ceil_log2(Fraction(float(ratio)))
    return min(max(e, -127), 127) + 127


# ==== 1. encodings ============================================================================

def test_format_facts_agree_across_tables():
    for fmt in ALL_FMTS:
        _, _, mbits, _, _, fmax, emax = FACTS[fmt]
        assert ref.fmt_max(fmt) == fmax == FORMATS[fmt].max
        assert ref.fmt_emax(fmt) == emax == FORMATS[fmt].emax
        assert ref.fmt_mbits(fmt) == mbits == FORMATS[fmt].mbits
        assert np.nanmax(_table(fmt)[1][np.isfinite(_table(fmt)[1])]) == fmax
    assert ref.fmt_max("e4m3fnuz") == 240.0  # not OCP's 448


@pytest.mark.parametrize("fmt", FP8_FMTS)
def test_decode_all_256_codes(fmt):
    codes, hand = _table(fmt)
    ml = np.arange(256, dtype=np.uint8).view(FACTS[fmt][0]).astype(np.float64)
    got = ref.decode(codes, fmt)
    assert got.dtype == np.float64
    for other in (ml, hand):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(other))
        np.testing.assert_array_equal(got, other)  # NaN == NaN here; +-inf compared
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(other[other == 0]))
    n_nan = {"e4m3": 2, "e5m2": 6, "e4m3fnuz": 1, "e5m2fnuz": 1}[fmt]
    assert np.isnan(got).sum() == n_nan
    assert (got == 0).sum() == (1 if FACTS[fmt][4] == "fnuz" else 2)


def test_decode_all_16_e2m1_codes():
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = np.array(mags + [-m for m in mags])
    got = ref.decode(np.arange(16, dtype=np.uint8), "e2m1")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), [False] * 8 + [True] * 8)  # 0x8 is -0
    np.testing.assert_array_equal(got, np.array([_decode_by_hand(c, "e2m1") for c in range(16)]))
    ml = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    np.testing.assert_array_equal(got, ml)
    # decode ignores the high nibble (a packed neighbour)
    np.testing.assert_array_equal(ref.decode(np.arange(16, dtype=np.uint8) | 0xA0, "e2m1"), want)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("saturate", [True, False])
def test_round_trip_every_finite_code(fmt, rounding, saturate):
    codes, vals = _table(fmt)
    fin = np.isfinite(vals)
    q = ref.round_elements(vals[fin].astype(F32), fmt, rounding=rounding, saturate=saturate)
    assert q.dtype == FACTS[fmt][0]
    np.testing.assert_array_equal(ref.codes_to_bits(q), codes[fin])


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_negative_zero_and_negative_underflow(fmt):
    tiny = _positive_table(fmt)[1][1] / 4  # a quarter of the smallest subnormal
    v = np.array([-0.0, -tiny, 0.0, tiny], F32)
    ml = v.astype(FACTS[fmt][0]).view(np.uint8) & (0x0F if fmt == "e2m1" else 0xFF)
    neg0 = 0 if FACTS[fmt][4] == "fnuz" else _sign_bit(fmt)  # fnuz has no -0: ml_dtypes gives 0
    np.testing.assert_array_equal(ml, [neg0, neg0, 0, 0])
    for rounding in ROUNDINGS:
        got = ref.codes_to_bits(ref.round_elements(v, fmt, rounding=rounding))
        np.testing.assert_array_equal(got, ml)


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_non_finite_inputs(fmt):
    v = np.array([np.nan, -np.nan, np.inf, -np.inf], F32)
    fmax = FACTS[fmt][5]
    for rounding in ROUNDINGS:
        sat = ref.decode(ref.codes_to_bits(ref.round_elements(v, fmt, rounding=rounding)), fmt)
        np.testing.assert_array_equal(sat[2:], [fmax, -fmax])  # satfinite: inf -> +-max
        with np.errstate(invalid="ignore"):  # ref computes 2*inf - inf (harmless, see report)
            raw = ref.codes_to_bits(ref.round_elements(v, fmt, rounding=rounding,
                                                       saturate=False))
        np.testing.assert_array_equal(raw, v.astype(FACTS[fmt][0]).view(np.uint8)
                                      & (0x0F if fmt == "e2m1" else 0xFF))
        if fmt == "e2m1":  # no NaN / inf in E2M1: ml_dtypes gives -0 (0x8) and saturates
            np.testing.assert_array_equal(ref.decode(raw, fmt)[2:], [6.0, -6.0])
        else:
            assert np.isnan(sat[:2]).all()
            want = [np.inf, -np.inf] if fmt == "e5m2" else [np.nan, np.nan]
            np.testing.assert_array_equal(ref.decode(raw, fmt)[2:], want)


def test_e8m0_value_all_256_bytes():
    b = np.arange(256, dtype=np.uint8)
    got = ref.e8m0_value(b)
    want = np.array([math.ldexp(1.0, i - 127) for i in range(255)] + [math.nan])
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[255]) and got[0] == 2.0 ** -127 and got[127] == 1.0
    assert got[254] == 2.0 ** 127
    np.testing.assert_array_equal(got, b.view(ml_dtypes.float8_e8m0fnu).astype(np.float64))


# ==== 2. rounding boundaries =================================================================

def _boundary_points(fmt):
    """Every midpoint between adjacent non-negative values, +-1 float32 ulp around it, the
    values themselves, and points at and beyond max; both signs."""
    _, pvals = _positive_table(fmt)
    mids = (pvals[:-1] + pvals[1:]) / 2
    assert (mids.astype(F32).astype(np.float64) == mids).all()  # exact in float32
    m32 = mids.astype(F32)
    top_gap = pvals[-1] - pvals[-2]
    top_mid = F32(pvals[-1] + top_gap / 2)
    over = [F32(pvals[-1]), np.nextafter(F32(pvals[-1]), F32(np.inf)), top_mid,
            np.nextafter(top_mid, F32(0)), np.nextafter(top_mid, F32(np.inf)),
            F32(pvals[-1] + top_gap), F32(2 * pvals[-1]), F32(1e30), np.finfo(F32).max]
    pos = np.concatenate([pvals.astype(F32), m32, np.nextafter(m32, F32(0)),
                          np.nextafter(m32, F32(np.inf)), np.array(over, F32)])
    return np.concatenate([pos, -pos]).astype(F32)


def test_oracle_matches_numerics_examples():
    # NUMERICS.md: E2M1, scale 1: 0.25, 1.25, 2.5, 5.0 -> RNE 0, 1, 2, 4; ties-away .5, 1.5, 3, 6
    v = [0.25, 1.25, 2.5, 5.0]
    assert _oracle_codes(v, "e2m1", "rne")[0].tolist() == [0, 2, 4, 6]
    assert _oracle_codes(v, "e2m1", "ties_away")[0].tolist() == [1, 3, 5, 7]
    for rounding, want in (("rne", [0, 2, 4, 6]), ("ties_away", [1, 3, 5, 7])):
        got = ref.codes_to_bits(ref.round_elements(np.array(v, F32), "e2m1", rounding=rounding))
        assert got.tolist() == want
        neg = ref.codes_to_bits(ref.round_elements(-np.array(v, F32), "e2m1", rounding=rounding))
        assert neg.tolist() == [w | 8 for w in want]
    # E4M3: 1.0625 is between 1.0 (0x38, even) and 1.125 (0x39)
    assert _oracle_codes([1.0625], "e4m3", "rne")[0][0] == 0x38
    assert _oracle_codes([1.0625], "e4m3", "ties_away")[0][0] == 0x39


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_rounding_boundaries_saturating(fmt, rounding):
    v = _boundary_points(fmt)
    got = ref.codes_to_bits(ref.round_elements(v, fmt, rounding=rounding, saturate=True))
    _assert_codes(got, v, fmt, rounding, saturate=True)
    # the hand rule for positive ties, stated directly too
    pcodes, pvals = _positive_table(fmt)
    mids = ((pvals[:-1] + pvals[1:]) / 2).astype(F32)
    tie = ref.codes_to_bits(ref.round_elements(mids, fmt, rounding=rounding))
    want = np.where(pcodes[:-1] % 2 == 0, pcodes[:-1], pcodes[1:]) if rounding == "rne" \
        else pcodes[1:]
    np.testing.assert_array_equal(tie, want)
    for nudge, side in ((F32(0), pcodes[:-1]), (F32(np.inf), pcodes[1:])):
        near = ref.round_elements(np.nextafter(mids, nudge), fmt, rounding=rounding)
        np.testing.assert_array_equal(ref.codes_to_bits(near), side)


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_rounding_boundaries_non_saturating_rne(fmt):
    v = _boundary_points(fmt)
    got = ref.codes_to_bits(ref.round_elements(v, fmt, rounding="rne", saturate=False))
    ml = v.astype(FACTS[fmt][0]).view(np.uint8) & (0x0F if fmt == "e2m1" else 0xFF)
    np.testing.assert_array_equal(got, ml)  # ml_dtypes' own overflow behaviour
    if fmt == "e2m1":  # ml_dtypes saturates E2M1 (it has no overflow value)
        _assert_codes(got, v, fmt, "rne", saturate=True)
    else:
        _assert_codes(got, v, fmt, "rne", saturate=False)


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_rounding_boundaries_non_saturating_ties_away(fmt):
    v = _boundary_points(fmt)
    if fmt == "e4m3":  # +-464 is pinned by the xfail below
        v = v[np.abs(v) != 464]
    got = ref.codes_to_bits(ref.round_elements(v, fmt, rounding="ties_away", saturate=False))
    _assert_codes(got, v, fmt, "ties_away", saturate=fmt == "e2m1")


# Ties-away at the overflow tie (464 between max 448 and the step 480 past it) overflows.
def test_e4m3_ties_away_overflow_tie_is_nan():
    q = ref.round_elements(np.array([464.0, -464.0], F32), "e4m3", rounding="ties_away",
                           saturate=False)
    assert np.isnan(q.astype(np.float64)).all()


# ==== 3. E8M0 scale modes =====================================================================

def _f32_neighbours(vals):
    v = np.asarray(vals, F32)
    v = v[np.isfinite(v) & (v > 0)]
    with np.errstate(over="ignore"):  # f32 max's upper neighbour is inf (byte 0xFF): kept
        return np.concatenate([v, np.nextafter(v, F32(0)), np.nextafter(v, F32(np.inf))])


def _scale_points(fmt):
    fmax, mbits = FACTS[fmt][5], FACTS[fmt][2]
    with np.errstate(over="ignore"):
        ks = np.arange(-160, 129)
        base = np.concatenate([np.ldexp(fmax, ks), np.ldexp(1.0, ks),
                               np.ldexp(2 - 2.0 ** -(mbits + 1), ks)]).astype(F32)  # EVEN edge
    rng = np.random.default_rng(1)
    rand_bits = rng.integers(1, 0x7F800000, 400, dtype=np.uint32).view(F32)  # incl. subnormals
    rand_log = np.exp2(rng.uniform(-140, 127, 200)).astype(F32)
    special = np.array([300.0, 448.0, 240.0, 6.0, 57344.0, 1e-45, 1e-43, 3e-43, 1e-40,
                        2.0 ** -126, np.finfo(F32).max, 3e38], F32)
    return np.concatenate([_f32_neighbours(base), rand_bits, rand_log,
                           _f32_neighbours(special)])


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
def test_e8m0_scale_matches_definition(fmt, mode):
    a = _scale_points(fmt)
    got = ref.e8m0_scale(a, fmt, mode)
    want = np.array([_oracle_e8m0(x, fmt, mode) for x in a], np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"amax {a[bad][:5].tolist()}: got {got[bad][:5]} want {want[bad][:5]}"


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_e8m0_scale_rceil_subnormal_amax_not_underflowing(fmt):
    # subnormal amaxes whose fp32 product amax * (1/max) is still non-zero
    sub = np.arange(1, 0x800000, 977, dtype=np.uint32).view(F32)
    sub = sub[sub * (F32(1) / F32(FACTS[fmt][5])) > 0]
    assert sub.size > 100
    got = ref.e8m0_scale(sub, fmt, "rceil")
    np.testing.assert_array_equal(got, [_oracle_e8m0(x, fmt, "rceil") for x in sub])
    assert (got == 0).all()  # exact ratio < 2^-128: every one clamps to byte 0 (2^-127)


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_e8m0_scale_rceil_underflowing_ratio_gives_byte_0(fmt):
    # Regression (fixed in 765dfa7): a ratio amax*(1/max) that underflows to 0 in fp32 gave
    # byte 127 (frexp(0) has exponent 0); ceil(log2 0) = -inf clamps to byte 0, as TE's
    # float_to_e8m0 returns 0x00 for 0.
    a = np.array([1e-45, 2e-45, 1e-44], F32)  # a few x the smallest subnormal: ratio is 0
    assert (a[:2] * (F32(1) / F32(FACTS[fmt][5])) == 0).all()
    np.testing.assert_array_equal(ref.e8m0_scale(a, fmt, "rceil"), [0, 0, 0])
    x = np.zeros((1, 32), F32)
    x[0, :3] = a
    bits, scales = ref.mx_quantize(x, fmt, "rceil", "rne")
    assert scales.tolist() == [[0]] and (bits == 0).all()


@given(st.floats(width=32), st.sampled_from(ALL_FMTS), st.sampled_from(MODES))
def test_e8m0_scale_hypothesis(a, fmt, mode):
    a = abs(a)
    assert int(ref.e8m0_scale(F32(a), fmt, mode)) == _oracle_e8m0(a, fmt, mode)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
def test_e8m0_scale_specials(fmt, mode):
    a = np.array([0.0, -0.0, np.nan, np.inf, np.finfo(F32).max], F32)
    got = ref.e8m0_scale(a, fmt, mode)
    assert got.dtype == np.uint8
    assert got[:4].tolist() == [0, 0, 0xFF, 0xFF]
    assert int(got[4]) == _oracle_e8m0(a[4], fmt, mode)
    # shape preserved, scalar and 2-D
    assert ref.e8m0_scale(F32(1.0), fmt, mode).shape == ()
    assert ref.e8m0_scale(np.ones((3, 2), F32), fmt, mode).shape == (3, 2)


def test_e8m0_scale_numerics_examples_and_hand_values():
    s = lambda a, fmt, mode: int(ref.e8m0_scale(F32(a), fmt, mode)) - 127  # noqa: E731
    assert s(300, "e4m3", "ceil") == 1 and s(300, "e4m3", "rceil") == 0
    assert s(300, "e4m3", "floor") == 0 and s(300, "e4m3", "even") == 0
    assert s(448, "e4m3", "floor") == 0 and s(449, "e4m3", "rceil") == 1
    assert s(6.0, "e2m1", "floor") == 0 and s(6.0, "e2m1", "ceil") == 1
    assert s(6.0, "e2m1", "rceil") == 0 and s(6.5, "e2m1", "rceil") == 1
    assert s(7.0, "e2m1", "even") == 1 and s(6.9, "e2m1", "even") == 0  # 7 rounds up to 8
    assert s(240, "e4m3fnuz", "rceil") == 0 and s(241, "e4m3fnuz", "rceil") == 1
    assert s(1.0, "e5m2", "floor") == -15 and s(2.0 ** -120, "e4m3", "floor") == -127
    assert s(2.0 ** 127, "e2m1", "ceil") == 125 and s(3e38, "e2m1", "ceil") == 126


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_e8m0_rceil_fp32_product_at_2_pow_minus_127(fmt):
    # For these maxes the fp32 product amax * (1/max) gives the exact ceil(log2(amax/max)) for
    # every normal ratio; only in the subnormal ratio range does its rounding show: one ulp
    # above max * 2^-127 the exact ratio is above 2^-127 (byte 1) but the fp32 product is 2^-127.
    a = np.nextafter(F32(np.ldexp(FACTS[fmt][5], -127)), F32(np.inf))
    assert Fraction(float(a)) / Fraction(FACTS[fmt][5]) > _pow2(-127)
    assert int(ref.e8m0_scale(a, fmt, "rceil")) == 0 == _oracle_e8m0(a, fmt, "rceil")
    assert int(ref.e8m0_scale(np.nextafter(a, F32(np.inf)), fmt, "rceil")) == 1


@pytest.mark.parametrize("mode", ["floor", "ceil", "even"])
def test_e8m0_scale_upper_clamp(mode, monkeypatch):
    # No float32 amax reaches the upper clamp with a real format (the largest byte is 253, e2m1
    # CEIL of ~2^128), so exercise the clamp with a pretend emax of -10.
    monkeypatch.setattr(ref, "fmt_emax", lambda fmt: -10)
    a = np.array([2.0 ** 116, 2.0 ** 117, 2.0 ** 120, 3e38], F32)
    got = ref.e8m0_scale(a, "e4m3", mode)
    want = [_oracle_e8m0(x, "e4m3", mode, emax=-10) for x in a]
    np.testing.assert_array_equal(got, want)
    assert got[-1] == 254 and got[0] == 253 and (got[1:] == 254).all()


# ==== 4. FP8 scale rules: TE's fmax/amax vs AITER's amax/fmax ==================================
# The oracle: exact Fraction arithmetic with a hand-written round-to-nearest-even to fp32
# (positive normal values), then the nearest E4M3 value from the hand-decoded code table.

def _rn_f32(q: Fraction) -> Fraction:
    """Round a positive rational in fp32's normal range to the nearest fp32, ties to even."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    ulp = Fraction(2) ** (e - 23)
    n, rem = divmod(q, ulp)
    n = int(n) + (rem > ulp / 2 or (rem == ulp / 2 and int(n) % 2 == 1))
    return n * ulp


def _rne_code(v: Fraction, fmt: str = "e4m3") -> int:
    """The code of the nearest finite value of fmt (ties to the even code), v >= 0, no sat."""
    codes = [c for c in range(_sign_bit(fmt)) if not math.isnan(_decode_by_hand(c, fmt))]
    best = min(codes, key=lambda c: (abs(Fraction(_decode_by_hand(c, fmt)) - v), c % 2))
    return best


def test_scale_rules_give_different_codes_by_hand():
    # amax = 4.75 and x = 3.5625 = 0.75 * amax: x * 448 / amax = 336 exactly, the midpoint of
    # the E4M3 neighbours 320 (code 0x7A) and 352 (0x7B).  TE's fp32 scale fl(448/4.75) lies
    # below 1792/19, AITER's fl(1/fl(4.75/448)) above it, so the products fall on either side.
    amax, x = Fraction(19, 4), Fraction(57, 16)
    te_scale = _rn_f32(Fraction(448) / amax)
    aiter_sinv = _rn_f32(amax / 448)
    aiter_recip = _rn_f32(1 / aiter_sinv)
    assert te_scale < Fraction(1792, 19) < aiter_recip
    te_code = _rne_code(_rn_f32(x * te_scale))
    aiter_code = _rne_code(_rn_f32(x * aiter_recip))
    assert (te_code, aiter_code) == (0x7A, 0x7B)

    row = np.array([[4.75, 3.5625]], F32)
    bits, sinv, a = ref.fp8_quantize(row, "e4m3", "row")
    assert bits[0, 1] == te_code and sinv[0] == F32(1 / te_scale) and a[0] == F32(4.75)
    bits, sinv, a = ref.fp8_quantize(row, "e4m3", "row", scale_rule="amax/fmax")
    assert bits[0, 1] == aiter_code and sinv[0] == F32(aiter_sinv) and a[0] == F32(4.75)
    assert bits[0, 0] == 0x7E  # amax * (1 / (amax / 448)) rounds to 448 exactly here
    t_bits, t_sinv, t_a = ref.fp8_quantize(row, "e4m3", "tensor", scale_rule="amax/fmax")
    np.testing.assert_array_equal(t_bits, bits)
    assert t_sinv.shape == (1,) and t_sinv[0] == sinv[0] and t_a[0] == a[0]


NAN = np.nan
INF = np.inf


@pytest.mark.parametrize("row,te,aiter,aiter_sinv", [
    # amax 0: TE's scale 1 (codes +-0); AITER's scale_inv 0 -> 1/0 = inf -> 0 * inf = NaN.
    ([0.0, -0.0], [0x00, 0x80], [NAN, NAN], 0.0),
    # NaN: TE's amax is NaN -> scale 1; AITER's amax ignores it (1.0) -> 1.0 * 448.
    ([NAN, 1.0], [NAN, 0x38], [NAN, 0x7E], 1 / 448),
    # only NaN: both NaN everywhere; AITER's scale_inv NaN.
    ([NAN, NAN], [NAN, NAN], [NAN, NAN], NAN),
    # Inf: TE's scale 1, Inf saturates to 448; AITER's scale_inv Inf -> 1/Inf = 0 -> +-0, and
    # Inf * 0 = NaN.
    ([INF, 2.0, -3.0], [0x7E, 0x40, 0xC4], [NAN, 0x00, 0x80], INF),
])
def test_scale_rules_at_zero_nan_inf_amax(row, te, aiter, aiter_sinv):
    x = np.array([row], F32)

    def check(bits, want):
        for b, w in zip(bits[0], want):
            if isinstance(w, float) and math.isnan(w):
                assert math.isnan(_decode_by_hand(int(b), "e4m3")), hex(b)
            else:
                assert b == w, (hex(b), hex(w))

    check(ref.fp8_quantize(x, "e4m3", "row")[0], te)
    bits, sinv, _ = ref.fp8_quantize(x, "e4m3", "row", scale_rule="amax/fmax")
    check(bits, aiter)
    np.testing.assert_array_equal(sinv, np.array([aiter_sinv], F32))


def test_aiter_rule_per_tensor_amax_and_fnuz():
    # Per tensor: the max of the row amaxes (NaN ignored within a row), but a row of only NaN
    # makes the tensor's amax NaN (AITER's atomic max of fp32 bits: NaN > Inf > finite).
    some_nan = np.array([[NAN, 1.0], [2.0, 3.0]], F32)
    _, sinv, a = ref.fp8_quantize(some_nan, "e4m3", "tensor", scale_rule="amax/fmax")
    assert a[0] == 3.0 and sinv[0] == F32(F32(3.0) / F32(448))
    nan_row = np.array([[NAN, NAN], [2.0, 3.0]], F32)
    bits, sinv, a = ref.fp8_quantize(nan_row, "e4m3", "tensor", scale_rule="amax/fmax")
    assert np.isnan(a[0]) and np.isnan(sinv[0])
    assert all(math.isnan(_decode_by_hand(int(b), "e4m3")) for b in bits.ravel())
    # The same elements transposed: no row of only NaN, so a finite amax.
    _, _, a = ref.fp8_quantize(nan_row.T.copy(), "e4m3", "tensor", scale_rule="amax/fmax")
    assert a[0] == 3.0
    # FNUZ: max 240, and the NaN of 0 * inf is FNUZ's single NaN 0x80.
    bits, sinv, _ = ref.fp8_quantize(np.array([[0.0, 0.0], [240.0, -1.0]], F32), "e4m3fnuz",
                                     "row", scale_rule="amax/fmax")
    assert bits[0].tolist() == [0x80, 0x80] and sinv.tolist() == [0.0, 1.0]
    assert bits[1, 0] == 0x7F and bits[1, 1] == 0xC0  # 240 and -1.0 in E4M3 FNUZ (bias 8)


def test_aiter_rule_refuses_te_only_options():
    with pytest.raises(ValueError, match="amax/fmax"):
        ref.fp8_quantize(np.ones((1, 2), F32), "e4m3", "row", force_pow2=True,
                         scale_rule="amax/fmax")
    with pytest.raises(ValueError, match="amax/fmax"):
        ref.fp8_quantize(np.ones((1, 2), F32), "e4m3", "given", scale=[1.0],
                         scale_rule="amax/fmax")


def test_recip_ulp_bounds():
    s = np.array([F32(3.0) / F32(448), 0.0, np.inf, np.nan, 1.0], F32)
    lo, hi = ref.recip_ulp_bounds(s, 2)
    exact = 1.0 / s[0].astype(np.float64)
    ulp = 2.0 ** (math.floor(math.log2(exact)) - 23)
    assert lo[0] >= exact - 2 * ulp and np.nextafter(lo[0], F32(0)) < exact - 2 * ulp
    assert hi[0] <= exact + 2 * ulp and np.nextafter(hi[0], F32(np.inf)) > exact + 2 * ulp
    assert lo[1] == hi[1] == np.inf and lo[2] == hi[2] == 0 and np.isnan(lo[3])
    assert (lo[4], hi[4]) == (F32(1 - 2 ** -22), F32(1 + 2 ** -22))  # absolute 2 ulp(1)
    z0, z1 = ref.recip_ulp_bounds(s, 0)
    np.testing.assert_array_equal(z0, ref.reciprocal(s))
    np.testing.assert_array_equal(z1, ref.reciprocal(s))
