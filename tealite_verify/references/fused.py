"""References for fused norm / activation -> quantize: the float64 norm or activation
(references/norms.py, activations.py), then the recipe's bit-exact quantization
(references/quantize.py) of that y rounded to nearest float32.

That quantization is what a fused kernel whose fp32 y happened to equal round32(y_ref) would
write.  A real kernel's fp32 y carries its own rounding error, so its codes are not bit-exact
against this reference: tealite_verify/tiers/code_interval.py judges them against an error bound
on y.  ``quantize_rows`` is also the e = 0 limit of that tier (bit-exact).

Recipes are the JSON dicts of tealite_verify.strategies.recipes:
``{"kind": "delayed", "fmt", "scale", "saturation"}``,
``{"kind": "current", "granularity": "row", "fmt", "force_pow2_scales", "amax_epsilon",
"saturation"[, "scale_rule"]}`` (the scale rule passes through to references.quantize's
fp8_quantize: TE's "fmax/amax" when absent, or AITER's "amax/fmax", which reports no amax),
``{"kind": "mx", "fmt", "scale_rounding", "element_rounding"}`` (FP8 or E2M1 elements; codes
are returned unpacked).
"""
from __future__ import annotations

import numpy as np

from tealite_verify.references import activations as act_ref
from tealite_verify.references import norms as norm_ref
from tealite_verify.references import quantize as qref

F32 = np.float32
TE_RULE = "fmax/amax"  # recipe dicts without "scale_rule" are TE's rule


def as_rows(y) -> np.ndarray:
    """y (..., N) as the 2-D (rows, N) a fused quantized output is stored as."""
    y = np.asarray(y)
    return y.reshape(int(np.prod(y.shape[:-1], dtype=np.int64)), y.shape[-1])


def quantize_rows(y32, recipe: dict, scale=None) -> dict:
    """Rowwise quantization of float32 y (rows, N) with a fused recipe.

    Returns {"bits": uint8 codes (rows, N), unpacked for e2m1, "scale_inv": float32 (1,) /
    (rows,) or E8M0 bytes (rows, N/32), "amax": float32 (1,) / (rows,), or None for MX and for
    AITER's scale rule}.
    """
    y32 = np.asarray(y32, dtype=F32)
    kind = recipe["kind"]
    if kind == "mx":
        bits, scales = qref.mx_quantize(y32, recipe["fmt"], recipe["scale_rounding"],
                                        recipe["element_rounding"])
        return {"bits": bits, "scale_inv": scales, "amax": None}
    saturate = recipe.get("saturation", "saturate") == "saturate"
    if kind == "delayed":
        given = np.asarray(scale if scale is not None else recipe["scale"], F32).reshape(1)
        bits, scale_inv, amax = qref.fp8_quantize(y32, recipe["fmt"], "given", scale=given,
                                                  saturate=saturate)
        return {"bits": bits, "scale_inv": scale_inv, "amax": np.asarray(amax, F32).reshape(1)}
    if kind == "current" and recipe["granularity"] == "row":
        rule = recipe.get("scale_rule", TE_RULE)
        bits, scale_inv, amax = qref.fp8_quantize(
            y32, recipe["fmt"], "row", force_pow2=recipe.get("force_pow2_scales", False),
            amax_epsilon=recipe.get("amax_epsilon", 0.0), saturate=saturate, scale_rule=rule)
        # AITER's rule reports no amax (tealite.recipes), so neither does the fused op.
        return {"bits": bits, "scale_inv": scale_inv, "amax": None if rule != TE_RULE else amax}
    raise ValueError(f"not a fused-quantize recipe: {recipe!r}")


def round_to_f32(y) -> np.ndarray:
    """float64 -> float32, round to nearest even (numpy's cast)."""
    with np.errstate(over="ignore"):
        return np.asarray(y, dtype=np.float64).astype(F32)


def layernorm_fwd_quantize(x, gamma, beta, recipe: dict, *, eps: float,
                           zero_centered_gamma: bool = False, scale=None):
    """(float64 y, mean, rsigma, quantize_rows(round32(y)))."""
    y, mean, rs = norm_ref.layernorm_fwd(x, gamma, beta, eps=eps,
                                         zero_centered_gamma=zero_centered_gamma)
    return y, mean, rs, quantize_rows(round_to_f32(as_rows(y)), recipe, scale)


def rmsnorm_fwd_quantize(x, gamma, recipe: dict, *, eps: float,
                         zero_centered_gamma: bool = False, scale=None):
    """(float64 y, rsigma, quantize_rows(round32(y)))."""
    y, rs = norm_ref.rmsnorm_fwd(x, gamma, eps=eps, zero_centered_gamma=zero_centered_gamma)
    return y, rs, quantize_rows(round_to_f32(as_rows(y)), recipe, scale)


def act_fwd_quantize(x, kind: str, recipe: dict, *, scale=None):
    """(float64 y, quantize_rows(round32(y)))."""
    y = act_ref.act_fwd(x, kind)
    return y, quantize_rows(round_to_f32(as_rows(y)), recipe, scale)
