"""Quantization tolerance tiers (tealite_verify/tiers/e8m0_adjusted.py and fp4_ties.py,
specs/quantize.py): seeded wrong quantize backends, end to end through the registry and
run_case.  Each fails against the reference (and pairwise against torch) while torch passes.

Harness / library bugs found here, now fixed, kept as regression tests (each docstring says
what it guards): the RCEIL excuse limited to rceil_allowed_bytes (not any +-1: the saturating
direction fails); wrong-shaped MX scales reported, not a crash; rescaled codes caught pairwise
(each side re-quantized under its own scales); e2m1 byte count and FP8 storage dtype checked.
The pairwise E8M0 scale check applies the RCEIL allowed range in both directions
(``test_pair_scales_judged_in_both_orders``).

Wrong backends are built from the torch backend (``TORCH_Q``) and the ``make_backend`` fixture
(conftest.py), which always unregisters them.  Helpers are in _helpers_quant.py.
"""
from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.torch import quantize as TQB
from tealite.formats import ScaleRounding, get_format
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_quant import (NORMAL, TORCH_Q, _RNE_CAST, _block, _current, _f64_rule,
                            _rescaler_x, _rescaling_fn, _ties_away_fn, _up_where_exact_pow2,
                            assert_caught, assert_passes, comparisons, crafted, metrics, mx,
                            mx_backend_with_scales, qcase, register_quantize, run)

_TE_SCALE = TQB._te_scale
_MX_EXPONENT = TQB.mx_exponent


# ============================================================================================
# Seeded wrong backends (each must fail against the reference and pairwise vs torch)
# ============================================================================================

def _fp8_cast_rtz(v, fmt):
    """Truncation: RNE, then one code toward zero where RNE rounded up in magnitude."""
    q = _RNE_CAST(v, fmt)
    bits = q.view(torch.uint8)
    up = (q.float().abs() > v.abs()) & torch.isfinite(v)
    down = bits - 1
    if fmt.fnuz:  # no -0 in FNUZ (0x80 is NaN)
        down = torch.where((down & 0x7F) == 0, torch.zeros_like(down), down)
    return torch.where(up, down, bits).view(fmt.torch_dtype)


def test_fp8_cast_rtz_helper_truncates():
    v = torch.tensor([1.0625, -1.0625, 1.1, 1.2, -1.2, 310.0, 500.0, -0.0009, 0.001, 2.0 ** -10])
    got = _fp8_cast_rtz(v, get_format("e4m3")).float()
    assert got.tolist() == [1.0, -1.0, 1.0, 1.125, -1.125, 288.0, 448.0, 0.0, 0.0, 0.0]
    assert (got.view(torch.int32) != _RNE_CAST(v, get_format("e4m3")).float().view(
        torch.int32)).sum() == 5
    # FNUZ has no -0: a negative value truncated to zero is +0 (0x00), not NaN (0x80)
    got = _fp8_cast_rtz(torch.tensor([-0.0009, 0.001, -250.0]), get_format("e4m3fnuz"))
    assert got.view(torch.uint8).tolist()[0] == 0
    assert got.float().tolist() == [0.0, 2.0 ** -10, -240.0]


@pytest.mark.parametrize("case", [
    qcase(_current("e4m3"), "bfloat16", [33, 70], dist=NORMAL, seed=3),
    qcase({"kind": "delayed", "fmt": "e5m2", "scale": 0.75}, "float32", [16, 40],
          columnwise=True, dist=NORMAL, seed=4),
    qcase(_block("e4m3fnuz", (1, 128)), "float16", [5, 200], dist=NORMAL, seed=5),
    qcase(mx("e4m3"), "bfloat16", [8, 64], seed=6),
], ids=["current", "delayed-e5m2", "block1x128-fnuz", "mx-e4m3"])
def test_wrong_fp8_rtz_instead_of_rne(make_backend, case):
    """(1) FP8 element rounding by truncation."""
    def fn(x, recipe, **kw):
        with mock.patch.object(TQB, "fp8_cast_rne", _fp8_cast_rtz):
            return TORCH_Q(x, recipe, **kw)
    name = register_quantize(make_backend, "rtz", fn)
    report = assert_caught("quantize", case, name, outputs=["data", "columnwise_data"])
    m = metrics(report, name, "reference", "data")
    assert m.mismatches > 0.1 * m.numel, m.summary()
    assert metrics(report, name, "reference", "scale_inv").passed  # only the codes are wrong


@pytest.mark.parametrize("case", [
    qcase(mx("e4m3"), "bfloat16", [32, 96], columnwise=True, seed=7),
    qcase(mx("e5m2"), "float16", [8, 64], seed=8),
    qcase(mx("e4m3"), "float32", [16, 128], dist=NORMAL, seed=9),
], ids=["e4m3-edges", "e5m2-edges", "e4m3-normal"])
def test_wrong_mx_floor_instead_of_rceil(make_backend, case):
    """(2) FLOOR scales on an RCEIL recipe (codes consistently re-quantized under them, so only
    the scale check can catch it: the code check must agree they are consistent)."""
    def fn(x, recipe, **kw):
        q = TORCH_Q(x, dataclasses.replace(recipe, scale_rounding=ScaleRounding.FLOOR), **kw)
        q.recipe = recipe
        return q
    name = register_quantize(make_backend, "floor", fn)
    report = assert_caught("quantize", case, name, outputs=["scale_inv"])
    assert metrics(report, name, "reference", "data").passed
    assert not metrics(report, "torch", name, "scale_inv").passed
    assert metrics(report, name, "reference", "scale_inv").excused == 0


def _swap_nibbles(d):
    return ((d & 0x0F) << 4) | (d >> 4) if d is not None else None


@pytest.mark.parametrize("case", [
    qcase(mx("e2m1", "floor"), "float32", [32, 64], columnwise=True, seed=10),
    qcase(mx("e2m1", "even", "ties_away"), "bfloat16", [8, 96], seed=11),
], ids=["floor-rne", "even-ties_away"])
def test_wrong_e2m1_swapped_nibbles(make_backend, case):
    """(3) high nibble = even element."""
    def fn(x, recipe, **kw):
        q = TORCH_Q(x, recipe, **kw)
        q.data, q.columnwise_data = _swap_nibbles(q.data), _swap_nibbles(q.columnwise_data)
        return q
    name = register_quantize(make_backend, "nibbles", fn)
    report = assert_caught("quantize", case, name, outputs=["data"])
    m = metrics(report, name, "reference", "data")
    assert m.mismatches > 0.5 * m.numel
    assert metrics(report, name, "reference", "scale_inv").passed


BLOCK_CASE = qcase(_block("e4m3", (128, 128)), "bfloat16", [257, 129], columnwise=True,
                   dist=NORMAL, seed=12)  # grid of blocks 3 x 2 (columnwise 2 x 3)


@pytest.mark.parametrize("bug", ["transposed", "transposed-same-shape", "columnwise",
                                 "columnwise-as-rowwise"])
def test_wrong_block128_scale_layout(make_backend, bug):
    """(4) 128x128 block scales on a non-square grid of blocks, transposed."""
    def fn(x, recipe, **kw):
        q = TORCH_Q(x, recipe, **kw)
        s, cs = q.scale_inv, q.columnwise_scale_inv
        if bug == "transposed":
            q.scale_inv = s.t().contiguous()
        elif bug == "transposed-same-shape":  # right shape, blocks in column-major order
            q.scale_inv = s.t().reshape(s.shape)
        elif bug == "columnwise":
            q.columnwise_scale_inv = cs.t().contiguous()
        else:  # the rowwise grid returned for the columnwise data
            q.columnwise_scale_inv = s.clone()
        return q
    name = register_quantize(make_backend, "blk_t", fn)
    out = "columnwise_scale_inv" if bug.startswith("columnwise") else "scale_inv"
    report = assert_caught("quantize", BLOCK_CASE, name, outputs=[out])
    m = metrics(report, name, "reference", out)
    if bug == "transposed-same-shape":
        assert m.mismatches == 4 and m.shape_error is None, m.summary()
    else:
        assert m.shape_error, m.summary()
    bad = {c.output for c in comparisons(report, name, "reference") if not c.metrics.passed}
    assert bad == {out}  # codes and the other direction untouched


def test_block128_grid_is_non_square_with_distinct_scales():
    x = get_spec("quantize").make_inputs(BLOCK_CASE, "cpu")["x"]
    q = tealite.quantize(x, R.Float8BlockScaling("e4m3", (128, 128), False), columnwise=True,
                         backend="torch")
    assert q.scale_inv.shape == (3, 2) and q.columnwise_scale_inv.shape == (2, 3)
    assert torch.equal(q.columnwise_scale_inv, q.scale_inv.t())
    assert q.scale_inv.unique().numel() == 6


def _te_scale_448(amax, fmt, force_pow2, eps):
    if fmt.fnuz and fmt.mbits == 3:
        fmt = dataclasses.replace(fmt, max=448.0)
    return _TE_SCALE(amax, fmt, force_pow2, eps)


def _mx_exponent_448(amax, fmt, mode):
    if fmt.fnuz and fmt.mbits == 3:
        fmt = dataclasses.replace(fmt, max=448.0)
    return _MX_EXPONENT(amax, fmt, mode)


@pytest.mark.parametrize("case,frac", [
    (qcase(_current("e4m3fnuz"), "bfloat16", [16, 48], dist=NORMAL, seed=13), 1.0),
    (qcase(_current("e4m3fnuz", "row", pow2=True), "float16", [33, 17], columnwise=True,
           dist={"kind": "normal", "scale": 4.0}, seed=7), 0.5),
    (qcase(_block("e4m3fnuz", (1, 128)), "float32", [4, 300], dist=NORMAL, seed=14), 1.0),
    # MX: amax = 240 * 2^j exactly gives the same RCEIL exponent with 448: only ~1/3 of the
    # quant_edges blocks (amax 240 * 2^j * (1 + 2^-7)) differ
    (qcase(mx("e4m3fnuz"), "bfloat16", [8, 64], seed=15), 0.1),
], ids=["current", "row-pow2", "block1x128", "mx-rceil"])
def test_wrong_fnuz_max_448(make_backend, case, frac):
    """(5) 448 (OCP E4M3) used as the E4M3FNUZ max: scale = 448 / amax; the cast still
    saturates at 240, so the largest values are clipped."""
    def fn(x, recipe, **kw):
        with mock.patch.object(TQB, "_te_scale", _te_scale_448), \
                mock.patch.object(TQB, "mx_exponent", _mx_exponent_448):
            return TORCH_Q(x, recipe, **kw)
    name = register_quantize(make_backend, "fnuz448", fn)
    report = assert_caught("quantize", case, name, outputs=["scale_inv"])
    m = metrics(report, name, "reference", "scale_inv")
    assert m.mismatches >= frac * m.numel, m.summary()


@pytest.mark.parametrize("case", [
    qcase(mx("e2m1", "floor"), "float32", [16, 64], seed=16),
    qcase(mx("e2m1", "rceil"), "bfloat16", [8, 96], columnwise=True, pad=True, seed=17),
], ids=["floor", "rceil-both"])
def test_wrong_mxfp4_ties_away_instead_of_rne(make_backend, case):
    """(6) ties away from zero on an RNE recipe, without declaring hardware tie rounding."""
    name = register_quantize(make_backend, "ties_away", _ties_away_fn)
    report = assert_caught("quantize", case, name, outputs=["data"])
    m = metrics(report, name, "reference", "data")
    assert m.excused == 0 and m.tier == "e8m0-adjusted"



# ---- (7) rescaling the reference codes on a +-1 E8M0 difference -----------------------------

@pytest.mark.parametrize("where,rule,source", [("exact", _up_where_exact_pow2, "torch"),
                                               ("f64", _f64_rule, "ref")])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_wrong_rescaled_codes_on_scale_difference(make_backend, fmt, where, rule, source):
    """(7) ROCm-TE style: on a +-1 scale difference the source codes are rescaled by 2 instead
    of re-quantized.  The scale difference itself is legitimate (excused), the codes are not:
    halving a subnormal code rounds twice.  Caught against the reference and pairwise against
    torch (each side's codes re-quantized under its own scales).  The same scales with the
    values re-quantized (mx_backend_with_scales) pass."""
    spec, case = crafted(_rescaler_x(fmt, where), mx(fmt))
    name = register_quantize(make_backend, "rescale", _rescaling_fn(rule, source))
    report, info = run(spec, case, name)
    ms = metrics(report, name, "reference", "scale_inv")
    assert ms.passed and ms.excused == 2, info
    md = metrics(report, name, "reference", "data")
    assert not md.passed and md.worst_index[1] < 32, info
    assert md.mismatches >= 4, info
    mp = metrics(report, "torch", name, "data")
    assert not mp.passed and mp.worst_index[1] < 32 and mp.mismatches >= 4, info
    assert metrics(report, "torch", name, "scale_inv").passed, info
    assert report.verdict == "fail"
    good = register_quantize(make_backend, "requant", mx_backend_with_scales(rule))
    report = assert_passes(spec, case, good)
    assert metrics(report, good, "reference", "scale_inv").excused == 2


# ---- (8) a scale off by one exponent outside the ambiguity zone -----------------------------

def _bump_fn(delta, pick):
    """torch's scales with ``delta`` added in the blocks ``pick(t, scales)`` selects; codes
    re-quantized under the bumped scales (consistent), so only the scale check can see it."""
    def rule(t, r, s):
        s = s.astype(np.int64)
        sel = pick(t, r, s)
        s[sel] += delta
        return s.astype(np.uint8)
    return mx_backend_with_scales(rule)


def _first_non_ambiguous(t, r, s):
    amax = TQ.mx_block_amax(t.float().numpy())
    ok = ~TQ.rceil_ambiguous(amax, r.fmt) & np.isfinite(amax) & (amax > 0) & (s > 2) \
        & (s < 250)
    assert ok.any()
    sel = np.zeros_like(ok)
    sel[np.unravel_index(np.argmax(ok), ok.shape)] = True
    return sel


@pytest.mark.parametrize("delta", [1, -1])
@pytest.mark.parametrize("case", [
    qcase(mx("e4m3"), "bfloat16", [8, 96], seed=18),
    qcase(mx("e2m1"), "bfloat16", [8, 64], seed=19),  # fp32 quant_edges: all ambiguous
], ids=["e4m3", "e2m1"])
def test_wrong_scale_off_by_one_outside_ambiguity(make_backend, case, delta):
    """(8) one block's exponent +-1 where amax * (1/max) is not near a power of two."""
    name = register_quantize(make_backend, "bump", _bump_fn(delta, _first_non_ambiguous))
    report = assert_caught("quantize", case, name, outputs=["scale_inv"])
    m = metrics(report, name, "reference", "scale_inv")
    assert (m.mismatches, m.excused) == (1, 0), m.summary()
    x = get_spec("quantize").make_inputs(case, "cpu")["x"].float().numpy()
    assert not TQ.rceil_ambiguous(TQ.mx_block_amax(x)[m.worst_index], case["recipe"]["fmt"])
    assert metrics(report, name, "reference", "data").passed  # codes consistent with it


def _exact_pow2_block_x():
    x = torch.full((2, 64), 3.0)
    x[0, 0] = 448.0 * 8  # amax * (1/448) rounds to exactly 2^3 (ambiguous under RCEIL)
    x[0, 1:5] = torch.tensor([3000.0, -1000.0, 17.0, 0.01])
    x[1, 40] = 448.0 * 8 * 1.125  # not ambiguous
    return x


def _pick_00(t, r, s):
    sel = np.zeros(s.shape, bool)
    sel[0, 0] = True
    return sel


def test_wrong_scale_off_by_one_floor_mode_has_no_ambiguity(make_backend):
    """(8) under FLOOR no block is ambiguous: +1 on the block whose amax is exactly 448 * 2^3
    (which RCEIL would excuse) fails."""
    name = register_quantize(make_backend, "bump_floor", _bump_fn(1, _pick_00))
    spec, case = crafted(_exact_pow2_block_x(), mx("e4m3", "floor"))
    report = assert_caught(spec, case, name, outputs=["scale_inv"])
    m = metrics(report, name, "reference", "scale_inv")
    assert (m.mismatches, m.excused, m.worst_index) == (1, 0, (0, 0))
    # Under RCEIL, the same +1 on the exactly-2^3 block is a legitimate difference.
    spec, case = crafted(_exact_pow2_block_x(), mx("e4m3", "rceil"))
    report = assert_passes(spec, case, name)
    assert metrics(report, name, "reference", "scale_inv").excused == 1



# ============================================================================================
# Bugs found (library / harness), fixed: regression tests
# ============================================================================================

def test_saturating_direction_backend_halves_block_max(make_backend):
    """The seeded backend of the next test: exponent 2 instead of 3 at amax = 448 * 2^3; its
    codes (re-quantized under that scale) saturate, so the block max dequantizes to half."""
    name = register_quantize(make_backend, "down1", _bump_fn(-1, _pick_00))
    x = _exact_pow2_block_x()
    q = tealite.quantize(x, R.MXFP8BlockScaling(), backend=name)
    q_t = tealite.quantize(x, R.MXFP8BlockScaling(), backend="torch")
    assert q.scale_inv[0, 0].item() == q_t.scale_inv[0, 0].item() - 1 == 127 + 2
    y = tealite.dequantize(q, backend="torch")
    assert y[0, 0].item() == 1792.0 and y[0, 1].item() == 1792.0  # 3584 and 3000
    assert tealite.dequantize(q_t, backend="torch")[0, 0].item() == 3584.0
    assert TQ.rceil_ambiguous(np.array([3584.0]), "e4m3").all()
    lo, hi = TQ.rceil_allowed_bytes(np.array([3584.0]), "e4m3")
    assert (lo.tolist(), hi.tolist()) == ([130], [131])  # exponents 3 and 4, not 2


def test_rceil_excuse_rejects_saturating_direction(make_backend):
    """check_mx_scales excuses only rceil_allowed_bytes, not any +-1 in an ambiguous block: at
    amax = 448 * 2^3 exactly (reference exponent 3, legitimate alternative 4), exponent 2
    fails against the reference (the +1 direction passes:
    test_wrong_scale_off_by_one_floor_mode_has_no_ambiguity)."""
    name = register_quantize(make_backend, "down1", _bump_fn(-1, _pick_00))
    spec, case = crafted(_exact_pow2_block_x(), mx("e4m3", "rceil"))
    report, info = run(spec, case, name)
    m = metrics(report, name, "reference", "scale_inv")
    assert not m.passed, info
    assert (m.mismatches, m.excused, m.worst_index) == (1, 0, (0, 0)), info
    assert report.verdict == "fail", info
    # pairwise, with the wrong backend on the judged (first) side
    report = run_case(spec, case, backends=[name, "torch"])
    assert not metrics(report, name, "torch", "scale_inv").passed, report.describe()


# Pairwise scales are judged both ways: backend order must not decide the verdict.
def test_pair_scales_judged_in_both_orders(make_backend):
    name = register_quantize(make_backend, "down1_pair", _bump_fn(-1, _pick_00))
    spec, case = crafted(_exact_pow2_block_x(), mx("e4m3", "rceil"))
    report, info = run(spec, case, name)
    assert not metrics(report, "torch", name, "scale_inv").passed, info


def test_rescaled_codes_caught_pairwise(make_backend):
    """Pairwise MX codes: each side is re-quantized under its own scales
    (check_mx_codes_pair), so a backend that rescales codes by 2 on a legitimate +-1 scale
    difference (seeded bug 7) is caught against torch too, not only against the reference
    (blocks whose scales differed used to be skipped)."""
    spec, case = crafted(_rescaler_x("e4m3", "exact"), mx("e4m3"))
    name = register_quantize(make_backend, "rescale_pair",
                             _rescaling_fn(_up_where_exact_pow2, "torch"))
    report, info = run(spec, case, name)
    assert any(not c.metrics.passed for c in comparisons(report, "torch", name)), info
    assert {c.output for c in comparisons(report, "torch", name)
            if not c.metrics.passed} == {"data"}, info


def test_mx_scale_shape_reported_not_raised(make_backend):
    """MX scales of the wrong shape (here transposed, (3, 64) for (64, 3)) are reported as a
    shape error by the scale and code checks, against the reference and pairwise (run_case
    used to raise 'operands could not be broadcast': check_mx_codes re-quantized with the bad
    scales before its shape check)."""
    def fn(x, r, **kw):
        q = TORCH_Q(x, r, **kw)
        q.scale_inv = q.scale_inv.t().contiguous()
        return q
    name = register_quantize(make_backend, "mx_t", fn)
    report = run_case(get_spec("quantize"), qcase(mx("e4m3"), "bfloat16", [64, 96], seed=27),
                      backends=["torch", name])
    assert metrics(report, name, "reference", "scale_inv").shape_error
    assert report.verdict == "fail"
    for lhs, rhs in ((name, "reference"), ("torch", name)):
        for out in ("scale_inv", "data"):
            m = metrics(report, lhs, rhs, out)
            assert not m.passed and "scale shape" in m.shape_error, (lhs, rhs, out, m)


def test_e2m1_extra_packed_bytes_fail(make_backend):
    """Packed e2m1 data must have exactly ceil(K/2) bytes per row: extra trailing bytes
    (data (M, K/2 + 3)) fail against the reference and pairwise (they used to be cut off by
    the unpacking and pass)."""
    def fn(x, r, **kw):
        q = TORCH_Q(x, r, **kw)
        q.data = torch.nn.functional.pad(q.data, (0, 3), value=0xAB)
        return q
    name = register_quantize(make_backend, "extra_bytes", fn)
    report, info = run("quantize", qcase(mx("e2m1", "floor"), "bfloat16", [8, 64], seed=28),
                       name)
    assert report.verdict == "fail", info
    for lhs, rhs in ((name, "reference"), ("torch", name)):
        m = metrics(report, lhs, rhs, "data")
        assert not m.passed and "bytes per row" in m.shape_error, info


U8_CASE = qcase(_current("e4m3"), "bfloat16", [8, 64], dist=NORMAL, seed=29)


def _u8_codes(x, r, **kw):
    q = TORCH_Q(x, r, **kw)
    q.data = q.data.view(torch.uint8)
    return q


def test_uint8_fp8_codes_break_dequantize():
    """The seeded backend of the next test: same bits, uint8 dtype; dequantize decodes the
    bytes as integers."""
    x = get_spec("quantize").make_inputs(U8_CASE, "cpu")["x"]
    q_ok = tealite.quantize(x, R.Float8CurrentScaling(), backend="torch")
    q_bad = _u8_codes(x, R.Float8CurrentScaling(), rowwise=True, columnwise=False, scale=None)
    assert torch.equal(q_bad.data, q_ok.data.view(torch.uint8))
    y_ok = tealite.dequantize(q_ok, backend="torch")
    y_bad = tealite.dequantize(q_bad, backend="torch")
    assert (y_ok < 0).any() and (y_bad >= 0).all()  # the sign bit read as 128
    assert (y_bad - y_ok).abs().max() > y_ok.abs().max()


@pytest.mark.parametrize("case", [U8_CASE, qcase(mx("e4m3"), "bfloat16", [8, 64], seed=6)],
                         ids=["current", "mx"])
def test_fp8_codes_dtype_checked(make_backend, case):
    """FP8 codes must come in the format's torch dtype: a backend returning the right bits as
    torch.uint8 (unusable: dequantize reads them as integers) fails against the reference and
    pairwise (the spec's call used to view the data as uint8 before comparing)."""
    name = register_quantize(make_backend, "u8codes", _u8_codes)
    report, info = run("quantize", case, name)
    assert report.verdict == "fail", info
    for lhs, rhs in ((name, "reference"), ("torch", name)):
        m = metrics(report, lhs, rhs, "data")
        assert not m.passed and "dtype torch.uint8" in m.shape_error, info
    bad = {c.output for c in report.comparisons if not c.metrics.passed}
    assert bad == {"data"}, info
