"""The faster cast-transpose variants behind ``VARIANTS`` (quantize.py, quantize_mx.py) give the
default kernels' bits, through Triton's interpreter in CI and cross-compiled for the GPUs.

* ``_codecs._encode_fp4_arith`` (E2M1 RNE by one fp32 addition) equals the comparison ladder
  on every fp32 bit pattern in the deciding range [2^-3, 2^3), on every exponent field with
  both signs, NaN and Inf, and ml_dtypes' float4_e2m1fn on the non-NaN ones.  (Offline the
  same formula in numpy was checked on all 2^32 patterns: docs/benchmarks.md.)
* Every variant writes the same bits as the default on hostile inputs (specials, ties of the
  E2M1 / FP8 grids, random bit patterns, partial tiles, M not a multiple of the word size,
  which falls back to the default kernel), and the packed kernels really run.
* A seeded packing or rounding bug is caught by the same comparison.
* The variants compile for sm_90 and gfx942 (CI has no GPU: cross-compiled).
* Per-tensor FP8, 1x128 blocks, MXFP8 and MXFP4 all have a packed variant.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R

from _helpers_cross_compile import compiled_json
from _helpers_triton_quantize import DEV, needs_triton

pytestmark = needs_triton

triton = pytest.importorskip("triton")
tl = triton.language

from tealite.backends.triton import _codecs as C  # noqa: E402
from tealite.backends.triton import quantize as TQ  # noqa: E402
from tealite.backends.triton import quantize_block as TQB  # noqa: E402
from tealite.backends.triton import quantize_mx as TQMX  # noqa: E402

_SWEEP = 1 << 20  # bit patterns per program of the exhaustive sweep


# ---- the arithmetic E2M1 encoder ----------------------------------------------------------------

@triton.jit
def _fp4_mismatch_kernel(out_ptr, first, BLOCK: tl.constexpr):
    """Per program: how many of the fp32 patterns first + pid * BLOCK + [0, BLOCK) the two
    E2M1 encoders code differently (no input tensor: the patterns are the offsets)."""
    bits = first + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = bits.to(tl.float32, bitcast=True)
    differ = C._encode_fp4_arith(v) != C._encode_fp4(v, False)
    tl.store(out_ptr + tl.program_id(0), tl.sum(differ.to(tl.int32), axis=0))


@triton.jit
def _fp4_codes_kernel(v_ptr, o_ptr, n, ARITH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    code = C._encode_fp4_arith(v) if ARITH else C._encode_fp4(v, False)
    tl.store(o_ptr + offs, code, mask=m)


def test_arith_e2m1_equals_the_ladder_on_every_fp32_in_the_deciding_range():
    """Every positive pattern from 2^-3 (below it both give 0: |v| < 0.25) to 2^3 (above it
    both saturate): all 6 binades, 2^23 mantissas each."""
    first, last = 0x3E000000, 0x41000000  # 0.125, 8.0
    grid = (last - first) // _SWEEP
    out = torch.zeros(grid, dtype=torch.int32, device=DEV)
    _fp4_mismatch_kernel[(grid,)](out, first, BLOCK=_SWEEP)
    assert grid * _SWEEP == last - first and int(out.sum()) == 0


def _every_exponent_both_signs() -> np.ndarray:
    mants = np.array([0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x1FFFFF, 0x200000,
                      0x200001, 0x5FFFFF, 0x600000, 0x600001, 0x123456], np.uint32)
    pos = (np.arange(256, dtype=np.uint32)[:, None] << 23 | mants[None, :]).reshape(-1)
    return np.concatenate([pos, pos | 0x80000000]).view(np.float32)


def test_arith_e2m1_keeps_signs_specials_and_matches_ml_dtypes():
    v = _every_exponent_both_signs()
    n = v.size
    codes = []
    for arith in (True, False):
        o = torch.empty(n, dtype=torch.int32, device=DEV)
        _fp4_codes_kernel[(triton.cdiv(n, 1024),)](torch.from_numpy(v).to(DEV), o, n,
                                                   ARITH=arith, BLOCK=1024)
        codes.append(o.cpu().numpy())
    arith, ladder = codes
    assert np.array_equal(arith, ladder), v[arith != ladder][:8]
    finite = ~np.isnan(v)
    want = v[finite].astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    assert np.array_equal(arith[finite], want.astype(np.int32))
    assert set(arith[np.isnan(v)].tolist()) == {0b0000, 0b1000}  # the ladder's NaN codes


# ---- the kernels: every variant gives the default bits -------------------------------------------

_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0], np.float32)


def _hostile(m: int, k: int, seed: int = 0) -> torch.Tensor:
    """bf16 (m, k): normals over 60 binades by row, E2M1 ties and codes at random powers of
    two, 3 % raw bit patterns (NaN payloads, subnormals, Inf), and the specials in row 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-30, 30, (m, 1), generator=g)
                                                     .float())
    ties = torch.from_numpy(_TIES)[torch.randint(0, _TIES.size, (m, k), generator=g)]
    ties = ties * torch.exp2(torch.randint(-3, 4, (m, 1), generator=g).float())
    x = torch.where(torch.rand(m, k, generator=g) < 0.3, ties, x).to(torch.bfloat16)
    raw = torch.randint(0, 1 << 16, (m, k), generator=g, dtype=torch.int32).to(torch.int16)
    x = torch.where(torch.rand(m, k, generator=g) < 0.03, raw.view(torch.bfloat16), x)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40,
                             -1e-40, 448.0])
    x[0, :min(k, 8)] = specials[:min(k, 8)].to(torch.bfloat16)
    return x


def _bits(q) -> list:
    return [None if t is None else t.contiguous().view(torch.uint8).clone() for t in
            (q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv, q.amax)]


def _same(a, b) -> bool:
    return all((u is None) == (w is None) and (u is None or torch.equal(u, w))
               for u, w in zip(a, b))


class _Spy:
    """Counts the launches of a jit kernel (``kernel[grid](...)``) and runs them."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


_MX = {"mxfp8": R.MXFP8BlockScaling("e4m3"), "mxfp8-e5m2-floor": R.MXFP8BlockScaling("e5m2", "floor"),
       "mxfp4": R.MXFP4BlockScaling(),
       "mxfp4-ties-away": R.MXFP4BlockScaling("even", "ties_away")}
# (M, K): whole packed tiles (EVEN: unmasked loads), partial tiles and blocks (pad), M not a
# multiple of 8 (FP4 falls back).
_MX_SHAPES = [(64, 128), (64, 96), (72, 40), (36, 64)]


# The kernels every variant is compared with (the ladder, the NaN fix-ups, the byte transpose).
_MX_REFERENCE = {"ct": "trans", "e2m1": "ladder", "nan": "fix", "row": "tile"}
_MX_CHOSEN = {"ct": "trans", "e2m1": "arith", "nan": "auto", "row": "pairs"}


def test_the_defaults_are_the_measured_choices():
    """The defaults are what the H100 sweep measured fastest (docs/benchmarks.md, fifth
    session): arithmetic E2M1 and no NaN fix-ups but for MXFP8 rowwise-only, the byte
    transpose for MX, the packed transpose for FP8 per-tensor and block 1x128; MXFP4 rowwise
    from bf16 pairs (seventh session)."""
    assert TQMX.VARIANTS == _MX_CHOSEN
    assert TQ.VARIANTS == TQB.VARIANTS == {"ct": "packed"}


def _mx_variants(name):
    """The variants that change the kernel for this recipe (the arithmetic encoder is RNE
    e2m1 only; elsewhere it is the ladder, covered by the packed-only run)."""
    if name == "mxfp4":
        return [{"ct": "packed"}, {"e2m1": "arith"}, {"e2m1": "arith", "nan": "skip"},
                {"ct": "packed", "e2m1": "arith", "nan": "skip"}, _MX_CHOSEN]
    return [{"ct": "packed"}, {"ct": "packed", "nan": "skip"}, _MX_CHOSEN]


@pytest.mark.parametrize("rowwise", [True, False], ids=["ct", "col-only"])
@pytest.mark.parametrize("name", sorted(_MX))
def test_mx_variants_give_the_default_bits(name, rowwise, monkeypatch):
    recipe = _MX[name]
    spy = _Spy(TQMX._mx_ct_packed_kernel)
    monkeypatch.setattr(TQMX, "_mx_ct_packed_kernel", spy)
    word = 8 if recipe.fmt == "e2m1" else 4
    for shape in _MX_SHAPES:
        x = _hostile(*shape).to(DEV)
        quant = lambda: tealite.quantize(x, recipe, rowwise=rowwise, columnwise=True,  # noqa: E731
                                         pad=True, backend="triton")
        monkeypatch.setattr(TQMX, "VARIANTS", dict(_MX_REFERENCE))
        want = _bits(quant())
        for variant in _mx_variants(name):
            monkeypatch.setattr(TQMX, "VARIANTS", dict(TQMX.VARIANTS, **variant))
            before = spy.launches
            assert _same(_bits(quant()), want), (shape, variant)
            packed = variant.get("ct") == "packed" and shape[0] % word == 0
            assert spy.launches - before == int(packed), (shape, variant)
            monkeypatch.setattr(TQMX, "VARIANTS", dict(_MX_REFERENCE))


@triton.jit
def _fp8_finite_kernel(v_ptr, o_ptr, n, FINITE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    fp8 = C._encode_fp8_rounded(v, 448.0, 3, -6, 7, False, 0x7F, 512.0, False, False, FINITE)
    fp4 = C._encode_fp4_arith(v, FINITE)
    tl.store(o_ptr + offs, fp8.to(tl.int32) | (fp4 << 8), mask=m)


def test_finite_encoders_differ_from_the_default_on_nan_only():
    """FINITE leaves out the NaN fix-ups and nothing else: so the kernel comparisons below,
    whose inputs hold NaN and Inf blocks, would fail if a NaN reached an encoder."""
    v = _every_exponent_both_signs()
    out = []
    for finite in (False, True):
        o = torch.empty(v.size, dtype=torch.int32, device=DEV)
        _fp8_finite_kernel[(triton.cdiv(v.size, 1024),)](torch.from_numpy(v).to(DEV), o, v.size,
                                                         FINITE=finite, BLOCK=1024)
        out.append(o.cpu().numpy())
    nan = np.isnan(v)
    assert np.array_equal(out[0][~nan], out[1][~nan])
    assert (out[0][nan] != out[1][nan]).any()



@triton.jit
def _fp8_hw_kernel(v_ptr, o_ptr, n, fmax, FINITE: tl.constexpr, HW: tl.constexpr,
                   MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                   FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, C._encode_fp8_rounded(v, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                                 SUB_SCALE, False, HW, FINITE), mask=m)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_hw_finite_path_gives_the_integer_encoders_bits(fmt):
    """On a GPU with ``hw_fp8``: without clamp and NaN fix-ups (FINITE) the hardware
    conversion still saturates, so every finite value (codes, midpoints and their fp32
    neighbours, beyond max up to fp32 max, every exponent) gets the integer encoder's code."""
    if DEV != "cuda" or not C.hw_fp8(torch.device("cuda")):
        pytest.skip("needs an NVIDIA GPU of sm_89+ running compiled kernels (hw_fp8 false here)")
    from tealite_verify.references import quantize as ref
    from tealite.formats import get_format
    tab = np.unique(np.abs(ref.codes_table(fmt)))
    tab = tab[np.isfinite(tab)].astype(np.float64)
    pts = np.concatenate([tab, (tab[1:] + tab[:-1]) / 2, tab[-1] * np.array([1.03, 1.0625, 1.07,
                                                                              1.5, 2, 1e30])])
    u = pts.astype(np.float32).view(np.uint32).astype(np.int64)
    near = np.concatenate([u + d for d in (-2, -1, 0, 1, 2)])
    near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32)
    v = np.concatenate([near, near | 0x80000000]).view(np.float32)
    v = np.concatenate([v, _every_exponent_both_signs()])
    v = v[np.isfinite(v)]
    f = get_format(fmt)
    out = []
    for hw in (True, False):
        o = torch.empty(v.size, dtype=torch.uint8, device=DEV)
        _fp8_hw_kernel[(triton.cdiv(v.size, 1024),)](torch.from_numpy(v).to(DEV), o, v.size,
                                                     f.max, FINITE=hw, HW=hw, BLOCK=1024,
                                                     **C._fmt_constants(f))
        out.append(o.cpu().numpy())
    assert np.array_equal(*out), v[out[0] != out[1]][:8]

def test_arith_e2m1_rowwise_gives_the_default_bits(monkeypatch):
    x = _hostile(64, 160).to(DEV)
    recipe = R.MXFP4BlockScaling()
    want = _bits(tealite.quantize(x, recipe, rowwise=True, columnwise=False, backend="triton"))
    monkeypatch.setitem(TQMX.VARIANTS, "e2m1", "arith")
    monkeypatch.setitem(TQMX.VARIANTS, "nan", "skip")
    got = _bits(tealite.quantize(x, recipe, rowwise=True, columnwise=False, backend="triton"))
    assert _same(got, want)


_FP8 = {  # name: (recipe, module of the variant, its packed kernel)
    "delayed-e4m3": (R.DelayedScaling("e4m3"), TQ, "_cast_transpose_tensor_packed_kernel"),
    "delayed-e5m2": (R.DelayedScaling("e5m2"), TQ, "_cast_transpose_tensor_packed_kernel"),
    "current-e4m3": (R.Float8CurrentScaling("e4m3"), TQ, "_cast_transpose_tensor_packed_kernel"),
    "block1x128-pow2": (R.Float8BlockScaling("e4m3", (1, 128)), TQB, "_block_ct_packed_kernel"),
    "block1x128-e5m2-eps": (R.Float8BlockScaling("e5m2", (1, 128), force_pow2_scales=False,
                                                 amax_epsilon=1e-3),
                                 TQB, "_block_ct_packed_kernel"),
}
# (M, K, rowwise): whole packed tiles (EVEN), partial tiles, columnwise only, M % 4 != 0 (the
# default kernel runs), K 0.
_FP8_SHAPES = [(128, 128, True), (64, 96, True), (132, 130, True), (36, 64, False),
               (37, 64, True), (8, 0, True)]


@pytest.mark.parametrize("name", sorted(_FP8))
def test_fp8_packed_gives_the_default_bits(name, monkeypatch):
    recipe, module, kernel = _FP8[name]
    spy = _Spy(getattr(module, kernel))
    monkeypatch.setattr(module, kernel, spy)
    scale = torch.full((1,), 3.0, device=DEV) if isinstance(recipe, R.DelayedScaling) else None
    for m, k, rowwise in _FP8_SHAPES:
        x = _hostile(max(m, 8), max(k, 8))[:m, :k].to(DEV)
        quant = lambda: tealite.quantize(x, recipe, rowwise=rowwise, columnwise=True,  # noqa: E731
                                         scale=scale, backend="triton")
        monkeypatch.setitem(module.VARIANTS, "ct", "trans")
        want = _bits(quant())
        monkeypatch.setitem(module.VARIANTS, "ct", "packed")
        before = spy.launches
        assert _same(_bits(quant()), want), (m, k)
        # The block kernels launch nothing for an empty x.
        runs = m % 4 == 0 and (k > 0 or module is TQ)
        assert spy.launches - before == int(runs), (m, k)
        monkeypatch.setitem(module.VARIANTS, "ct", "trans")


# ---- the comparison catches what it should ------------------------------------------------------

@triton.jit
def _into_word_reversed(word, codes, j, BITS: tl.constexpr):
    return word | (codes.to(tl.int32) << ((32 // BITS - 1 - j) * BITS))


@triton.jit
def _fp4_ties_away(v, FINITE: tl.constexpr = False):
    return C._encode_fp4(v, True)


@pytest.mark.skipif(DEV != "cpu", reason="patches jit helpers: only the interpreter re-reads them")
@pytest.mark.parametrize("module, helper, bad, recipe", [
    (TQMX, "_into_word", _into_word_reversed, R.MXFP8BlockScaling("e4m3")),
    (TQMX, "_into_word", _into_word_reversed, R.MXFP4BlockScaling()),
    (TQ, "_into_word", _into_word_reversed, R.DelayedScaling("e4m3")),
    (TQB, "_into_word", _into_word_reversed, R.Float8BlockScaling("e4m3", (1, 128))),
    (TQMX, "_encode_fp4_arith", _fp4_ties_away, R.MXFP4BlockScaling()),
], ids=["mxfp8-word-order", "mxfp4-nibble-order", "tensor-word-order", "block-word-order",
        "e2m1-ties-away"])
def test_a_seeded_variant_bug_is_caught(module, helper, bad, recipe, monkeypatch):
    x = _hostile(64, 64).to(DEV)
    scale = torch.full((1,), 3.0, device=DEV) if isinstance(recipe, R.DelayedScaling) else None
    quant = lambda: _bits(tealite.quantize(x, recipe, rowwise=True, columnwise=True,  # noqa: E731
                                           scale=scale, backend="triton"))
    want = quant()
    monkeypatch.setattr(module, "VARIANTS", {"ct": "packed", "e2m1": "arith", "nan": "skip",
                                           "row": "tile"})
    assert _same(quant(), want)
    monkeypatch.setattr(module, helper, bad)
    assert not _same(quant(), want)


# ---- compiled for the GPUs (CI has none: cross-compiled) ----------------------------------------

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import quantize as TQ, quantize_block as TQB, quantize_mx as TQMX
from tealite.backends.triton._codecs import (_fmt_constants, _mx_scale_constants,
                                             _overflow_constants)
from tealite.formats import get_format

def build(kernel, consts, ptrs, target, warps):
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("fmax", "eps")
                                                       else "i32") for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n] not in ("constexpr", "fp32")}
    k = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget(*target),
                       options=dict(num_warps=warps))
    return len(k.asm["cubin" if target[0] == "cuda" else "hsaco"])

def mx(name, mode, kernel, extra):
    fmt = get_format(name)
    c = dict(_fmt_constants(fmt), **_mx_scale_constants(name, mode), ROW=True, FP4=fmt.packed,
             TIES_AWAY=False, X_BF16=True, HW_FP8=False, BM=64, BN=64, GROUP_M=1,
             FP4_ARITH=fmt.packed, FINITE=True, **extra)
    return kernel, c, dict(x_ptr="*i16", qt_ptr="*i32" if "COL" not in extra else "*u8")

def fp8(k, bm, **extra):
    fmt = get_format("e4m3")
    c = dict(_fmt_constants(fmt), **_overflow_constants(fmt), ROW=True, POW2=False,
             SATURATE=True, X_BF16=True, HW_FP8=False, BM=bm, BN=128, GROUP_M=1, **extra)
    ptrs = {n: "*fp32" for n in k.arg_names if n.endswith("_ptr")}
    return k, c, dict(ptrs, x_ptr="*i16", q_ptr="*u8", qt_ptr="*i32")

cases = {"mxfp8-packed": mx("e4m3", "rceil", TQMX._mx_ct_packed_kernel, {}),
         "mxfp4-packed-arith": mx("e2m1", "floor", TQMX._mx_ct_packed_kernel, {}),
         "mxfp4-arith": mx("e2m1", "floor", TQMX._mx_cast_kernel, dict(COL=True)),
         "tensor-packed": fp8(TQ._cast_transpose_tensor_packed_kernel, 64, GIVEN=True),
         "block-packed": fp8(TQB._block_ct_packed_kernel, 128)}
out = {}
for name, (kernel, consts, ptrs) in cases.items():
    ptrs = {n: ptrs.get(n, "*u8") for n in kernel.arg_names if n.endswith("_ptr")}
    for target in (("cuda", 90, 32), ("hip", "gfx942", 64)):
        out[f"{name}-{target[1]}"] = build(kernel, consts, ptrs, target, 2)
json.dump(out, sys.stdout)
"""


def test_variants_compile_for_sm90_and_gfx942():
    sizes = compiled_json(_COMPILE)
    assert len(sizes) == 10 and all(sizes.values()), sizes
