"""The MX kernel variants added after the fifth session's sweep (quantize_mx.VARIANTS "row"
and "ct": "pairs" / "cols", _mx_pairs.py) give the default kernels' bits: through Triton's
interpreter in CI, cross-compiled for sm_90 and gfx942.

* The bf16-pair MXFP4 rowwise and cast-transpose kernels ("cols" too) and the MXFP8 "cols"
  cast-transpose write the default kernels' codes and
  scales on hostile inputs (NaN / Inf blocks, subnormals, E2M1 ties, all-zero blocks, partial
  blocks and tiles), and really run; where they cannot (odd K, odd M for the cast-transpose,
  fp32 x, ties-away, an odd element offset; M % 4 for MXFP8 "cols") the default kernel runs.
* A seeded bug in it (the NaN-scale blocks' mask left out, the sign from the wrong bit) is caught.
"""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R

from _helpers_cross_compile import compiled_json
from _helpers_triton_quantize import DEV, needs_triton
from test_triton_ct_variants import _MX, _Spy, _bits, _hostile, _same

pytestmark = needs_triton

triton = pytest.importorskip("triton")
tl = triton.language

from tealite.backends.triton import _codecs as C  # noqa: E402
from tealite.backends.triton import _mx_pairs as P  # noqa: E402
from tealite.backends.triton import quantize_mx as TQMX  # noqa: E402

# (M, K): whole tiles, partial blocks and tiles, K a multiple of 2 but not of 32, tiny.
_SHAPES = [(64, 256), (64, 96), (33, 258), (36, 64), (5, 2)]


def _with_zero_blocks(x: torch.Tensor) -> torch.Tensor:
    """``x`` with all-zero (one of them -0.0) and subnormal-only 32-element blocks in row 1."""
    x = x.clone()
    if x.shape[0] > 1 and x.shape[1] >= 96:
        x[1, :32] = 0.0
        x[1, 32:64] = -0.0
        x[1, 64:96] = 1e-39  # bf16 subnormal
    return x


def _rowwise(x, recipe, variant, monkeypatch):
    monkeypatch.setattr(TQMX, "VARIANTS", dict(TQMX.VARIANTS, row=variant))
    return _bits(tealite.quantize(x, recipe, rowwise=True, columnwise=False, pad=True,
                                  backend="triton"))


def _ct(x, recipe, variant, monkeypatch, rowwise=True):
    monkeypatch.setattr(TQMX, "VARIANTS", dict(TQMX.VARIANTS, ct=variant))
    return _bits(tealite.quantize(x, recipe, rowwise=rowwise, columnwise=True, pad=True,
                                  backend="triton"))


def test_the_default_kernels_stay_until_measured():
    """MXFP4 rowwise from bf16 pairs (H100: 90.7 % of copy against 81.7, same bits); the MX
    cast-transposes stay on the byte transpose ("cols" wrote other bits for MXFP8)."""
    assert TQMX.VARIANTS["row"] == "pairs" and TQMX.VARIANTS["ct"] == "trans"


def test_pairs_gives_the_default_bits_and_runs(monkeypatch):
    spy = _Spy(TQMX._mx_fp4_pairs_kernel)
    monkeypatch.setattr(TQMX, "_mx_fp4_pairs_kernel", spy)
    recipe = R.MXFP4BlockScaling()
    for seed, shape in enumerate(_SHAPES):
        x = _with_zero_blocks(_hostile(*shape, seed=seed)).to(DEV)
        want = _rowwise(x, recipe, "tile", monkeypatch)
        before = spy.launches
        assert _same(_rowwise(x, recipe, "pairs", monkeypatch), want), shape
        assert spy.launches - before == 1, shape


@pytest.mark.parametrize("rowwise", [True, False], ids=["ct", "col-only"])
def test_pairs_ct_gives_the_default_bits_and_runs(rowwise, monkeypatch):
    spy = _Spy(TQMX._mx_fp4_pairs_ct_kernel)
    monkeypatch.setattr(TQMX, "_mx_fp4_pairs_ct_kernel", spy)
    recipe = R.MXFP4BlockScaling()
    for seed, shape in enumerate(_SHAPES + [(130, 64)]):
        x = _with_zero_blocks(_hostile(*shape, seed=seed)).to(DEV)
        want = _ct(x, recipe, "trans", monkeypatch, rowwise)
        before = spy.launches
        assert _same(_ct(x, recipe, "pairs", monkeypatch, rowwise), want), shape
        assert spy.launches - before == int(shape[0] % 2 == 0), shape


@pytest.mark.parametrize("rowwise", [True, False], ids=["ct", "col-only"])
def test_cols_ct_gives_the_default_bits_and_runs(rowwise, monkeypatch):
    spy = _Spy(TQMX._mx_fp4_cols_ct_kernel)
    monkeypatch.setattr(TQMX, "_mx_fp4_cols_ct_kernel", spy)
    recipe = R.MXFP4BlockScaling()
    # M a multiple of 8 (whole and partial 32-row tiles) runs it; 36 % 8 != 0 falls back.
    for seed, shape in enumerate([(64, 256), (40, 98), (8, 2), (36, 64)]):
        x = _with_zero_blocks(_hostile(*shape, seed=seed)).to(DEV)
        want = _ct(x, recipe, "trans", monkeypatch, rowwise)
        before = spy.launches
        assert _same(_ct(x, recipe, "cols", monkeypatch, rowwise), want), shape
        assert spy.launches - before == int(shape[0] % 8 == 0), shape


@pytest.mark.parametrize("name, rowwise", [("mxfp8", True), ("mxfp8-e5m2-floor", False)],
                         ids=["ct-e4m3-rceil", "col-only-e5m2-floor"])
def test_mxfp8_cols_ct_gives_the_default_bits_and_runs(name, rowwise, monkeypatch):
    spy = _Spy(TQMX._mx_fp8_cols_ct_kernel)
    monkeypatch.setattr(TQMX, "_mx_fp8_cols_ct_kernel", spy)
    recipe = _MX[name]
    # M a multiple of 4 runs it (whole and partial 32-row tiles); 38 falls back.
    for seed, shape in enumerate([(64, 256), (36, 98), (4, 2), (38, 64)]):
        x = _with_zero_blocks(_hostile(*shape, seed=seed)).to(DEV)
        want = _ct(x, recipe, "trans", monkeypatch, rowwise)
        before = spy.launches
        assert _same(_ct(x, recipe, "cols", monkeypatch, rowwise), want), shape
        assert spy.launches - before == int(shape[0] % 4 == 0), shape


@pytest.mark.parametrize("case", ["odd-m", "odd-k", "fp32", "ties-away", "odd-offset"])
def test_pairs_falls_back_where_it_cannot_run(case, monkeypatch):
    names = ["_mx_fp4_pairs_kernel", "_mx_fp4_pairs_ct_kernel", "_mx_fp4_cols_ct_kernel"]
    spies = [_Spy(getattr(TQMX, n)) for n in names]
    for n, spy in zip(names, spies):
        monkeypatch.setattr(TQMX, n, spy)
    recipe = R.MXFP4BlockScaling("even", "ties_away") if case == "ties-away" \
        else R.MXFP4BlockScaling()
    x = _hostile(7 if case == "odd-m" else 8, 67 if case == "odd-k" else 64).to(DEV)
    if case == "fp32":
        x = x.float()
    if case == "odd-offset":
        x = x.reshape(-1)[1:1 + 8 * 62].reshape(8, 62)
        assert x.is_contiguous() and x.storage_offset() == 1
    # Odd M stops only the cast-transpose (its x.T bytes pair rows); rowwise-only runs "pairs".
    for columnwise in (True,) if case == "odd-m" else (False, True):
        quant = lambda: _bits(tealite.quantize(x, recipe, rowwise=True,  # noqa: E731
                                               columnwise=columnwise, pad=True,
                                               backend="triton"))
        monkeypatch.setattr(TQMX, "VARIANTS", dict(TQMX.VARIANTS, row="tile", ct="trans"))
        want = quant()
        for ct in ("pairs", "cols"):
            monkeypatch.setattr(TQMX, "VARIANTS", dict(TQMX.VARIANTS, row="pairs", ct=ct))
            assert _same(quant(), want), (columnwise, ct)
    assert [spy.launches for spy in spies] == [0, 0, 0]


@triton.jit
def _half_code_unmasked(mag, bits, keep, mult, sgn):
    y = mag.to(tl.float32, bitcast=True) * mult
    return C._fp4_arith_magnitude(y.to(tl.int32, bitcast=True)) | ((bits >> 28) & 8)


@triton.jit
def _half_code_sign_bit(mag, bits, keep, mult, sgn):
    y = (mag & keep).to(tl.float32, bitcast=True) * mult
    return C._fp4_arith_magnitude(y.to(tl.int32, bitcast=True)) | ((bits >> 27) & sgn)  # bit 30


@triton.jit
def _store_col_words_swapped(qt_ptr, n, w0, K, qt_words, a0, a1, a2, a3):
    """_store_col_words with words 1 and 2 exchanged."""
    quad = tl.reshape(tl.join(tl.join(a0, a1), tl.join(a2, a3)), (n.shape[0], 4))
    w = w0 + tl.arange(0, 4)
    tl.store(qt_ptr + n.to(tl.int64)[:, None] * qt_words + w[None, :], quad,
             mask=(n < K)[:, None] & (w < qt_words)[None, :])


@pytest.mark.skipif(DEV != "cpu", reason="patches jit helpers: only the interpreter re-reads them")
def test_a_seeded_cols_word_order_bug_is_caught(monkeypatch):
    recipe = R.MXFP4BlockScaling()
    x = _with_zero_blocks(_hostile(64, 128)).to(DEV)
    want = _ct(x, recipe, "trans", monkeypatch)
    assert _same(_ct(x, recipe, "cols", monkeypatch), want)
    monkeypatch.setattr(P, "_store_col_words", _store_col_words_swapped)
    assert not _same(_ct(x, recipe, "cols", monkeypatch), want)


@pytest.mark.skipif(DEV != "cpu", reason="patches jit helpers: only the interpreter re-reads them")
@pytest.mark.parametrize("bad", [_half_code_unmasked, _half_code_sign_bit],
                         ids=["nan-block-mask", "sign-bit"])
@pytest.mark.parametrize("quant", [_rowwise, _ct], ids=["row", "ct"])
def test_a_seeded_pairs_bug_is_caught(bad, quant, monkeypatch):
    recipe = R.MXFP4BlockScaling()
    x = _with_zero_blocks(_hostile(64, 128)).to(DEV)
    want = quant(x, recipe, "tile" if quant is _rowwise else "trans", monkeypatch)
    assert _same(quant(x, recipe, "pairs", monkeypatch), want)
    monkeypatch.setattr(P, "_fp4_half_code", bad)
    assert not _same(quant(x, recipe, "pairs", monkeypatch), want)


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import quantize_mx as TQMX
from tealite.backends.triton._codecs import _mx_scale_constants

def build(kernel, consts, ptrs, target, warps):
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n] != "constexpr"}
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget(*target),
                       options=dict(num_warps=warps))
    return len(k.asm["cubin" if target[0] == "cuda" else "hsaco"])

out = {}
for mode in ("floor",):
    consts = dict(_mx_scale_constants("e2m1", mode), BM=32, BN=128, GROUP_M=1)
    ptrs = dict(x_ptr="*i32", q_ptr="*u8", s_ptr="*u8")
    for target in (("cuda", 90, 32), ("hip", "gfx942", 64)):
        out[f"pairs-{mode}-{target[1]}"] = build(TQMX._mx_fp4_pairs_kernel, consts, ptrs,
                                                 target, 4)
for row in (True,):  # rowwise-and-columnwise: the columnwise-only kernel is a subset
    consts = dict(_mx_scale_constants("e2m1", "floor"), BM=64, BN=64, GROUP_M=1, ROW=row)
    ptrs = dict(x_ptr="*i32", q_ptr="*u8", s_ptr="*u8", qt_ptr="*u8", st_ptr="*u8")
    for target in (("cuda", 90, 32), ("hip", "gfx942", 64)):
        out[f"pairs-ct-{row}-{target[1]}"] = build(TQMX._mx_fp4_pairs_ct_kernel, consts, ptrs,
                                                   target, 2)
    consts = dict(_mx_scale_constants("e2m1", "floor"), BN=256, GROUP_M=1, ROW=row)
    for target in (("cuda", 90, 32), ("hip", "gfx942", 64)):
        out[f"cols-ct-{row}-{target[1]}"] = build(TQMX._mx_fp4_cols_ct_kernel, consts,
                                                  dict(ptrs, qt_ptr="*i32"), target, 4)
from tealite.backends.triton._codecs import _fmt_constants
from tealite.formats import get_format
for target, hw in ((("cuda", 90, 32), True), (("hip", "gfx942", 64), False)):
    fmt = get_format("e4m3")
    consts = dict(_fmt_constants(fmt), **_mx_scale_constants("e4m3", "rceil"), ROW=True,
                  TIES_AWAY=False, X_BF16=True, HW_FP8=hw, BN=128, GROUP_M=1, FINITE=True)
    ptrs = dict(x_ptr="*i16", q_ptr="*u8", s_ptr="*u8", qt_ptr="*i32", st_ptr="*u8")
    out[f"mxfp8-cols-{target[1]}"] = build(TQMX._mx_fp8_cols_ct_kernel, consts, ptrs, target, 4)
json.dump(out, sys.stdout)
"""


def test_variants_compile_for_sm90_and_gfx942():
    sizes = compiled_json(_COMPILE)
    assert len(sizes) == 8 and all(sizes.values()), sizes


def test_mxfp8_cast_transpose_tile_is_its_own(monkeypatch):
    """MXFP8's cast-transpose entry can move (the sweep's 32x128/2) without moving MXFP4's,
    and another tile gives the same bits."""
    from tealite.formats import get_format
    # the measured choice (H100: 73.5-74.5 % of copy against 68.4 % on 32x64/2)
    assert TQMX._TILES[(True, True, "e4m3")] == (32, 128, 2)
    monkeypatch.setitem(TQMX._TILES, (True, True, "e4m3"), (32, 128, 2))
    assert TQMX._tile(get_format("e4m3"), True, True) == (32, 128, 2)
    assert TQMX._tile(get_format("e2m1"), True, True) == TQMX._TILES[(True, True)]
    recipe = R.MXFP8BlockScaling("e4m3")
    x = _with_zero_blocks(_hostile(64, 256)).to(DEV)
    got = _ct(x, recipe, "trans", monkeypatch)
    monkeypatch.setitem(TQMX._TILES, (True, True, "e4m3"), TQMX._TILES[(True, True)])
    assert _same(got, _ct(x, recipe, "trans", monkeypatch))  # 32x64/2: the same bits
