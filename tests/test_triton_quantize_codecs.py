"""The codecs shared by the Triton quantization kernels (tealite/backends/triton/_codecs.py),
each run in a tiny kernel (through Triton's interpreter in CI) and compared bit for bit with
``tealite_verify.references.quantize``.

* Hardware FP8 conversion (``_codecs.hw_fp8``): on an sm_89+ GPU its codes equal the integer
  encoder's on every boundary class; under the interpreter the integer encoder is used.
* Codec unit tests: ``_e8m0_scale`` (every fp32 exponent field, RCEIL boundaries, subnormals,
  0 / NaN / Inf), ``_encode_fp4``, ``_encode_fp8_rounded`` (RNE and ties-away),
  ``_encode_fp8_sat`` (non-saturating), ``_mx_descale`` and the dequantize decoder; their
  inputs tell every rule apart, so a kernel using the wrong one fails.

The kernels themselves through the differential harness: test_triton_quantize_kernels.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tealite import recipes as R
from tealite_verify.references import quantize as ref

from _helpers_triton_quantize import DEV, needs_triton

pytestmark = needs_triton

triton = pytest.importorskip("triton")
tl = triton.language

from tealite.backends.triton import INTERPRET  # noqa: E402
from tealite.backends.triton import _codecs as C  # noqa: E402
from tealite.formats import get_format  # noqa: E402

F32 = np.float32
FP8 = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")
MODES = ("floor", "ceil", "even", "rceil")
_BLOCK = 1024


# ---- tiny kernels around the codecs -------------------------------------------------------------

@triton.jit
def _e8m0_kernel(a_ptr, o_ptr, n, MODE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                 FMAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, C._e8m0_scale(a, MODE, EMAX, MBITS, FMAX), mask=m)


@triton.jit
def _fp4_kernel(v_ptr, o_ptr, n, TIES_AWAY: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, C._encode_fp4(tl.load(v_ptr + offs, mask=m, other=0.0), TIES_AWAY),
             mask=m)


@triton.jit
def _fp8_kernel(v_ptr, o_ptr, n, fmax, TIES_AWAY: tl.constexpr, MBITS: tl.constexpr,
                EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, C._encode_fp8_rounded(v, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                                 SUB_SCALE, TIES_AWAY), mask=m)


@triton.jit
def _fp8_nonfinite_kernel(v_ptr, o_ptr, n, fmax, MBITS: tl.constexpr, EMIN: tl.constexpr,
                          BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                          SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr,
                          OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, C._encode_fp8_sat(v, fmax, False, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                             SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE), mask=m)


@triton.jit
def _fp8_path_kernel(v_ptr, o_ptr, n, fmax, SATURATE: tl.constexpr, HW: tl.constexpr,
                     MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                     FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                     OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr,
                     BLOCK: tl.constexpr):
    """``_encode_fp8_sat`` (RNE) with the hardware conversion chosen explicitly (HW)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, C._encode_fp8_sat(v, fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                                             NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE,
                                             OVF_CODE, HW), mask=m)


@triton.jit
def _descale_kernel(x_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs, mask=m, other=0)
    tl.store(o_ptr + offs, C._mx_descale(x, b), mask=m)


def _launch(kernel, inputs, out_dtype, **kw):
    n = inputs[0].size
    out = torch.empty(n, dtype=out_dtype, device=DEV)
    args = [torch.from_numpy(np.ascontiguousarray(a)).to(DEV) for a in inputs]
    kernel[(triton.cdiv(n, _BLOCK),)](*args, out, n, BLOCK=_BLOCK, **kw)
    return out.cpu().numpy()


def _bits(u) -> np.ndarray:
    return np.asarray(u, np.uint32).view(F32)


def _assert_same(got, want, inputs):
    bad = np.nonzero(np.asarray(got) != np.asarray(want))[0]
    assert bad.size == 0, [(inputs[i], got[i], want[i]) for i in bad[:8]]


# ---- inputs -------------------------------------------------------------------------------------

def _every_exponent() -> np.ndarray:
    """Every fp32 exponent field (subnormal, normal, Inf/NaN) with mantissas at the power of
    two, one ulp above and below it, and at the E2M1 / FP8 rounding points of EVEN."""
    mants = np.array([0, 1, 2, 3, 0x7FFFFF, 0x7FFFFE, 0x400000, 0x3FFFFF, 0x200000, 0x1FFFFF,
                      0x600000, 0x5FFFFF, 0x100000, 0x0FFFFF, 0x700000, 0x6FFFFF, 0x080000,
                      0x07FFFF], np.uint32)
    fields = np.arange(256, dtype=np.uint32)
    return _bits((fields[:, None] << 23 | mants[None, :]).reshape(-1))


def _rceil_boundaries(fmt: str) -> np.ndarray:
    """amax = max * 2^j moved by up to 3 fp32 ulps, for every j keeping it finite: where
    amax * (1/max) rounds onto or off a power of two."""
    base = F32(ref.fmt_max(fmt)) * np.exp2(np.arange(-160, 128)).astype(F32)
    base = base[np.isfinite(base) & (base > 0)].astype(F32)
    u = base.view(np.uint32).astype(np.int64)
    near = np.concatenate([u + d for d in range(-3, 4)])
    return near[(near > 0) & (near < 0x7F800000)].astype(np.uint32).view(F32)


def _scale_inputs(fmt: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 2 ** 31, 3000, dtype=np.uint32).view(F32)
    singles = _bits(1 << np.arange(23, dtype=np.uint32))  # every subnormal power of two
    return np.concatenate([_every_exponent(), _rceil_boundaries(fmt), singles, rand,
                           np.array([0.0, np.inf, np.nan], F32)]).astype(F32)


def _element_inputs(fmt: str) -> np.ndarray:
    """Codes, midpoints (ties) and their neighbours, beyond max, specials, every exponent."""
    tab = np.unique(np.abs(ref.codes_table(fmt))).astype(F32)
    mids = ((tab[1:].astype(np.float64) + tab[:-1]) / 2).astype(F32)
    near = np.concatenate([np.nextafter(mids, F32(0)), np.nextafter(mids, F32(np.inf))])
    big = F32(ref.fmt_max(fmt)) * np.array([1.01, 1.04, 1.0625, 1.2, 2, 1e3], F32)
    rng = np.random.default_rng(11)
    rand = (rng.standard_normal(2000) * np.exp2(rng.integers(-20, 18, 2000))).astype(F32)
    pos = np.concatenate([tab, mids, near, big, _every_exponent(), rand])
    return np.concatenate([pos, -pos, np.array([np.nan, -np.nan, np.inf, -np.inf], F32)])


# ---- codec unit tests ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FP8 + ("e2m1",))
def test_e8m0_scale_matches_reference(fmt, mode):
    a = _scale_inputs(fmt)
    got = _launch(_e8m0_kernel, [a], torch.int32, **C._mx_scale_constants(fmt, mode))
    _assert_same(got, ref.e8m0_scale(a, fmt, mode).astype(np.int32), a)


@pytest.mark.parametrize("fmt", FP8 + ("e2m1",))
def test_unit_inputs_tell_every_rule_apart(fmt):
    """The codec tests can fail: on their inputs the reference tells every pair of scale
    modes, and RNE from ties-away elements, apart (so a kernel using the wrong one fails)."""
    a = _scale_inputs(fmt)
    got = {m: ref.e8m0_scale(a, fmt, m) for m in MODES}
    assert all((got[x] != got[y]).any() for x in MODES for y in MODES if x < y)
    v = _element_inputs(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        rne, away = (ref.codes_to_bits(ref.round_elements(v, fmt, rounding=r))
                     for r in ("rne", "ties_away"))
    assert (rne != away).any()


def test_mx_scale_constants_reject_unknown_mode():
    with pytest.raises(ValueError, match="unknown scale rounding"):
        C._mx_scale_constants("e4m3", "nearest")


@pytest.mark.parametrize("rounding", ["rne", "ties_away"])
def test_encode_fp4_matches_reference(rounding):
    v = np.concatenate([_element_inputs("e2m1"), np.arange(-128, 129, dtype=F32) / 16,
                        np.array([0.0, -0.0, 0.25, -0.25, 1e-45, -1e-45], F32)]).astype(F32)
    got = _launch(_fp4_kernel, [v], torch.int32, TIES_AWAY=rounding == "ties_away")
    with np.errstate(invalid="ignore"):
        want = ref.codes_to_bits(ref.round_elements(v, "e2m1", rounding=rounding))
    _assert_same(got, want.astype(np.int32), v)


@pytest.mark.parametrize("rounding", ["rne", "ties_away"])
@pytest.mark.parametrize("fmt", FP8)
def test_encode_fp8_rounded_matches_reference(fmt, rounding):
    v = _element_inputs(fmt)
    got = _launch(_fp8_kernel, [v], torch.uint8, fmax=ref.fmt_max(fmt),
                  TIES_AWAY=rounding == "ties_away", **C._fmt_constants(get_format(fmt)))
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref.codes_to_bits(ref.round_elements(v, fmt, rounding=rounding))
    _assert_same(got, want, v)


@pytest.mark.parametrize("fmt", FP8)
def test_encode_fp8_nonfinite_matches_reference(fmt):
    v = _element_inputs(fmt)
    f = get_format(fmt)
    got = _launch(_fp8_nonfinite_kernel, [v], torch.uint8, fmax=f.max,
                  **C._fmt_constants(f), **C._overflow_constants(f))
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref.codes_to_bits(ref.round_elements(v, fmt, saturate=False))
    ml = ref.ML_DTYPES[fmt]
    nan_both = np.isnan(got.view(ml).astype(F32)) & np.isnan(want.view(ml).astype(F32))
    _assert_same(np.where(nan_both, 0, got), np.where(nan_both, 0, want), v)


def _fp8_boundary_inputs(fmt: str) -> np.ndarray:
    """Every fp32 bit-pattern class near the format's rounding boundaries: every code value,
    every midpoint between neighbouring codes, and +-1, +-2 fp32 ulps around both; fp32
    subnormals; max and beyond (up to Inf); +-0; NaNs of both signs and several payloads;
    every fp32 exponent field; random bit patterns."""
    tab = np.unique(np.abs(ref.codes_table(fmt)))
    tab = tab[np.isfinite(tab)].astype(np.float64)
    mids = (tab[1:] + tab[:-1]) / 2  # exact in fp32: one more mantissa bit than the format
    pts = np.concatenate([tab, mids, [ref.fmt_max(fmt) * 2 - mids[-1]]]).astype(F32)
    u = pts.view(np.uint32).astype(np.int64)
    near = np.concatenate([u + d for d in (-2, -1, 0, 1, 2)])
    near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32).view(F32)
    sub = _bits(np.concatenate([np.arange(1, 64, dtype=np.uint32),
                                0x7FFFFF - np.arange(64, dtype=np.uint32),
                                1 << np.arange(23, dtype=np.uint32)]))
    big = F32(ref.fmt_max(fmt)) * np.array([1.0, 1.0625, 1.124, 1.125, 1.126, 2, 1e3, 1e30],
                                            F32)
    nans = _bits(np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FA00000], np.uint32))
    rng = np.random.default_rng(5)
    rand = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(F32)
    pos = np.concatenate([near, sub, big, nans, _every_exponent(), np.array([0.0, np.inf], F32)])
    return np.concatenate([pos, -pos, rand]).astype(F32)


@pytest.mark.parametrize("saturate", [True, False], ids=["saturate", "nonfinite"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_hw_fp8_conversion_gives_the_integer_encoders_bits(fmt, saturate):
    """On a GPU where ``hw_fp8`` is true, the hardware-conversion path and the integer
    encoder give identical codes on every boundary class (and both the reference's)."""
    if INTERPRET or not torch.cuda.is_available() or not C.hw_fp8(torch.device("cuda")):
        pytest.skip("needs an NVIDIA GPU of sm_89+ running compiled kernels (hw_fp8 false here)")
    f = get_format(fmt)
    v = _fp8_boundary_inputs(fmt)
    kw = dict(fmax=f.max, SATURATE=saturate, **C._fmt_constants(f), **C._overflow_constants(f))
    hw = _launch(_fp8_path_kernel, [v], torch.uint8, HW=True, **kw)
    sw = _launch(_fp8_path_kernel, [v], torch.uint8, HW=False, **kw)
    _assert_same(hw, sw, v)
    if saturate:
        with np.errstate(invalid="ignore", over="ignore"):
            _assert_same(hw, ref.codes_to_bits(ref.round_elements(v, fmt)), v)


def test_boundary_inputs_hold_ties_and_both_nan_signs():
    """The hardware-path test can fail: its inputs hold exact ties (where RNE and ties-away
    differ), values beyond max, and NaNs of both signs (whose codes a bare cast might not
    give the integer encoder's sign)."""
    for fmt in ("e4m3", "e5m2"):
        v = _fp8_boundary_inputs(fmt)
        with np.errstate(invalid="ignore", over="ignore"):
            rne, away = (ref.codes_to_bits(ref.round_elements(v, fmt, rounding=r))
                         for r in ("rne", "ties_away"))
        assert (rne != away).any()
        signs = np.signbit(v[np.isnan(v)])
        assert signs.any() and not signs.all()
        assert (np.abs(v[np.isfinite(v)]) > ref.fmt_max(fmt)).any()


def test_interpreter_uses_the_integer_fp8_encoder():
    """Under the interpreter (whose fp32 -> fp8 cast rounds ties away) no kernel gets the
    hardware path, and a per-tensor cast of exact e4m3 ties gives RNE codes."""
    if not INTERPRET:
        pytest.skip("checks the interpreter's choice of encoder")
    import tealite
    assert not C.hw_fp8(torch.device("cpu")) and not C.hw_fp8(torch.device("cuda", 0))
    tab = np.unique(np.abs(ref.codes_table("e4m3")))
    tab = tab[np.isfinite(tab)].astype(np.float64)
    mids = ((tab[1:] + tab[:-1]) / 2).astype(F32)
    x = torch.from_numpy(np.concatenate([mids, -mids])[None, :].copy())
    q = tealite.quantize(x, R.DelayedScaling("e4m3"), scale=torch.ones(1), backend="triton")
    want = ref.codes_to_bits(ref.round_elements(x.numpy()[0], "e4m3"))
    _assert_same(q.data.view(torch.uint8).numpy()[0], want, x.numpy()[0])


def test_mx_descale_matches_reference_every_byte():
    rng = np.random.default_rng(3)
    x = np.concatenate([np.array([1.0, -1.0, 1.5, 3.0, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -126,
                                  1.75 * 2.0 ** -130, 3e38, -3e38, 0.0, -0.0, np.inf, np.nan],
                                 F32),
                        (rng.standard_normal(500) * np.exp2(rng.integers(-149, 127, 500)))
                        .astype(F32)])
    b = np.repeat(np.arange(256, dtype=np.uint8), x.size)
    xs = np.tile(x, 256).astype(F32)
    got = _launch(_descale_kernel, [xs, b], torch.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (xs.astype(np.float64) / ref.e8m0_value(b)).astype(F32)
    want = np.where(b == ref.E8M0_NAN, F32(0.0), want).astype(F32)  # codes 0 under NaN
    # Bit-exact except NaN payloads (the H100 returns 0x7FFFFFFF for NaN / 2^k; payloads carry
    # no meaning here, as NaN inputs become NaN codes whatever the payload).
    got, want = (np.where(np.isnan(v), F32(np.nan), v).astype(F32) for v in (got, want))
    _assert_same(got.view(np.uint32), want.view(np.uint32), xs)


@pytest.mark.parametrize("fmt", FP8 + ("e2m1",))
def test_dequantize_decodes_every_code(fmt):
    """Every code of the format, per-tensor scale 1 (FP8) or E8M0 scale 2^0 (e2m1)."""
    import tealite
    from tealite.ops.quantize import QuantizedTensor
    f = get_format(fmt)
    n = 16 if f.packed else 256
    codes = np.arange(n, dtype=np.uint8)
    want = ref.decode(codes, fmt).astype(F32)
    if f.packed:
        recipe = R.MXFP4BlockScaling()
        data = torch.from_numpy(ref.pack_e2m1(codes[None, :]))
        scale = torch.full((1, 1), 127, dtype=torch.uint8)
    else:
        recipe = R.Float8CurrentScaling(fmt)
        data = torch.from_numpy(codes[None, :]).view(f.torch_dtype)
        scale = torch.ones(1)
    q = QuantizedTensor(recipe=recipe, shape=(1, n), data=data.to(DEV), scale_inv=scale.to(DEV))
    got = tealite.dequantize(q, backend="triton").cpu().numpy()[0]
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), [(c, got[c], want[c]) for c in np.nonzero(~same)[0][:8]]
