"""Quantized GEMM as dequantize (fp32) + fp32 matmul: the reference-quality fallback."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch.quantize import dequantize, dequantize_reason
from tealite.types import Op, QuantizedTensor

_NUMERICS = {"compute_dtype": torch.float32, "operands_dequantized_to": torch.float32}


def _dequantize_k_last(recipe, codes, scales, rows: int, k: int) -> torch.Tensor:
    q = QuantizedTensor(recipe=recipe, shape=(rows, k), data=codes, scale_inv=scales)
    return dequantize(q, out_dtype=torch.float32, columnwise=False)


def _why_not(params) -> str | None:
    """Each operand is dequantized: refused where its scale layout is not one dequantize takes."""
    for name in ("recipe_a", "recipe_b"):
        why = dequantize_reason(params[name])
        if why:
            return f"{name}: {why}"
    return None


@BACKEND.implements(Op.QGEMM, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                    check=_why_not, numerics=_NUMERICS)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    a = _dequantize_k_last(recipe_a, a_codes, a_scales, n, k)
    b = _dequantize_k_last(recipe_b, b_codes, b_scales, m, k)
    out = b @ a.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype), {}
