"""Mutation operators for ``quantize``, ``dequantize``, ``amax`` and
``delayed_scaling_update``: element and scale rounding modes swapped, scale exponents off by
one, packed nibbles swapped, scales along the wrong axis, FNUZ / OCP confused, saturation
dropped or forced, amax taken from the output, tails corrupted, history reductions swapped.

Rounding-mode bugs replace one of the torch backend's public numerics building blocks
(``fp8_cast_rne``, ``e2m1_codes``, ``mx_exponent``, ...: listed in
``tealite/backends/torch/quantize.py``'s docstring) while the mutant runs (``base.patched``),
so every recipe path that uses it gets the bug, as a kernel with a wrong cast would.  Only
public names: tests/test_architecture.py fails on a private one.
"""
from __future__ import annotations

import dataclasses

import torch

from tealite import recipes as R
from tealite.backends.torch import quantize as TQB
from tealite.formats import ElementRounding, ScaleRounding
from tealite_verify.mutate.base import (Mutation, bump_ulps, largest_finite_index, on_output,
                                        register, stale_last_row, with_args, with_patches)

# ---- element rounding ---------------------------------------------------------------------


def fp8_cast_truncating(original):
    """FP8 cast by truncation: the saturating RNE cast, then one code toward zero wherever it
    rounded up in magnitude."""
    def cast(v, fmt):
        q = original(v, fmt)
        bits = q.view(torch.uint8)
        rounded_up = (q.float().abs() > v.abs()) & torch.isfinite(v)
        down = bits - 1
        if fmt.fnuz:  # FNUZ has no -0: 0x80 is NaN, a value truncated to zero is +0
            down = torch.where((down & 0x7F) == 0, torch.zeros_like(down), down)
        return torch.where(rounded_up, down, bits).view(fmt.torch_dtype)
    return cast


def _ties_swap(original_ties_away):
    def make(original_rne):
        return lambda v, fmt: original_ties_away(v, fmt)
    return make


def _e2m1_rounding_swapped(original):
    def codes(v, rounding):
        other = ElementRounding.TIES_AWAY if rounding is ElementRounding.RNE \
            else ElementRounding.RNE
        return original(v, other)
    return codes


def _e2m1_truncating(original):
    """E2M1 by truncation: the largest representable magnitude not above |v| (saturating)."""
    def codes(v, rounding):
        values = TQB.E2M1_VALUES.to(v.device)
        a = v.abs().clamp(max=6.0)
        idx = (a.unsqueeze(-1) >= values[1:]).sum(-1)
        sign = torch.signbit(v)
        return (idx | (sign.to(idx.dtype) << 3)).to(torch.uint8)
    return codes


# ---- scale rounding -----------------------------------------------------------------------

def _scale_mode_swapped(mapping: dict):
    def make(original):
        return lambda amax, fmt, mode: original(amax, fmt, mapping.get(mode, mode))
    return make


def _last_block_exponent(delta: int):
    """One block's scale exponent (the last block's) moved by ``delta``, codes computed under
    the moved scale: consistent, so only the scale check can see it."""
    def make(original):
        def exponent(amax, fmt, mode):
            e = original(amax, fmt, mode).clone()
            if e.numel():
                e.view(-1)[-1] += delta
            return e
        return exponent
    return make


def _fnuz_max_as_ocp(original):
    """get_format with E4M3FNUZ's max taken as OCP E4M3's 448 (its max is 240)."""
    def get(name):
        fmt = original(name)
        if fmt.fnuz and fmt.mbits == 3:
            return dataclasses.replace(fmt, max=448.0)
        return fmt
    return get


def _overflow_kept_saturated(original):
    return lambda v, codes, fmt: codes


def _fp8_cast_nonsaturating(original):
    """Every FP8 cast gives the overflow value (NaN / Inf) past max, whatever the recipe's
    saturation mode says."""
    return lambda v, fmt: TQB.overflow_to_nonfinite(v, original(v, fmt), fmt)


def _fp8_subnormals_flushed(original):
    """Codes below the format's smallest normal flushed to (signed, +0 in FNUZ) zero: a cast
    with flush-to-zero on."""
    def cast(v, fmt):
        q = original(v, fmt)
        tiny = torch.finfo(fmt.torch_dtype).tiny
        qf = q.float()
        sub = (qf != 0) & (qf.abs() < tiny)
        zero = torch.zeros_like(qf) if fmt.fnuz else torch.where(torch.signbit(qf), -0.0, 0.0)
        return torch.where(sub, zero.to(fmt.torch_dtype), q)
    return cast


def _fp8_nan_as_zero(original):
    """NaN inputs encoded as code 0 instead of the format's NaN."""
    def cast(v, fmt):
        q = original(v, fmt)
        return torch.where(torch.isnan(v), torch.zeros((), dtype=fmt.torch_dtype), q)
    return cast


_RNE = TQB.fp8_cast_rne
_TIES_AWAY = TQB.fp8_cast_ties_away

# ---- outputs ------------------------------------------------------------------------------


def _scale_inv_doubled(q, args, kw):
    """FP8 (not MX) dequantization scales one exponent too large, codes untouched."""
    if q.recipe.family is R.Family.MX:
        return q
    for name in ("scale_inv", "columnwise_scale_inv"):
        s = getattr(q, name)
        if s is not None:
            setattr(q, name, s * 2)
    return q


def _e8m0_last_byte_up(q, args, kw):
    """The last block's E8M0 byte + 1 (codes untouched)."""
    if q.recipe.family is not R.Family.MX:
        return q
    for name in ("scale_inv", "columnwise_scale_inv"):
        s = getattr(q, name)
        if s is not None and s.numel():
            s = s.clone()
            s.view(-1)[-1] = min(int(s.view(-1)[-1]) + 1, 254)
            setattr(q, name, s)
    return q


def _nibbles_swapped(t: torch.Tensor) -> torch.Tensor:
    return ((t >> 4) | (t << 4)).to(torch.uint8)


def _packed(q) -> bool:
    return q.recipe.family is R.Family.MX and q.recipe.fmt == "e2m1"


def _output_nibbles_swapped(q, args, kw):
    if _packed(q):
        for name in ("data", "columnwise_data"):
            if getattr(q, name) is not None:
                setattr(q, name, _nibbles_swapped(getattr(q, name)))
    return q


def _columnwise_wrong_axis(fn):
    # The columnwise output is the rowwise quantization of x, transposed: scales taken along
    # x's rows (the wrong axis) instead of along x.T's rows.
    def mutated(x, recipe, *, rowwise, columnwise, scale):
        q = fn(x, recipe, rowwise=rowwise, columnwise=columnwise, scale=scale)
        if columnwise and x.numel():
            r = fn(x, recipe, rowwise=True, columnwise=False, scale=scale)
            q.columnwise_data = r.data.t().contiguous() if not _packed(q) else r.data
            s = r.scale_inv
            q.columnwise_scale_inv = s.t().contiguous() if s.dim() == 2 else s
        return q
    return mutated


def _amax_of_output(fn):
    # The reported amax is the dequantized output's, not the input's.
    def mutated(x, recipe, *, rowwise, columnwise, scale):
        q = fn(x, recipe, rowwise=rowwise, columnwise=columnwise, scale=scale)
        if q.amax is None or x.numel() == 0:
            return q
        y = TQB.dequantize(q, out_dtype=torch.float32, columnwise=not rowwise)
        y = y.t() if not rowwise else y
        per_row = q.amax.numel() == x.shape[0] and q.amax.numel() > 1
        q.amax = y.abs().amax(dim=1) if per_row else y.abs().amax().reshape(1)
        return q
    return mutated


def _last_row_garbage(q, args, kw):
    if q.data is not None:
        q.data = stale_last_row(q.data.view(torch.uint8)).view(q.data.dtype)
    return q


def _mx_partial_block_garbage(q, args, kw):
    """The codes of each row's partial last MX block hold a fixed byte (never written)."""
    if q.recipe.family is not R.Family.MX or q.data is None:
        return q
    k = q.shape[1]
    start = 32 * (k // 32)
    if start == k:
        return q
    data = q.data.view(torch.uint8).clone()
    lo = start // 2 if _packed(q) else start
    data[:, lo:] = 0x33
    q.data = data.view(q.data.dtype)
    return q


for _m in (
    Mutation("quantize.fp8_truncation", "quantize", "rounding-mode",
             "FP8 element codes rounded toward zero instead of to nearest even",
             with_patches((TQB, "fp8_cast_rne", fp8_cast_truncating))),
    Mutation("quantize.fp8_ties_swapped", "quantize", "rounding-mode",
             "FP8 ties: RNE recipes round ties away from zero, ties-away recipes to even",
             with_patches((TQB, "fp8_cast_rne", _ties_swap(_TIES_AWAY)),
                          (TQB, "fp8_cast_ties_away", _ties_swap(_RNE)))),
    Mutation("quantize.e2m1_ties_swapped", "quantize", "rounding-mode",
             "E2M1 ties: RNE and ties-away exchanged",
             with_patches((TQB, "e2m1_codes", _e2m1_rounding_swapped))),
    Mutation("quantize.e2m1_truncation", "quantize", "rounding-mode",
             "E2M1 codes rounded toward zero", with_patches((TQB, "e2m1_codes",
                                                             _e2m1_truncating))),
    Mutation("quantize.mx_scale_floor_for_rceil", "quantize", "rounding-mode",
             "MX scale exponent by FLOOR where the recipe says RCEIL",
             with_patches((TQB, "mx_exponent",
                           _scale_mode_swapped({ScaleRounding.RCEIL: ScaleRounding.FLOOR})))),
    Mutation("quantize.mx_scale_ceil_for_floor", "quantize", "rounding-mode",
             "MX scale exponent by CEIL where the recipe says FLOOR",
             with_patches((TQB, "mx_exponent",
                           _scale_mode_swapped({ScaleRounding.FLOOR: ScaleRounding.CEIL})))),
    Mutation("quantize.mx_scale_floor_for_even", "quantize", "rounding-mode",
             "MX scale exponent by FLOOR where the recipe says EVEN (mantissa rounding "
             "skipped)", with_patches((TQB, "mx_exponent", _scale_mode_swapped(
                 {ScaleRounding.EVEN: ScaleRounding.FLOOR})))),
    Mutation("quantize.fp8_subnormals_flushed", "quantize", "rounding-mode",
             "FP8 codes below the smallest normal flushed to zero (FTZ cast)",
             with_patches((TQB, "fp8_cast_rne", _fp8_subnormals_flushed))),
    Mutation("quantize.fp8_nan_as_zero", "quantize", "saturation",
             "NaN inputs encoded as code 0 instead of NaN (FP8)",
             with_patches((TQB, "fp8_cast_rne", _fp8_nan_as_zero))),
    Mutation("quantize.scale_inv_exponent_up", "quantize", "scale-exponent",
             "FP8 scale_inv one exponent too large (x 2), codes untouched",
             on_output(_scale_inv_doubled)),
    Mutation("quantize.e8m0_last_block_up", "quantize", "scale-exponent",
             "the last MX block's E8M0 byte + 1, codes untouched", on_output(_e8m0_last_byte_up)),
    Mutation("quantize.e8m0_last_block_down_consistent", "quantize", "scale-exponent",
             "the last MX block's exponent - 1 with its codes quantized under it (saturating)",
             with_patches((TQB, "mx_exponent", _last_block_exponent(-1)))),
    Mutation("quantize.e2m1_nibbles_swapped", "quantize", "layout",
             "packed E2M1: high and low nibbles exchanged", on_output(_output_nibbles_swapped)),
    Mutation("quantize.columnwise_wrong_axis", "quantize", "axis",
             "columnwise output = rowwise quantization of x transposed (scales along the "
             "wrong axis)", _columnwise_wrong_axis),
    Mutation("quantize.fnuz_max_as_ocp", "quantize", "format",
             "E4M3FNUZ handled with OCP E4M3's max 448 (FNUZ / OCP confusion)",
             with_patches((TQB, "get_format", _fnuz_max_as_ocp))),
    Mutation("quantize.nonfinite_saturates", "quantize", "saturation",
             "NONFINITE recipes saturate on overflow instead of giving NaN / Inf",
             with_patches((TQB, "overflow_to_nonfinite", _overflow_kept_saturated))),
    Mutation("quantize.saturation_dropped", "quantize", "saturation",
             "saturating recipes give NaN / Inf on overflow (the clamp dropped)",
             with_patches((TQB, "fp8_cast_rne", _fp8_cast_nonsaturating))),
    Mutation("quantize.amax_of_output", "quantize", "formula",
             "the reported amax is the dequantized output's instead of the input's",
             _amax_of_output),
    Mutation("quantize.last_row_garbage", "quantize", "tail",
             "the rowwise codes' last row keeps the first row's codes",
             on_output(_last_row_garbage)),
    Mutation("quantize.mx_partial_block_garbage", "quantize", "tail",
             "codes of a partial last MX block are a fixed byte (never written)",
             on_output(_mx_partial_block_garbage)),
):
    register(_m)


# ---- dequantize -------------------------------------------------------------------------------

def _mx_bias_126(y, args, kw):
    """E8M0 decoded with bias 126: every MX value twice too large."""
    (q,) = args
    return y * 2 if q.recipe.family is R.Family.MX else y


def _input_nibbles_swapped(args, kw):
    (q,) = args
    if _packed(q):
        q = dataclasses.replace(q, data=_nibbles_swapped(q.data) if q.data is not None else None)
    return (q,), kw


def _k_ulp_at_largest(k: int):
    def change(t, args, kw):
        i = largest_finite_index(t)
        return t if i is None else bump_ulps(t, k, i)
    return change


for _m in (
    Mutation("dequantize.mx_exponent_bias_126", "dequantize", "scale-exponent",
             "E8M0 scales decoded with bias 126 instead of 127", on_output(_mx_bias_126)),
    Mutation("dequantize.e2m1_nibbles_swapped", "dequantize", "layout",
             "packed E2M1 unpacked high nibble first", with_args(_input_nibbles_swapped)),
    Mutation("dequantize.out_2ulp_at_largest", "dequantize", "k-ulp",
             "+2 output ulps at the output element of largest magnitude",
             on_output(_k_ulp_at_largest(2))),
):
    register(_m)


# ---- amax -------------------------------------------------------------------------------------

def _last_element_skipped(fn):
    def mutated(x):
        flat = x.reshape(-1)
        return fn(flat[:-1]) if flat.numel() > 1 else fn(x)
    return mutated


def _signed_max(fn):
    def mutated(x):
        if x.numel() == 0:
            return fn(x)
        return x.amax().float().reshape(1)
    return mutated


def _nan_ignored(fn):
    def mutated(x):
        return fn(torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf")))
    return mutated


for _m in (
    Mutation("amax.last_element_skipped", "amax", "tail",
             "the reduction stops one element short", _last_element_skipped),
    Mutation("amax.signed_max", "amax", "formula", "max(x) instead of max(|x|)", _signed_max),
    Mutation("amax.nan_ignored", "amax", "saturation",
             "NaN elements skipped (NaN must propagate to the amax)", _nan_ignored),
):
    register(_m)


# ---- delayed_scaling_update -------------------------------------------------------------------

def _reduction_swapped(args, kw):
    history, scale, recipe = args
    other = "most_recent" if recipe.amax_compute_algo == "max" else "max"
    return (history, scale, dataclasses.replace(recipe, amax_compute_algo=other)), kw


def _margin_ignored(args, kw):
    history, scale, recipe = args
    return (history, scale, dataclasses.replace(recipe, margin=0)), kw


def _history_not_rolled(fn):
    def mutated(history, scale, recipe):
        _, new_scale = fn(history.clone(), scale, recipe)
        return history.clone(), new_scale
    return mutated


def _nonfinite_amax_used(fn):
    # The guard that keeps the old scale when the reduced amax is 0, NaN or Inf is missing.
    def mutated(history, scale, recipe):
        new_history, new_scale = fn(history, scale, recipe)
        amax = history[:1] if recipe.amax_compute_algo == "most_recent" else \
            history.max().reshape(1)
        fmax = TQB.get_format(recipe.fmt).max
        raw = torch.tensor([fmax], dtype=torch.float32, device=history.device) / amax \
            / (2.0 ** recipe.margin)
        return new_history, torch.where(torch.isfinite(amax) & (amax > 0), new_scale, raw)
    return mutated


for _m in (
    Mutation("delayed_scaling_update.history_reduction_swapped", "delayed_scaling_update",
             "reduction", "amax history reduced by max <-> most_recent (swapped)",
             with_args(_reduction_swapped)),
    Mutation("delayed_scaling_update.margin_ignored", "delayed_scaling_update", "parameter",
             "the recipe's margin ignored (taken as 0)", with_args(_margin_ignored)),
    Mutation("delayed_scaling_update.history_not_rolled", "delayed_scaling_update", "layout",
             "the amax history returned as it came (not rolled, newest slot not cleared)",
             _history_not_rolled),
    Mutation("delayed_scaling_update.nonfinite_amax_used", "delayed_scaling_update",
             "saturation", "a 0 / NaN / Inf amax turned into a new scale instead of keeping "
             "the old one", _nonfinite_amax_used),
):
    register(_m)
