"""Grouped GEMM references in float64, per group, from the math (see tealite/moe_types.py for
the semantics; no tealite code).

Layout letters as TE's (A the weight side, B the token side):

* TN / NN split B's rows: rows ``[o_g, o_g + s_g)`` of the (M_total, N) output are
  ``op_B(B_g) @ op_A(A_g)`` (+ bias[g]) with A_g = A[g] (3-D A) or the shared 2-D A.
* NT splits the contraction: out[g] = B[rows_g]^T @ A[rows_g], (G, M, N); an empty group
  contributes an exact zero product.

``prior`` (accumulate) is added to the product: beta = 1.  Quantized operands arrive already
dequantized exactly (codes x scales in float64, references/qgemm.py), in their K-last
orientation, one per group.
"""
from __future__ import annotations

import numpy as np

from tealite_verify.references.gemm import product
from tealite_verify.references.qgemm import qgemm as qgemm_k_last


def offsets(splits) -> list[int]:
    """The exclusive prefix sum of ``splits``: group g holds rows [off[g], off[g + 1])."""
    out = [0]
    for s in splits:
        out.append(out[-1] + int(s))
    return out


def splits_k(layout: str) -> bool:
    return layout == "NT"


def group_operands(a, b, splits, layout: str, g: int):
    """Group ``g``'s stored (A_g, B_g), each a 2-D matrix in ``layout``'s orientation."""
    off = offsets(splits)
    rows = slice(off[g], off[g + 1])
    if splits_k(layout):
        return a[rows], b[rows]
    return (a[g] if a.ndim == 3 else a), b[rows]


def grouped_gemm(a, b, splits, *, layout: str, bias=None, prior=None,
                 mag=False) -> np.ndarray:
    """The grouped product (+ bias) (+ prior), float64.  ``mag``: the same with |A|, |B| and
    without bias or prior: the sum of |products| each output element's error scales with."""
    out_rows = []
    for g in range(len(splits)):
        a_g, b_g = group_operands(a, b, splits, layout, g)
        if mag:
            a_g, b_g = np.abs(a_g), np.abs(b_g)
        p = product(a_g, b_g, layout)
        if bias is not None and not mag:
            p = p + bias[g][None, :]
        out_rows.append(p)
    if splits_k(layout):
        out = np.stack(out_rows) if out_rows else np.zeros((0,) + a.shape[1:])
    else:
        n = a.shape[-2] if layout[0] == "T" else a.shape[-1]
        out = np.concatenate(out_rows) if out_rows else np.zeros((0, n))
    if prior is not None and not mag:
        out = out + prior
    return out


def grouped_qgemm(a_deq, b_deq, splits, *, layout: str, n: int, m: int | None = None,
                  bias=None, prior=None, mag=False) -> np.ndarray:
    """Quantized grouped product from dequantized K-last operands: ``a_deq`` one (N, K_g)
    matrix per group (or one shared), ``b_deq`` one (rows_g, K_g) per group; ``m`` is NT's
    output rows.  ``mag`` as in :func:`grouped_gemm`."""
    parts = []
    for g in range(len(splits)):
        a_g = a_deq[g if len(a_deq) > 1 else 0]
        b_g = b_deq[g]
        if mag:
            a_g, b_g = np.abs(a_g), np.abs(b_g)
        p = qgemm_k_last(a_g, b_g)
        if bias is not None and not mag:
            p = p + bias[g][None, :]
        parts.append(p.reshape(b_g.shape[0], n))
    out = np.stack(parts) if splits_k(layout) else np.concatenate(parts)
    if splits_k(layout):
        out = out.reshape(len(splits), m, n)
    if prior is not None and not mag:
        out = out + prior
    return out
