"""Quantized GEMM: ``D = op_B(B) @ op_A(A)`` on quantized operands, TE layout convention.

Layouts are those of :func:`tealite.gemm` (``TN``: A stored (N, K), B stored (M, K); ``NN``:
A (K, N), B (M, K); ``NT``: A (K, N), B (K, M); ``TT``: A (N, K), B (K, M)).  Scales block
along K, so each operand is read in its K-last orientation: the rowwise data of an operand
stored with K last, the columnwise data (the quantization of its transpose) of one stored K
first.  The operand must carry that data (quantize with ``columnwise=True`` when needed).

Supported recipe pairs (A's recipe, B's recipe):

* FP8 per-tensor or per-row: Float8CurrentScaling ("tensor" or "row") or DelayedScaling, any
  mix; ``D[i, j] = sum_k b[i,k] a[j,k] * s_B[i] * s_A[j]`` with s the dequantization scales.
* FP8 block scaling: A 1x128 or 128x128, B 1x128 (TE / DeepSeek-V3 style); the scales of each
  128-long K block multiply that block's partial product.
* MX: both MXBlockScaling (FP8 or FP4 elements, any mix); E8M0 scales per 32-long K block.

Returns ``QGemmOutput(out, meta)``; ``meta`` reports what a backend did beyond the math (for
example the zero padding ``torch._scaled_mm`` needs: ``{"padded": {"k": [257, 272]}}``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import tealite.registry as registry
from tealite._checks import FLOAT_DTYPES, check_choice, check_dtype_in, check_shape, \
    check_tensor, require
from tealite.recipe_facts import QGEMM_KINDS, qgemm_kind
from tealite.types import LAYOUTS, Op, QuantizedTensor


class QGemmOutput(NamedTuple):
    out: torch.Tensor
    meta: dict


def k_last(q: QuantizedTensor, k_first: bool, name: str):
    """(codes, scales) of operand ``q`` in its K-last orientation."""
    if k_first:
        require(q.columnwise_data is not None,
                f"{name} is stored K-first under this layout: quantize it with columnwise=True")
        return q.columnwise_data, q.columnwise_scale_inv
    require(q.data is not None, f"{name} needs rowwise data under this layout")
    return q.data, q.scale_inv


class QGemmOperands(NamedTuple):
    """A checked operand pair: the scaled-GEMM kind, the product's dims and each operand's
    K-last (codes, scales)."""

    kind: str
    m: int
    n: int
    k: int
    a_codes: torch.Tensor
    a_scales: torch.Tensor | None
    b_codes: torch.Tensor
    b_scales: torch.Tensor | None


def check_operands(a: QuantizedTensor, b: QuantizedTensor, layout: str, *, a_name: str = "a",
                   b_name: str = "b") -> QGemmOperands:
    """Check that ``a`` and ``b`` form a qgemm operand pair under ``layout`` (recipes qgemm
    takes and that pair, 1x128 activations for block scaling, matching K, the K-last data
    present); errors name ``a_name`` / ``b_name``.  Shared with tealite/ops/grouped_gemm.py."""
    for name, q in ((a_name, a), (b_name, b)):
        require(isinstance(q, QuantizedTensor),
                f"{name} must be a QuantizedTensor, got {type(q).__name__}")
    kind_a, kind_b = qgemm_kind(a.recipe), qgemm_kind(b.recipe)
    for name, q, kind in ((a_name, a, kind_a), (b_name, b, kind_b)):
        gran = getattr(q.recipe, "scale_granularity", None)
        require(kind is not None, f"{name}'s recipe has scale_granularity {gran}; qgemm takes "
                                  f"scales per {[g.value for g in QGEMM_KINDS]}")
    require(kind_a == kind_b, f"{a_name} and {b_name} must use compatible recipes, got "
                              f"{kind_a} and {kind_b}")
    if kind_a == "block":
        require(tuple(b.recipe.block) == (1, 128),
                f"{b_name} (activations) must use 1x128 block scaling, got {b.recipe.block}")
    n, k_a = a.shape if layout[0] == "T" else a.shape[::-1]
    m, k_b = b.shape if layout[1] == "N" else b.shape[::-1]
    require(k_a == k_b, f"contraction dims differ under layout {layout}: {a_name} gives K={k_a} "
                        f"({a_name} shape {a.shape}), {b_name} gives K={k_b} ({b_name} shape "
                        f"{b.shape})")
    a_codes, a_scales = k_last(a, layout[0] == "N", a_name)
    b_codes, b_scales = k_last(b, layout[1] == "T", b_name)
    return QGemmOperands(kind_a, m, n, k_a, a_codes, a_scales, b_codes, b_scales)


def operand_devices(ops: QGemmOperands) -> set:
    """The devices of a checked pair's codes and scales."""
    return {t.device for t in (ops.a_codes, ops.b_codes, ops.a_scales, ops.b_scales)
            if t is not None}


def qgemm(a: QuantizedTensor, b: QuantizedTensor, *, layout: str = "TN",
          out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
          backend: str | None = None) -> QGemmOutput:
    check_choice("layout", layout, LAYOUTS)
    for name, q in (("a", a), ("b", b)):
        require(isinstance(q, QuantizedTensor),
                f"{name} must be a QuantizedTensor, got {type(q).__name__}")
    check_dtype_in("out_dtype", out_dtype, FLOAT_DTYPES)
    ops = check_operands(a, b, layout)
    kind_a, m, n, k_a = ops.kind, ops.m, ops.n, ops.k
    a_codes, a_scales, b_codes, b_scales = ops.a_codes, ops.a_scales, ops.b_codes, ops.b_scales
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
        check_shape("bias", bias, (n,), "one value per output column N")
    devices = operand_devices(ops)
    if bias is not None:
        devices.add(bias.device)
    require(len(devices) == 1, f"all operands must be on one device, got {sorted(map(str, devices))}")
    params = dict(kind=kind_a, m=m, n=n, k=k_a, layout=layout, out_dtype=out_dtype,
                  dtype=out_dtype, fmt_a=a.recipe.fmt, fmt_b=b.recipe.fmt,
                  recipe_a=a.recipe, recipe_b=b.recipe, bias=bias is not None,
                  device=registry.device_kind(next(iter(devices))))
    impl = registry.dispatch(Op.QGEMM, params, backend)
    out, meta = impl.fn(a.recipe, a_codes, a_scales, b.recipe, b_codes, b_scales, m=m, n=n,
                        k=k_a, out_dtype=out_dtype, bias=bias)
    return QGemmOutput(out, meta)
