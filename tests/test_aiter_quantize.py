"""``quantize`` on the ``aiter_triton`` backend (tealite/backends/aiter_triton/quantize.py):
contracts, dispatch and the FP8 entry points.  MXFP4 (``dynamic_mxfp4_quant``):
test_aiter_quantize_mxfp4.py.

* Contracts: every entry point used has one, with the family keys of the TE-difference table.
* Dispatch: every case an entry point cannot do, or whose recipe asks for another convention,
  is rejected with the reason; a missing entry point is rejected with the loader's reason; a
  lifted platform rejection holds inside its block only.
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

import ml_dtypes
import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.aiter_common import contracts as C
from tealite.formats import ElementRounding, FP8ScaleRule, ScaleRounding
from tealite_verify.references import quantize as ref
from tealite_verify.runner import run_case

from _helpers_aiter import B, aiter_fp8_recipe, quant_case
from _helpers_aiter_quantize import (F32, INTERPRET, MX_RECIPE, MXFP4_AITER, SPEC, _assert_caught,
                                     _assert_pass, _rejected, _run, _seed_kernel, needs_aiter)
from _helpers_aiter_quantize import device  # noqa: F401  (a fixture: the tests ask for it by name)
from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import kernels
from tealite.backends.aiter_triton import quantize as AQ

AITER = FP8ScaleRule.AMAX_OVER_FMAX


@pytest.fixture(scope="module")
def fp8():
    """The loaded AITER's FP8 format name (e4m3 with gfx950 pinned, e4m3fnuz on gfx942)."""
    return "e4m3fnuz" if kernels().fp8_dtype == torch.float8_e4m3fnuz else "e4m3"


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
