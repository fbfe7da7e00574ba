"""AITER's FP8 scale rule (``FP8ScaleRule.AMAX_OVER_FMAX``) without AITER: the recipe, the torch
backend's and the triton backend's handling of it, and the ``fp32_div_ulps`` tier that judges
what a GPU build of AITER's FP8 quantizers may legitimately return (Triton's ``/`` is CUDA's
approximate ``div.full.f32`` there).  The AITER kernels themselves: tests/test_aiter_quantize.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

import tealite
from tealite import recipes as R
from tealite.errors import UnsupportedCase
from tealite.formats import FP8ScaleRule
from tealite_verify.references import quantize as ref
from tealite_verify.specs import get_spec

from _helpers_aiter import aiter_fp8_recipe, quant_case

AITER = FP8ScaleRule.AMAX_OVER_FMAX
SPEC = get_spec("quantize")
F32 = np.float32


@pytest.fixture(scope="module")
def device(triton_device):
    return triton_device


# ==== the fp32_div_ulps tiers of AITER's rule (no AITER needed) ===============================
# What a GPU build of AITER's FP8 kernels may legitimately return (Triton's '/' is CUDA's
# div.full.f32 there, <= 2 ulp), simulated: scale_inv and the reciprocal off by a few ulp.

def _nudge(v, steps):
    v = np.asarray(v, F32).copy()
    finite = np.isfinite(v) & (v != 0)
    for _ in range(abs(steps)):
        v = np.where(finite, np.nextafter(v, F32(np.inf if steps > 0 else -np.inf)), v)
    return v.astype(F32)


def _approx_outputs(x, gran, scale_steps, recip_steps):
    per_row = gran == "row"
    amax = ref.aiter_amax(x, per_row=per_row)
    s = _nudge(ref.aiter_scale_inv(amax, "e4m3"), scale_steps)
    r = _nudge(ref.reciprocal(s), recip_steps)
    v = ref.aiter_scaled(x, None, recip=r[:, None] if per_row else r)
    codes = ref.codes_to_bits(ref.round_elements(v, "e4m3"))
    return {"data": torch.from_numpy(codes).view(torch.float8_e4m3fn),
            "scale_inv": torch.from_numpy(s)}


def _tier_x():
    g = np.random.default_rng(3)
    x = (g.standard_normal((16, 256)) * 3).astype(F32)
    x[1] = 0.0
    x[2, 3] = np.nan
    x[3, 4] = np.inf
    return x


@pytest.mark.parametrize("gran", ["tensor", "row"])
def test_fp32_div_ulps_tier_accepts_the_declared_error_and_no_more(gran):
    x = _tier_x() if gran == "row" else np.nan_to_num(_tier_x(), posinf=0.0)
    case = quant_case(aiter_fp8_recipe("e4m3", gran), x.shape, {"kind": "normal", "scale": 1.0})
    expected = SPEC.reference({"x": x.astype(np.float64)}, case)
    approx = Numerics(fp32_div_ulps=2)

    def verdict(outs, numerics):
        return {n: expected[n].check(outs, numerics).passed for n in ("data", "scale_inv")}

    exact = _approx_outputs(x, gran, 0, 0)
    assert verdict(exact, Numerics()) == verdict(exact, approx) == {"data": True, "scale_inv": True}
    # Both divisions one fp32 step from the correctly rounded result (<= 1.5 ulp from the
    # exact quotient): a legal GPU result; not for an IEEE division.
    off = _approx_outputs(x, gran, 1, -1)
    assert verdict(off, approx) == {"data": True, "scale_inv": True}
    assert verdict(off, Numerics())["scale_inv"] is False
    assert verdict(_approx_outputs(x, gran, 3, 0), approx)["scale_inv"] is False
    # Codes under a reciprocal beyond the bound (here 4000 ulp: some products cross a
    # rounding boundary) fail, as does one bumped code.
    assert verdict(_approx_outputs(x, gran, 0, 4000), approx)["data"] is False
    bumped = dict(off, data=off["data"].view(torch.uint8).clone())
    bumped["data"][0, 0] += 1
    bumped["data"] = bumped["data"].view(torch.float8_e4m3fn)
    assert verdict(bumped, approx)["data"] is False
    # Pairwise: exact vs approximate passes; two approximations each judged on their own.
    for name in ("data", "scale_inv"):
        assert expected[name].check_pair(exact, off, Numerics(), approx).passed, name
    assert not expected["scale_inv"].check_pair(exact, off, Numerics(), Numerics()).passed


def test_aiter_rule_reports_no_amax():
    x = _tier_x()
    case = quant_case(aiter_fp8_recipe("e4m3", "row"), x.shape, {"kind": "normal", "scale": 1.0})
    expected = SPEC.reference({"x": x.astype(np.float64)}, case)
    outs = _approx_outputs(x, "row", 0, 0)
    assert expected["amax"].check(outs, Numerics()).passed
    outs["amax"] = torch.from_numpy(ref.aiter_amax(x, per_row=True))
    assert not expected["amax"].check(outs, Numerics()).passed


def test_aiter_rule_recipe_and_torch_backend():
    r = R.Float8CurrentScaling("e4m3", "row", scale_rule="amax/fmax")
    assert r.scale_rule is AITER
    assert R.describe(r) == "current[e4m3,row,pow2=False,amax/fmax]"
    assert R.describe(R.Float8CurrentScaling("e4m3", "row")) == "current[e4m3,row,pow2=False]"
    with pytest.raises(ValueError, match="no force_pow2_scales"):
        R.Float8CurrentScaling("e4m3", "row", force_pow2_scales=True, scale_rule=AITER)
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        R.Float8CurrentScaling("e4m3", "row", scale_rule="max/amax")
    # The torch backend follows the rule (the hand-computed case of test_references_quantize)
    # and reports no amax (the triton backend rejects it: the next test).
    x = torch.tensor([[4.75, 3.5625], [0.0, 0.0]])
    q = tealite.quantize(x, r, backend="torch")
    assert q.amax is None
    assert q.data.view(torch.uint8)[0].tolist() == [0x7E, 0x7B]
    assert torch.isnan(q.data[1].float()).all() and q.scale_inv[1] == 0
    assert q.scale_inv[0] == torch.tensor(4.75) / 448


def test_triton_backend_rejects_aiters_rule(device):
    """On the device the triton backend runs on (so the rejection is the rule's, not the
    device's)."""
    r = R.Float8CurrentScaling("e4m3", "row", scale_rule=AITER)
    x = torch.tensor([[4.75, 3.5625], [0.0, 0.0]], device=device)
    with pytest.raises(UnsupportedCase, match="AITER's"):
        tealite.quantize(x, r, backend="triton")
    with pytest.raises(UnsupportedCase, match="AITER's"):  # its fused kernels: TE's rule only
        tealite.rmsnorm_fwd_quantize(x, torch.ones(2, device=device), r, backend="triton")
