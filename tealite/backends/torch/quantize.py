"""Quantization in plain torch ops (CPU and GPU), every recipe.

Casts to FP8 go through torch's ``.to(float8_*)`` (RNE) after an explicit clamp, because
torch's out-of-range behaviour differs by device (the CPU saturates, CUDA gives NaN).  E2M1
has no torch cast: it is rounded here by comparing against the midpoints between its values.

Public numerics building blocks (part of this backend's contract with tealite_verify):
:func:`fp8_cast_rne`, :func:`fp8_cast_ties_away`, :func:`overflow_to_nonfinite`,
:func:`e2m1_codes`, :func:`mx_exponent` and :data:`E2M1_VALUES`.  The mutation library
(``tealite_verify/mutate/``) builds its mutants by swapping one of them for a wrong version
while a case runs, and reuses them to build others; so every step of a quantization goes
through these module-level names, looked up at call time (never bound to a local alias at
import), and renaming or inlining one breaks the mutation suite, not just this file.
"""
from __future__ import annotations

import functools

import torch

from tealite.backends._pad import pad_end
from tealite.backends.torch import BACKEND
from tealite.formats import (FP8_FORMATS, ElementRounding, FP8ScaleRule, Saturation,
                             ScaleRounding, get_format)
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_F32_MANT = 23
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@functools.lru_cache(maxsize=None)
def _e2m1_values_on(device: torch.device) -> torch.Tensor:
    """E2M1_VALUES on ``device``, copied once: a host-to-device copy inside a CUDA graph
    capture is an error (an H100 graph-replay fuzz of MXFP4 grouped_qgemm), and the eager
    call before a capture fills this cache."""
    return E2M1_VALUES.to(device)


def _f32(value: float, device) -> torch.Tensor:
    """A float32 scalar made on ``device`` by a fill (no host copy: CUDA-graph safe)."""
    return torch.full((), value, dtype=torch.float32, device=device)


def _clamp(v: torch.Tensor, fmax: float) -> torch.Tensor:
    return torch.where(torch.isnan(v), v, v.clamp(-fmax, fmax))


def fp8_cast_rne(v: torch.Tensor, fmt) -> torch.Tensor:
    return _clamp(v, fmt.max).to(fmt.torch_dtype)


def overflow_to_nonfinite(v: torch.Tensor, codes: torch.Tensor, fmt) -> torch.Tensor:
    """Where RNE would round past max, give the format's overflow value (NaN; inf for e5m2)
    instead of the saturated code.  torch's own cast cannot be trusted for this: it saturates
    on the CPU and gives NaN on CUDA."""
    step = 2.0 ** (fmt.emax - fmt.mbits)  # code spacing in max's binade
    threshold = fmt.max + step / 2
    max_mantissa_odd = round(fmt.max / 2.0 ** (fmt.emax - fmt.mbits)) % 2 == 1
    a = v.abs()
    over = (a > threshold) | ((a == threshold) & max_mantissa_odd) | torch.isinf(v)
    special = torch.where(v > 0, torch.inf, -torch.inf) if fmt.name == "e5m2" else \
        torch.full_like(v, torch.nan)
    return torch.where(over, special.to(fmt.torch_dtype), codes)


def fp8_cast_ties_away(v: torch.Tensor, fmt) -> torch.Tensor:
    """RNE, then move exact ties that went toward zero one code away from zero."""
    v = _clamp(v, fmt.max)
    q = v.to(fmt.torch_dtype)
    qf = q.float()
    other = (2 * v.double() - qf.double())
    other_q = other.float().to(fmt.torch_dtype)
    tie = (other_q.double() == other) & (qf != v) & (other.abs() > qf.abs()) & torch.isfinite(v)
    return torch.where(tie, other_q, q)


def e2m1_codes(v: torch.Tensor, rounding: ElementRounding) -> torch.Tensor:
    """4-bit E2M1 codes (uint8) of fp32 values already scaled into range (saturating)."""
    values = _e2m1_values_on(v.device)
    a = v.abs().clamp(max=6.0)
    mids = (values[1:] + values[:-1]) / 2
    # Index of the largest value not above a midpoint-decision: count midpoints below a.
    idx = (a.unsqueeze(-1) > mids).sum(-1)
    at_mid = (a.unsqueeze(-1) == mids)
    if rounding is ElementRounding.RNE:
        # At a midpoint pick the neighbour with the even code (even index).
        tie_idx = at_mid.int().argmax(-1)
        tie = at_mid.any(-1)
        up = tie_idx + 1
        idx = torch.where(tie, torch.where(up % 2 == 0, up, tie_idx), idx)
    else:
        idx = torch.where(at_mid.any(-1), at_mid.int().argmax(-1) + 1, idx)
    # A negative value that rounds to zero keeps its sign (-0 = 0b1000), as hardware casts do.
    sign = torch.signbit(v)
    return (idx | (sign.to(idx.dtype) << 3)).to(torch.uint8)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    if codes.shape[-1] % 2:
        codes = pad_end(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(
        *packed.shape[:-1], 2 * packed.shape[-1])
    return out[..., :n]


def _e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    mag = _e2m1_values_on(codes.device)[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


# ---- scales -------------------------------------------------------------------------------

def _te_scale(amax: torch.Tensor, fmt, force_pow2: bool, eps: float) -> torch.Tensor:
    a = torch.clamp(amax, min=eps) if eps > 0 else amax
    scale = _f32(fmt.max, a.device) / a
    scale = torch.where(torch.isinf(scale), torch.finfo(torch.float32).max, scale)
    scale = torch.where((a == 0) | ~torch.isfinite(a), torch.ones_like(scale), scale)
    if force_pow2:
        bits = scale.view(torch.int32) & ~((1 << _F32_MANT) - 1)
        scale = bits.view(torch.float32)
    return scale


def _aiter_row_amax(x32: torch.Tensor) -> torch.Tensor:
    """AITER's per-row amax (tealite.recipes): max |x| ignoring NaN, NaN for a row of only
    NaN, 0 for an empty row."""
    a = x32.abs()
    if a.shape[1] == 0:
        return torch.zeros(a.shape[0], device=a.device)
    nan = torch.isnan(a)
    rows = torch.where(nan, torch.zeros_like(a), a).amax(dim=1)
    return torch.where(nan.all(dim=1), torch.full_like(rows, torch.nan), rows)


def _aiter_amax(x32: torch.Tensor, per_row: bool) -> torch.Tensor:
    """Per row, or per tensor (1,): the row amaxes' max with NaN winning (0 for no rows)."""
    rows = _aiter_row_amax(x32)
    if per_row:
        return rows
    if rows.numel() == 0:
        return torch.zeros(1, device=x32.device)
    return rows.amax().reshape(1)  # torch's amax propagates NaN, as AITER's atomic max does


def _aiter_fp8(x32: torch.Tensor, recipe):
    """(codes, scale_inv) under AITER's rule: scale_inv = amax / max, codes = cast(x * (1 /
    scale_inv)), all in fp32 with no special cases (amax 0 -> NaN codes)."""
    fmt = get_format(recipe.fmt)
    per_row = recipe.scale_granularity is Granularity.ROW
    s_inv = _aiter_amax(x32, per_row) / _f32(fmt.max, x32.device)
    recip = torch.reciprocal(s_inv)  # IEEE on the CPU and on CUDA / ROCm (no fast-math)
    v = x32 * (recip.unsqueeze(1) if per_row else recip)
    codes = fp8_cast_rne(v, fmt)
    if recipe.saturation is Saturation.NONFINITE:
        codes = overflow_to_nonfinite(v, codes, fmt)
    return codes, s_inv


def _exponent_field(a: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32) >> _F32_MANT) & 0xFF


def mx_exponent(amax: torch.Tensor, fmt, mode: ScaleRounding) -> torch.Tensor:
    """Unbiased scale exponent per block (int32), before clamping; amax > 0 and finite."""
    mant = amax.view(torch.int32) & ((1 << _F32_MANT) - 1)
    if mode is ScaleRounding.RCEIL:
        ratio = amax * torch.tensor(1.0 / fmt.max, dtype=torch.float32)
        m, e = torch.frexp(ratio)  # ratio = m * 2^e, m in [0.5, 1); subnormals too
        e = torch.where(m == 0.5, e - 1, e)  # exact power of two: ceil(log2) = e - 1
        return torch.where(ratio > 0, e, torch.full_like(e, -127))  # underflow: clamp floor
    if mode is ScaleRounding.EVEN:
        bumped = amax.view(torch.int32) + (1 << (_F32_MANT - fmt.mbits - 1))
        return ((bumped >> _F32_MANT) & 0xFF) - 127 - fmt.emax
    _, e = torch.frexp(amax)
    floor = e - 1
    if mode is ScaleRounding.FLOOR:
        return floor - fmt.emax
    normal = _exponent_field(amax) > 0
    return floor + ((mant != 0) & normal).int() - fmt.emax  # CEIL; subnormals clamp anyway


def _mx_rowwise(x: torch.Tensor, recipe):
    fmt = get_format(recipe.fmt)
    m, k = x.shape
    nb = -(-k // recipe.block)
    xp = pad_end(x.float(), (0, nb * recipe.block - k))
    blocks = xp.reshape(m, nb, recipe.block)
    amax = blocks.abs().amax(dim=-1) if k else torch.zeros(m, 0, device=x.device)
    good = torch.isfinite(amax) & (amax > 0)
    e = mx_exponent(torch.where(good, amax, torch.ones_like(amax)), fmt, recipe.scale_rounding)
    e = e.clamp(-127, 127)
    biased = torch.where(amax == 0, torch.zeros_like(e), e + 127)
    biased = torch.where(torch.isfinite(amax), biased, torch.full_like(e, 0xFF))
    # x * 2^-e is exact in fp32 except below fp32's normal range, where every element format
    # rounds to zero anyway; ldexp in float64 avoids a 2^127 overflow of the multiplier.
    scaled = torch.ldexp(blocks.double(), (-e).unsqueeze(-1).double()).float()
    if fmt.packed:
        codes = e2m1_codes(scaled, recipe.element_rounding)
    else:
        cast = fp8_cast_rne if recipe.element_rounding is ElementRounding.RNE \
            else fp8_cast_ties_away
        codes = cast(scaled, fmt).view(torch.uint8)
    codes = torch.where((biased == 0xFF).unsqueeze(-1), torch.zeros_like(codes), codes)
    codes = codes.reshape(m, nb * recipe.block)[:, :k]
    data = _pack_nibbles(codes) if fmt.packed else codes.view(fmt.torch_dtype)
    return data, biased.to(torch.uint8)


def _block_scales(x32: torch.Tensor, recipe):
    """(scale per block, scale per element) of TE's rule over the recipe's blocks."""
    bm, bn = recipe.block
    m, k = x32.shape
    mb, nb = -(-m // bm), -(-k // bn)
    xp = pad_end(x32.abs(), (0, nb * bn - k, 0, mb * bm - m))
    block_amax = xp.reshape(mb, bm, nb, bn).amax(dim=(1, 3)) if xp.numel() else \
        torch.zeros(mb, nb, device=x32.device)
    s = _te_scale(block_amax, get_format(recipe.fmt), recipe.force_pow2_scales,
                  recipe.amax_epsilon)
    return s, s.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:m, :k]


def _te_scales(x: torch.Tensor, recipe):
    """(scale, scale per element) of TE's rule at the recipe's scale granularity."""
    x32 = x.float()
    gran = recipe.scale_granularity
    if gran is Granularity.BLOCK:
        return _block_scales(x32, recipe)
    fmt, pow2, eps = get_format(recipe.fmt), recipe.force_pow2_scales, recipe.amax_epsilon
    if gran is Granularity.ROW:
        s = _te_scale(_row_amax(x32), fmt, pow2, eps)
        return s, s.unsqueeze(1)
    s = _te_scale(_amax(x).reshape(1), fmt, pow2, eps)  # TENSOR (the check admits no other)
    return s, s


def _fp8_rowwise(x: torch.Tensor, recipe, scale):
    fmt = get_format(recipe.fmt)
    x32 = x.float()
    if recipe.scale_given:
        s = expand = scale
    elif recipe.scale_rule is FP8ScaleRule.AMAX_OVER_FMAX:
        return _aiter_fp8(x32, recipe)
    else:
        s, expand = _te_scales(x, recipe)
    v = x32 * expand
    codes = fp8_cast_rne(v, fmt)
    if recipe.saturation is Saturation.NONFINITE:
        codes = overflow_to_nonfinite(v, codes, fmt)
    return codes, torch.reciprocal(s)


def _amax(x: torch.Tensor) -> torch.Tensor:
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.abs().amax().float()


def _recipe_amax(x: torch.Tensor, recipe):
    """The amax the recipe reports for x: per tensor, per row, or None."""
    gran = recipe.amax_granularity
    if gran is Granularity.TENSOR:
        return _amax(x).reshape(1)
    if gran is Granularity.ROW:
        return _row_amax(x.float())
    return None


def _row_amax(x32: torch.Tensor) -> torch.Tensor:
    if x32.shape[1] == 0:
        return torch.zeros(x32.shape[0], device=x32.device)
    return x32.abs().amax(dim=1)


# ---- what this backend computes, in recipe facts (the check refuses every other value) ----

_TENSOR, _ROW, _BLOCK = Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK


def _fp8_reason(recipe) -> str | None:
    why = outside(recipe, "torch FP8 quantize", fmt=FP8_FORMATS, scale_given=(False, True))
    if why:
        return why
    if recipe.scale_given:  # codes of x times the given scale (TE's delayed scaling)
        return outside(recipe, "torch quantize with a given scale", scale_granularity=(_TENSOR,),
                       scale_rule=(FP8ScaleRule.FMAX_OVER_AMAX,),
                       amax_granularity=(_TENSOR, None))
    if getattr(recipe, "scale_rule", None) is FP8ScaleRule.AMAX_OVER_FMAX:
        return outside(recipe, "torch quantize under AITER's scale rule",
                       scale_granularity=(_TENSOR, _ROW), force_pow2_scales=(False,),
                       amax_epsilon=(0.0,), amax_granularity=(None,))
    why = outside(recipe, "torch quantize", scale_rule=(FP8ScaleRule.FMAX_OVER_AMAX,),
                  scale_granularity=(_TENSOR, _ROW, _BLOCK))
    if why:
        return why
    # The amax reported is the one the scales came from, or none (a block amax: none).
    gran = recipe.scale_granularity
    return outside(recipe, "torch quantize",
                   amax_granularity=(None,) if gran is _BLOCK else (gran, None))


def recipe_reason(recipe) -> str | None:
    """Why this backend does not quantize ``recipe`` (None: it does), from its facts."""
    why = outside(recipe, "torch quantize", family=(Family.FP8, Family.MX))
    if why or recipe.family is Family.MX:
        # _mx_rowwise: every scale and element rounding, FP8 and e2m1 elements.
        return why or outside(recipe, "torch MX quantize",
                              scale_granularity=(Granularity.MX_BLOCK,), block=(32,),
                              fmt=FP8_FORMATS + ("e2m1",))
    return _fp8_reason(recipe)


def _expand_mx(s, recipe, rows: int, cols: int):
    scale = torch.where(s == 0xFF, torch.nan,
                        torch.ldexp(torch.ones_like(s, dtype=torch.float32), s.int() - 127))
    return scale.repeat_interleave(recipe.block, 1)[:, :cols]


def _expand_block(s, recipe, rows: int, cols: int):
    bm, bn = recipe.block
    return s.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:rows, :cols]


# How each scale layout's scale_inv multiplies the codes it covers (rowwise, (rows, cols)).
_EXPAND = {
    Granularity.MX_BLOCK: _expand_mx,
    _BLOCK: _expand_block,
    _ROW: lambda s, recipe, rows, cols: s.unsqueeze(1),
    _TENSOR: lambda s, recipe, rows, cols: s,
}


def dequantize_reason(recipe) -> str | None:
    """Why this backend does not dequantize ``recipe`` (None: it does), from its facts."""
    why = outside(recipe, "torch dequantize", family=(Family.FP8, Family.MX))
    if why or recipe.family is Family.MX:  # E8M0 bytes, one per 32 codes
        return why or outside(recipe, "torch MX dequantize",
                              scale_granularity=(Granularity.MX_BLOCK,), block=(32,))
    # float32 scales per tensor, row or block of any size
    return outside(recipe, "torch FP8 dequantize", scale_granularity=(_TENSOR, _ROW, _BLOCK))


def _why_not(params) -> str | None:
    return recipe_reason(params["recipe"])


def _why_not_dequantize(params) -> str | None:
    return dequantize_reason(params["recipe"])


@BACKEND.implements(Op.QUANTIZE, dtypes=_FLOATS, check=_why_not)
def quantize(x, recipe, *, rowwise, columnwise, scale):
    out = QuantizedTensor(recipe=recipe, shape=tuple(x.shape), amax=_recipe_amax(x, recipe))
    if recipe.family is Family.MX:
        one = _mx_rowwise
    else:
        def one(t, r):
            return _fp8_rowwise(t, r, scale)
    if rowwise:
        out.data, out.scale_inv = one(x, recipe)
    if columnwise:
        out.columnwise_data, out.columnwise_scale_inv = one(x.t().contiguous(), recipe)
    return out


@BACKEND.implements(Op.DEQUANTIZE, dtypes=_FLOATS, check=_why_not_dequantize)
def dequantize(q, *, out_dtype, columnwise):
    data = q.columnwise_data if columnwise else q.data
    s = q.columnwise_scale_inv if columnwise else q.scale_inv
    rows = q.shape[1] if columnwise else q.shape[0]
    cols = q.shape[0] if columnwise else q.shape[1]
    recipe = q.recipe
    fmt = get_format(recipe.fmt)
    if fmt.packed:
        vals = _e2m1_decode(_unpack_nibbles(data, cols))
    else:
        vals = data.float()
    expand = _EXPAND[recipe.scale_granularity](s, recipe, rows, cols)
    return (vals * expand).to(out_dtype)


@BACKEND.implements(Op.AMAX, dtypes=_FLOATS)
def amax(x):
    return _amax(x).reshape(1)


@BACKEND.implements(Op.DELAYED_SCALING_UPDATE, dtypes=(torch.float32,))
def delayed_scaling_update(history, scale, recipe):
    fmt = get_format(recipe.fmt)
    amax = history[:1] if recipe.amax_compute_algo == "most_recent" else history.max().reshape(1)
    new = _f32(fmt.max, history.device).reshape(1) / amax
    new = new / _f32(2.0 ** recipe.margin, history.device)
    keep = ~(amax > 0) | ~torch.isfinite(amax)
    new_scale = torch.where(keep, scale, new)
    new_history = torch.roll(history, -1, 0)
    new_history[0] = 0.0
    return new_history, new_scale
