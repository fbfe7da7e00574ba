"""Quantization tolerance tiers (tealite_verify/tiers/e8m0_adjusted.py): the tier primitives
on crafted arrays (rceil_ambiguous, rceil_allowed_bytes, check_mx_scales, check_mx_codes) and
the RCEIL facts they rest on.  End to end: test_quant_seeded_bugs.py (wrong backends that must be caught)
and test_quant_legit_differences.py (legitimate differences that must pass).

Harness / library bugs found here, now fixed, kept as regression tests (each docstring says
what it guards): the FP4 tie at +-0.25 next to +-0 excused (sign bits compared); an
underflowing RCEIL ratio gives byte 0 (torch); torch's power-of-two test holds for the
subnormal ratio 2^-127.

Facts established here (``test_only_float64_ratio_disagrees...``, ``test_torch_rceil_agrees...``):
for every fp32 amax, RCEIL computed as one fp32 division amax / max gives the same byte as the
reference's amax * (1/max), and the torch backend gives exactly the reference's byte (ratios
that underflow to 0 and the subnormal 2^-127 included).  Correct computations disagree only
where the fp32 ratio is the subnormal 2^-127 (2^-22 relative spacing): the exact (float64)
ratio on max * 2^-127 + 1 ulp (one exponent up, inside rceil_allowed_bytes).  For normal
ratios, a legitimate difference needs a computation that is not RNE fp32 (a ratio rounded up:
modelled by ``_up_where_exact_pow2``).  Helpers are in _helpers_quant.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.formats import get_format
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.references import quantize as ref

from _helpers_quant import (A_E2M1, A_E4M3, E8M0_NAN, F32, TORCH_Q, _tiny_x,
                            disagreeing_amaxes, near_pow2_times_max, rceil_float64,
                            rceil_fp32_division)


# ============================================================================================
# Tier primitives on crafted arrays
# ============================================================================================

@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e5m2", "e4m3fnuz"])
def test_rceil_ambiguous_zone(fmt):
    fmax = get_format(fmt).max
    p = fmax * 2.0 ** np.array([-127, -40, -3, 0, 5, 100])
    tol = TQ.RCEIL_AMBIGUITY
    assert tol == 2.0 ** -22
    assert TQ.rceil_ambiguous(p, fmt).all()
    assert TQ.rceil_ambiguous(p * (1 + 0.99 * tol), fmt).all()
    assert TQ.rceil_ambiguous(p * (1 - 0.99 * tol), fmt).all()
    assert not TQ.rceil_ambiguous(p * (1 + 1.01 * tol), fmt).any()
    assert not TQ.rceil_ambiguous(p * (1 - 1.01 * tol), fmt).any()
    # float32 amaxes within one ulp of max * 2^j are all ambiguous
    near = np.array([np.nextafter(F32(fmax * 8), F32(s)) for s in (0, np.inf)], F32)
    assert TQ.rceil_ambiguous(near, fmt).all()
    assert not TQ.rceil_ambiguous(np.array([0.0, -fmax, np.nan, np.inf, fmax * 0.75,
                                            fmax * 1.5, 1e-300]), fmt).any()


def test_rceil_ambiguous_covers_every_disagreement_of_correct_rules():
    """Soundness of the tier: every fp32 amax where a correct RCEIL computation (float64
    ratio; fp32 division) differs from the reference is inside the ambiguity zone."""
    for fmt in ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1"):
        for rule in (rceil_float64, rceil_fp32_division):
            a = disagreeing_amaxes(fmt, rule)
            assert TQ.rceil_ambiguous(a, fmt).all(), (fmt, rule.__name__, a)
            diff = rule(a, fmt).astype(int) - ref.e8m0_scale(a, fmt, "rceil").astype(int)
            assert (np.abs(diff) == 1).all()


def test_only_float64_ratio_disagrees_and_only_at_max_times_2_pow_minus_127():
    """Where correct RCEIL computations really disagree: fp32 division never does; the exact
    (float64) ratio does on exactly one fp32 amax per format, max * 2^-127 + 1 ulp, where the
    fp32 ratio is subnormal (2^-22 relative spacing) and rounds down to 2^-127."""
    for fmt, a in (("e4m3", A_E4M3), ("e2m1", A_E2M1)):
        assert disagreeing_amaxes(fmt, rceil_fp32_division).size == 0
        got = disagreeing_amaxes(fmt, rceil_float64)
        assert got.tolist() == [F32(a)]
        assert rceil_float64(got, fmt).tolist() == [1]
        assert ref.e8m0_scale(got, fmt, "rceil").tolist() == [0]
    for fmt in ("e5m2", "e4m3fnuz", "e5m2fnuz"):
        assert disagreeing_amaxes(fmt, rceil_fp32_division).size == 0
        assert disagreeing_amaxes(fmt, rceil_float64).size == 1
    assert near_pow2_times_max("e4m3").size > 4000


def _scales_and_x(fmt="e4m3", mode="rceil"):
    """x (3, 96) float32 whose block amaxes are: row 0 exact max * 2^j (ambiguous), row 1
    max * 2^j * 1.25 (not ambiguous), row 2 mixed, with a NaN block and a zero block."""
    fmax = get_format(fmt).max
    x = np.full((3, 96), 0.5, F32)
    x[0, [0, 32, 64]] = [fmax, fmax * 2.0 ** -3, fmax * 2.0 ** 6]
    x[1, [0, 32, 64]] = [fmax * 1.25, fmax * 2.0 ** -3 * 1.25, -fmax * 3.0]
    x[2, :32] = np.nan
    x[2, 32:64] = 0.0
    x[2, 64] = np.nextafter(F32(fmax * 16), F32(np.inf))
    return x, ref.e8m0_scale(TQ.mx_block_amax(x), fmt, mode)


def test_check_mx_scales_exact_and_rceil_excuse():
    x, s = _scales_and_x()
    m = TQ.check_mx_scales(s, s, x, "e4m3", "rceil")
    assert m.passed and m.mismatches == 0 and m.excused == 0 and m.numel == 9
    assert s[2, 0] == E8M0_NAN and s[2, 1] == 0
    # Row 0 (amax exactly max * 2^j, reference exponent j) may be one up (a ratio rounded up);
    # block (2, 2) (amax max * 2^4 + 1 ulp, reference exponent 5) may be one down: excused
    a = s.copy()
    a[0] += 1
    a[2, 2] -= 1
    m = TQ.check_mx_scales(a, s, x, "e4m3", "rceil")
    assert m.passed and m.excused == 4, m
    # the other direction of the same blocks is no ratio error away: not excused (row 0 one
    # down saturates the block max; (2, 2) one up loses a bit for nothing)
    for blk, delta in (((0, 0), -1), ((0, 1), -1), ((0, 2), -1), ((2, 2), 1)):
        a = s.copy()
        a[blk] = int(a[blk]) + delta
        m = TQ.check_mx_scales(a, s, x, "e4m3", "rceil")
        assert (m.mismatches, m.excused, m.worst_index) == (1, 0, blk), (blk, m)
    # the excused differences under FLOOR (no ambiguity zone) fail, first one reported
    xs, sf = _scales_and_x(mode="floor")
    a = sf.copy()
    a[0] += 1
    a[2, 2] -= 1
    m = TQ.check_mx_scales(a, sf, xs, "e4m3", "floor")
    assert not m.passed and m.mismatches == 4 and m.excused == 0
    assert m.worst_index == (0, 0) and m.worst_actual == sf[0, 0] + 1
    assert m.worst_expected == sf[0, 0]


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e5m2", "e4m3fnuz", "e5m2fnuz"])
def test_rceil_allowed_bytes(fmt):
    """[lo, hi]: the exponents ceil(log2) reaches under a 2^-22 relative ratio error.  Near
    max * 2^j (exactly, one ulp above or below) that is {j, j + 1}, clamped at byte 0; one
    exponent only outside the ambiguity zone.  Every correct rule's byte (fp32 product, fp32
    division, float64 ratio) lies inside, and no amax allows more than two exponents."""
    fmax = get_format(fmt).max
    p = F32(fmax * 2.0 ** -3)
    lo, hi = TQ.rceil_allowed_bytes(np.array([p, np.nextafter(p, F32(np.inf)),
                                              np.nextafter(p, F32(0)), p * F32(1.25)]), fmt)
    assert lo.tolist() == [124, 124, 124, 125] and hi.tolist() == [125, 125, 125, 125]
    lo, hi = TQ.rceil_allowed_bytes(np.array([fmax * 2.0 ** -127, fmax * 2.0 ** -128, 1e-45],
                                             F32), fmt)
    assert lo.tolist() == [0, 0, 0] and hi.tolist() == [1, 0, 0]
    a = near_pow2_times_max(fmt)
    with np.errstate(under="ignore"):
        lo, hi = TQ.rceil_allowed_bytes(a, fmt)
        for rule in (rceil_float64, rceil_fp32_division, lambda v, f: ref.e8m0_scale(v, f,
                                                                                    "rceil")):
            b = rule(a, fmt).astype(np.int64)
            assert ((lo <= b) & (b <= hi)).all(), (fmt, a[(b < lo) | (b > hi)])
    zone = TQ.rceil_ambiguous(a, fmt)
    assert ((hi - lo) <= 1).all() and (hi > lo).sum() > 200
    assert (lo[~zone] == hi[~zone]).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_check_mx_scales_catches_non_ambiguous_and_two_exponents(fmt):
    x, s = _scales_and_x(fmt)
    a = s.copy()
    a[1, 2] -= 1  # not ambiguous
    m = TQ.check_mx_scales(a, s, x, fmt, "rceil")
    assert (m.mismatches, m.excused, m.worst_index) == (1, 0, (1, 2))
    a = s.copy()
    a[0, 1] += 2  # ambiguous block, but two exponents
    m = TQ.check_mx_scales(a, s, x, fmt, "rceil")
    assert (m.mismatches, m.worst_index, m.max_abs_err) == (1, (0, 1), 2.0)


def test_check_mx_scales_nan_zero_and_shape():
    x, s = _scales_and_x()
    for blk, val in (((2, 0), 0x7F), ((2, 0), 0xFE), ((0, 0), E8M0_NAN), ((2, 1), 1)):
        a = s.copy()
        a[blk] = val
        m = TQ.check_mx_scales(a, s, x, "e4m3", "rceil")
        assert m.mismatches == 1 and m.worst_index == blk, (blk, val, m)
    m = TQ.check_mx_scales(s[:, :2], s, x, "e4m3", "rceil")
    assert not m.passed and m.shape_error and "shape" in m.shape_error


def _codes_x():
    """(2, 64) float32 at FLOOR e2m1 scales 2^0 / 2^3: exact values, ties 1.25 / 2.5 / 5 and
    non-ties; block (1, 1) holds a NaN."""
    x = np.zeros((2, 64), F32)
    x[0, :8] = [6, 1.25, -2.5, 5, 0.7, -3.2, 4, 0.5]
    x[0, 32:40] = np.array([6, 1.25, 2.5, -5, 1.4, 0.2, 3, 1.75], F32) * 8
    x[1, :4] = [-6, 2.5, 2.6, 0.75]
    x[1, 32:36] = [1.0, np.nan, 2.0, 3.0]
    s = ref.e8m0_scale(TQ.mx_block_amax(x), "e2m1", "floor")
    return x, s


def test_check_mx_codes_requantizes_under_backend_scales():
    x, s = _codes_x()
    assert s.tolist() == [[127, 130], [127, E8M0_NAN]]
    want = ref.mx_codes_with_scales(x, s, "e2m1", "rne")
    m = TQ.check_mx_codes(want, s, x, "e2m1", "rne")
    assert m.passed and m.numel == 96 and m.excused == 0  # 32 NaN-scale codes not counted
    # codes under a NaN scale are free
    a = want.copy()
    a[1, 32:] = 0x7
    assert TQ.check_mx_codes(a, s, x, "e2m1", "rne").passed
    # one flipped code in a live block is reported where it is
    a = want.copy()
    a[0, 37] ^= 0x1
    m = TQ.check_mx_codes(a, s, x, "e2m1", "rne")
    assert (m.mismatches, m.worst_index) == (1, (0, 37))
    assert (m.worst_actual, m.worst_expected) == (float(a[0, 37]), float(want[0, 37]))
    # codes judged under *other* (here: larger) scales: re-quantized, not the reference codes
    s2 = s.copy()
    s2[0, 0] += 1
    assert TQ.check_mx_codes(ref.mx_codes_with_scales(x, s2, "e2m1", "rne"), s2, x, "e2m1",
                             "rne").passed
    assert not TQ.check_mx_codes(want, s2, x, "e2m1", "rne").passed
    m = TQ.check_mx_codes(want[:, :62], s, x, "e2m1", "rne")
    assert not m.passed and m.shape_error


def test_check_mx_codes_fp4_ties():
    x, s = _codes_x()
    away = ref.mx_codes_with_scales(x, s, "e2m1", "ties_away")
    want = ref.mx_codes_with_scales(x, s, "e2m1", "rne")
    n_ties = int((away != want).sum())
    assert n_ties == 7  # 1.25, -2.5, 5 | 1.25, 2.5, -5 (x8) | 2.5; the NaN block is all 0
    m = TQ.check_mx_codes(away, s, x, "e2m1", "rne")
    assert m.mismatches == n_ties and m.excused == 0 and m.tier == "e8m0-adjusted"
    m = TQ.check_mx_codes(away, s, x, "e2m1", "rne", tie_tolerant=True)
    assert m.passed and m.excused == n_ties and m.tier == "fp4-ties"
    # a one-step difference off a tie (2.6 -> 2 instead of 3) is not excused
    a = away.copy()
    a[1, 2] = want[1, 2] - 1
    m = TQ.check_mx_codes(a, s, x, "e2m1", "rne", tie_tolerant=True)
    assert (m.mismatches, m.excused, m.worst_index) == (1, n_ties, (1, 2))
    # nor a sign flip at a tie (2.5 -> -3)
    a = away.copy()
    a[0, 2] ^= 0x8
    assert TQ.check_mx_codes(a, s, x, "e2m1", "rne", tie_tolerant=True).mismatches == 1



# ============================================================================================
# Bugs found (library / harness), fixed: regression tests
# ============================================================================================

def test_fp4_ties_at_quarter_excused():
    """check_mx_codes' fp4-ties excuse compares the codes' sign *bits*: the tie at +-0.25
    (between +-0 and +-0.5; RNE gives +-0, ties-away +-0.5, the NUMERICS.md example) is
    excused (np.sign(0) == 0 used to refuse it).  A zero of the wrong sign, or the other
    sign's 0.5, is not a tie and still fails."""
    x = np.zeros((1, 32), F32)
    x[0, :4] = [6, 0.25, -0.25, 1.25]
    s = ref.e8m0_scale(TQ.mx_block_amax(x), "e2m1", "floor")
    away = ref.mx_codes_with_scales(x, s, "e2m1", "ties_away")
    m = TQ.check_mx_codes(away, s, x, "e2m1", "rne", tie_tolerant=True)
    assert m.passed and m.excused == 3, m
    want = ref.mx_codes_with_scales(x, s, "e2m1", "rne")
    assert want[0, 1:3].tolist() == [0x0, 0x8] and away[0, 1:3].tolist() == [0x1, 0x9]
    for i, code in ((1, 0x8), (2, 0x0), (1, 0x9), (2, 0x1)):  # -0 for +0.25, +0 for -0.25...
        a = want.copy()
        a[0, i] = code
        m = TQ.check_mx_codes(a, s, x, "e2m1", "rne", tie_tolerant=True)
        assert (m.mismatches, m.excused, m.worst_index) == (1, 0, (0, i)), (i, code, m)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e5m2", "e4m3fnuz"])
def test_torch_rceil_subnormal_power_of_two_ratio(fmt):
    """Torch mx_exponent RCEIL tests a power of two by the frexp mantissa (0.5), which holds
    for the subnormal fp32 ratio 2^-127 too: amax = max * 2^-127 gives byte 0 (the
    exponent-field test used to miss it and give byte 1, excused by the ambiguity zone)."""
    a = F32(get_format(fmt).max * 2.0 ** -127)
    x = torch.zeros(1, 32)
    x[0, 0] = float(a)
    assert ref.e8m0_scale(np.array([a]), fmt, "rceil").tolist() == [0]
    assert TORCH_Q(x, R.MXBlockScaling(fmt), rowwise=True, columnwise=False,
                   scale=None).scale_inv.tolist() == [[0]]


def test_torch_rceil_agrees_with_reference():
    """The torch backend's RCEIL bytes equal the reference's on every fp32 amax near
    max * 2^j (ratios that underflow to 0 and the subnormal 2^-127 included) and on a sweep of
    subnormal and random amaxes: no block of a torch run is excused against the reference."""
    rng = np.random.default_rng(5)
    extra = np.concatenate([np.arange(1, 0x800000, 4099, dtype=np.uint32),
                            rng.integers(1, 0x7F800000, 2000, dtype=np.uint32)]).view(F32)
    for fmt in ("e4m3", "e2m1", "e5m2", "e4m3fnuz", "e5m2fnuz"):
        a = np.concatenate([near_pow2_times_max(fmt), extra])
        with np.errstate(under="ignore"):
            ratio = (a * (F32(1.0) / F32(get_format(fmt).max))).astype(F32)
        assert (ratio == 0).any() and (ratio == F32(2.0 ** -127)).any()
        x = torch.zeros(a.size, 32)
        x[:, 0] = torch.from_numpy(a)
        got = TORCH_Q(x, R.MXBlockScaling(fmt), rowwise=True, columnwise=False,
                      scale=None).scale_inv[:, 0].numpy()
        want = ref.e8m0_scale(a, fmt, "rceil")
        assert np.array_equal(got, want), (fmt, a[got != want][:5])


def test_torch_rceil_underflowing_ratio():
    """Torch gives byte 0 for a block of amax 1e-45 (fp32 ratio 0), like the reference (both
    used to give 127, so run_case showed nothing)."""
    q = tealite.quantize(_tiny_x(), R.MXFP8BlockScaling(), backend="torch")
    assert q.scale_inv[:, 0].tolist() == [0, 119]  # row 1: amax 1, ceil(log2(1/448)) = -8
