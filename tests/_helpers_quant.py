"""Shared helpers of the quantization tier tests (test_quant_tiers_primitives.py,
test_quant_seeded_bugs.py, test_quant_legit_differences.py): quantize case builders, a spec
variant that feeds a crafted x through the real quantize spec (reference, checks and pairwise
checks unchanged), an independent re-quantization under arbitrary E8M0 scales, alternative RCEIL
scale rules, runner assertions, and the inputs, recipes and backends more than one of those
files uses.

Wrong backends wrap the torch backend's implementation (``TORCH_Q``) and corrupt one thing; the
re-quantization helpers reuse the torch backend's (correct) element casts so that each seeded
backend differs from torch in exactly the seeded respect.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

import tealite
from tealite.backends.torch import quantize as TQB
from tealite.formats import ElementRounding, get_format
from tealite.ops.quantize import QuantizedTensor
from tealite_verify.tiers import e8m0_adjusted as TQ
from tealite_verify.references import quantize as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

F32 = np.float32
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TORCH_Q = tealite.get_backend("torch").impls["quantize"].fn
TORCH_DQ = tealite.get_backend("torch").impls["dequantize"].fn
E8M0_NAN = 0xFF


# ---- cases ---------------------------------------------------------------------------------

def mx(fmt="e4m3", scale="rceil", elem="rne") -> dict:
    return {"kind": "mx", "fmt": fmt, "scale_rounding": scale, "element_rounding": elem}


def qcase(recipe: dict, dtype: str, shape, *, rowwise=True, columnwise=False, pad=False,
          dist=None, seed=1) -> dict:
    if dist is None:
        fmt = recipe["fmt"]
        dist = {"kind": "quant_edges", "fmt": fmt, "block": 32}
    return {"recipe": recipe, "dtype": dtype, "shape": list(shape), "rowwise": rowwise,
            "columnwise": columnwise, "pad": pad, "dist": dist, "seed": seed}


def crafted(x: torch.Tensor, recipe: dict, *, rowwise=True, columnwise=False, pad=False):
    """(spec, case) running the real quantize spec on a crafted x (NaN, subnormals, exact
    amaxes... that no distribution draws).  Only make_inputs differs from the registered spec."""
    x = x.detach().clone()
    spec = dataclasses.replace(get_spec("quantize"),
                               make_inputs=lambda case, device: {"x": x.clone().to(device)})
    dtype = str(x.dtype).removeprefix("torch.")
    case = qcase(recipe, dtype, x.shape, rowwise=rowwise, columnwise=columnwise, pad=pad,
                 dist={"kind": "crafted"})
    return spec, case


# ---- runner assertions ---------------------------------------------------------------------

def comparisons(report, lhs, rhs, output=None):
    return [c for c in report.comparisons if {c.lhs, c.rhs} == {lhs, rhs}
            and (output is None or c.output == output)]


def run(spec_or_op, case, wrong):
    spec = get_spec(spec_or_op) if isinstance(spec_or_op, str) else spec_or_op
    report = run_case(spec, case, backends=["torch", wrong])
    info = report.describe()
    assert report.outcomes["torch"].status == "ok", info
    assert report.outcomes[wrong].status == "ok", info
    torch_ref = comparisons(report, "torch", "reference")
    assert torch_ref and all(c.metrics.passed for c in torch_ref), info
    return report, info


def assert_caught(spec_or_op, case, wrong, *, outputs, pairwise=True):
    """torch passes; ``wrong`` fails against the reference on one of ``outputs`` (and pairwise
    against torch).  Returns the report."""
    report, info = run(spec_or_op, case, wrong)
    bad_ref = [c for c in comparisons(report, wrong, "reference") if not c.metrics.passed]
    assert {c.output for c in bad_ref} & set(outputs), \
        "wrong backend not caught against the reference:\n" + info
    if pairwise:
        bad_pair = [c for c in comparisons(report, "torch", wrong) if not c.metrics.passed]
        assert bad_pair, "wrong backend not caught pairwise against torch:\n" + info
    assert report.verdict == "fail", info
    return report


def assert_passes(spec_or_op, case, name):
    report, info = run(spec_or_op, case, name)
    assert report.verdict == "pass", info
    assert comparisons(report, "torch", name), info
    return report


def metrics(report, lhs, rhs, output):
    (c,) = comparisons(report, lhs, rhs, output)
    return c.metrics


def register_quantize(make_backend, prefix, fn, numerics=None) -> str:
    b = make_backend(prefix)
    b.implements("quantize", dtypes=FLOATS, numerics=numerics)(fn)
    return b.name


def per_direction(x, recipe, rowwise, columnwise, one) -> QuantizedTensor:
    """A QuantizedTensor whose rowwise / columnwise (x.T) parts come from ``one(t, recipe)``."""
    out = QuantizedTensor(recipe=recipe, shape=tuple(x.shape), amax=TQB._recipe_amax(x, recipe))
    if rowwise:
        out.data, out.scale_inv = one(x, recipe)
    if columnwise:
        out.columnwise_data, out.columnwise_scale_inv = one(x.t().contiguous(), recipe)
    return out


# ---- MX: re-quantization under given E8M0 scales (torch, independent of the numpy ref) --------

def mx_block_amax(t: torch.Tensor, block=32) -> torch.Tensor:
    m, k = t.shape
    nb = -(-k // block)
    xp = torch.nn.functional.pad(t.float(), (0, nb * block - k))
    return xp.reshape(m, nb, block).abs().amax(dim=-1) if k else torch.zeros(m, 0)


def mx_codes_under(t: torch.Tensor, biased: torch.Tensor, recipe, rounding=None,
                   block=32) -> torch.Tensor:
    """Codes of t (M, K) quantized with the E8M0 bytes ``biased`` (M, nb): packed uint8 for
    e2m1, the FP8 dtype otherwise.  Codes under a NaN scale are 0."""
    fmt = get_format(recipe.fmt)
    rounding = recipe.element_rounding if rounding is None else rounding
    m, k = t.shape
    nb = biased.shape[1]
    blocks = torch.nn.functional.pad(t.float(), (0, nb * block - k)).reshape(m, nb, block)
    e = biased.to(torch.int32) - 127
    scaled = torch.ldexp(blocks.double(), (-e).unsqueeze(-1).double()).float()
    if fmt.packed:
        codes = TQB.e2m1_codes(scaled, rounding)
    else:
        cast = TQB.fp8_cast_rne if rounding is ElementRounding.RNE else TQB.fp8_cast_ties_away
        codes = cast(scaled, fmt).view(torch.uint8)
    codes = torch.where((biased == E8M0_NAN).unsqueeze(-1), torch.zeros_like(codes), codes)
    codes = codes.reshape(m, nb * block)[:, :k]
    return TQB._pack_nibbles(codes) if fmt.packed else codes.view(fmt.torch_dtype)


def e8m0_from_exponent(e: np.ndarray, amax: np.ndarray) -> np.ndarray:
    biased = np.clip(e, -127, 127) + 127
    biased = np.where(amax == 0, 0, biased)
    biased = np.where(~np.isfinite(amax), E8M0_NAN, biased)
    return biased.astype(np.uint8)


def _ceil_log2(r: np.ndarray) -> np.ndarray:
    """ceil(log2 r) for positive float64 r, exact (frexp)."""
    mant, ex = np.frexp(r)
    return np.where(mant == 0.5, ex - 1, ex).astype(np.int64)


def rceil_float64(amax, fmt: str) -> np.ndarray:
    """RCEIL with the ratio amax / max in float64: ceil(log2) of the exact ratio (amax has 24
    bits, so float64 never rounds the ratio across a power of two)."""
    a = np.asarray(amax, np.float64)
    safe = np.where(np.isfinite(a) & (a > 0), a, 1.0)
    return e8m0_from_exponent(_ceil_log2(safe / get_format(fmt).max), a)


def rceil_fp32_division(amax, fmt: str) -> np.ndarray:
    """RCEIL with the ratio amax / max as one fp32 division (instead of amax * (1/max))."""
    a = np.asarray(amax, F32)
    safe = np.where(np.isfinite(a) & (a > 0), a, F32(1.0)).astype(F32)
    r = (safe / F32(get_format(fmt).max)).astype(F32)
    e = np.where(r > 0, _ceil_log2(np.where(r > 0, r, 1.0).astype(np.float64)), -127)
    return e8m0_from_exponent(e, a)


def mx_backend_with_scales(scale_rule):
    """A quantize fn: MX scales from ``scale_rule(t, recipe, torch_scales) -> uint8 (M, nb)``,
    codes = the re-quantization of the original values under those scales."""
    def fn(x, recipe, *, rowwise, columnwise, scale):
        def one(t, r):
            _, torch_scales = TQB._mx_rowwise(t, r)
            biased = torch.as_tensor(np.asarray(scale_rule(t, r, torch_scales.numpy()),
                                                np.uint8))
            return mx_codes_under(t, biased, r), biased
        return per_direction(x, recipe, rowwise, columnwise, one)
    return fn


def near_pow2_times_max(fmt: str, ulps: int = 8) -> np.ndarray:
    """Every float32 within ``ulps`` ulps of max * 2^j, over the whole positive fp32 range."""
    fmax = get_format(fmt).max
    j = np.arange(-160, 128)
    base = fmax * np.exp2(j.astype(np.float64))
    base = base[(base > 0) & (base < float(np.finfo(F32).max))].astype(F32)
    bits = base.view(np.uint32).astype(np.int64)[:, None] + np.arange(-ulps, ulps + 1)[None, :]
    bits = bits[bits > 0].astype(np.uint32)
    return np.unique(bits.view(F32))


def disagreeing_amaxes(fmt: str, rule=None) -> np.ndarray:
    """float32 amaxes near max * 2^j on which ``rule`` (default: RCEIL in float64) and the
    reference's fp32 amax * (1/max) give different E8M0 bytes.  Amaxes whose fp32 ratio
    underflows to 0 (max * 2^j for j < -150) are included: every rule gives byte 0 there."""
    rule = rceil_float64 if rule is None else rule
    a = near_pow2_times_max(fmt)
    with np.errstate(under="ignore"):
        return a[rule(a, fmt) != ref.e8m0_scale(a, fmt, "rceil")]


# ---- inputs, recipes and backends shared by the tier test files ----------------------------

A_E4M3 = 2.6331075e-36  # 448 * 2^-127 + 1 ulp: float64 RCEIL byte 1, reference byte 0
A_E2M1 = 3.5264833e-38  # 6 * 2^-127 + 1 ulp: likewise


def _current(fmt="e4m3", gran="tensor", pow2=False):
    return {"kind": "current", "fmt": fmt, "granularity": gran, "force_pow2_scales": pow2,
            "amax_epsilon": 0.0}


def _block(fmt="e4m3", block=(128, 128), pow2=False):
    return {"kind": "block", "fmt": fmt, "block": list(block), "force_pow2_scales": pow2,
            "amax_epsilon": 0.0}


NORMAL = {"kind": "normal", "scale": 1.0}


def _tiny_x():
    x = torch.full((2, 32), 1.0)
    x[0] = torch.tensor(1e-45) * torch.arange(32).remainder(2)  # block amax 1e-45
    assert x[0].max().item() > 0
    return x


def _ties_away_fn(x, recipe, **kw):
    q = TORCH_Q(x, dataclasses.replace(recipe, element_rounding=ElementRounding.TIES_AWAY),
                **kw)
    q.recipe = recipe
    return q


def _rescaler_x(fmt, where="exact"):
    """float32 (2, 96) whose block 0 (row 1 negated) holds an ambiguous amax and elements that
    are subnormal codes under the reference scale; blocks 1, 2 are ordinary.

    ``where="exact"``: amax = max * 2^3 exactly (reference exponent 3; 4 is the legitimate
    alternative of a ratio rounded up).  ``where="f64"``: amax = max * 2^-127 + 1 ulp
    (A_E4M3 / A_E2M1: reference byte 0, exact ratio byte 1).  Element multiples of the code
    step: halving 1.375 steps rounds to 1 then 0.5 -> 0, re-quantizing 0.6875 gives 1."""
    fmax = get_format(fmt).max
    step = 2.0 ** -9 if fmt == "e4m3" else 0.5  # smallest subnormal code
    if where == "exact":
        a, unit = fmax * 8.0, step * 8.0
    else:
        a, unit = (A_E4M3 if fmt == "e4m3" else A_E2M1), step * 2.0 ** -127
    mults = ([1.375, 2.75, 3.375, 5.5, 0.6875, 1.625, 6.5, 7.25, 0.75, 10.5, 13.5, 1.0]
             if fmt == "e4m3" else  # e2m1: below the amax, 12 steps
             [1.375, 2.75, 0.6875, 1.625, 3.25, 5.5, 0.75, 1.0, 4.5, 6.5, 8.5, 10.5])
    x = torch.zeros(2, 96, dtype=torch.float64)
    for r, sign in ((0, 1.0), (1, -1.0)):
        x[r, 0] = sign * a
        x[r, 1:1 + len(mults)] = sign * torch.tensor(mults, dtype=torch.float64) * unit
        x[r, 32:64] = torch.linspace(-2.9, 3.1, 32, dtype=torch.float64) * (r + 1)
        x[r, 64:96] = torch.linspace(0.01, 5, 32, dtype=torch.float64) * 100
    x = x.float()
    assert x[0, 0].item() == F32(a) and (x[0, 1:13].double() / unit).tolist() == mults
    return x


def _up_where_exact_pow2(t, r, s):
    """A legitimate RCEIL variant: one exponent up where amax / max is exactly a power of two
    (a ratio rounded up by a last bit), as a GPU could compute."""
    amax = TQ.mx_block_amax(t.float().numpy()).astype(np.float64)
    exact = (np.frexp(amax / get_format(r.fmt).max)[0] == 0.5) & (s < 254)
    return (s.astype(np.int64) + exact).astype(np.uint8)


def _f64_rule(t, r, s):
    return rceil_float64(mx_block_amax(t).numpy(), r.fmt)


_RNE_CAST = TQB.fp8_cast_rne


# seeded bug (7), test_quant_seeded_bugs.py: the wrong twin of mx_backend_with_scales
def _rescaling_fn(own_rule, source):
    """Own scales from ``own_rule``; codes: ``source``'s ("torch" or the numpy "ref"), and
    where that scale differs by one, its code values multiplied by 2^(e_src - e_own) and cast
    again (instead of re-quantizing the original values)."""
    def fn(x, recipe, **kw):
        def one(t, r):
            fmt = get_format(r.fmt)
            k = t.shape[1]
            if source == "ref":
                bits, s = ref.mx_quantize(t.float().numpy(), r.fmt, r.scale_rounding.value,
                                          r.element_rounding.value)
                codes = torch.from_numpy(bits)
            else:
                data, st = TQB._mx_rowwise(t, r)
                s = st.numpy()
                codes = TQB._unpack_nibbles(data, k) if fmt.packed else data.view(torch.uint8)
            own = own_rule(t, r, s)
            vals = (TQB._e2m1_decode(codes) if fmt.packed
                    else codes.view(fmt.torch_dtype).float())
            shift = torch.from_numpy(s.astype(np.int64) - own).repeat_interleave(32, 1)[:, :k]
            moved = torch.ldexp(vals, shift.float())
            new = (TQB.e2m1_codes(moved, r.element_rounding) if fmt.packed
                   else _RNE_CAST(moved, fmt).view(torch.uint8))
            codes = torch.where(shift != 0, new, codes)
            data = TQB._pack_nibbles(codes) if fmt.packed else codes.view(fmt.torch_dtype)
            return data, torch.from_numpy(np.asarray(own, np.uint8))
        return per_direction(x, recipe, kw["rowwise"], kw["columnwise"], one)
    return fn
