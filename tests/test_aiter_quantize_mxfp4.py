"""``quantize`` on the ``aiter_triton`` backend with MXFP4: AITER's ``dynamic_mxfp4_quant``,
checked against the reference configured with the conventions it declares.  Contracts, dispatch
and the FP8 entry points: test_aiter_quantize.py.

* MXFP4 passes the harness (EVEN scales, ties-away elements, AITER's NaN / Inf policy); the
  declared conventions are verified (the reference with another rounding or policy fails it);
  AITER's kernel source with a changed rounding constant, and wrapped outputs, are caught.
  bf16 x reaches the kernel as fp32 in the interpreter, whose bf16 subnormal load is wrong.
* MXFP4 on NVIDIA: AITER's kernel is wrong there (``NVIDIA_MXFP4_SCALE_CAST``: a negative
  float -> uint8 cast that NVIDIA saturates; and an Inf block's -Inf elements lose their sign),
  so the backend rejects it with the reason; measured by calling AITER directly, and the
  harness tests above run with the rejection lifted as strict expected failures, on exactly the
  cases whose inputs reach those paths (checked on the CPU from the inputs themselves).

Needs an AITER source (``$TEALITE_AITER_PATH`` or an installed aiter) and a GPU or
``TRITON_INTERPRET=1``; otherwise skipped with the reason.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

import tealite
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.references import quantize as ref
from tealite_verify.runner import run_case

from _helpers_aiter import B, quant_case
from _helpers_aiter_quantize import (F32, INTERPRET, MX_RECIPE, MXFP4_AITER, SPEC, _assert_caught,
                                     _assert_pass, _rejected, _run, _seed_kernel, needs_aiter)
from _helpers_aiter_quantize import device  # noqa: F401  (a fixture: the tests ask for it by name)
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import kernels
from tealite.backends.aiter_triton import quantize as AQ

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
