"""Quantization tolerance tiers (tealite_verify/tiers/e8m0_adjusted.py and fp4_ties.py,
specs/quantize.py):
legitimate differences that must pass (a false alarm is a bug too): float64 RCEIL ratio,
declared hardware FP4 tie rounding, codes under NaN scales, the e2m1 padding nibble, float64
dequantization.  Each comes with the wrong counterpart that must still fail.

Harness / library bugs found here, now fixed, kept as regression tests (each docstring says
what it guards): declared hardware FP4 ties excused, the tie at +-0.25 next to +-0 included,
and pairwise too (check_pair receives both numerics); an underflowing RCEIL ratio gives byte 0
(reference).

Wrong backends are built from the torch backend (``TORCH_Q``) and the ``make_backend`` fixture
(conftest.py), which always unregisters them.  Helpers are in _helpers_quant.py.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.torch import quantize as TQB
from tealite.formats import ScaleRounding, get_format
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.references import quantize as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_quant import (E8M0_NAN, FLOATS, NORMAL, TORCH_DQ, TORCH_Q, _block, _current,
                            _f64_rule, _rescaler_x, _tiny_x, _ties_away_fn,
                            _up_where_exact_pow2, assert_caught, assert_passes, comparisons,
                            crafted, metrics, mx, mx_backend_with_scales, mx_block_amax, qcase,
                            rceil_float64, rceil_fp32_division, register_quantize, run)
from _helpers_tolerance import _round_once


# ============================================================================================
# Legitimate differences that must pass
# ============================================================================================

def _float64_ratio_x(fmt):
    """_rescaler_x plus a block with amax max * 2^-127 exactly (row 1, block 2; the subnormal
    fp32 ratio 2^-127, where torch used to give byte 1) and one with amax max * 2^5 (row 1,
    block 1): the float64 rule, torch and the reference agree on both."""
    x = _rescaler_x(fmt, "f64")
    x[1, 40] = get_format(fmt).max * 2.0 ** 5
    x[1, 64:] = x[1, 64:] * 2.0 ** -140
    x[1, 70] = get_format(fmt).max * 2.0 ** -127
    return x


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_legit_float64_rceil_ratio_passes_with_excused_scales(make_backend, fmt):
    """(a) RCEIL with the ratio amax / max computed in float64 (codes re-quantized under its own
    scales): differs from the reference in the two blocks with amax = max * 2^-127 + 1 ulp
    (one exponent up, inside rceil_allowed_bytes), passes, and the excused blocks are reported,
    against the reference and pairwise against torch (which agrees with the reference)."""
    name = register_quantize(make_backend, "rceil64", mx_backend_with_scales(_f64_rule))
    x = _float64_ratio_x(fmt)
    spec, case = crafted(x, mx(fmt), columnwise=False)
    report = assert_passes(spec, case, name)
    ms = metrics(report, name, "reference", "scale_inv")
    assert ms.excused == 2 and ms.mismatches == 0
    mt = metrics(report, "torch", "reference", "scale_inv")
    assert mt.passed and mt.excused == 0 and mt.mismatches == 0
    mp = metrics(report, "torch", name, "scale_inv")
    assert mp.passed and mp.excused == 2 and mp.mismatches == 0
    q_b = tealite.quantize(x, R.MXBlockScaling(fmt), backend=name)
    want = ref.e8m0_scale(TQ.mx_block_amax(x.numpy()), fmt, "rceil")
    assert (q_b.scale_inv.int().numpy() - want)[:, 0].tolist() == [1, 1]
    assert (q_b.scale_inv.int().numpy() - want)[1, 2] == 0


@pytest.mark.parametrize("case", [
    qcase(mx("e4m3"), "bfloat16", [32, 96], columnwise=True, seed=20),
    qcase(mx("e4m3"), "float32", [16, 64], seed=21),
    qcase(mx("e2m1"), "float16", [8, 64], seed=22),
], ids=["e4m3-bf16", "e4m3-fp32", "e2m1-fp16"])
@pytest.mark.parametrize("rule", [rceil_float64, rceil_fp32_division])
def test_legit_rceil_ratio_variants_pass_on_edges(make_backend, case, rule):
    """(a) the same variants on quant_edges data (max * 2^j +- 1 ulp amaxes), and the
    'ratio rounded up' variant (one exponent up where amax / max is exactly 2^j): all pass,
    the last with its differing blocks excused."""
    name = register_quantize(make_backend, "rceil_var", mx_backend_with_scales(
        lambda t, r, s: rule(mx_block_amax(t).numpy(), r.fmt)))
    assert_passes("quantize", case, name)
    up = register_quantize(make_backend, "rceil_up", mx_backend_with_scales(_up_where_exact_pow2))
    report = assert_passes("quantize", case, up)
    assert metrics(report, up, "reference", "scale_inv").excused > 0


def _tie_x():
    """float32 (8, 64) of exact e2m1 values and midpoints (ties 0.25 next to +-0, 1.25, 2.5,
    5, and the non-differing 0.75, 1.75, 3.5) times 2^s per block, each block's amax 6 * 2^s."""
    pool = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5.0])
    g = torch.Generator().manual_seed(3)
    x = pool[torch.randint(0, len(pool), (8, 64), generator=g)]
    x = x * (torch.randint(0, 2, (8, 64), generator=g) * 2 - 1)
    x[:, [0, 32]] = 6.0
    s = torch.tensor([[0, 3], [-2, 5], [7, -9], [1, 1]] * 2, dtype=torch.float32)
    return x * torch.exp2(s).repeat_interleave(32, 1)


def test_legit_fp4_hardware_ties_declared_passes_vs_reference(make_backend):
    """(b) ties away from zero on an RNE recipe, declared fp4_tie_rounding="hardware": every
    differing code is an exact tie (+-0.25 next to +-0 included), excused and counted, against
    the reference and pairwise against torch; undeclared, the same backend fails both."""
    declared = register_quantize(make_backend, "hwties", _ties_away_fn,
                                 numerics={"fp4_tie_rounding": "hardware"})
    plain = register_quantize(make_backend, "noties", _ties_away_fn)
    x = _tie_x()
    scaled = x.abs() / x.abs().reshape(8, 2, 32).amax(-1).repeat_interleave(32, 1) * 6
    assert (scaled == 0.25).sum() > 5  # ties next to +-0 are in the data
    for scale in ("floor", "rceil"):
        spec, case = crafted(_tie_x(), mx("e2m1", scale))
        report = assert_passes(spec, case, declared)
        info = report.describe()
        m = metrics(report, declared, "reference", "data")
        assert m.passed and m.excused > 20 and m.tier == "fp4-ties", info
        assert all(c.metrics.passed for c in comparisons(report, declared, "reference"))
        assert metrics(report, "torch", declared, "data").excused == m.excused, info
        report = assert_caught(spec, case, plain, outputs=["data"])
        m = metrics(report, plain, "reference", "data")
        assert m.excused == 0 and m.mismatches > 10


def _nan_x(dtype):
    x = torch.linspace(-5, 5, 64 * 96, dtype=torch.float64).reshape(64, 96).to(dtype)
    x[3, 40] = float("nan")
    x[10, 5] = float("inf")
    x[40, 70] = float("-inf")
    return x


def _fill_blocks(q, fill, which):
    """Set the codes of the blocks ``which(scales) -> bool (M, nb)`` to ``fill``, both
    directions."""
    fmt = get_format(q.recipe.fmt)
    for dname, sname, k in (("data", "scale_inv", q.shape[1]),
                            ("columnwise_data", "columnwise_scale_inv", q.shape[0])):
        d, s = getattr(q, dname), getattr(q, sname)
        if d is None:
            continue
        sel = which(s).repeat_interleave(32, 1)[:, :k]
        codes = TQB._unpack_nibbles(d, k) if fmt.packed else d.view(torch.uint8)
        codes = torch.where(sel, torch.full_like(codes, fill & (0xF if fmt.packed else 0xFF)),
                            codes)
        setattr(q, dname, TQB._pack_nibbles(codes) if fmt.packed
                else codes.view(fmt.torch_dtype))
    return q


def _first_block(s):
    sel = torch.zeros(s.shape, dtype=torch.bool)
    sel[0, 0] = True
    return sel


@pytest.mark.parametrize("fmt,dtype", [("e4m3", torch.bfloat16), ("e2m1", torch.float32)])
def test_legit_codes_under_nan_scale_are_free(make_backend, fmt, dtype):
    """(c) blocks containing NaN / Inf get the NaN scale; their codes may be anything.  A
    backend that writes garbage there passes; garbage in a live block, or a finite scale for
    a NaN block (a NaN-ignoring amax), fails."""
    spec, case = crafted(_nan_x(dtype), mx(fmt), columnwise=True)
    free = register_quantize(make_backend, "nan_free", lambda x, r, **kw: _fill_blocks(
        TORCH_Q(x, r, **kw), 0x5B, lambda s: s == E8M0_NAN))
    report = assert_passes(spec, case, free)
    s = tealite.quantize(_nan_x(dtype), R.MXBlockScaling(fmt), backend=free).scale_inv
    assert (s == E8M0_NAN).sum() == 3
    assert metrics(report, free, "reference", "data").numel == 64 * 96 - 3 * 32

    name = register_quantize(make_backend, "live_garbage", lambda x, r, **kw: _fill_blocks(
        TORCH_Q(x, r, **kw), 0x5B, _first_block))
    report = assert_caught(spec, case, name, outputs=["data", "columnwise_data"])
    assert metrics(report, name, "reference", "data").worst_index[0] == 0

    def nan_ignoring(x, r, **kw):
        q = TORCH_Q(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), r, **kw)
        return q
    name = register_quantize(make_backend, "nanmax", nan_ignoring)
    report = assert_caught(spec, case, name, outputs=["scale_inv", "columnwise_scale_inv"])
    assert metrics(report, name, "reference", "scale_inv").mismatches == 3


def _set_pad_nibble(d, n):
    if d is None or n % 2 == 0:
        return d
    d = d.clone()
    d[:, -1] |= 0xF0
    return d


def _clobber_last_real_nibble(d, n):
    if d is None:
        return d
    d = d.clone()
    d[:, -1] ^= 0x01 if n % 2 else 0x10
    return d


@pytest.mark.parametrize("scale", ["floor", "rceil"])
def test_legit_e2m1_padding_nibble_not_compared(make_backend, scale):
    """(d) an odd e2m1 row with pad=True: the high nibble of the last byte is padding; a
    backend writing 0xF there passes, one that corrupts the last real nibble fails."""
    case = qcase(mx("e2m1", scale), "bfloat16", [33, 47], columnwise=True, pad=True, seed=23)

    def fn(x, r, **kw):
        q = TORCH_Q(x, r, **kw)
        q.data = _set_pad_nibble(q.data, q.shape[1])
        q.columnwise_data = _set_pad_nibble(q.columnwise_data, q.shape[0])
        return q
    name = register_quantize(make_backend, "padnib", fn)
    assert_passes("quantize", case, name)
    x = get_spec("quantize").make_inputs(case, "cpu")["x"]
    q = tealite.quantize(x, R.MXBlockScaling("e2m1", ScaleRounding(scale)), columnwise=True,
                         pad=True, backend=name)
    assert q.data.shape == (33, 24) and q.columnwise_data.shape == (47, 17)
    assert ((q.data[:, -1] >> 4) == 0xF).all() and ((q.columnwise_data[:, -1] >> 4) == 0xF).all()

    def bad(x, r, **kw):
        q = TORCH_Q(x, r, **kw)
        q.data = _clobber_last_real_nibble(q.data, q.shape[1])
        return q
    name = register_quantize(make_backend, "lastnib", bad)
    report = assert_caught("quantize", case, name, outputs=["data"])
    m = metrics(report, name, "reference", "data")
    assert m.mismatches == 33 and m.worst_index == (0, 46)


# ---- (e) dequantize in float64, rounded once ------------------------------------------------

def _dq_float64(q, *, out_dtype, columnwise):
    data = q.columnwise_data if columnwise else q.data
    s = q.columnwise_scale_inv if columnwise else q.scale_inv
    rows, cols = (q.shape[1], q.shape[0]) if columnwise else q.shape
    r = q.recipe
    fmt = get_format(r.fmt)
    vals = (TQB._e2m1_decode(TQB._unpack_nibbles(data, cols)) if fmt.packed
            else data.float()).double()
    if isinstance(r, R.MXBlockScaling):
        sc = torch.where(s == E8M0_NAN, torch.nan, torch.exp2(s.double() - 127))
        expand = sc.repeat_interleave(32, 1)[:, :cols]
    elif isinstance(r, R.Float8BlockScaling):
        bm, bn = r.block
        expand = s.double().repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:rows, :cols]
    elif isinstance(r, R.Float8CurrentScaling) and r.granularity == "row":
        expand = s.double().unsqueeze(1)
    else:
        expand = s.double()
    return _round_once(vals * expand, out_dtype)


DQ_CASES = list(get_spec("dequantize").smoke_cases) + [
    qcase(mx("e2m1", "rceil"), "bfloat16", [8, 64], seed=24),
    qcase(_current("e4m3", "tensor"), "float16", [16, 33], dist=NORMAL, seed=25),
    qcase(_block("e5m2", (1, 128)), "bfloat16", [4, 200],
          dist={"kind": "wide", "log2_lo": -20, "log2_hi": 20}, seed=26),
]


def test_legit_dequantize_float64_rounded_once(make_backend):
    """(e) code x scale in float64, one rounding to the output dtype: passes against the
    reference and pairwise against torch (fp32 product, then the output rounding)."""
    b = make_backend("dq64")
    b.implements("dequantize", dtypes=FLOATS)(_dq_float64)
    for case in DQ_CASES:
        case = dict(case, rowwise=True, columnwise=False)
        report = assert_passes("dequantize", case, b.name)
        assert metrics(report, "torch", b.name, "y").tier == "ulp-pair"


def test_wrong_dequantize_caught(make_backend):
    """(e) counterparts: E8M0 bias 126 (every MX value doubled); per-row scales applied along
    columns' order (a (M,) scale read with the wrong stride: reversed)."""
    bias = make_backend("dq_bias")

    @bias.implements("dequantize", dtypes=FLOATS)
    def dq_bias(q, *, out_dtype, columnwise):
        if isinstance(q.recipe, R.MXBlockScaling):
            q = dataclasses.replace(q, scale_inv=q.scale_inv + 1)
        return TORCH_DQ(q, out_dtype=out_dtype, columnwise=columnwise)

    for case in (DQ_CASES[0], DQ_CASES[5]):
        assert_caught("dequantize", dict(case, rowwise=True, columnwise=False), bias.name,
                      outputs=["y"])
    rows = make_backend("dq_rows")

    @rows.implements("dequantize", dtypes=FLOATS)
    def dq_rows(q, *, out_dtype, columnwise):
        return TORCH_DQ(dataclasses.replace(q, scale_inv=q.scale_inv.flip(0)),
                        out_dtype=out_dtype, columnwise=columnwise)

    assert_caught("dequantize", dict(DQ_CASES[2], columnwise=False), rows.name, outputs=["y"])



# ============================================================================================
# Bugs found (library / harness), fixed: regression tests
# ============================================================================================

def test_fp4_hardware_ties_quant_edges_pass(make_backend):
    """End to end: a backend declaring fp4_tie_rounding='hardware' on quant_edges data, whose
    midpoints include +-0.25 * 2^s, passes against the reference and pairwise against torch
    (it used to fail on the +-0.25 ties)."""
    name = register_quantize(make_backend, "hwties_edges", _ties_away_fn,
                             numerics={"fp4_tie_rounding": "hardware"})
    report = assert_passes("quantize", qcase(mx("e2m1", "floor"), "float32", [16, 64], seed=16),
                           name)
    info = report.describe()
    assert all(c.metrics.passed for c in comparisons(report, name, "reference")), info
    assert metrics(report, name, "reference", "data").excused > 100, info


@pytest.mark.parametrize("scale", ["floor", "rceil"])
def test_fp4_hardware_ties_excused_pairwise(make_backend, scale):
    """check_pair receives both backends' numerics: where either declares
    fp4_tie_rounding='hardware', codes one step apart at an exact midpoint are excused
    pairwise too (they used to be compared bit-exactly, failing the declared backend against
    torch).  The same backend undeclared fails pairwise
    (test_legit_fp4_hardware_ties_declared_passes_vs_reference)."""
    name = register_quantize(make_backend, "hwties_pair", _ties_away_fn,
                             numerics={"fp4_tie_rounding": "hardware"})
    spec, case = crafted(_tie_x(), mx("e2m1", scale))
    report, info = run(spec, case, name)
    assert report.verdict == "pass", info
    m = metrics(report, "torch", name, "data")
    assert m.passed and m.excused > 20, info


def test_rceil_underflowing_ratio_correct_backend_passes(make_backend):
    """When fp32 amax * (1/max) underflows to 0 (fp32 amax < max * 2^-150, e.g. 1e-45), the
    reference's RCEIL byte is 0 (ceil(log2 0) clamped to -127), not 127: a correct backend
    (here: the float64 ratio, byte 0) passes on a block of tiny fp32 subnormals.  (Unit level:
    test_references_quantize.py.)"""
    name = register_quantize(make_backend, "rceil64_tiny", mx_backend_with_scales(_f64_rule))
    spec, case = crafted(_tiny_x(), mx("e4m3"))
    report = run_case(spec, case, backends=[name])
    assert report.verdict == "pass", report.describe()
