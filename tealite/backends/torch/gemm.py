"""GEMM through torch.matmul in the input dtype, epilogue (alpha, beta, bias, GELU) in fp32."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch.probes import matmul_flushes_subnormal_inputs
from tealite.types import Op


def _numerics(params) -> dict:
    """What the tolerance model may assume about this implementation (the fields of tealite.numerics.Numerics)."""
    dtype = params["dtype"]
    fused = _single_rounding(params["bias"], params["gelu"], params["alpha"], params["beta"],
                             params["out_dtype"] == dtype)
    numerics = {"compute_dtype": torch.float32}
    if not fused and dtype != torch.float32:
        # torch.matmul returns the fp32 accumulator rounded to the input dtype; the epilogue
        # then runs in fp32 on that rounded value.
        numerics["accumulator_rounded_to"] = dtype
    # A device this machine lacks cannot be probed (nor run): `list` still shows its other,
    # configuration-dependent declarations.
    present = params["device"] != "cuda" or torch.cuda.is_available()
    if present and matmul_flushes_subnormal_inputs(dtype, str(params["device"])):
        # Probed, not assumed (probes.py): oneDNN's bf16 kernels on AVX512-BF16 / AMX CPUs
        # treat subnormal operands as zero; the kernel choice depends on the shape, so "may".
        numerics["subnormal_inputs"] = "may_flush"
    if params["device"] == "cuda":
        cuda = torch.backends.cuda.matmul
        if dtype == torch.float32 and cuda.allow_tf32:
            numerics["matmul_input_rounding"] = "tf32"
        if ((dtype == torch.float16 and cuda.allow_fp16_reduced_precision_reduction)
                or (dtype == torch.bfloat16 and cuda.allow_bf16_reduced_precision_reduction)):
            # cuBLAS may keep split-K partial sums in the input dtype.
            numerics["partial_sums_rounded_to"] = dtype
    return numerics


def _single_rounding(bias, gelu, alpha, beta, same_dtype) -> bool:
    return not bias and not gelu and alpha == 1.0 and beta == 0.0 and same_dtype


@BACKEND.implements(Op.GEMM, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                    layouts=("TN", "NN", "NT", "TT"), numerics=_numerics)
def gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta):
    op_a = a.t() if layout[0] == "T" else a
    op_b = b.t() if layout[1] == "T" else b
    acc = torch.matmul(op_b, op_a)
    pre_gelu = None
    if _single_rounding(bias is not None, gelu, alpha, beta, out_dtype == a.dtype):
        result = acc
    else:
        pre = acc.float() * alpha
        if beta != 0.0:
            pre = pre + beta * out.float()
        if bias is not None:
            pre = pre + bias.float()
        if gelu:
            pre_gelu = pre.to(out_dtype)
            result = torch.nn.functional.gelu(pre).to(out_dtype)
        else:
            result = pre.to(out_dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return result, pre_gelu
