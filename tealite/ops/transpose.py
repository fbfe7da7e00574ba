"""``transpose``: a 2-D tensor's transpose, materialised (TE's ``fp8_transpose`` and the
transpose half of cast-transpose); ``fp8_transpose``: a quantized tensor's columnwise layout
built from its rowwise codes.

``transpose(x)`` returns ``x.T`` as a new contiguous (N, M) tensor of x's dtype, every element
copied bit for bit (NaN payloads, -0 and FP8 codes included): x is float32 / bf16 / fp16, an
FP8 dtype or uint8 (packed codes, scales), any strides, any shape including 0 and 1 rows.

``fp8_transpose(q)`` returns q with ``columnwise_data`` (K, M) = ``q.data.T`` and
``columnwise_scale_inv`` filled.  That equals quantizing x with ``columnwise=True`` exactly
where the scales do not depend on the direction (tests/test_transpose.py checks it):

* per-tensor scaling (current or delayed): one scale for all, ``columnwise_scale_inv`` = a copy
  of ``scale_inv``;
* square blocks (Float8BlockScaling 128x128): the same blocks seen from the other side,
  ``columnwise_scale_inv`` = ``scale_inv.T``.

Per-row scaling, 1xN blocks and MX scale along the row, so the columnwise codes are another
quantization, not a transpose: they are refused (quantize with ``columnwise=True``).
"""
from __future__ import annotations

import dataclasses

import torch

import tealite.registry as registry
from tealite._checks import check_tensor, require
from tealite.recipes import Granularity
from tealite.training_types import TRANSPOSE_DTYPES
from tealite.types import Op, QuantizedTensor


def transpose(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """x.T (2-D) as a new contiguous tensor, bit for bit."""
    check_tensor("x", x, ndim=2, dtypes=TRANSPOSE_DTYPES)
    params = dict(dtype=x.dtype, rows=x.shape[0], cols=x.shape[1],
                  device=registry.device_kind(x.device))
    return registry.dispatch(Op.TRANSPOSE, params, backend).fn(x)


def _why_not_a_transpose(recipe) -> str | None:
    gran = recipe.scale_granularity
    if gran is Granularity.TENSOR:
        return None
    if gran is Granularity.BLOCK and recipe.block[0] == recipe.block[1]:
        return None
    return (f"{recipe.describe()} scales along the row ({gran.value} scales): its columnwise "
            "codes are another quantization, not the transpose of the rowwise ones; quantize "
            "with columnwise=True")


def fp8_transpose(q: QuantizedTensor, *, backend: str | None = None) -> QuantizedTensor:
    """q with its columnwise layout made from the rowwise codes (see the module docstring)."""
    require(isinstance(q, QuantizedTensor), f"q must be a QuantizedTensor, got "
                                            f"{type(q).__name__}")
    require(q.data is not None, "q has no rowwise data (quantize with rowwise=True)")
    why = _why_not_a_transpose(q.recipe)
    require(why is None, f"q: {why}")
    codes = transpose(q.data, backend=backend)
    if q.recipe.scale_granularity is Granularity.TENSOR:
        scales = q.scale_inv.clone()
    else:
        scales = transpose(q.scale_inv, backend=backend)
    return dataclasses.replace(q, columnwise_data=codes, columnwise_scale_inv=scales)
