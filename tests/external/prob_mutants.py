"""Seeded-wrong GEMMs the deterministic ``gemm`` tier cannot see at large K (issue 13, part 5).

Each is the torch backend with one small bug, declared ``like="torch"`` (the same support and
numerics as torch), so any error beyond torch's own is the bug.  With zero-mean data at
K = 4096 the deterministic bound gamma_K |A||B| is ~20 fp16 output ulps wide; these bugs are
one ulp or a few fp32 ulps of |A||B| and are what the opt-in probabilistic check
(tealite_verify/tiers/probabilistic.py) is for.  tests/test_tolerance_prob.py registers them under
unique names; ``prob_mutants_plugin`` registers them all for ``fuzz`` / ``run``
(TEALITE_BACKEND_MODULES=prob_mutants_plugin with tests/external on PYTHONPATH).

No module-level side effects: importing this module registers nothing.
"""
from __future__ import annotations

import torch

from tealite.registry import get_backend

FP16_ULP_REL = 2.0 ** -10  # one fp16 ulp at 1.0, relative


def _torch_gemm(a, b, **kw):
    return get_backend("torch").impls["gemm"].fn(a, b, **kw)


def _torch_qgemm(*args, **kw):
    return get_backend("torch").impls["qgemm"].fn(*args, **kw)


def _operands(a, b, layout):
    op_a = a.t() if layout[0] == "T" else a
    op_b = b.t() if layout[1] == "T" else b
    return op_b, op_a


def _epilogue(acc, *, out_dtype, bias, gelu, out, alpha, beta):
    """torch's fp32 epilogue on an fp32 accumulator (one rounding to out_dtype)."""
    pre = acc.float() * alpha
    if beta != 0.0:
        pre = pre + beta * out.float()
    if bias is not None:
        pre = pre + bias.float()
    result = (torch.nn.functional.gelu(pre) if gelu else pre).to(out_dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return result, (pre.to(out_dtype) if gelu else None)


def gemm_scale_ulp(a, b, *, alpha, **kw):
    """alpha read from an fp16 register with one ulp of error: every output x (1 + 2^-10)."""
    return _torch_gemm(a, b, alpha=alpha * (1.0 + FP16_ULP_REL), **kw)


def gemm_row_bias_ulp(a, b, **kw):
    """Output row 0 one ulp (of the output dtype) too large: an off-by-one-ulp row bias."""
    out, pre = _torch_gemm(a, b, **kw)
    if out.shape[0] > 0:
        row = out[0].clone()
        out[0] = torch.nextafter(row, torch.full_like(row, float("inf")))
    return out, pre


def gemm_partial_sums_in_input_dtype(a, b, *, layout, out_dtype, **kw):
    """Split-K in 256-long chunks whose fp32 partial sums are added in the input dtype:
    an undeclared reduced-precision reduction (cuBLAS's allow_*_reduced_precision_reduction)."""
    op_b, op_a = _operands(a, b, layout)
    k = op_a.shape[0]
    acc = torch.zeros(op_b.shape[0], op_a.shape[1], dtype=a.dtype, device=a.device)
    for s in range(0, k, 256):
        acc = (acc.float() + op_b[:, s:s + 256].float() @ op_a[s:s + 256].float()).to(a.dtype)
    return _epilogue(acc.float(), out_dtype=out_dtype, **kw)


def gemm_drop_k_tail(a, b, *, layout, out_dtype, **kw):
    """K walked in 64-long blocks; the last, partial block is dropped (a tail bug)."""
    op_b, op_a = _operands(a, b, layout)
    k = op_a.shape[0]
    kk = (k // 64) * 64 if k > 64 else k
    acc = op_b[:, :kk].float() @ op_a[:kk].float()
    return _epilogue(acc, out_dtype=out_dtype, **kw)


def gemm_tf32_inputs(a, b, *, layout, out_dtype, **kw):
    """fp32 operands rounded to TF32 (10 explicit mantissa bits) without declaring it, as
    allow_tf32 does on a GPU; other dtypes untouched (the rounding is exact for them)."""
    if a.dtype == torch.float32:
        a, b = _round_tf32(a), _round_tf32(b)
    return _torch_gemm(a, b, layout=layout, out_dtype=out_dtype, **kw)


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even fp32 -> TF32 (kept in fp32), finite values."""
    bits = x.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0xFFF + lsb) & ~0x1FFF
    return rounded.view(torch.float32)


def gemm_acc_16_bits(a, b, *, layout, out_dtype, **kw):
    """A narrower accumulator than declared: 16 significant bits (15 explicit), chopped,
    added to in 32-long K chunks, while fp32 round-to-nearest accumulation is declared (in
    the spirit of Hopper FP8 WGMMA's ~14-bit accumulation, DeepSeek-V3 report; at 14 bits
    the deterministic tier already catches it at K = 4096)."""
    op_b, op_a = _operands(a, b, layout)
    k = op_a.shape[0]
    acc = torch.zeros(op_b.shape[0], op_a.shape[1], dtype=torch.float32, device=a.device)
    for s in range(0, k, 32):
        acc = _truncate(acc + op_b[:, s:s + 32].float() @ op_a[s:s + 32].float(), 15)
    return _epilogue(acc, out_dtype=out_dtype, **kw)


def _truncate(x: torch.Tensor, mant: int) -> torch.Tensor:
    """fp32 chopped toward zero to ``mant`` explicit mantissa bits (finite values)."""
    bits = x.contiguous().view(torch.int32)
    return (bits & ~((1 << (23 - mant)) - 1)).view(torch.float32)


def qgemm_one_scale_ulp(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, **kw):
    """B's first fp32 dequantization scale one fp16 ulp too large (x (1 + 2^-10)): output
    row 0 (per-row), every output (per-tensor) or the first 128-block's rows (block) off.
    MX's E8M0 scales have no such ulp: unchanged there."""
    if b_scales.dtype.is_floating_point and b_scales.numel():
        b_scales = b_scales.clone()
        flat = b_scales.view(-1)
        flat[0] = flat[0] * (1.0 + FP16_ULP_REL)
    return _torch_qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, **kw)


# name -> (op, implementation)
MUTANTS = {
    "scale_ulp": ("gemm", gemm_scale_ulp),
    "row_bias_ulp": ("gemm", gemm_row_bias_ulp),
    "partial_sums_in_input_dtype": ("gemm", gemm_partial_sums_in_input_dtype),
    "drop_k_tail": ("gemm", gemm_drop_k_tail),
    "tf32_inputs": ("gemm", gemm_tf32_inputs),
    "acc_16_bits": ("gemm", gemm_acc_16_bits),
    "qgemm_one_scale_ulp": ("qgemm", qgemm_one_scale_ulp),
}


def register(backend, name: str):
    """Declare mutant ``name`` on ``backend`` (a registered tealite Backend), like torch."""
    op, fn = MUTANTS[name]
    backend.implements(op, like="torch")(fn)
    return backend
