"""Quantized GEMM reference: dequantize the exact codes and scales (float64, exact) and
multiply in float64.  Operands are in their K-last orientation: A (N, K), B (M, K)."""
from __future__ import annotations

import numpy as np

from tealite_verify.references import quantize as q
from tealite_verify.references._device import matmul_f64


def dequantize_fp8(bits, scale_inv, fmt: str, granularity: str, block=None) -> np.ndarray:
    """float64 values of FP8 code bits (R, K) with float32 dequantization scales."""
    vals = q.decode(bits, fmt)
    s = np.asarray(scale_inv, dtype=np.float64)
    if granularity == "row":
        s = s[:, None]
    elif granularity == "block":
        bm, bn = block
        s = np.repeat(np.repeat(s, bm, axis=0), bn, axis=1)[: vals.shape[0], : vals.shape[1]]
    return vals * s


def qgemm(a_deq: np.ndarray, b_deq: np.ndarray, bias=None) -> np.ndarray:
    """D = B @ A.T (+ bias) for K-last operands, on the reference device."""
    out = matmul_f64(b_deq, a_deq.T)
    return out + bias[None, :] if bias is not None else out
