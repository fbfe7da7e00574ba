"""GEMM reference in float64 with TE's layout convention (see tealite.ops.gemm)."""
from __future__ import annotations

import numpy as np

from tealite_verify.references._device import matmul_f64
from tealite_verify.references.activations import gelu


def operands(a: np.ndarray, b: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """(op_B(B), op_A(A)) so that D = op_B(B) @ op_A(A) is (M, N)."""
    op_a = a.T if layout[0] == "T" else a
    op_b = b.T if layout[1] == "T" else b
    return op_b, op_a


def product(a: np.ndarray, b: np.ndarray, layout: str) -> np.ndarray:
    """op_B(B) @ op_A(A) in float64, on the reference device (see references._device)."""
    op_b, op_a = operands(a, b, layout)
    return matmul_f64(op_b, op_a)


def gemm(a, b, *, layout: str, alpha: float = 1.0, beta: float = 0.0, c=None, bias=None,
         gelu_epilogue: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Return (D, pre) with pre = alpha*op(B)op(A) + beta*C + bias and D = gelu(pre) or pre."""
    pre = alpha * product(a, b, layout)
    if beta != 0.0:
        pre = pre + beta * c
    if bias is not None:
        pre = pre + bias[None, :]
    return (gelu(pre) if gelu_epilogue else pre), pre
