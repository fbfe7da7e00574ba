"""LayerNormLinear / LayerNormMLP in float64 (issue 17 part 5): the composition of the norm,
quantize, GEMM and activation references, forward and backward, every intermediate returned
(tiers/modules.py propagates the bound through them).

    z = norm(x);  h = Q(z) Q(W1)^T + b1;  [a = act(h);  y = Q(a) Q(W2)^T + b2]

and back from dy (and dz_out, the gradient of the returned norm output):

    da = Q(dy) Q(W2);  dW2 = Q(dy)^T Q(a);  db2 = sum_rows dy;  dh = act'(h) da
    dz = Q(dh) Q(W1) + dz_out;  dW1 = Q(dh)^T Q(z);  db1 = sum_rows dh;  norm backward(dz)

``Q`` is the identity without a recipe.  Under one it is the exact quantize-dequantize of the
recipe's rule applied to the exact value: codes = RNE_fmt(fl32(v * s)) (saturating), value =
codes * fl32(1 / s); s = TE's fmax / amax (current, per tensor, from the exact tensor's amax in
fp32), the given scale (delayed), or 2^e per 32-element block from the block amax with the
recipe's E8M0 rounding (MX).  Each GEMM reads its operand with K last: rowwise for the fprop
input and weight and the dgrad dY, columnwise (the quantization of the transpose: for MX blocks
along the other dim) for the dgrad weight and both wgrad operands; per-tensor scaling gives
the same values both ways.

Only numpy and the norm / activation / quantize references: no tealite code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tealite_verify.references import norms
from tealite_verify.references import quantize as rq
from tealite_verify.references.activations import act_bwd, act_fwd

F32 = np.float32


@dataclass(frozen=True)
class QuantStep:
    """One recipe's quantize-dequantize as plain data: ``kind`` "current" | "delayed" | "mx",
    the element format, the given scale (delayed) and the MX scale rounding."""

    kind: str
    fmt: str = "e4m3"
    scale: float | None = None
    mx_rounding: str = "rceil"

    def __post_init__(self):
        if self.kind not in ("current", "delayed", "mx"):
            raise ValueError(f"kind must be 'current', 'delayed' or 'mx', got {self.kind!r}")
        if (self.kind == "delayed") != (self.scale is not None):
            raise ValueError("scale is given exactly for kind 'delayed'")


def rounded_codes(scaled, fmt: str) -> np.ndarray:
    """RNE_fmt(fl32(scaled)), saturating, as float64 values of the codes: monotone in
    ``scaled`` (the bound brackets a backend's codes between two of these)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return rq.round_elements(np.asarray(scaled, np.float64).astype(F32), fmt,
                                 rounding="rne", saturate=True).astype(np.float64)


def scales_of(v: np.ndarray, step: QuantStep) -> np.ndarray:
    """The scale s of every element of the rowwise quantization of ``v`` (2-D), float64."""
    if step.kind == "delayed":
        return np.full(v.shape, float(F32(step.scale)))
    if step.kind == "current":
        a = F32(np.max(np.abs(v))) if v.size else F32(0)
        return np.full(v.shape, float(rq.te_scale_from_amax(a, step.fmt)))
    return mx_block_scales(mx_block_amax(v), v.shape, step)


def mx_block_amax(v: np.ndarray) -> np.ndarray:
    blocks, _ = rq._blocks(np.abs(v), 32)
    return blocks.max(axis=-1)


def mx_block_scales(block_amax, shape, step: QuantStep) -> np.ndarray:
    """1 / 2^e per element from block amaxes (the E8M0 exponent of the recipe's rounding)."""
    e = rq.e8m0_value(rq.e8m0_scale(np.asarray(block_amax, F32), step.fmt, step.mx_rounding))
    return np.repeat(1.0 / e, 32, axis=-1)[:, : shape[1]]


def dequantized(codes: np.ndarray, s: np.ndarray) -> np.ndarray:
    """codes * fl32(1/s) (the stored scale_inv; exact for MX's powers of two)."""
    with np.errstate(divide="ignore"):
        return codes * (F32(1) / s.astype(F32)).astype(np.float64)


def qdq(v: np.ndarray, step: QuantStep | None, columnwise: bool = False) -> np.ndarray:
    """The value a GEMM reads of ``v`` quantized rowwise (or columnwise) under ``step``."""
    if step is None:
        return v
    if columnwise:
        return qdq(v.T, step).T
    s = scales_of(v, step)
    return dequantized(rounded_codes(v * s, step.fmt), s)


def _gemm_tn(a, w, bias):
    out = a @ w.T
    return out if bias is None else out + bias


def layer(x, gamma, beta, w1, b1, w2, b2, dy, *, normalization: str, eps: float,
          zero_centered_gamma: bool = False, activation: str | None = None,
          steps: dict | None = None, dz_out=None) -> dict:
    """Forward and backward in float64.  ``steps`` maps CASTS names ("input1", "weight1",
    "grad1", "input2", "weight2", "grad2") to a QuantStep (None or absent: no recipe).
    Returns every intermediate and output by name."""
    steps = steps or {}
    q = steps.get
    if normalization == "LayerNorm":
        z, mean, rsigma = norms.layernorm_fwd(x, gamma, beta, eps=eps,
                                              zero_centered_gamma=zero_centered_gamma)
    else:
        z, rsigma = norms.rmsnorm_fwd(x, gamma, eps=eps, zero_centered_gamma=zero_centered_gamma)
        mean = None
    r = {"z": z, "mean": mean, "rsigma": rsigma}
    r["zq"], r["zq_col"] = qdq(z, q("input1")), qdq(z, q("input1"), True)
    r["w1q"], r["w1q_col"] = qdq(w1, q("weight1")), qdq(w1, q("weight1"), True)
    r["h"] = h = _gemm_tn(r["zq"], r["w1q"], b1)
    if activation is None:
        r["y"], dh = h, dy
    else:
        r["a"] = a = act_fwd(h, activation)
        r["aq"], r["aq_col"] = qdq(a, q("input2")), qdq(a, q("input2"), True)
        r["w2q"], r["w2q_col"] = qdq(w2, q("weight2")), qdq(w2, q("weight2"), True)
        r["y"] = _gemm_tn(r["aq"], r["w2q"], b2)
        r["dyq"], r["dyq_col"] = qdq(dy, q("grad2")), qdq(dy, q("grad2"), True)
        r["da"] = r["dyq"] @ r["w2q_col"]
        r["dw2"] = r["dyq_col"].T @ r["aq_col"]
        r["db2"] = dy.sum(axis=0)
        dh = act_bwd(r["da"], h, activation)
    r["dh"] = dh
    r["dhq"], r["dhq_col"] = qdq(dh, q("grad1")), qdq(dh, q("grad1"), True)
    dz = r["dhq"] @ r["w1q_col"]
    r["dz"] = dz if dz_out is None else dz + dz_out
    r["dw1"] = r["dhq_col"].T @ r["zq_col"]
    r["db1"] = dh.sum(axis=0)
    if normalization == "LayerNorm":
        r["dx"], r["dgamma"], r["dbeta"] = norms.layernorm_bwd(
            r["dz"], x, mean, rsigma, gamma, zero_centered_gamma=zero_centered_gamma)
    else:
        r["dx"], r["dgamma"] = norms.rmsnorm_bwd(r["dz"], x, rsigma, gamma,
                                                 zero_centered_gamma=zero_centered_gamma)
    return r
