"""Semantic contracts of the MX and FP8-scaled reference quantizers
(tealite_verify.references.quantize: mx_quantize / mx_dequantize / pack_e2m1 / unpack_e2m1,
te_scale_from_amax / scaled_cast / fp8_quantize / amax), checked against hand-computed values
and the independent oracles of test_references_quantize.py (hand-decoded code tables, a
brute-force nearest-value search, exact-fraction E8M0 scale rules).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from tealite_verify.references import quantize as ref

from test_references_quantize import (ALL_FMTS, F32, FACTS, FP8_FMTS, MODES, ROUNDINGS,
                                      _floor_log2, _oracle_codes, _oracle_e8m0,
                                      _positive_table, _sign_bit)

FMAX32 = np.finfo(F32).max


def _mx_oracle(x, fmt, mode, rounding, block=32):
    """Block-by-block MX quantization from the definitions: (codes (M, K), scale bytes)."""
    x = np.asarray(x, F32)
    m, k = x.shape
    nb = -(-k // block)
    codes, scales = np.zeros((m, k), np.uint8), np.zeros((m, nb), np.uint8)
    for i in range(m):
        for j in range(nb):
            blk = x[i, j * block:(j + 1) * block]
            b = _oracle_e8m0(np.max(np.abs(blk)), fmt, mode)  # NaN propagates
            scales[i, j] = b
            if b != 0xFF:
                exact = blk.astype(np.float64) / math.ldexp(1.0, b - 127)
                codes[i, j * block:(j + 1) * block] = _oracle_codes(exact, fmt, rounding)[0]
    return codes, scales


def _mx_data(fmt, seed, k=80):
    """Rows: normal, wide-range, table values x 2^k, midpoints x 2^k (exact ties after scaling)."""
    rng = np.random.default_rng(seed)
    _, pvals = _positive_table(fmt)
    sgn = lambda n: rng.choice([-1.0, 1.0], n)  # noqa: E731
    shift = np.repeat(rng.integers(-20, 20, -(-k // 32)), 32)[:k]
    mids = (pvals[:-1] + pvals[1:]) / 2
    rows = [rng.standard_normal(k) * 3,
            sgn(k) * np.exp2(rng.uniform(-30, 30, k)),
            sgn(k) * rng.choice(pvals, k) * np.exp2(shift),
            sgn(k) * rng.choice(mids, k) * np.exp2(shift)]
    return np.array(rows).astype(F32)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mx_quantize_matches_block_oracle(fmt, mode, rounding):
    x = _mx_data(fmt, seed=sum(map(ord, fmt + mode + rounding)))
    bits, scales = ref.mx_quantize(x, fmt, mode, rounding)
    want_bits, want_scales = _mx_oracle(x, fmt, mode, rounding)
    assert bits.dtype == scales.dtype == np.uint8
    assert bits.shape == x.shape and scales.shape == (4, 3)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(bits, want_bits)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
def test_mx_zero_blocks(fmt, mode):
    x = np.zeros((2, 64), F32)
    x[1] = -0.0
    bits, scales = ref.mx_quantize(x, fmt, mode, "rne")
    assert (scales == 0).all()  # amax 0 -> byte 0 (2^-127)
    neg0 = 0 if FACTS[fmt][4] == "fnuz" else _sign_bit(fmt)
    assert (bits[0] == 0).all() and (bits[1] == neg0).all()
    np.testing.assert_array_equal(ref.mx_dequantize(bits, scales, fmt), 0.0)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_mx_nonfinite_poisons_only_its_block(fmt, mode, bad):
    x = _mx_data(fmt, seed=7, k=96)
    clean_bits, clean_scales = ref.mx_quantize(x, fmt, mode, "rne")
    x[0, 40], x[2, 95] = bad, bad
    bits, scales = ref.mx_quantize(x, fmt, mode, "rne")
    assert scales[0, 1] == 0xFF and scales[2, 2] == 0xFF
    assert (bits[0, 32:64] == 0).all() and (bits[2, 64:96] == 0).all()  # unspecified: 0
    poisoned = np.zeros(scales.shape, bool)
    poisoned[0, 1] = poisoned[2, 2] = True
    np.testing.assert_array_equal(scales[~poisoned], clean_scales[~poisoned])
    keep = ~np.repeat(poisoned, 32, axis=1)
    np.testing.assert_array_equal(bits[keep], clean_bits[keep])
    deq = ref.mx_dequantize(bits, scales, fmt)
    assert np.isnan(deq[~keep]).all() and np.isfinite(deq[keep]).all()


def _overflowing_amax(fmt):
    """Above max but below the next power of two: FLOOR gives the same exponent as max."""
    fmax, emax = FACTS[fmt][5], FACTS[fmt][6]
    return (fmax + 2.0 ** (emax + 1)) / 2  # e4m3 480, e5m2 61440, e4m3fnuz 248, e2m1 7


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("shift", [0, 5, -9])
def test_mx_floor_saturates_ceil_rceil_do_not(fmt, shift):
    a = _overflowing_amax(fmt) * 2.0 ** shift
    x = np.zeros((2, 32), F32)
    x[0, 3], x[1, 7], x[1, 8] = a, -a, 2.0 ** shift
    max_code = _positive_table(fmt)[0][-1]
    for rounding in ROUNDINGS:
        bits, scales = ref.mx_quantize(x, fmt, "floor", rounding)
        assert (scales == 127 + shift).all()  # a / 2^shift > max: element saturates
        assert bits[0, 3] == max_code and bits[1, 7] == max_code | _sign_bit(fmt)
        for mode in ("ceil", "rceil"):
            bits, scales = ref.mx_quantize(x, fmt, mode, rounding)
            assert (scales == 128 + shift).all()
            assert bits[0, 3] != max_code


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", ["ceil", "rceil"])
def test_mx_ceil_rceil_never_need_saturation(fmt, mode):
    fmax, emax = FACTS[fmt][5], FACTS[fmt][6]
    ks = np.arange(-100, 100)
    edge = np.ldexp(fmax, ks).astype(F32)
    amaxes = np.concatenate([edge, np.nextafter(edge, F32(np.inf)), np.nextafter(edge, F32(0)),
                             np.exp2(np.random.default_rng(3).uniform(-100, 100, 200))])
    x = np.zeros((amaxes.size, 32), F32)
    x[:, 0], x[:, 1] = amaxes, -amaxes.astype(F32)
    bits, scales = ref.mx_quantize(x, fmt, mode, "rne")
    scaled = ref.mx_scaled_values(x, scales)
    if mode == "ceil":
        assert (np.abs(scaled) <= 2.0 ** emax).all()
    raw = ref.codes_to_bits(ref.round_elements(scaled.astype(F32), fmt, saturate=False))
    np.testing.assert_array_equal(raw, bits)  # no clamping was needed anywhere
    assert np.isfinite(ref.decode(bits, fmt)).all()


@pytest.mark.parametrize("mode", ["floor", "even"])
def test_mx_subnormal_elements_e4m3_by_hand(mode):
    vals = [448, 2**-9, 2**-10, 3 * 2**-10, -2**-10, 2**-11, -3 * 2**-10, 7 * 2**-10, 5 * 2**-10]
    want = {"rne": [0x7E, 0x01, 0x00, 0x02, 0x80, 0x00, 0x82, 0x04, 0x02],
            "ties_away": [0x7E, 0x01, 0x01, 0x02, 0x81, 0x00, 0x82, 0x04, 0x03]}
    for shift in (0, 10, -100):
        x = np.zeros((1, 32), F32)
        x[0, :9] = np.array(vals) * 2.0 ** shift
        for rounding in ROUNDINGS:
            bits, scales = ref.mx_quantize(x, "e4m3", mode, rounding)
            assert scales.tolist() == [[127 + shift]]
            assert bits[0, :9].tolist() == want[rounding]
    assert ref.decode(np.array([1, 2, 4], np.uint8), "e4m3").tolist() == [2**-9, 2**-8, 2**-7]


@pytest.mark.parametrize("mode", ["floor", "even"])
def test_mx_e2m1_by_hand(mode):
    # NUMERICS.md examples (scale 1): 1.25, 2.5, 5.0 -> RNE 1, 2, 4; ties-away 1.5, 3, 6
    vals = [6.0, 0.25, 0.75, 0.5, -0.25, 1.25, 2.5, 5.0, -5.0, 0.0, -0.0, 5.5]
    want = {"rne": [7, 0, 2, 1, 8, 2, 4, 6, 14, 0, 8, 7],
            "ties_away": [7, 1, 2, 1, 9, 3, 5, 7, 15, 0, 8, 7]}
    x = np.zeros((1, 32), F32)
    x[0, :12] = vals
    for rounding in ROUNDINGS:
        bits, scales = ref.mx_quantize(x, "e2m1", mode, rounding)
        assert scales.tolist() == [[127]] and bits[0, :12].tolist() == want[rounding]


@pytest.mark.parametrize("fmt", ALL_FMTS)
def test_mx_negative_zero_and_underflow(fmt):
    x = np.zeros((1, 32), F32)
    x[0, :4] = [-0.0, 1.0, -2.0 ** -40, 0.0]
    neg0 = 0 if FACTS[fmt][4] == "fnuz" else _sign_bit(fmt)
    for mode in MODES:
        bits, _ = ref.mx_quantize(x, fmt, mode, "rne")
        assert bits[0, [0, 2, 3]].tolist() == [neg0, neg0, 0]


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("mode", MODES)
def test_mx_partial_last_block(fmt, mode):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal((3, 32)) * 100, rng.standard_normal((3, 8)) / 100],
                       axis=1).astype(F32)
    bits, scales = ref.mx_quantize(x, fmt, mode, "rne")
    assert bits.shape == (3, 40) and scales.shape == (3, 2)
    for i in range(3):
        assert scales[i, 1] == _oracle_e8m0(np.abs(x[i, 32:]).max(), fmt, mode)
        assert scales[i, 0] == _oracle_e8m0(np.abs(x[i, :32]).max(), fmt, mode)
    padded = np.concatenate([x, np.zeros((3, 24), F32)], axis=1)
    pbits, pscales = ref.mx_quantize(padded, fmt, mode, "rne")
    np.testing.assert_array_equal(pscales, scales)
    np.testing.assert_array_equal(pbits[:, :40], bits)
    for k in (1, 33):
        b, s = ref.mx_quantize(x[:, :k], fmt, mode, "rne")
        assert b.shape == (3, k) and s.shape == (3, -(-k // 32))
        assert s[0, -1] == _oracle_e8m0(np.abs(x[0, (k - 1) // 32 * 32:k]).max(), fmt, mode)
    b, s = ref.mx_quantize(np.zeros((3, 0), F32), fmt, mode, "rne")
    assert b.shape == (3, 0) and s.shape == (3, 0)
    # a zero or tiny partial block: padding must not leak into its amax
    x[0, 32:], x[1, 32:], x[2, 32:] = 0.0, 2.0 ** -130, -(2.0 ** -126)
    _, s = ref.mx_quantize(x, fmt, mode, "rne")
    assert s[:, 1].tolist() == [0] + [_oracle_e8m0(v, fmt, mode) for v in (2.0**-130, 2.0**-126)]


def test_pack_unpack_e2m1():
    assert ref.pack_e2m1(np.array([1, 2, 3, 4, 5], np.uint8)).tolist() == [0x21, 0x43, 0x05]
    assert ref.pack_e2m1(np.array([[0xF, 0x8]], np.uint8)).tolist() == [[0x8F]]
    assert ref.unpack_e2m1(np.array([0x21, 0x43, 0x05], np.uint8), 5).tolist() == [1, 2, 3, 4, 5]
    rng = np.random.default_rng(0)
    for k in (1, 7, 8, 33):
        c = rng.integers(0, 16, (3, k), dtype=np.uint8)
        p = ref.pack_e2m1(c)
        assert p.dtype == np.uint8 and p.shape == (3, (k + 1) // 2)
        np.testing.assert_array_equal(p & 0x0F, c[:, 0::2])  # low nibble = even element
        if k % 2:
            assert (p[:, -1] >> 4 == 0).all()  # odd K: zero high nibble
        np.testing.assert_array_equal(ref.unpack_e2m1(p, k), c)
    bits, _ = ref.mx_quantize(_mx_data("e2m1", 1, k=33), "e2m1", "floor", "rne")
    assert bits.max() <= 15  # mx_quantize returns unpacked codes
    np.testing.assert_array_equal(ref.unpack_e2m1(ref.pack_e2m1(bits), 33), bits)


@pytest.mark.parametrize("fmt", ALL_FMTS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mx_dequantize_error_bound(fmt, mode, rounding):
    x = _mx_data(fmt, seed=11)
    bits, scales = ref.mx_quantize(x, fmt, mode, rounding)
    deq = ref.mx_dequantize(bits, scales, fmt)
    s = np.repeat(np.ldexp(1.0, scales.astype(int) - 127), 32, axis=1)[:, :x.shape[1]]
    np.testing.assert_array_equal(deq, ref.decode(bits, fmt) * s)
    x64 = x.astype(np.float64)
    _, pvals = _positive_table(fmt)
    y = np.abs(x64) / s
    sat = y > FACTS[fmt][5]
    assert not sat.any() or mode in ("floor", "even")  # EVEN: amax in (448, 464) -> 448
    np.testing.assert_array_equal(deq[sat], np.copysign(FACTS[fmt][5], x64[sat]) * s[sat])
    hi = np.clip(np.searchsorted(pvals, y[~sat]), 0, len(pvals) - 1)
    lo = np.where(pvals[hi] == y[~sat], hi, hi - 1)
    half_step = 0.5 * (pvals[hi] - pvals[lo]) * s[~sat]
    assert (np.abs(deq[~sat] - x64[~sat]) <= half_step).all()
    assert not (np.signbit(deq) != np.signbit(x64))[deq != 0].any()


# ==== FP8 with fp32 scales =====================================================================

@pytest.mark.parametrize("fmt", FP8_FMTS)
def test_te_scale_from_amax(fmt):
    fmax = F32(FACTS[fmt][5])
    s = ref.te_scale_from_amax(np.array([0.0, -0.0, np.nan, np.inf, 1e-45, 1e-38], F32), fmt)
    assert s.dtype == F32 and s.tolist() == [1.0, 1.0, 1.0, 1.0, FMAX32, FMAX32]
    a = np.exp2(np.random.default_rng(2).uniform(-30, 30, 500)).astype(F32)
    np.testing.assert_array_equal(ref.te_scale_from_amax(a, fmt), fmax / a)  # fp32 division
    assert ref.te_scale_from_amax(F32(2.0), fmt) == FACTS[fmt][5] / 2
    # amax_epsilon clamps amax from below (so amax 0 with eps > 0 is max / eps, not 1)
    e = ref.te_scale_from_amax(np.array([0.0, 0.25, 0.5, 1.0, np.nan], F32), fmt,
                               amax_epsilon=0.5)
    np.testing.assert_array_equal(e, [fmax / F32(0.5)] * 3 + [fmax, 1.0])


def test_te_scale_fnuz_uses_240():
    assert ref.te_scale_from_amax(F32(1.0), "e4m3fnuz") == 240.0
    assert ref.te_scale_from_amax(F32(2.0), "e4m3fnuz") == 120.0
    assert ref.te_scale_from_amax(F32(1.0), "e4m3") == 448.0
    x = np.array([[1.0, -1.0, 0.5, 0.25]], F32)
    bits, sinv, a = ref.fp8_quantize(x, "e4m3fnuz", "tensor")
    assert sinv.tolist() == [F32(1) / F32(240)] and a.tolist() == [1.0]
    assert bits[0].tolist() == [0x7F, 0xFF, 0x77, 0x6F]  # +-240, 120, 60
    np.testing.assert_array_equal(ref.decode(bits, "e4m3fnuz")[0], [240, -240, 120, 60])


@pytest.mark.parametrize("fmt", FP8_FMTS)
def test_te_scale_force_pow2_rounds_down(fmt):
    fmax = FACTS[fmt][5]
    a = np.array([fmax / 300 * 448, 1.0, fmax / 128, fmax, 1e-3, 1e-45, 0.0, 3.0, fmax * 4],
                 F32)
    got = ref.te_scale_from_amax(a, fmt, force_pow2=True)
    plain = ref.te_scale_from_amax(a, fmt)
    want = [float(2.0 ** _floor_log2(Fraction(float(p)))) for p in plain]
    np.testing.assert_array_equal(got, want)
    assert got[2] == 128.0 and got[3] == 1.0 and got[8] == 0.25  # exact powers stay
    assert got[5] == 2.0 ** 127 and got[6] == 1.0
    assert (got <= plain).all() and (got > plain / 2).all()


def _f32_product_flip(fmt, target):
    """(x, s) whose exact product is just above the tie ``target`` but whose fp32 product is
    exactly the tie (so RNE of the fp32 product differs from RNE of the exact product)."""
    rng = np.random.default_rng(0)
    for _ in range(10000):
        s = F32(rng.uniform(1.0, 2.0))
        x = F32(target / float(s))
        exact = Fraction(float(x)) * Fraction(float(s))
        if x * s == F32(target) and exact > target:
            return x, s
    raise AssertionError("no example found")


@pytest.mark.parametrize("fmt,target,lo,hi", [("e4m3", 1.0625, 0x38, 0x39),
                                              ("e5m2", 1.125, 0x3C, 0x3D),
                                              ("e4m3fnuz", 1.0625, 0x40, 0x41)])
def test_scaled_cast_rounds_product_in_float32(fmt, target, lo, hi):
    x, s = _f32_product_flip(fmt, target)
    p64 = float(x) * float(s)  # exact: 24 + 24 bits fit a double
    assert p64 > target and F32(x) * F32(s) == F32(target)
    assert _oracle_codes([p64], fmt)[0][0] == hi and _oracle_codes([target], fmt)[0][0] == lo
    assert ref.scaled_cast(np.array([x, -x], F32), s, fmt).tolist() == [lo, lo | 0x80]


@pytest.mark.parametrize("fmt", FP8_FMTS)
def test_scaled_cast_random(fmt):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(3000) * np.exp2(rng.integers(-12, 12, 3000))).astype(F32)
    s = F32(FACTS[fmt][5]) / F32(np.abs(x).max() / 4)  # a quarter of the values saturate
    got = ref.scaled_cast(x, s, fmt)
    want, kind = _oracle_codes((x * s).astype(np.float64), fmt)
    assert (kind == 0).all()
    np.testing.assert_array_equal(got, want)


def _expand(s, bm, bn, m, k):
    return s[np.arange(m)[:, None] // bm, np.arange(k)[None, :] // bn]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2fnuz"])
@pytest.mark.parametrize("gran,block,shape", [("tensor", None, (1,)), ("row", None, (257,)),
                                              ("block", (1, 128), (257, 2)),
                                              ("block", (128, 128), (3, 2))])
@pytest.mark.parametrize("pow2", [False, True])
def test_fp8_quantize_granularities(fmt, gran, block, shape, pow2):
    rng = np.random.default_rng(6)
    m, k = 257, 129
    x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-8, 8, (m, 1)))).astype(F32)
    x[256, 128] = 1e-3  # alone in its edge block for both block shapes
    x[256, 127] = 1e-4
    x[:128, :128] *= 1000  # so the edge blocks' amaxes differ from their neighbours'
    bits, sinv, a = ref.fp8_quantize(x, fmt, gran, force_pow2=pow2, block=block)
    assert bits.shape == (m, k) and sinv.shape == a.shape == shape
    assert sinv.dtype == a.dtype == F32
    bm, bn = {"tensor": (m, k), "row": (1, k)}.get(gran, block)
    want_a = np.array([[np.abs(x[i:i + bm, j:j + bn]).max() for j in range(0, k, bn)]
                       for i in range(0, m, bm)], F32)
    np.testing.assert_array_equal(a, want_a.reshape(shape))
    if block:
        assert a[-1, -1] == F32(1e-3)
        z = x.copy()
        z[256, 128] = 0.0  # an all-zero edge block: amax 0 -> scale 1 (padding must not leak)
        _, zsinv, za = ref.fp8_quantize(z, fmt, gran, force_pow2=pow2, block=block)
        assert za[-1, -1] == 0 and zsinv[-1, -1] == 1.0
    fmax = F32(FACTS[fmt][5])
    s = fmax / want_a
    if pow2:
        s = np.array([[2.0 ** _floor_log2(Fraction(float(v))) for v in r] for r in s], F32)
    np.testing.assert_array_equal(sinv, (F32(1) / s).reshape(shape))
    prod = (x * _expand(s, bm, bn, m, k)).astype(np.float64)
    want, kind = _oracle_codes(prod, fmt)
    np.testing.assert_array_equal(bits.ravel(), want)


@pytest.mark.parametrize("fmt", FP8_FMTS)
def test_fp8_quantize_given_scale(fmt):
    x = np.array([[1.0, -3.0, 0.1], [200.0, 0.0, -2e5]], F32)
    bits, sinv, a = ref.fp8_quantize(x, fmt, "given", scale=np.array([3.0], F32))
    assert a.tolist() == [2e5] and sinv.tolist() == [F32(1) / F32(3)]
    np.testing.assert_array_equal(bits.ravel(), _oracle_codes((x * F32(3)).ravel(), fmt)[0])
    assert bits[1, 2] == _positive_table(fmt)[0][-1] | 0x80  # -6e5 saturates to -max
    raw, _, _ = ref.fp8_quantize(x, fmt, "given", scale=np.array([3.0], F32), saturate=False)
    over = ref.decode(raw, fmt)[1, 2]
    assert over == -np.inf if fmt == "e5m2" else np.isnan(over)


def test_amax_nan_propagation_and_empty():
    x = np.array([[1.0, np.nan, -2.0], [-5.0, 3.0, 0.0], [-np.inf, 1.0, 2.0]], F32)
    assert np.isnan(ref.amax(x))
    r = ref.amax(x, axis=1)
    assert np.isnan(r[0]) and r[1:].tolist() == [5.0, np.inf] and r.dtype == F32
    assert np.isnan(ref.block_amax(x, (1, 2))[0, 0])
    assert ref.block_amax(x, (2, 2)).tolist()[1] == [np.inf, 2.0]
    assert ref.amax(np.zeros((0,), F32)).shape == () and ref.amax(np.zeros(0, F32)) == 0
    assert ref.amax(np.zeros((0, 4), F32), axis=1).shape == (0,)
    np.testing.assert_array_equal(ref.amax(np.zeros((3, 0), F32), axis=1), np.zeros(3))
    np.testing.assert_array_equal(ref.amax(np.zeros((3, 0), F32), axis=0), np.zeros(0))
    bits, sinv, a = ref.fp8_quantize(np.zeros((0, 16), F32), "e4m3", "tensor")
    assert bits.shape == (0, 16) and sinv.tolist() == [1.0] and a.tolist() == [0.0]
    bits, sinv, a = ref.fp8_quantize(np.zeros((3, 0), F32), "e4m3", "row")
    assert sinv.tolist() == [1.0] * 3 and a.tolist() == [0.0] * 3
    bits, sinv, a = ref.fp8_quantize(x, "e4m3", "tensor")  # NaN amax -> scale 1
    assert np.isnan(a[0]) and sinv.tolist() == [1.0]
    assert np.isnan(ref.decode(bits, "e4m3")[0, 1]) and bits[1, 2] == 0
    bits, sinv, a = ref.fp8_quantize(x, "e4m3", "row")
    assert sinv.tolist() == [1.0, F32(1) / (F32(448) / F32(5)), 1.0]  # Inf amax -> 1


@pytest.mark.parametrize("fmt,a,byte,code", [
    ("e4m3", 456.0, 127, 0x7E), ("e4m3", 495.0, 127, 0x7E), ("e4m3", 496.0, 128, 0x78),
    ("e2m1", 6.5, 127, 0x7), ("e2m1", 7.0, 128, 0x6)])
def test_mx_even_saturates_below_its_rounding_threshold(fmt, a, byte, code):
    # EVEN rounds amax half-up at the element's mantissa width, then FLOORs: 456 and 495 keep
    # exponent 8 (so they saturate to 448); 496 = 1.1111b * 2^8 carries to 2^9 (248: the tie
    # 240 / 256 goes to the even code 0x78).  E2M1: 6.5 -> 6 saturates, 7 -> 8 does not.
    x = np.zeros((1, 32), F32)
    x[0, 0] = a
    bits, scales = ref.mx_quantize(x, fmt, "even", "rne")
    assert scales.tolist() == [[byte]] and bits[0, 0] == code
