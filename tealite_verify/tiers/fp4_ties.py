"""The ``fp4-ties`` tier (MX codes, for a backend that declares ``fp4_tie_rounding="hardware"``):
a code may differ by one step from the re-quantization only where the scaled input lies
exactly on the midpoint between the two codes; such codes are counted in ``excused``.

It refines the e8m0-adjusted tier's code check (tiers/e8m0_adjusted.py calls :func:`ties`), and
shares its pair rule (label ``e8m0-adjusted-pair``).
"""
from __future__ import annotations

import numpy as np

from tealite_verify.references import quantize as ref


def declared(numerics) -> bool:
    """Whether the backend declares hardware FP4 tie rounding."""
    return numerics.fp4_tie_rounding == "hardware"


def ties(ok, actual, want, x, scales, fmt: str, block: int = 32) -> np.ndarray:
    """Where a rejected code ``actual`` and the re-quantized ``want`` are the two codes around
    an exact midpoint of x scaled by the backend's own ``scales``."""
    v = ref.mx_scaled_values(x, scales, block)
    va, vw = ref.decode(actual, fmt), ref.decode(want, fmt)
    sign_bit = 0x08 if fmt == "e2m1" else 0x80
    with np.errstate(invalid="ignore"):
        # Same sign *bit* (so the ties at +-0.25 next to +-0 count), midpoint exactly.
        return ~ok & (v == (va + vw) / 2) & ((actual & sign_bit) == (want & sign_bit))
