"""FP8 quantized GEMM through torch._scaled_mm.

``_scaled_mm(mat1 (M, K) row-major, mat2 (K, N) column-major, scale_a, scale_b)`` computes
``(mat1 @ mat2) * scale_a * scale_b`` with fp32 accumulation; scales are dequantization
scales: a 0-d tensor (per tensor) or (M, 1) / (1, N) (rowwise; bf16 output only on CUDA).
cuBLASLt rejects K or N that are not multiples of 16, so both are zero-padded (zero codes add
nothing to the products) on every device -- also on the CPU, where it is not needed, so that
CI exercises the padding -- and the output is sliced back.  ``meta["padded"]`` says so.
"""
from __future__ import annotations

import torch

from tealite.backends._pad import pad_end
from tealite.backends.scaled_mm import BACKEND, probes
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import Op

_ALIGN = 16
FP8_MMA_UNIT_ROUNDOFF = 2.0 ** -13  # Hopper FP8 tensor cores: see _numerics


def _is_rowwise(recipe) -> bool:
    return recipe.scale_granularity is Granularity.ROW


def _why_not(params) -> str | None:
    if params["kind"] != "fp8":
        return "only FP8 per-tensor / per-row scaling (no block or MX scales)"
    for name in ("recipe_a", "recipe_b"):  # float32 dequantization scales, 0-d or a vector
        why = outside(params[name], f"scaled_mm ({name})", family=(Family.FP8,),
                      scale_granularity=(Granularity.TENSOR, Granularity.ROW))
        if why:
            return why
    fnuz = {params["fmt_a"], params["fmt_b"]} & {"e4m3fnuz", "e5m2fnuz"}
    hip = torch.version.hip is not None
    if fnuz and not hip:
        return "FNUZ FP8 needs ROCm (gfx942)"
    if hip and not fnuz and params["device"] == "cuda":
        arch = torch.cuda.get_device_properties(0).gcnArchName
        if arch.startswith("gfx942"):
            return "gfx942 computes FNUZ FP8 only"
    if params["fmt_a"] == "e5m2" and params["fmt_b"] == "e5m2":
        return "e5m2 x e5m2 is not supported by cuBLASLt"
    rowwise = _is_rowwise(params["recipe_a"]) or _is_rowwise(params["recipe_b"])
    if rowwise and params["device"] == "cuda" and (params["out_dtype"] != torch.bfloat16
                                                   or params["bias"]):
        return ("rowwise scales need a bfloat16 result on CUDA (and a bias needs an fp32 one "
                "to be added with a single rounding)")
    # What the device's _scaled_mm runs is probed, not assumed (oneDNN's FP8 matmul on the
    # CPU depends on the instruction set): the dtype asked of it is fp32 when a bias follows.
    mm_dtype = torch.float32 if params["bias"] else params["out_dtype"]
    return probes.why_not(params["fmt_b"], params["fmt_a"], mm_dtype, rowwise,
                          params["device"])


def _numerics(params) -> dict:
    numerics = {"compute_dtype": torch.float32}
    if params["device"] == "cuda" and torch.version.hip is None:
        # Hopper FP8 MMA cuts each product toward zero to a multiple of 2^(E - 13), E the
        # largest nominal exponent (e_a + e_b) among the products and the running sum
        # (measured on an H200: 1 + 1.75 * 2^-13 -> 1 + 2^-13, 1 + 31 * 2^-15 -> 1;
        # tests/test_fp8_mma_accumulator.py): up to one unit of 2^-13 lost per product, so
        # u = 2^-13 over the whole sum (2^-14, "~14 bits" from the DeepSeek-V3 report, gave
        # 3 false alarms in a 2.5-minute H200 campaign).  A subnormal code counts at its
        # format's smallest normal exponent: declared as the qgemm tier's FP8 code alignment.
        numerics["accumulator_unit_roundoff"] = FP8_MMA_UNIT_ROUNDOFF
        numerics["alignment_floor"] = FP8_CODE_ALIGNMENT
    return numerics


def _pad_to(t: torch.Tensor, dim: int, align: int) -> torch.Tensor:
    extra = -t.shape[dim] % align
    if not extra:
        return t
    pad = [0, 0] * t.dim()
    pad[2 * (t.dim() - 1 - dim) + 1] = extra
    return pad_end(t.view(torch.uint8), pad).view(t.dtype)


def _scale(scales: torch.Tensor, recipe, rows: int, as_column: bool) -> torch.Tensor:
    s = scales.float().reshape(-1)
    if not _is_rowwise(recipe):
        s = s.expand(rows)
    return (s.reshape(rows, 1) if as_column else s.reshape(1, rows)).contiguous()


@BACKEND.implements(Op.QGEMM, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                    check=_why_not, numerics=_numerics)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    a = _pad_to(_pad_to(a_codes, 1, _ALIGN), 0, _ALIGN)  # (N', K')
    b = _pad_to(b_codes, 1, _ALIGN)  # (M, K')
    meta = {}
    padded = {d: [v, p] for d, v, p in (("k", k, a.shape[1]), ("n", n, a.shape[0])) if p != v}
    if padded:
        meta["padded"] = padded
    both_tensor = not (_is_rowwise(recipe_a) or _is_rowwise(recipe_b))
    if both_tensor:
        scale_b, scale_a = b_scales.float().reshape(()), a_scales.float().reshape(())
    else:
        scale_b = _scale(b_scales, recipe_b, m, as_column=True)
        scale_a = pad_end(_scale(a_scales, recipe_a, n, as_column=False),
                          (0, a.shape[0] - n), value=1.0).contiguous()
    if m == 0 or k == 0:
        out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype), meta
    # With a bias, take the fp32 result and round once after adding it (an unfused bias on a
    # rounded output would round twice).
    mm_dtype = torch.float32 if bias is not None else out_dtype
    out = torch._scaled_mm(b, a.t(), scale_a=scale_b, scale_b=scale_a, out_dtype=mm_dtype)
    out = out[:, :n]
    if bias is not None:
        out = (out + bias.float()).to(out_dtype)
    return out, meta
