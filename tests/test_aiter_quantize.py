"""``quantize`` on the ``aiter_triton`` backend (tealite/backends/aiter_triton/quantize.py):
AITER's own Triton quant kernels, checked against the reference configured with the
conventions each entry point declares.

* Contracts: every entry point used has one, with the family keys of the TE-difference table.
* Dispatch: every case an entry point cannot do, or whose recipe asks for another convention,
  is rejected with the reason; a missing entry point is rejected with the loader's reason.
* MXFP4 (``dynamic_mxfp4_quant``): passes the harness (EVEN scales, ties-away elements, AITER's
  NaN / Inf policy); the declared conventions are verified (the reference with another
  rounding or policy fails it); AITER's kernel source with a changed rounding constant, and
  wrapped outputs, are caught.
* MXFP4 on NVIDIA: AITER's kernel is wrong there (``NVIDIA_MXFP4_SCALE_CAST``: a negative
  float -> uint8 cast that NVIDIA saturates; and an Inf block's -Inf elements lose their sign),
  so the backend rejects it with the reason; measured by calling AITER directly, and the
  harness tests above run with the rejection lifted as strict expected failures, on exactly the
  cases whose inputs reach those paths (checked on the CPU from the inputs themselves).
* FP8 (``dynamic_per_tensor_quant_fp8_i8``, ``dynamic_per_token_quant_fp8_i8``): on a GPU
  through the harness.  In Triton's interpreter they cast with the interpreter's wrong
  ``.to(fp8)``: the harness run is a strict expected failure, and the proof that the cast is
  the only cause is that AITER's codes equal the interpreter's own cast of the reference's
  exact pre-cast fp32 values, with bit-exact scales.  Seeded wrong kernels are caught by the
  harness on a GPU and by that same model in the interpreter.

Needs an AITER source (``$TEALITE_AITER_PATH`` or an installed aiter) and a GPU or
``TRITON_INTERPRET=1``; otherwise skipped with the reason.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import inspect
import os
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

import tealite
from tealite import recipes as R
from tealite.backends.aiter_common import loader as L
from tealite.backends.aiter_common import contracts as C
from tealite.errors import UnsupportedCase
from tealite.formats import ElementRounding, FP8ScaleRule, ScaleRounding
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.references import quantize as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_aiter import aiter_fp8_recipe, quant_case

REASON = L.why_unavailable()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_aiter = pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")
# Importing these loads nothing from AITER (kernels() does, on first use).
from tealite.backends import aiter_triton  # noqa: E402
from tealite.backends.aiter_triton import kernels  # noqa: E402
from tealite.backends.aiter_triton import quantize as AQ  # noqa: E402

F32 = np.float32
B = "aiter_triton"
AITER = FP8ScaleRule.AMAX_OVER_FMAX
MXFP4_AITER = R.MXFP4BlockScaling(ScaleRounding.EVEN, ElementRounding.TIES_AWAY)
SPEC = get_spec("quantize")
ON_NVIDIA = not INTERPRET and torch.cuda.is_available() and torch.version.hip is None
SCALE_CAST = aiter_triton.NVIDIA_MXFP4_SCALE_CAST
# Measured on the H100 (the specials case: its 21 -Inf elements, all in Inf blocks, were the
# only mismatches; scales right): an Inf block gets byte 0xFE and multiplier exp2(-127), a
# subnormal, and its -Inf elements come out +6 (code 0x7), as from a NaN (-Inf * 0, canonical
# +NaN): most likely the subnormal multiplier flushed to zero.
INF_SIGN = ("AITER's MXFP4 quantizer on NVIDIA encodes -Inf in an Inf block as +6 (code 0x7), "
            "not -6: its multiplier exp2(-127) is subnormal (flushed to zero there, so "
            "-Inf * 0 = NaN)")


def nvidia_xfail(reason: str):
    """AITER's MXFP4 quantizer run on NVIDIA (rejection lifted) where it is wrong: strict."""
    return pytest.mark.xfail(ON_NVIDIA, strict=True, raises=AssertionError, reason=reason)


@pytest.fixture
def mxfp4_on_nvidia():
    """Lift the backend's NVIDIA rejection of the MXFP4 quantizer (a no-op elsewhere), so the
    tests below run AITER's kernel on every target."""
    with aiter_triton.lift_platform_rejections(mxfp4_on_nvidia=True):
        yield


@pytest.fixture(scope="module")
def device(triton_device):
    return triton_device


@pytest.fixture(scope="module")
def fp8():
    """The loaded AITER's FP8 format name (e4m3 with gfx950 pinned, e4m3fnuz on gfx942)."""
    return "e4m3fnuz" if kernels().fp8_dtype == torch.float8_e4m3fnuz else "e4m3"


MX_RECIPE = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
             "element_rounding": "ties_away"}
EDGES = {"kind": "quant_edges", "fmt": "e2m1", "block": 32}
SPECIALS = {"kind": "specials", "frac": 0.2}
MX_CASES = [quant_case(MX_RECIPE, (40, 96), EDGES, "float32", 3),
            quant_case(MX_RECIPE, (7, 64), SPECIALS, "bfloat16", 4),
            quant_case(MX_RECIPE, (33, 32), {"kind": "tiny"}, "bfloat16", 5),
            quant_case(MX_RECIPE, (5, 160), {"kind": "wide", "log2_lo": -24, "log2_hi": 12},
                  "float16", 6)]
# Why each MX case fails on NVIDIA (None: it passes there; the wide case's blocks all have
# amax >= 4 and no -Inf).  test_nvidia_expectations_follow_from_the_inputs derives these.
MX_ON_NVIDIA = [SCALE_CAST, INF_SIGN, SCALE_CAST, None]


def _mx_id(c) -> str:
    return f"{c['dist']['kind']}-{c['dtype']}"


MX_PARAMS = [pytest.param(c, id=_mx_id(c), marks=[nvidia_xfail(why)] if why else [])
             for c, why in zip(MX_CASES, MX_ON_NVIDIA)]


def _run(case, device):
    return run_case(SPEC, case, backends=[B, "torch"], device=device)


def _assert_pass(report):
    assert report.outcomes[B].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


def _assert_caught(report):
    assert report.outcomes[B].status == "ok", report.describe()
    assert any(c.lhs == B and c.rhs == "reference" for c in report.failures), report.describe()


# ==== contracts =================================================================================

@needs_aiter
def test_every_entry_point_has_a_declared_contract():
    declared = {c.entry_point: c for c in C.contracts(B)}
    for ep in (AQ.PER_TENSOR, AQ.PER_TOKEN, AQ.STATIC, AQ.MXFP4):
        assert ep in declared and declared[ep].op == "quantize", ep
        assert declared[ep].family in C.TE_CONVENTIONS, ep
    for recipe in (R.Float8CurrentScaling("e4m3", "tensor", scale_rule=AITER),
                   R.Float8CurrentScaling("e4m3", "row", scale_rule=AITER), MXFP4_AITER):
        ep, why = AQ.entry_point(recipe)
        assert why is None and ep in declared
        numerics = AQ._numerics({"recipe": recipe, "dtype": torch.float32})
        assert numerics["entry_point"] == ep


@needs_aiter
def test_differences_from_te_are_listed():
    rows = {(r["entry_point"], r["field"]): (r["aiter"], r["te"])
            for r in C.differences_from_te(B)}
    assert rows[(AQ.PER_TOKEN, "scale_rule")] == ("amax/fmax", "fmax/amax")
    assert rows[(AQ.PER_TENSOR, "scale_rule")] == ("amax/fmax", "fmax/amax")
    assert rows[(AQ.MXFP4, "scale_rule")] == ("e8m0-even", "e8m0-rceil")
    assert rows[(AQ.MXFP4, "element_rounding")] == ("ties-away", "rne")
    assert rows[(AQ.STATIC, "scale_rule")] == ("given-scale_inv", "given")


# ==== dispatch: rejections with reasons =========================================================

def _rejected(x, recipe, match, **kw):
    with pytest.raises(UnsupportedCase, match=match):
        tealite.quantize(x, recipe, backend=B, **kw)


@needs_aiter
def test_recipes_with_other_conventions_are_rejected(fp8, device):
    x = torch.randn(4, 64, device=device)
    _rejected(x, R.Float8CurrentScaling(fp8, "row"), "follow scale_rule amax/fmax")
    _rejected(x, R.DelayedScaling(fp8), "amax", scale=torch.ones(1, device=device))
    _rejected(x, R.Float8BlockScaling(fp8), "block-scaling")
    _rejected(x, R.MXFP8BlockScaling(), "e2m1 only")
    _rejected(x, R.MXFP4BlockScaling(ScaleRounding.EVEN, ElementRounding.RNE),
              "ties-away, not even / rne")
    _rejected(x, R.MXFP4BlockScaling(ScaleRounding.FLOOR, ElementRounding.TIES_AWAY),
              "EVEN.*not floor")
    other = "e4m3" if fp8 == "e4m3fnuz" else "e4m3fnuz"
    _rejected(x, R.Float8CurrentScaling(other, "row", scale_rule=AITER), "FNUZ on gfx942")


@needs_aiter
def test_shapes_and_directions_aiter_cannot_do_are_rejected(fp8, device):
    def x(*shape):
        return torch.randn(*shape, device=device)
    _rejected(x(32, 64), MXFP4_AITER, "rows only", columnwise=True)
    _rejected(x(4, 48), MXFP4_AITER, "multiple of 32", pad=True)
    _rejected(x(0, 64), MXFP4_AITER, "M = 0")
    _rejected(x(4, 0), R.Float8CurrentScaling(fp8, "row", scale_rule=AITER), "empty row")


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's FP8 cast only")
@needs_aiter
def test_fp8_entry_points_are_rejected_in_the_interpreter(fp8):
    _rejected(torch.randn(4, 64), R.Float8CurrentScaling(fp8, "row", scale_rule=AITER),
              "interpreter's fp32 -> fp8")


@pytest.mark.parametrize("recipe,ep", [
    (R.Float8CurrentScaling("e4m3", "row", scale_rule=AITER), "dynamic_per_token_quant_fp8_i8"),
    (MXFP4_AITER, "dynamic_mxfp4_quant")])
@needs_aiter
def test_missing_entry_point_is_rejected_with_the_loaders_reason(monkeypatch, device, recipe,
                                                                  ep):
    at = kernels()
    monkeypatch.delitem(at.functions, ep)
    monkeypatch.setitem(at.missing, ep, "aiter.ops.triton.quant: AttributeError: moved")
    recipe = R.Float8CurrentScaling(AQ.fp8_name(at), "row", scale_rule=AITER) \
        if isinstance(recipe, R.Float8CurrentScaling) else recipe
    want = f"lacks {ep}: aiter.ops.triton.quant: AttributeError: moved"
    _rejected(torch.randn(4, 64, device=device), recipe, want)
    case = quant_case(aiter_fp8_recipe(recipe.fmt, "row") if recipe.kind == "current" else MX_RECIPE,
                 (4, 64), {"kind": "normal", "scale": 1.0})
    out = run_case(SPEC, case, backends=[B], device=device)
    assert out.outcomes[B].status == "unsupported" and want in out.outcomes[B].reason


# ==== MXFP4 =====================================================================================

@pytest.mark.parametrize("case", MX_PARAMS)
@needs_aiter
def test_mxfp4_passes_the_harness(mxfp4_on_nvidia, case, device):
    report = _run(case, device)
    _assert_pass(report)
    assert report.outcomes[B].numerics.entry_point == "dynamic_mxfp4_quant"


@functools.lru_cache(maxsize=None)
def _load_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def load_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.float32), mask=mask)

    return load_kernel


@pytest.mark.skipif(not INTERPRET, reason="a fact about Triton's CPU interpreter")
@needs_aiter
def test_interpreter_bf16_subnormal_load_is_wrong():
    """Why bf16 x reaches dynamic_mxfp4_quant as fp32 in the interpreter (NUMERICS.md): the
    kernel's `tl.load(x).to(tl.float32)` misreads bf16 subnormals there."""
    x = torch.tensor([2.0 ** -130, -(2.0 ** -127), 3 * 2.0 ** -133, 1.0, 2.0 ** -126],
                     dtype=torch.bfloat16)
    y = torch.empty(5)
    _load_kernel()[(1,)](x, y, 5, BLOCK=8)
    assert torch.equal(y[3:], x[3:].float())          # normal values load right
    assert not torch.equal(y[:3], x[:3].float())      # subnormals do not


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's bf16 load only")
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="Triton interpreter's bf16 subnormal load (proof above)")
@needs_aiter
def test_mxfp4_bf16_subnormals_without_the_fp32_handover():
    # Simulate a platform whose bf16 loads are right: bf16 x goes to AITER's kernel as is.
    with aiter_triton.PLATFORM.override(misreads_bf16_subnormals=False):
        _assert_pass(_run(MX_CASES[2], "cpu"))


def _aiter_mx(x, device):
    q = tealite.quantize(torch.from_numpy(x).to(device), MXFP4_AITER, backend=B)
    codes = ref.unpack_e2m1(q.data.cpu().numpy(), x.shape[1])
    return codes, q.scale_inv.cpu().numpy()


@nvidia_xfail(SCALE_CAST)
@needs_aiter
def test_mxfp4_declared_conventions_are_verified(mxfp4_on_nvidia, device):
    """The reference configured with the declared conventions passes AITER's output; with any
    other scale rule or element rounding it fails (so the declaration is checked)."""
    from tealite_verify.tensors import generate
    # Ties for the element rounding; a normal sample for the scale rules (on these exact
    # codes EVEN and FLOOR agree: block maxima are codes times powers of two).
    x = np.concatenate([generate(EDGES, (32, 128), torch.float32, 11).numpy(),
                        generate({"kind": "normal", "scale": 3.0}, (32, 128), torch.float32,
                                 12).numpy()])
    codes, scales = _aiter_mx(x, device)
    assert TQ.check_mx_scales(scales, ref.mx_quantize(x, "e2m1", "even",
                                                                    "ties_away")[1],
                                           x, "e2m1", "even").passed
    assert TQ.check_mx_codes(codes, scales, x, "e2m1", "ties_away").passed
    assert not TQ.check_mx_codes(codes, scales, x, "e2m1", "rne").passed
    for mode in ("floor", "ceil", "rceil"):
        other = ref.mx_quantize(x, "e2m1", mode, "ties_away")[1]
        assert not TQ.check_mx_scales(scales, other, x, "e2m1", mode).passed, mode


@nvidia_xfail(SCALE_CAST)  # its finite blocks have amax <= 3
@needs_aiter
def test_mxfp4_nonfinite_policy_is_declared_and_verified(mxfp4_on_nvidia, device):
    x = np.linspace(-3, 3, 4 * 64, dtype=F32).reshape(4, 64)
    x[0, 3] = np.nan          # NaN left out of the block amax; the element encodes as +-6
    x[1, 40] = np.inf         # an Inf block gets the largest exponent, byte 0xFE
    x[2, :32] = np.nan        # a block of only NaN: undefined scale
    codes, scales = _aiter_mx(x, device)
    want, undefined = ref.mx_scales_nan_ignoring(x, "e2m1", "even")
    assert undefined.tolist() == [[False, False], [False, False], [True, False],
                                  [False, False]]
    np.testing.assert_array_equal(np.where(undefined, 0, scales), np.where(undefined, 0, want))
    assert scales[1, 1] == 0xFE and ref.mx_quantize(x, "e2m1", "even", "ties_away")[1][1, 1] \
        == 0xFF
    assert codes[0, 3] & 0x7 == 0x7 and codes[1, 40] == 0x7
    r = quant_case(MX_RECIPE, x.shape, {"kind": "normal", "scale": 1.0})
    expected = SPEC.reference({"x": x.astype(np.float64)}, r)
    outs = {"data": torch.from_numpy(ref.pack_e2m1(codes)), "scale_inv": torch.from_numpy(scales)}
    for name in ("data", "scale_inv"):
        assert expected[name].check(outs, Numerics(mx_nonfinite="ignore-nan")).passed, name
    # Declaring TE's policy instead fails: the Inf block's scale and the NaN element's code.
    assert not expected["scale_inv"].check(outs, Numerics()).passed


def _seed_kernel(tmp_path, monkeypatch, ep: str, kernel: str, old: str, new: str):
    """Replace ``kernel`` in the module of AITER's ``ep`` wrapper with a copy compiled from
    AITER's own kernel source with ``old`` replaced by ``new`` (exactly once)."""
    wrapper = sys.modules[kernels().functions[ep].__module__]
    original = getattr(wrapper, kernel)
    path = inspect.getsourcefile(L._innermost_kernel(original).fn)
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, f"{old!r} not unique in {path}"
    seeded = tmp_path / f"seeded_{kernel}_{abs(hash(new))}.py"
    seeded.write_text(text.replace(old, new))
    spec = importlib.util.spec_from_file_location(seeded.stem, seeded)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    copy = getattr(module, kernel)
    # As the loader does for AITER's own kernels: AMD-only launch options dropped off ROCm,
    # the interpreter's check of AITER's `tl.assume(pid > 0)` hint disabled.
    L._wrap_launch(L._innermost_kernel(copy), () if L._on_rocm() else L.AMD_ONLY_LAUNCH_OPTIONS,
                   INTERPRET and L._interpreter_has_assume_hook())
    monkeypatch.setattr(wrapper, kernel, copy)


MX_SEEDS = {
    # EVEN rounds amax at E2M1's mantissa width (half of bit 22); one bit up rounds too much.
    "scale-rounding": ("(amax + 0x200000)", "(amax + 0x400000)"),
    # Ties away adds half an E2M1 ulp before the shift; without it elements truncate.
    "element-rounding": ("(m >> 21)) + 1) >> 1", "(m >> 21)) + 0) >> 1"),
}


@nvidia_xfail(MX_ON_NVIDIA[0])  # the correct kernel must pass MX_CASES[0] first
@pytest.mark.parametrize("seed", sorted(MX_SEEDS))
@needs_aiter
def test_seeded_wrong_mxfp4_kernel_is_caught(tmp_path, monkeypatch, mxfp4_on_nvidia, device,
                                            seed):
    case = MX_CASES[0]
    _assert_pass(_run(case, device))
    _seed_kernel(tmp_path, monkeypatch, AQ.MXFP4, "_dynamic_mxfp4_quant_kernel",
                 *MX_SEEDS[seed])
    _assert_caught(_run(case, device))


@pytest.mark.parametrize("perturb", ["swapped-nibbles", "scale+1"])
@needs_aiter
def test_wrapped_mxfp4_outputs_are_caught(monkeypatch, mxfp4_on_nvidia, device, perturb):
    at = kernels()
    real = at.functions[AQ.MXFP4]

    def wrong(x, *args, **kw):
        codes, scales = real(x, *args, **kw)
        if perturb == "swapped-nibbles":
            return ((codes << 4) | (codes >> 4)).to(torch.uint8), scales
        scales = scales.clone()
        scales[0, 0] += 1
        return codes, scales

    monkeypatch.setitem(at.functions, AQ.MXFP4, wrong)
    _assert_caught(_run(MX_CASES[0], device))


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's FP8 rejection")
def test_lifting_a_platform_rejection_is_scoped_to_its_block():
    """A lifted rejection holds inside its block only, and lifting one keeps the others as
    they are (a test or a gate probe cannot leak it into later cases)."""
    cast = aiter_triton.INTERPRETER_FP8_CAST
    assert aiter_triton.fp8_platform_reason() == cast
    with aiter_triton.lift_platform_rejections(mxfp4_on_nvidia=True):
        with aiter_triton.lift_platform_rejections(fp8_in_interpreter=True):
            assert aiter_triton.fp8_platform_reason() is None
            with aiter_triton.lift_platform_rejections(mxfp4_on_nvidia=True):
                assert aiter_triton.fp8_platform_reason() is None
        assert aiter_triton.fp8_platform_reason() == cast
    assert aiter_triton.fp8_platform_reason() == cast
    assert not hasattr(aiter_triton, "REJECT_FP8_IN_INTERPRETER")  # no global to patch


# ---- MXFP4 on NVIDIA: rejected, and why -------------------------------------------------------

NVIDIA_ONLY = "NVIDIA only (AITER's MXFP4 quantizer is right in the interpreter and on AMD)"


@pytest.mark.skipif(not ON_NVIDIA, reason=NVIDIA_ONLY)
@needs_aiter
def test_mxfp4_is_rejected_on_nvidia_with_the_reason(device):
    assert aiter_triton.mxfp4_platform_reason() == SCALE_CAST
    _rejected(torch.randn(4, 64, device=device), MXFP4_AITER, re.escape(SCALE_CAST))
    out = run_case(SPEC, MX_CASES[3], backends=[B], device=device)  # even a case it gets right
    assert out.outcomes[B].status == "unsupported" and SCALE_CAST in out.outcomes[B].reason


@pytest.mark.skipif(not ON_NVIDIA, reason=NVIDIA_ONLY)
@needs_aiter
def test_aiter_mxfp4_scale_byte_saturates_on_nvidia(device):
    """SCALE_CAST, measured on AITER's own entry point: amax 1.0 has unbiased exponent
    0 - 2 (E2M1's emax) = -2, byte 125; AITER's ``(-2.0).to(tl.uint8)`` saturates to 0 on
    NVIDIA, so it writes 127.  A block with a positive exponent (amax 8: byte 128) is right."""
    x = np.concatenate([np.linspace(-1, 1, 32, dtype=F32), np.linspace(-8, 8, 32, dtype=F32)])
    x = x.reshape(1, 64)
    _, scales = kernels().dynamic_mxfp4_quant(torch.from_numpy(x).to(device))
    assert ref.mx_quantize(x, "e2m1", "even", "ties_away")[1].tolist() == [[125, 128]]
    assert scales.contiguous().cpu().numpy().tolist() == [[127, 128]]


@pytest.mark.skipif(not (INTERPRET or ON_NVIDIA), reason="measured in the interpreter and on "
                    "NVIDIA")
@needs_aiter
def test_aiter_mxfp4_sign_of_minus_inf_in_an_inf_block(device):
    """INF_SIGN: an Inf block gets byte 0xFE and +Inf code 0x7 everywhere; -Inf keeps its sign
    (0xF, what the reference's AITER policy wants) in the interpreter, not on NVIDIA."""
    x = np.linspace(-1, 1, 32, dtype=F32).reshape(1, 32)
    x[0, 3], x[0, 5] = -np.inf, np.inf
    codes, scales = kernels().dynamic_mxfp4_quant(torch.from_numpy(x).to(device))
    codes = ref.unpack_e2m1(codes.cpu().numpy(), 32)
    assert scales.contiguous().cpu().numpy().tolist() == [[0xFE]]
    assert codes[0, 5] == 0x7
    assert codes[0, 3] == (0x7 if ON_NVIDIA else 0xF)


def test_nvidia_expectations_follow_from_the_inputs():
    """MX_ON_NVIDIA derived from each case's input: the saturated cast is reached exactly where
    a block's right E8M0 byte is below 127 (a negative unbiased exponent: AITER writes 127
    there), the Inf-block sign where an element is -Inf.  (No AITER needed.)"""
    for case, why in zip(MX_CASES, MX_ON_NVIDIA):
        x = SPEC.make_inputs(case, "cpu")["x"].float().numpy()
        causes = []
        if (ref.mx_quantize(x, "e2m1", "even", "ties_away")[1] < 127).any():
            causes.append(SCALE_CAST)
        if (x == -np.inf).any():
            causes.append(INF_SIGN)
        assert causes == ([why] if why else []), _mx_id(case)


# ==== FP8: the interpreter's cast, and the entry points =========================================

@pytest.fixture
def fp8_in_interpreter():
    with aiter_triton.lift_platform_rejections(fp8_in_interpreter=True):
        yield


@functools.lru_cache(maxsize=None)
def _cast_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def cast_kernel(v_ptr, q_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(q_ptr + offs, tl.load(v_ptr + offs, mask=mask).to(q_ptr.dtype.element_ty),
                 mask=mask)

    return cast_kernel


def _triton_cast(v: np.ndarray, dtype: torch.dtype, device: str = "cpu") -> np.ndarray:
    """Code bits of Triton's ``tl.load(v).to(fp8)`` (fp32 v) on ``device``: in the interpreter
    on the CPU, the target's own conversion on a GPU."""
    import triton
    flat = torch.from_numpy(np.ascontiguousarray(v, F32)).reshape(-1).to(device)
    q = torch.empty(flat.shape, dtype=dtype, device=device)
    _cast_kernel()[(1,)](flat, q, flat.numel(),
                         BLOCK=triton.next_power_of_2(max(flat.numel(), 1)))
    return q.view(torch.uint8).cpu().numpy().reshape(v.shape)


@pytest.mark.skipif(not INTERPRET, reason="a fact about Triton's CPU interpreter")
@needs_aiter
def test_interpreter_fp32_to_fp8_cast_is_wrong():
    """The cause (NUMERICS.md), on the values the FP8 proof below runs into."""
    v = np.array([-8.5, -7.99, 336.0, np.nan, 1.0], F32)
    got = _triton_cast(v, torch.float8_e4m3fn)
    rne = ref.codes_to_bits(v.astype(ml_dtypes.float8_e4m3fn))
    assert rne.tolist()[:3] == [0xD0, 0xD0, 0x7A] and got[4] == rne[4] == 0x38
    assert got[0] == 0xD1                # the tie -8.5 rounds away (-9), RNE gives -8
    assert got[1] == 0xC8                # -7.99 collapses to -4, RNE gives -8
    assert got[2] == 0x7B                # the tie 336 rounds away (352), RNE gives 320
    assert not np.isnan(ref.decode(got[3:4], "e4m3"))[0]  # NaN becomes a finite code


def _fp8_inputs(gran: str):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(12, 80, generator=g) * 3
    x[2] = 0.0                                       # amax 0: scale 0, NaN codes
    x[3, 5] = float("nan")                           # left out of the amax
    if gran == "row":  # (per tensor an Inf would make every code +-0 or NaN)
        x[4, 7], x[4, 8] = float("inf"), -1.0        # amax Inf: scale Inf, +-0 and NaN
    # The two rules' fp32 products straddle the E4M3 midpoint 336 (neither is a tie):
    # 9.421875 * fl(448 / 12.5625) < 336 < 9.421875 * fl(1 / fl(12.5625 / 448)).
    x[5, :2] = torch.tensor([12.5625, 9.421875])
    x[5, 2:] = torch.linspace(-12.5, 12.5, 78)
    return x


def _model_mismatches(x: torch.Tensor, gran: str, q) -> int:
    """Elements where AITER's codes differ from the interpreter's own cast of the reference's
    exact pre-cast fp32 values; scale_inv must be bit-exact (the interpreter divides exactly)."""
    fmt = AQ.fp8_name(kernels())
    xn = x.float().numpy()
    bits, sinv, _ = ref.fp8_quantize(xn, fmt, gran, scale_rule=AITER.value)
    np.testing.assert_array_equal(q.scale_inv.numpy().view(np.uint32), sinv.view(np.uint32))
    v = ref.aiter_scaled(xn, sinv[:, None] if gran == "row" else sinv[0])
    model = _triton_cast(v, kernels().fp8_dtype)
    got = q.data.view(torch.uint8).numpy()
    return int((got != model).sum()), int((got != bits).sum())


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's FP8 cast only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("gran", ["tensor", "row"])
@needs_aiter
def test_interpreter_fp8_cast_is_the_only_difference(fp8_in_interpreter, gran, dtype):
    x = _fp8_inputs(gran).to(dtype)
    recipe = R.Float8CurrentScaling(AQ.fp8_name(kernels()), gran, scale_rule=AITER)
    q = tealite.quantize(x, recipe, backend=B)
    off_model, off_reference = _model_mismatches(x, gran, q)
    assert off_model == 0
    assert off_reference > 0  # ... and the interpreter's cast is why it fails the harness


FP8_CASES = [("tensor", "float32", {"kind": "normal", "scale": 4.0}),
             ("row", "bfloat16", {"kind": "specials", "frac": 0.2}),
             ("row", "float16", {"kind": "zero_rows", "scale": 1.0, "frac": 0.25}),
             ("tensor", "bfloat16", {"kind": "wide", "log2_lo": -12, "log2_hi": 6})]


@pytest.mark.xfail(INTERPRET, strict=True, raises=AssertionError,
                   reason="Triton interpreter's fp32 -> fp8 cast (see the proof above)")
@pytest.mark.parametrize("gran,dtype,dist", FP8_CASES, ids=lambda p: str(p))
@needs_aiter
def test_fp8_entry_points_pass_the_harness(fp8_in_interpreter, fp8, device, gran, dtype, dist):
    report = _run(quant_case(aiter_fp8_recipe(fp8, gran), (24, 72), dist, dtype, 9), device)
    _assert_pass(report)
    want = AQ.PER_TENSOR if gran == "tensor" else AQ.PER_TOKEN
    assert report.outcomes[B].numerics.entry_point == want


FP8_SEEDS = {
    # The FNUZ max (240) with OCP codes: scales 448/240 too large (ROCm TE PR 485's bug class).
    "per-token-max": (AQ.PER_TOKEN, "_dynamic_per_token_quant_fp8_i8_kernel",
                      "scale_out = m.to(tl.float32) / DTYPE_MAX",
                      "scale_out = m.to(tl.float32) / 240.0"),
    "per-tensor-max": (AQ.PER_TENSOR, "_dynamic_per_tensor_quant_fp8_i8_kernel",
                       "tl.atomic_max(scale_out_ptr, m / DTYPE_MAX",
                       "tl.atomic_max(scale_out_ptr, m / 240.0"),
    # TE's rule inside AITER's kernel: x * (max / amax) instead of x * (1 / (amax / max)).
    # Within a 2-ulp division bound the two are indistinguishable: interpreter only.
    "te-rule": (AQ.PER_TOKEN, "_dynamic_per_token_quant_fp8_i8_kernel",
                "scale_recip = 1 / scale_out",
                "scale_recip = DTYPE_MAX / m.to(tl.float32)"),
}


@pytest.mark.parametrize("seed", sorted(FP8_SEEDS))
@needs_aiter
def test_seeded_wrong_fp8_kernel_is_caught(tmp_path, monkeypatch, fp8_in_interpreter, fp8,
                                           device, seed):
    ep, kernel, old, new = FP8_SEEDS[seed]
    gran = "tensor" if ep == AQ.PER_TENSOR else "row"
    if not INTERPRET and seed == "te-rule":
        pytest.skip("TE's and AITER's multipliers are within the declared 2-ulp division bound")
    x = _fp8_inputs(gran)
    recipe = R.Float8CurrentScaling(fp8, gran, scale_rule=AITER)
    case = quant_case(aiter_fp8_recipe(fp8, gran), (24, 72), {"kind": "normal", "scale": 4.0},
                 "float32", 9)
    if INTERPRET:
        assert _model_mismatches(x, gran, tealite.quantize(x, recipe, backend=B))[0] == 0
    else:
        _assert_pass(_run(case, device))
    _seed_kernel(tmp_path, monkeypatch, ep, kernel, old, new)
    if INTERPRET:
        q = tealite.quantize(x, recipe, backend=B)
        with pytest.raises(AssertionError):
            assert _model_mismatches(x, gran, q)[0] == 0
    else:
        _assert_caught(_run(case, device))


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="the target's own cast")
@needs_aiter
def test_target_fp32_to_fp8_cast_rounds_to_nearest_even_and_saturates():
    """What the contracts' "cast" is on this GPU: RNE on ties, and finite values past max
    saturate (AITER's rule never reaches past max: |x| <= amax)."""
    at = kernels()
    fmax = torch.finfo(at.fp8_dtype).max
    v = np.array([-8.5, -7.99, 336.0 * fmax / 448, 1.0, fmax * 1.2, -fmax * 1.5], F32)
    got = ref.decode(_triton_cast(v, at.fp8_dtype, "cuda"), AQ.fp8_name(at))
    rne = torch.from_numpy(np.clip(v, -fmax, fmax)).to(at.fp8_dtype).float().numpy()
    np.testing.assert_array_equal(got, rne)
    assert got[4] == fmax and got[5] == -fmax
