"""The one table from what a recipe declares to how the harness judges it.

A recipe (``tealite.recipes``) declares typed facts: its ``family`` (FP8 codes with float32
scales, or MX codes with E8M0 block scales), its ``scale_granularity``, whether its scale is
``scale_given`` (an input of the call, as DelayedScaling's), which amax ``quantize`` reports
(``amax_granularity``), its scale rule, and whether its scale may legitimately sit one
exponent off (``scale_exponent_slack``).  This module alone turns those facts into the
reference quantizer's arguments (``references/quantize.py`` takes plain strings: references
import no tealite code) and into tier labels, so specs, strategies and tiers name no recipe
kind, and a recipe that fits a family needs no change here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tealite.formats import FP8ScaleRule, Saturation
from tealite.recipes import Family, Granularity
from tealite_verify.references import quantize as qref
from tealite_verify.tiers.metrics import Tier

F32 = np.float32


@dataclass(frozen=True)
class Quantized:
    """A reference quantization: code bits (rows, K), unpacked for e2m1; scale_inv (float32
    per tensor / row / block, or E8M0 bytes per 32-block); the amax the recipe reports (None
    when it reports none)."""

    bits: np.ndarray
    scale_inv: np.ndarray
    amax: np.ndarray | None


def _fp8(x32, recipe, scale) -> Quantized:
    if recipe.scale_given:
        gran, kw = "given", {"scale": np.asarray(scale, F32).reshape(1)}
    else:
        gran = recipe.scale_granularity.value
        kw = {"force_pow2": recipe.force_pow2_scales, "amax_epsilon": recipe.amax_epsilon,
              "block": tuple(recipe.block)
              if recipe.scale_granularity is Granularity.BLOCK else None}
    bits, scale_inv, amax = qref.fp8_quantize(
        x32, recipe.fmt, gran, saturate=recipe.saturation is Saturation.SATURATE,
        scale_rule=recipe.scale_rule.value, **kw)
    return Quantized(bits, scale_inv, None if recipe.amax_granularity is None else amax)


def _mx(x32, recipe, scale) -> Quantized:
    bits, scales = qref.mx_quantize(x32, recipe.fmt, recipe.scale_rounding.value,
                                    recipe.element_rounding.value)
    return Quantized(bits, scales, None)


def _fp8_dequantize(bits, scale_inv, recipe) -> np.ndarray:
    return qref.decode(bits, recipe.fmt) * element_scale(scale_inv, recipe, np.shape(bits))


def _mx_dequantize(bits, scales, recipe) -> np.ndarray:
    return qref.mx_dequantize(bits, scales, recipe.fmt)


@dataclass(frozen=True)
class _FamilyRules:
    quantize: object     # the reference quantizer: (x32, recipe, scale) -> Quantized
    dequantize: object   # (bits, scale_inv, recipe) -> float64 values
    code_tier: Tier      # the tier a single backend's codes and scales are judged by
    scale_dtype: torch.dtype


_FAMILIES = {
    Family.FP8: _FamilyRules(_fp8, _fp8_dequantize, Tier.EXACT, torch.float32),
    Family.MX: _FamilyRules(_mx, _mx_dequantize, Tier.E8M0_ADJUSTED, torch.uint8),
}


def quantize(x32, recipe, scale=None) -> Quantized:
    """The bit-exact reference quantization of float32 ``x32`` (rows, K) along its rows;
    ``scale`` is the given scale of a recipe whose scale is an input."""
    return _FAMILIES[recipe.family].quantize(np.asarray(x32, F32), recipe, scale)


def dequantize(bits, scale_inv, recipe) -> np.ndarray:
    """float64 values of reference code bits (rows, K) under their scales."""
    return _FAMILIES[recipe.family].dequantize(bits, scale_inv, recipe)


def code_tier(recipe) -> Tier:
    """The tier a single backend's codes and scales are judged by (MX: under its own scales,
    which may sit an exponent off)."""
    return _FAMILIES[recipe.family].code_tier


def scale_dtype(recipe) -> torch.dtype:
    return _FAMILIES[recipe.family].scale_dtype


def divides_by_fmax(recipe) -> bool:
    """AITER's scale rule: scale_inv = amax / fmax from an fp32 division a backend may declare
    approximate (Numerics.fp32_div_ulps); it reports no amax."""
    return recipe.family is Family.FP8 and recipe.scale_rule is FP8ScaleRule.AMAX_OVER_FMAX


def element_scale(scale_inv, recipe, shape) -> np.ndarray:
    """Per-element float64 dequantization scale (rows, K) of a rowwise quantization."""
    m, k = shape
    s = np.asarray(scale_inv)
    gran = recipe.scale_granularity
    if gran is Granularity.MX_BLOCK:
        s = np.repeat(qref.e8m0_value(s.astype(np.uint8)), recipe.block, axis=-1)[:, :k]
    elif gran is Granularity.BLOCK:
        bm, bn = recipe.block
        s = np.repeat(np.repeat(s, bm, axis=0), bn, axis=1)[:m, :k]
    elif gran is Granularity.ROW:
        s = s[:, None]
    else:
        s = np.full((m, k), float(s.reshape(-1)[0]) if s.size else 1.0)
    return np.broadcast_to(np.asarray(s, np.float64), (m, k))


def reference_amax(x32, recipe) -> np.ndarray | None:
    """The amax ``quantize`` reports for float32 x (rows, K): (1,) per tensor, (rows,) per
    row, None when the recipe reports none."""
    gran = recipe.amax_granularity
    if gran is None:
        return None
    return qref.amax(x32, axis=1) if gran is Granularity.ROW else qref.amax(x32).reshape(1)


def row_block(recipe) -> int | None:
    """The run of elements along a row that shares one scale and that an unpadded operand
    must hold whole (MX: 32); None where a row may have any length."""
    return recipe.block if recipe.scale_granularity is Granularity.MX_BLOCK else None
