"""The ``dequantized`` tier: values, not codes, so it can judge two recipes (or two backends
with different rounding conventions) against each other.

A round trip dequantize(quantize(x)) lies within :func:`dequantized_bound` of x.  Pair rule:
two backends' round trips within the sum of their bounds (``dequantized-pair``); two recipes'
round trips on one backend likewise (``dequantized-cross-recipe``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from tealite_verify.references import quantize as ref
from tealite_verify.tiers.bounded import compare_bounded
from tealite_verify.tiers.metrics import Metrics, Tier


def dequantized_bound(x, scale, fmt: str, *, dequant_dtype_u: float = 2.0 ** -24) -> np.ndarray:
    """Largest legitimate |dequantize(quantize(x)) - x| per element for codes of ``fmt`` with
    per-element dequantization scale ``scale`` (float64 arrays, broadcastable).

    Half a code step at |x|/scale (subnormal step below the normal range), plus what
    saturation clips off beyond max, plus four fp32 roundings relative to |x| (x * scale before
    the cast, scale_inv = 1/scale, code x scale_inv, and the dequantized output).
    """
    info = ml_dtypes.finfo(ref.ML_DTYPES[fmt])
    mant, emin = int(info.nmant), int(info.minexp)
    x = np.abs(np.asarray(x, np.float64))
    s = np.asarray(scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = x / s
        _, e = np.frexp(np.where(v > 0, v, 1.0))
        step = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)
        fmax = ref.fmt_max(fmt)
        clipped = np.where(v > fmax, (v - fmax) * s, 0.0)
        return 0.5 * step * s + clipped + 4 * dequant_dtype_u * np.minimum(x, fmax * s)


def check_dequantized(y, x, bound, *, tier: Tier = Tier.DEQUANTIZED) -> Metrics:
    """|y - x| <= bound elementwise (NaN matches NaN, Inf matches the same Inf)."""
    return compare_bounded(torch.as_tensor(np.asarray(y, np.float64)), np.asarray(x, np.float64),
                           np.asarray(bound, np.float64), torch.float64, tier=tier)


def check_pair(y_x, y_y, bound_x, bound_y, *, cross_recipe: bool = False) -> Metrics:
    """Two round trips of one x (two backends, or with ``cross_recipe`` two recipes) within the
    sum of their bounds."""
    return check_dequantized(y_x, y_y, bound_x + bound_y, tier=Tier.DEQUANTIZED_CROSS_RECIPE
                             if cross_recipe else Tier.DEQUANTIZED_PAIR)
