"""Tolerance primitives: ulp, unit_roundoff, gamma, overflow_threshold, compare_exact,
compare_bounded (and the Metrics it returns), with_output_rounding.

The tiers on crafted data and the pairwise checks are in test_tolerance_tiers.py; deliberately
wrong backends, end to end through the registry, in test_seeded_wrong_backends.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

from tealite_verify.tiers import bounded as TB
from tealite_verify.tiers import exact as TE
from tealite_verify.tiers import gemm as TG
from tealite_verify.tiers import primitives as TPR
from tealite_verify.tiers import ulp as TU
from tealite_verify.tiers.metrics import Tier

from _helpers_tolerance import BF16, FP16, FP32, FP64, _round_once

@pytest.mark.parametrize("dtype,mant,emin", [(FP32, 23, -126), (BF16, 7, -126), (FP16, 10, -14)])
def test_ulp_normal_range(dtype, mant, emin):
    assert TPR.ulp(dtype, 1.0) == 2.0**-mant
    assert TPR.ulp(dtype, -1.0) == 2.0**-mant
    largest_below_2 = 2.0 - 2.0**-mant  # the representable neighbour of 2.0 from below
    assert float(torch.tensor(largest_below_2, dtype=dtype)) == largest_below_2
    assert TPR.ulp(dtype, largest_below_2) == 2.0**-mant
    assert TPR.ulp(dtype, np.nextafter(2.0, 0.0)) == 2.0**-mant  # any real just below 2
    assert TPR.ulp(dtype, 2.0) == 2.0**(1 - mant)
    assert TPR.ulp(dtype, 0.75) == 2.0**(-1 - mant)
    # Smallest normal: spacing 2^(emin - mant), the same as the subnormal spacing.
    assert TPR.ulp(dtype, 2.0**emin) == 2.0**(emin - mant)
    # Agrees with the real format's spacing (torch.nextafter) over many binades.
    t = torch.tensor([2.0**e * m for e in range(emin, 15) for m in (1.0, 1.3, 1.99)], dtype=dtype)
    up = torch.nextafter(t, torch.full_like(t, math.inf))
    np.testing.assert_array_equal(TPR.ulp(dtype, t.double().numpy()),
                                  (up.double() - t.double()).numpy())


@pytest.mark.parametrize("dtype,sub_spacing", [(FP16, 2.0**-24), (BF16, 2.0**-133),
                                               (FP32, 2.0**-149)])
def test_ulp_zero_and_subnormal(dtype, sub_spacing):
    tiny = torch.finfo(dtype).tiny
    vals = np.array([0.0, -0.0, sub_spacing, 3 * sub_spacing, tiny / 2, tiny * (1 - 2.0**-20)])
    np.testing.assert_array_equal(TPR.ulp(dtype, vals), np.full(vals.shape, sub_spacing))
    # The smallest positive subnormal is exactly that spacing in the real format.
    assert float(torch.tensor(sub_spacing, dtype=torch.float64).to(dtype)) == sub_spacing
    assert float(torch.tensor(sub_spacing / 4, dtype=torch.float64).to(dtype)) == 0.0


def test_ulp_is_elementwise_and_shape_preserving():
    v = np.array([[1.0, 2.0], [0.0, -4.0]])
    out = TPR.ulp(BF16, v)
    assert out.shape == v.shape
    np.testing.assert_array_equal(out, [[2.0**-7, 2.0**-6], [2.0**-133, 2.0**-5]])


def test_unit_roundoff():
    assert TPR.unit_roundoff(FP64) == 2.0**-53
    assert TPR.unit_roundoff(FP32) == 2.0**-24
    assert TPR.unit_roundoff(BF16) == 2.0**-8
    assert TPR.unit_roundoff(FP16) == 2.0**-11
    assert TPR.unit_roundoff("tf32") == 2.0**-11
    with pytest.raises(ValueError):
        TPR.unit_roundoff(torch.int32)


def test_gamma():
    u = 2.0**-24
    assert TPR.gamma(0, u) == 0.0
    assert TPR.gamma(1, u) == pytest.approx(u / (1 - u), rel=1e-15)
    assert TPR.gamma(4096, u) == pytest.approx(4096 * u / (1 - 4096 * u), rel=1e-15)
    assert TPR.gamma(4096, u) > 4096 * u  # strictly above the first-order term
    np.testing.assert_allclose(TPR.gamma(np.array([1, 10]), 2.0**-8),
                               [2.0**-8 / (1 - 2.0**-8), 10 * 2.0**-8 / (1 - 10 * 2.0**-8)])
    assert TPR.gamma(256, 2.0**-8) == np.inf  # n u = 1: the bound is vacuous
    assert TPR.gamma(1000, 2.0**-8) == np.inf


def test_overflow_threshold():
    assert TPR.overflow_threshold(FP16) == 65520.0
    assert TPR.overflow_threshold(BF16) == (2 - 2.0**-8) * 2.0**127
    assert TPR.overflow_threshold(FP32) == (2 - 2.0**-24) * 2.0**127
    # It really is the round-to-nearest boundary: just below stays finite (the largest finite
    # value), the threshold itself (a tie with an odd last bit) goes to infinity.
    for dt in (FP16, BF16, FP32):
        thr = TPR.overflow_threshold(dt)
        below = torch.tensor([np.nextafter(thr, 0)], dtype=FP64)
        assert float(_round_once(below, dt)) == torch.finfo(dt).max
        assert math.isinf(float(_round_once(torch.tensor([thr], dtype=FP64), dt)))


# ---- compare_exact -------------------------------------------------------------------------

def _nan_with_payload(dtype, payload):
    bits = {FP32: (torch.int32, 0x7FC00000), BF16: (torch.int16, 0x7FC0),
            FP16: (torch.int16, 0x7E00)}[dtype]
    return torch.tensor([bits[1] | payload], dtype=bits[0]).view(dtype)


@pytest.mark.parametrize("dtype", [FP32, BF16, FP16])
def test_compare_exact_signed_zero_and_nan(dtype):
    pz, nz = torch.tensor([0.0], dtype=dtype), torch.tensor([-0.0], dtype=dtype)
    assert TE.compare_exact(pz, pz.clone()).passed
    m = TE.compare_exact(pz, nz)
    assert not m.passed and m.mismatches == 1 and m.max_ratio == math.inf

    n1, n2 = _nan_with_payload(dtype, 0), _nan_with_payload(dtype, 1)
    assert torch.isnan(n1).all() and torch.isnan(n2).all()
    assert TE.compare_exact(n1, n2).passed  # any NaN matches any NaN by default
    m = TE.compare_exact(n1, n2, nan_payload=True)
    assert not m.passed and m.mismatches == 1 and m.nonfinite_mismatches == 1
    assert TE.compare_exact(n1, n1.clone(), nan_payload=True).passed
    # NaN vs a number never matches.
    assert not TE.compare_exact(n1, torch.tensor([1.0], dtype=dtype)).passed


def test_compare_exact_values_ints_and_metrics():
    a = torch.tensor([1, 2, 3, 4], dtype=torch.int8)
    e = torch.tensor([1, 2, 5, 4], dtype=torch.int8)
    m = TE.compare_exact(a, e)
    assert not m.passed and m.mismatches == 1 and m.worst_index == (2,)
    assert (m.worst_actual, m.worst_expected) == (3.0, 5.0)
    assert TE.compare_exact(a, a.clone()).passed
    # Floats: one bit apart is a mismatch, even though it is a tiny numerical difference.
    x = torch.tensor([1.0, 2.0], dtype=BF16)
    y = x.clone()
    y.view(torch.int16)[1] += 1
    m = TE.compare_exact(x, y)
    assert m.mismatches == 1 and m.worst_index == (1,) and m.worst_expected == 2.0 + 2.0**-6
    # numpy float arrays work too (NaN-aware).
    assert TE.compare_exact(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])).passed


def test_compare_exact_numpy_bfloat16_nan_aware():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    n1 = np.array([0x7FC0], dtype=np.uint16).view(ml_dtypes.bfloat16)
    n2 = np.array([0x7FC1], dtype=np.uint16).view(ml_dtypes.bfloat16)
    assert np.isnan(n1.astype(np.float64)).all() and np.isnan(n2.astype(np.float64)).all()
    assert TE.compare_exact(n1, n2).passed


def test_compare_exact_shape_mismatch():
    m = TE.compare_exact(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not m.passed and m.shape_error and "(2, 3)" in m.shape_error
    assert "(2, 3)" in m.summary()


def test_compare_exact_rejects_different_element_types():
    # Same bits, different types: not "exact" (a kernel returning int32 codes for uint8 is a bug).
    one_f = torch.tensor([1.0], dtype=torch.float32)
    one_i = torch.tensor([1065353216], dtype=torch.int32)
    m = TE.compare_exact(one_f, one_i)
    assert not m.passed and "element type" in m.shape_error
    assert not TE.compare_exact(np.array([1, 2], np.int16), np.array([1, 2], np.int32)).passed
    assert TE.compare_exact(np.array([1, 2], np.int16), np.array([1, 2], np.int16)).passed


# ---- compare_bounded -----------------------------------------------------------------------

def test_compare_bounded_nan_inf_rules():
    nan, inf = math.nan, math.inf
    # (actual, expected, tol, passes)
    rows = [
        (nan, 1.0, 1.0, False),   # NaN vs number
        (1.0, nan, 1.0, False),   # number vs NaN
        (nan, nan, 0.0, True),    # both NaN
        (inf, inf, 0.0, True),    # same-sign inf
        (-inf, -inf, 0.0, True),
        (-inf, inf, 0.0, False),  # opposite-sign inf
        (65504.0, inf, 1e9, False),  # finite vs inf reference, whatever tol
        (inf, 1.0, 0.5, False),   # spurious overflow
        (nan, inf, 0.0, False),
    ]
    a = torch.tensor([r[0] for r in rows], dtype=FP16)
    e = np.array([r[1] for r in rows])
    tol = np.array([r[2] for r in rows])
    m = TB.compare_bounded(a, e, tol, FP16)
    # Check element by element (so a failure names the row).
    for i, (av, ev, tv, want) in enumerate(rows):
        mi = TB.compare_bounded(a[i:i + 1], e[i:i + 1], tol[i:i + 1], FP16)
        assert mi.passed == want, (av, ev, tv, mi.summary())
    assert m.mismatches == sum(not r[3] for r in rows)
    assert m.nonfinite_mismatches == m.mismatches
    assert m.max_ratio == math.inf


def test_compare_bounded_overflow_threshold():
    thr = TPR.overflow_threshold(FP16)  # 65520
    inf = torch.tensor([math.inf], dtype=FP16)
    fmax = torch.tensor([65504.0], dtype=FP16)
    # Reference well beyond the threshold (by more than tol): only +inf is right.
    assert TB.compare_bounded(inf, np.array([70000.0]), 8.0, FP16).passed
    m = TB.compare_bounded(fmax, np.array([70000.0]), 8.0, FP16)
    assert not m.passed and m.mismatches == 1
    # A band wide enough to reach back below the threshold straddles it: both are accepted.
    assert TB.compare_bounded(fmax, np.array([70000.0]), 5000.0, FP16).passed
    assert TB.compare_bounded(inf, np.array([70000.0]), 5000.0, FP16).passed
    assert not TB.compare_bounded(-inf, np.array([70000.0]), 8.0, FP16).passed  # wrong sign
    assert TB.compare_bounded(-inf, np.array([-70000.0]), 8.0, FP16).passed
    # Band straddling the threshold: either the finite value (within tol) or inf.
    e = np.array([thr - 4.0])
    assert TB.compare_bounded(fmax, e, 16.0, FP16).passed
    assert TB.compare_bounded(inf, e, 16.0, FP16).passed
    # Band entirely below the threshold: inf is wrong.
    assert not TB.compare_bounded(inf, np.array([65000.0]), 16.0, FP16).passed
    # A float64 out dtype has no overflow rule: inf vs a huge finite value fails.
    assert not TB.compare_bounded(torch.tensor([math.inf], dtype=FP64), np.array([1e300]), 1.0,
                                 FP64).passed


def test_compare_bounded_metrics_fields():
    expected = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    actual = torch.tensor([[1.0, 2.25, 3.0], [4.0, 5.0, 7.5]], dtype=FP32)
    tol = np.array([[0.1, 0.5, 0.1], [0.0, 0.1, 0.5]])
    m = TB.compare_bounded(actual, expected, tol, FP32, tier="ulp")
    assert m.tier is Tier.ULP and m.numel == 6
    assert m.mismatches == 1  # only (1, 2): 1.5 > 0.5; (0, 1): 0.25 <= 0.5
    assert m.max_abs_err == 1.5
    assert m.max_ratio == 3.0
    assert m.worst_index == (1, 2)
    assert (m.worst_actual, m.worst_expected, m.worst_tol) == (7.5, 6.0, 0.5)
    assert m.nonfinite_mismatches == 0 and not m.passed
    d = m.to_dict()
    assert d["passed"] is False and d["worst_index"] == [1, 2]
    assert "1/6 mismatched" in m.summary()
    # Passing case: worst element is the largest ratio (<= 1); zero tol + zero error is fine.
    ok = TB.compare_bounded(torch.tensor(expected, dtype=FP32), expected, 0.0, FP32)
    assert ok.passed and ok.max_ratio == 0.0 and ok.max_abs_err == 0.0
    m2 = TB.compare_bounded(actual, expected, 1.5, FP32)
    assert m2.passed and m2.max_ratio == 1.0 and m2.worst_index == (1, 2)
    # Shape mismatch and empty tensors.
    bad = TB.compare_bounded(torch.zeros(3), np.zeros(4), 1.0, FP32)
    assert not bad.passed and bad.shape_error
    empty = TB.compare_bounded(torch.zeros(0, 5), np.zeros((0, 5)), 1.0, FP32)
    assert empty.passed and empty.numel == 0


def test_with_output_rounding_and_elementwise_bound_shape():
    ref = np.array([1.0, 1.5, 2.0 - 2.0**-9, 0.0])
    tol = TU.with_output_rounding(ref, 0.0, BF16)
    np.testing.assert_array_equal(tol, [2.0**-8, 2.0**-8, 2.0**-8, 2.0**-134])
    # Compute error pushes |ref| + e into the next binade: the larger ULP is used.
    tol = TU.with_output_rounding(np.array([2.0 - 2.0**-9]), 2.0**-8, BF16)
    assert tol[0] == 0.5 * 2.0**-6 + 2.0**-8
    tol2 = TU.with_output_rounding(ref, 0.0, BF16, roundings=2)
    np.testing.assert_array_equal(tol2[:3], [2.0**-7] * 3)


def test_alignment_floor_covers_the_measured_h100_subnormal_fp16_dot_only_when_declared():
    """Measured on an H100 (ci/device_probes.py): an fp16 dot of [5 * 2^-24, 1023 * 2^-24] and
    [0.75, 2^-20] gave 2.2357471607392654e-07 for the exact 2.2357556872520945e-07.  The base
    tensor-core model (truncating fp32 accumulation) cannot explain that; the declared
    ``alignment_floor`` (subnormal operands aligned at the smallest normal exponent) does, and
    it changes nothing for normal operands."""
    from tealite_verify.tiers import bounded as TB
    from tealite_verify.tiers import exact as TE
    from tealite_verify.tiers import gemm as TG
    from tealite_verify.tiers import primitives as TPR
    from tealite_verify.tiers import ulp as TU
    a = np.array([[5 * 2.0 ** -24, 1023 * 2.0 ** -24]])
    b = np.array([[0.75], [2.0 ** -20]])
    p = a @ b
    got = 2.2357471607392654e-07
    base = Numerics(accumulator_unit_roundoff=2.0 ** -23)
    floored = base.with_(alignment_floor=torch.float16)
    err = abs(got - p[0, 0])
    plain = TG.gemm_error(np.abs(a) @ np.abs(b), p, 2, base)[0, 0]
    aligned = TG.gemm_error(TG.aligned_magnitude(a, torch.float16)
                           @ TG.aligned_magnitude(b, torch.float16), p, 2, floored)[0, 0]
    assert err > plain and err <= aligned
    normal = np.array([[1.5, -3.0]])
    assert np.array_equal(TG.aligned_magnitude(normal, torch.float16), np.abs(normal))
    assert TG.aligned_magnitude(np.array([0.0]), torch.float16)[0] == 0.0


def _ulp_by_frexp(dtype, value):
    """The spacing written the slow, obvious way (frexp / ldexp): the oracle for ulp's bit
    reading, including its documented Inf / NaN / float64-subnormal conventions."""
    mant, emin = TPR._fmt(dtype)
    v = np.abs(np.asarray(value, dtype=np.float64))
    _, exp = np.frexp(v)
    e = np.maximum(np.where(v > 0, exp - 1, emin), emin)
    return np.ldexp(1.0, (e - mant).astype(np.int64))


@pytest.mark.parametrize("dtype", [FP64, FP32, BF16, FP16, "tf32"])
def test_ulp_bit_reading_matches_frexp(dtype):
    rng = np.random.default_rng(7)
    vals = np.concatenate([
        rng.standard_normal(500) * 2.0 ** rng.integers(-160, 160, 500),
        [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
         math.inf, -math.inf, math.nan, 65504.0, 65520.0, 2.0**-126, 2.0**-14, 2.0**-149]])
    np.testing.assert_array_equal(TPR.ulp(dtype, vals), _ulp_by_frexp(dtype, vals))
    assert TPR.ulp(dtype, 3.0) == _ulp_by_frexp(dtype, 3.0)  # 0-d input too
    # A tensor on the reference device gets the same spacings (float64 tensor).
    on_device = TPR.ulp(dtype, torch.from_numpy(vals))
    assert on_device.dtype == torch.float64
    np.testing.assert_array_equal(on_device.numpy(), _ulp_by_frexp(dtype, vals))


@pytest.mark.parametrize("out_dtype", [FP32, BF16, FP16, FP64])
def test_compare_bounded_fast_path_is_the_general_verdict(out_dtype):
    """Where every element is finite and within tol, compare_bounded takes a short path; it
    must return exactly the Metrics the general path (every NaN / Inf / overflow rule)
    returns, zero and infinite tolerances included, and decline anything else."""
    rng = np.random.default_rng(3)
    e = rng.standard_normal((7, 13)) * 4
    tol = np.abs(rng.standard_normal((7, 13))) * 1e-2
    tol[0, :3] = 0.0
    tol[1, :2] = math.inf
    a = e + rng.uniform(-1, 1, e.shape) * tol
    a[0, :3] = e[0, :3]
    a[1, :2] = e[1, :2] + 1e3
    a = torch.from_numpy(a).to(out_dtype).double().numpy()  # actual lies in out_dtype
    e = a + rng.uniform(-0.5, 0.5, e.shape) * np.where(np.isfinite(tol), tol, 1.0)
    thr = TPR.overflow_threshold(out_dtype) if out_dtype != FP64 else math.inf
    err = np.abs(a - e)
    fast = TB._all_finite_within("ulp", err, tol, a, e, thr)
    assert fast is not None and fast == TB._bounded_general("ulp", err, tol, a, e, thr)
    assert TB.compare_bounded(torch.from_numpy(a), e, tol, out_dtype, tier="ulp") == fast
    # One element out of bound, NaN, or Inf: the short path declines.
    for bad in (e[2, 2] + 1.0, math.nan, math.inf):
        a2 = a.copy()
        a2[2, 2] = bad
        assert TB._all_finite_within("ulp", np.abs(a2 - e), tol, a2, e, thr) is None
    # |a| at or past the overflow threshold (an actual not in out_dtype): declined.
    if out_dtype != FP64:
        big = np.full((2,), thr)
        assert TB._all_finite_within("ulp", np.zeros(2), np.ones(2), big, big, thr) is None


def _same_metrics(x, y) -> bool:
    """Metrics equality with NaN equal to NaN (a NaN worst value is a legitimate report)."""
    dx, dy = x.to_dict(), y.to_dict()
    return dx.keys() == dy.keys() and all(
        dx[k] == dy[k] or (isinstance(dx[k], float) and isinstance(dy[k], float)
                           and math.isnan(dx[k]) and math.isnan(dy[k])) for k in dx)


@pytest.mark.parametrize("out_dtype", [FP32, BF16, FP16])
def test_compare_bounded_on_device_tensors_is_the_host_verdict(out_dtype):
    """Expected and tol as torch float64 tensors (a reference computed on the device): the
    comparison decided there returns exactly the host path's Metrics, and anything not all
    finite and within (an error, NaN / Inf, a shape mismatch) gets the host's general rules."""
    rng = np.random.default_rng(11)
    a = torch.from_numpy(rng.standard_normal((5, 17)) * 3).to(out_dtype)
    tol = np.abs(rng.standard_normal((5, 17))) * 1e-2
    tol[0, :2] = 0.0
    e = a.double().numpy() + rng.uniform(-0.5, 0.5, tol.shape) * tol
    host = TB.compare_bounded(a, e, tol, out_dtype, tier="ulp")
    dev = TB.compare_bounded(a, torch.from_numpy(e), torch.from_numpy(tol), out_dtype, tier="ulp")
    assert host.passed and host.max_ratio > 0 and dev == host
    for bad in (float(e[3, 3]) + 1.0, math.nan, math.inf):
        a2 = a.clone()
        a2[3, 3] = bad
        host = TB.compare_bounded(a2, e, tol, out_dtype, tier="ulp")
        dev = TB.compare_bounded(a2, torch.from_numpy(e), torch.from_numpy(tol), out_dtype,
                                tier="ulp")
        assert not host.passed and _same_metrics(dev, host), bad
    shape = TB.compare_bounded(a[:4], torch.from_numpy(e), torch.from_numpy(tol), out_dtype)
    assert shape.shape_error and not shape.passed


def test_exact_metrics_report_the_value_error_and_the_bit_distance_apart():
    """Issue 13: got 0.0 vs want 0.0103 printed max|err| = 1.009e+09 (the bit distance)."""
    from tealite_verify.tiers.exact import compare_exact
    m = compare_exact(torch.tensor([0.0, 1.0]), torch.tensor([0.0103, 1.0]))
    assert not m.passed and m.max_abs_err == pytest.approx(0.0103, rel=1e-6)
    assert m.max_bit_distance == 0x3C28C155 and "max bit distance=1009303893" in m.summary()
    ok = compare_exact(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert ok.passed and ok.max_abs_err == 0.0 and ok.max_bit_distance == 0


def test_exact_reads_torch_and_numpy_bit_patterns_alike():
    """A torch bf16 tensor and the same values as an ml_dtypes bf16 array are bit for bit
    equal, negatives included (the torch side was read as signed ints, numpy as unsigned);
    one flipped bit is still caught."""
    import ml_dtypes
    import numpy as np
    import torch

    from tealite_verify.tiers.exact import compare_exact
    t = torch.tensor([-1.5, -0.0, 0.0, 2.0, -3.0e-3], dtype=torch.bfloat16)
    a = t.float().numpy().astype(ml_dtypes.bfloat16)
    assert compare_exact(t, a).passed and compare_exact(a, t).passed
    bumped = a.copy()
    bumped.view(np.uint16)[0] ^= 1
    m = compare_exact(t, bumped)
    assert not m.passed and m.max_bit_distance == 1
