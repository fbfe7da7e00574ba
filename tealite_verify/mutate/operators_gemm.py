"""Mutation operators for ``gemm`` and ``qgemm``: operands read wrongly, epilogue terms dropped
or doubled, a lowered accumulation precision, scale exponents, k-ulp and tail errors.

torch's implementations: ``gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta) ->
(out, pre_gelu)`` and ``qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m,
n, k, out_dtype, bias) -> (out, meta)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tealite.backends.torch import quantize as torch_quantize
from tealite.ops.quantize import QuantizedTensor
from tealite_verify.mutate.base import (Mutation, bump_ulps, largest_finite_index, on_output,
                                        register, stale_last_row, with_args, with_params)

_K_ULP = 4


# ---- gemm -------------------------------------------------------------------------------------

def _a_layout_flag_ignored(args, kw):
    """A stored (N, K) under 'T' read as if stored (K, N): row-major memory read as the other
    layout (the layout flag dropped, the buffer reinterpreted, not transposed)."""
    a, b = args
    layout = kw["layout"]
    rows, cols = a.shape
    kw["layout"] = ("N" if layout[0] == "T" else "T") + layout[1]
    return (a.contiguous().reshape(cols, rows), b), kw


def _square_a_transposed(args, kw):
    """A kernel that infers the transpose from the shapes: a square A is taken transposed."""
    a, b = args
    if a.dim() == 2 and a.shape[0] == a.shape[1]:
        a = a.t().contiguous()
    return (a, b), kw


def _b_row_stride_off_by_one(args, kw):
    """B read with a row stride one element short (a mis-strided operand)."""
    a, b = args
    b = b.contiguous()
    rows, cols = b.shape
    if rows > 1 and cols > 1:
        # The last element read is (rows - 1) * (cols - 1) + cols - 1 < rows * cols.
        b = torch.as_strided(b, (rows, cols), (cols - 1, 1))
    return (a, b), kw


def _doubled_bias(kw):
    if kw.get("bias") is not None:
        kw["bias"] = kw["bias"] * 2  # exact in any float dtype
    return kw


def _gelu_dropped(fn):
    def mutated(a, b, **kw):
        if not kw["gelu"]:
            return fn(a, b, **kw)
        out, _ = fn(a, b, **dict(kw, gelu=False))
        # The pre-activation is produced (and returned as pre_gelu) but the GELU never runs.
        return out, out.clone()
    return mutated


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float16 if dtype == torch.float16 else torch.bfloat16


def low_precision_matmul(op_b: torch.Tensor, op_a: torch.Tensor, acc_dtype: torch.dtype,
                         chunk: int = 16) -> torch.Tensor:
    """op_b @ op_a with a running accumulator kept in ``acc_dtype`` (each chunk of K summed in
    fp32, then added to the accumulator and rounded): what a kernel with a 16-bit accumulator
    computes.  Returns fp32."""
    m, k = op_b.shape
    acc = torch.zeros(m, op_a.shape[1], dtype=acc_dtype, device=op_b.device)
    for start in range(0, k, chunk):
        part = op_b[:, start:start + chunk].float() @ op_a[start:start + chunk].float()
        acc = (acc.float() + part).to(acc_dtype)
    return acc.float()


def _epilogue(acc32, *, out_dtype, bias, gelu, out, alpha, beta):
    """alpha * acc + beta * C + bias, then GELU, in fp32 (TE's epilogue order)."""
    pre = acc32 * alpha
    if beta != 0.0:
        pre = pre + beta * out.float()
    if bias is not None:
        pre = pre + bias.float()
    result = (F.gelu(pre) if gelu else pre).to(out_dtype)
    pre_gelu = pre.to(out_dtype) if gelu else None
    if out is not None:
        out.copy_(result)
        result = out
    return result, pre_gelu


def _low_precision_gemm(fn):
    # The correct part here is the operand selection and the epilogue order; only the
    # accumulator's precision is wrong, so fn (which accumulates in fp32) is not called.
    def mutated(a, b, *, layout, **kw):
        op_a = a.t() if layout[0] == "T" else a
        op_b = b.t() if layout[1] == "T" else b
        return _epilogue(low_precision_matmul(op_b, op_a, _acc_dtype(a.dtype)), **kw)
    return mutated


def _k_ulp_at_largest(k: int):
    def change(t, args, kw):
        i = largest_finite_index(t)
        if i is None:
            return t
        return _into_out(bump_ulps(t, k, i), kw)
    return change


def _into_out(t, kw):
    """gemm's result aliases C when ``out`` is given: the wrong values are written there."""
    out = kw.get("out")
    if out is not None:
        out.copy_(t)
        return out
    return t


def _subnormal_inputs_flushed(args, kw):
    """Subnormal operands read as zero (denormals-are-zero), whatever the backend declared."""
    def daz(t):
        tiny = torch.finfo(t.dtype).tiny
        return torch.where(t.abs() < tiny, torch.zeros_like(t), t)
    a, b = args
    return (daz(a), daz(b)), kw


for _m in (
    Mutation("gemm.a_layout_flag_ignored", "gemm", "operand",
             "A's 'T'/'N' flag flipped: its memory reinterpreted as the other layout",
             with_args(_a_layout_flag_ignored)),
    Mutation("gemm.square_a_transposed", "gemm", "operand",
             "A transposed when it happens to be square (layout inferred from the shapes)",
             # Wrong only when A is square (N == K): the gemm matrix has a square-A cell
             # (coverage.SQUARE) since this operator survived the suite without one.
             with_args(_square_a_transposed)),
    Mutation("gemm.b_row_stride_off_by_one", "gemm", "operand",
             "B read with a row stride of cols - 1 (mis-strided operand)",
             with_args(_b_row_stride_off_by_one)),
    Mutation("gemm.bias_dropped", "gemm", "epilogue", "the bias epilogue term is skipped",
             with_params(lambda kw: dict(kw, bias=None))),
    Mutation("gemm.bias_doubled", "gemm", "epilogue", "the bias is added twice",
             with_params(_doubled_bias)),
    Mutation("gemm.gelu_dropped", "gemm", "epilogue",
             "the GELU epilogue never runs (out = pre_gelu)", _gelu_dropped),
    Mutation("gemm.alpha_dropped", "gemm", "epilogue", "alpha ignored (taken as 1)",
             with_params(lambda kw: dict(kw, alpha=1.0))),
    Mutation("gemm.beta_dropped", "gemm", "epilogue",
             "beta * C ignored: C is overwritten instead of accumulated into",
             with_params(lambda kw: dict(kw, beta=0.0))),
    Mutation("gemm.accumulate_16bit", "gemm", "precision",
             "the K reduction accumulates in bf16 (fp16 for fp16 inputs), 16-element chunks",
             _low_precision_gemm),
    Mutation(f"gemm.out_{_K_ULP}ulp_at_largest", "gemm", "k-ulp",
             f"+{_K_ULP} output ulps at the output element of largest magnitude",
             on_output(_k_ulp_at_largest(_K_ULP), index=0)),
    Mutation("gemm.out_1ulp_at_largest", "gemm", "k-ulp",
             "+1 output ulp at the output element of largest magnitude",
             on_output(_k_ulp_at_largest(1), index=0), must_kill=False,
             why_not="inside the declared tolerance wherever the element's own rounding error "
                     "and gamma_K |A||B| leave room (the bound is at least half an ulp plus "
                     "the compute term)"),
    Mutation("gemm.subnormal_inputs_flushed", "gemm", "precision",
             "subnormal operands treated as zero (DAZ) without declaring it",
             with_args(_subnormal_inputs_flushed)),
    Mutation("gemm.last_row_stale", "gemm", "tail",
             "the output's last row keeps the first row's values (last tile not written)",
             on_output(lambda t, a, kw: _into_out(stale_last_row(t), kw), index=0)),
):
    register(_m)


# ---- qgemm ------------------------------------------------------------------------------------

def _scale_exponent_up(scales: torch.Tensor, index: int | None) -> torch.Tensor:
    """Scales one exponent too large: E8M0 bytes + 1, float scales x 2; only at ``index``
    (flat) when given."""
    out = scales.clone()
    flat = out.view(-1)
    if flat.numel() == 0:
        return out
    sel = slice(None) if index is None else slice(index, index + 1)
    if out.dtype == torch.uint8:
        flat[sel] = torch.clamp(flat[sel].int() + 1, max=254).to(torch.uint8)
    else:
        flat[sel] = flat[sel] * 2
    return out


def _a_scales_doubled(args, kw):
    ra, ac, asc, rb, bc, bsc = args
    return (ra, ac, _scale_exponent_up(asc, None), rb, bc, bsc), kw


def _b_last_scale_up(args, kw):
    ra, ac, asc, rb, bc, bsc = args
    return (ra, ac, asc, rb, bc, _scale_exponent_up(bsc, bsc.numel() - 1)), kw


def _qgemm_low_precision(fn):
    # Dequantize with the torch backend's dequantize (the correct part), then a 16-bit
    # accumulator instead of fp32.
    def deq(recipe, codes, scales, rows, k):
        q = QuantizedTensor(recipe=recipe, shape=(rows, k), data=codes, scale_inv=scales)
        return torch_quantize.dequantize(q, out_dtype=torch.float32, columnwise=False)

    def mutated(ra, ac, asc, rb, bc, bsc, *, m, n, k, out_dtype, bias):
        a = deq(ra, ac, asc, n, k)
        b = deq(rb, bc, bsc, m, k)
        out = low_precision_matmul(b, a.t(), torch.bfloat16)
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype), {}
    return mutated


for _m in (
    Mutation("qgemm.bias_dropped", "qgemm", "epilogue", "the bias is not added",
             with_params(lambda kw: dict(kw, bias=None))),
    Mutation("qgemm.a_scales_exponent_up", "qgemm", "scale-exponent",
             "every A scale one exponent too large (E8M0 byte + 1, float scale x 2)",
             with_args(_a_scales_doubled)),
    Mutation("qgemm.b_last_scale_exponent_up", "qgemm", "scale-exponent",
             "B's last scale (last block's E8M0 byte, last row's or the tensor's scale) one "
             "exponent too large", with_args(_b_last_scale_up)),
    Mutation("qgemm.accumulate_bf16", "qgemm", "precision",
             "operands dequantized correctly, the K reduction accumulated in bf16",
             _qgemm_low_precision),
    Mutation("qgemm.last_row_stale", "qgemm", "tail",
             "the output's last row keeps the first row's values",
             on_output(lambda t, a, kw: stale_last_row(t), index=0)),
):
    register(_m)
