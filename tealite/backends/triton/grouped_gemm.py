"""Grouped GEMM (TE's ``general_grouped_gemm``) in one persistent launch per call.

Semantics: tealite/moe_types.py.  Kernels: _grouped_kernels.py.

Split M (TN fprop, NN dgrad): the token operand B (M_total, K) is cut into the groups' row
ranges; group g's rows are multiplied by its weight (one 3-D tensor indexed by a group stride,
or one shared 2-D weight: stride 0).  A device-side offset table (``offs``: the groups' first
rows) and tile table (``tiles``: the prefix sum of each group's output tiles) let one
persistent launch of ``min(tiles, programs)`` programs cover every group; a tile never crosses
a group boundary, and an empty group owns no tile (its output has no rows).
Split K (NT wgrad): out[g] (M, N) = B[rows_g]^T A[rows_g], every group the same (M, N) tiles;
``accumulate`` adds into ``out`` (beta = 1, as the dense kernel's epilogue), an empty group
leaves out[g] untouched, without ``accumulate`` it gets exact zeros.
FP8 (per-tensor / per-row scales applied in the epilogue; 1x128 x 128x128 block scaling with
each 128-long K block's partial multiplied by its two scales) runs the dense quantized
kernel's K loop and epilogue (qgemm.py ``_blockwise_loop`` / ``_epilogue``) per tile, on split
M; MXFP8 / MXFP4 (E8M0 bytes per 32 along K: the weights' (G, N, K/32), the tokens' (M_total,
K/32) rows, as tealite/ops/grouped_gemm.py hands each group's K-last scales over) runs the
dense kernel's MX tile (qgemm.py ``_mx_tile``: the per-tile exactness check, then the scaled
bf16 operand loop or the exact per-32-block fallback) on the group's pointers; the K-split
quantized wgrad (a different K per group, each with its own scale blocks) runs the dense
quantized kernel once per group.

Numerics (the ``gemm`` tier's model, as the dense kernels declare): each tile is the dense
kernel's tile (the same jit helpers: gemm.tile_pointers / tile_k_loop / epilogue_store, and
qgemm's block loop, MX tile and epilogue), exact products, fp32 accumulation over all of K (of the
group's K rows for NT), one rounding to out_dtype; fp32 inputs use ``ieee`` dots (no TF32),
as the dense kernel.  Where the grouped launch also uses the dense kernel's block sizes for
every group, each output element is summed in exactly the dense kernel's order and
``grouped_matches_split`` is declared (bit-for-bit parity with a loop of ``triton`` gemm /
qgemm calls): under the interpreter (one fixed config for both).  On a GPU the dense kernel
picks its config per group size (and a TMA variant for large ones), so parity is declared
bounded only (MX's dense configs do not depend on the size, so its GPU parity may turn out
exact: not declared until a GPU shows it).  MX declares the dense MX kernel's numerics: no
operand term (scaled operands are exact), fp32 sums, 2^-23 for NVIDIA's bf16 tensor cores.

Performance: the pointer-based tiled kernel of gemm.py (no TMA), persistent over the flat
tile list; programs = a multiple of the SM count; configs from ``_CUDA`` / ``_HIP`` below
(untimed: benchmarks/test_bench_grouped_gemm.py is where they are measured).  Not yet run on
a GPU: the three kernels cross-compile with triton 3.9 for sm_90 (128x256x64 / 3 stages: 48 KB
shared for split M, 128 KB for NT; FP8 block 128x128x128: 32 KB) and for gfx942.  The FP8
block rows have since run on an H100 (docs/benchmarks.md); the MX split-M path has not (its
cross-compile for sm_90 / gfx942 is tests/test_triton_grouped_qgemm_mx.py; the GPU commands
to run are in docs/benchmarks.md, "MXFP8 / MXFP4 grouped qgemm").
"""
from __future__ import annotations


import torch
import triton

from tealite.backends._host_tables import device_table
from tealite._checks import require
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET, PLATFORM
from tealite.backends.triton import gemm as dense
from tealite.backends.triton import qgemm as qdense
from tealite.backends.triton._grouped_kernels import (grouped_k_kernel, grouped_m_kernel,
                                                      grouped_q_kernel, tile_table)
from tealite.backends.triton._io import as_kernel_arg
from tealite.formats import get_format
from tealite.recipe_facts import qgemm_kind
from tealite.moe_types import GROUPED_LAYOUTS, split_offsets, splits_k
from tealite.recipes import Granularity, describe
from tealite.types import Op

_C = dense.GemmConfig
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
_E8M0_BIAS = qdense._E8M0_BIAS  # OCP MX: scale = 2^(byte - 127)
# NVIDIA / ROCm starting points (untimed; see the module docstring).  128-row tiles waste
# little on MoE splits of a few hundred rows or more; fp32 takes the dense kernel's CUDA-core
# tiles.
_CUDA = {"16bit": _C(128, 256, 64, 8, 8, 3), "fp32": _C(64, 64, 32, 8, 4, 3)}
_HIP = {"16bit": _C(256, 128, 64, 8, 8, 2, waves_per_eu=0, matrix_instr_nonkdim=16),
        "fp32": _C(64, 64, 32, 8, 4, 2)}
_PROGRAMS_PER_SM = 2


def pick_config(dtype: torch.dtype) -> dense.GemmConfig:
    """The grouped kernel's config: the dense kernel's interpreter config under the
    interpreter (so a tile's arithmetic is the dense kernel's, see the module docstring)."""
    if INTERPRET:
        return dense._INTERPRETER
    key = "fp32" if dtype == torch.float32 else "16bit"
    return (_HIP if PLATFORM.get().rocm else _CUDA)[key]


def programs(num_tiles: int, device: torch.device) -> int:
    """Persistent grid size: a few programs in the interpreter (so each walks several tiles
    and groups), a multiple of the SM count on a GPU."""
    if INTERPRET:
        return max(1, min(num_tiles, 3))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(num_tiles, _PROGRAMS_PER_SM * sms))


def _table(values, device) -> torch.Tensor:
    """``values`` (host ints) as a cached device int32 table (capturable after one eager call:
    backends/_host_tables.py)."""
    return device_table(values, torch.int32, device)


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0


def _weights(a: torch.Tensor, layout: str):
    """(Y_0 view (K, N), unit stride along K?, its other stride, group stride) of the weight
    side: a 3-D (G, ...) tensor or one 2-D weight for every group (group stride 0)."""
    w = a if a.dim() == 3 else a.unsqueeze(0)
    if w.stride(2) != 1 and w.stride(1) != 1:
        w = w.contiguous()
    y, k_contig, stride_y = dense.y_operand(w[0], layout)
    # The kernel steps from group 0's view by the group stride: it must be a view of w.
    require(y.data_ptr() == w.data_ptr(), "a: the grouped kernel reads the weights in place; "
                                          f"strides {tuple(a.stride())} are not supported")
    return w, y, k_contig, stride_y, (w.stride(0) if a.dim() == 3 else 0)


def launch_split_m(a, b, splits, *, layout, out_dtype, bias, out, accumulate=False,
                   config=None) -> torch.Tensor:
    """TN / NN: out (M_total, N); ``a`` (G, N, K) / (G, K, N) or one 2-D weight; ``bias``
    (G, N) or None; ``splits`` host ints (checked by the front-end)."""
    x, x_k_contig, stride_x = dense.x_operand(b, layout)
    w, y, y_k_contig, stride_y, stride_yg = _weights(a, layout)
    m_total, k = x.shape
    n = y.shape[1]
    d = out if out is not None and out.stride(1) == 1 else torch.empty(
        (m_total, n), dtype=out_dtype, device=b.device)
    if accumulate and d is not out:
        d.copy_(out)
    cfg = config or pick_config(b.dtype)
    n_tiles = triton.cdiv(n, cfg.block_n)
    tiles = tile_table(splits, cfg.block_m, n_tiles)
    if tiles[-1]:
        bf16_bits = INTERPRET and b.dtype == torch.bfloat16
        fp32_dot = b.dtype == torch.float32 or bf16_bits
        bias_c = bias.contiguous() if bias is not None else None
        big = max(_span(x), _span(w), _span(d)) + 256 > _INT32_MAX
        arg = as_kernel_arg if bf16_bits else (lambda t: t)
        grid = programs(tiles[-1], b.device)
        grouped_m_kernel[(grid,)](
            arg(x), arg(w), as_kernel_arg(d), as_kernel_arg(bias_c) if bias_c is not None else d,
            _table(split_offsets(splits), b.device), _table(tiles, b.device), n, k, stride_x,
            stride_y, stride_yg, d.stride(0), bias_c.stride(0) if bias_c is not None else 0,
            tiles[-1], grid,
            X_K_CONTIG=x_k_contig, Y_K_CONTIG=y_k_contig, BF16_BITS=bf16_bits,
            DOT_PRECISION="ieee" if fp32_dot else None, I64=big, HAS_BIAS=bias is not None,
            ACCUMULATE=accumulate, OUT_BF16=d.dtype == torch.bfloat16,
            BIAS_BF16=b.dtype == torch.bfloat16,
            EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, **cfg.launch_options())
    if out is not None and d is not out:
        out.copy_(d)
        d = out
    return d


def launch_split_k(a, b, splits, *, out_dtype, out, accumulate, config=None) -> torch.Tensor:
    """NT: out (G, M, N), out[g] = B[rows_g]^T @ A[rows_g] (+ out[g] when ``accumulate``)."""
    require(not accumulate or out is not None, "accumulate=True needs out= holding the prior "
                                               "wgrad")
    k_total, n = a.shape
    m = b.shape[1]
    g_count = len(splits)
    # The kernel reads X = B^T with unit stride along M and Y = A along N (wgrad operands are
    # row-major activations / gradients); anything else is made so.
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    d = out if out is not None and out.is_contiguous() else torch.empty(
        (g_count, m, n), dtype=out_dtype, device=b.device)
    if accumulate and d is not out:
        d.copy_(out)
    cfg = config or pick_config(b.dtype)
    per_group = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    num_tiles = per_group * g_count
    if m and n:
        bf16_bits = INTERPRET and b.dtype == torch.bfloat16
        fp32_dot = b.dtype == torch.float32 or bf16_bits
        big = max(_span(a), _span(b), _span(d)) + 256 > _INT32_MAX
        arg = as_kernel_arg if bf16_bits else (lambda t: t)
        grid = programs(num_tiles, b.device)
        grouped_k_kernel[(grid,)](
            arg(b), arg(a), as_kernel_arg(d), _table(split_offsets(splits), b.device), m, n,
            b.stride(0), a.stride(0), d.stride(0), d.stride(1), num_tiles, per_group, grid,
            BF16_BITS=bf16_bits, DOT_PRECISION="ieee" if fp32_dot else None, I64=big,
            ACCUMULATE=accumulate, OUT_BF16=d.dtype == torch.bfloat16,
            EVEN_K=all(s % cfg.block_k == 0 for s in splits), BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            **cfg.launch_options())
    if out is not None and d is not out:
        out.copy_(d)
        d = out
    return d


# ---- FP8 ------------------------------------------------------------------------------------

def _b_scales(recipe, scales: torch.Tensor, m_total: int, k: int, per_group: bool):
    """(scales, group stride, row stride, K stride) of the concatenated token operand's
    scales: ``per_group`` per-tensor ones (G,), else per-row / 1x128 block ones per row."""
    if per_group:
        return scales.reshape(-1), 1, 0, 0
    s, row, ks, _ = qdense._scale_operand(recipe, scales, m_total, k, "b")
    return s, 0, row, ks


def _stacked(t: torch.Tensor, per_group_dims: int):
    """(t as (G, ...), group stride): a tensor of one group's dims is shared (stride 0)."""
    if t.dim() == per_group_dims:
        return t.unsqueeze(0), 0
    return t, t.stride(0)


def _weight_scales_operand(recipe, kind: str, a_scales: torch.Tensor, n: int, k: int):
    """(scales as (G, ...), group stride, row stride, K stride, rows per scale row) of the
    weight side: per tensor (G, 1), per row (G, N), 128x128 / 1x128 blocks (G, N/rows, K/128),
    MX E8M0 bytes (G, N, K/32); one group's shape (no G) for a shared weight."""
    sa, stride_g = _stacked(a_scales, {"fp8": 1}.get(kind, 2))
    if kind == "fp8":
        per_row = recipe.scale_granularity is Granularity.ROW
        require(sa.shape[1] == (n if per_row else 1), f"a scales: {n if per_row else 1} per "
                                                      f"group expected, got {tuple(sa.shape)}")
        return sa, stride_g, (sa.stride(1) if per_row else 0), 0, 1
    rows = recipe.block[0] if kind == "block" else 1
    want = (triton.cdiv(n, rows), triton.cdiv(k, qdense._scale_k(kind)))
    require(tuple(sa.shape[1:]) == want, f"a scales: {want} per group expected for "
                                         f"{describe(recipe)}, got {tuple(sa.shape)}")
    if kind == "mx" and sa.dtype != torch.uint8:
        sa = sa.view(torch.uint8)  # E8M0 bytes
    return sa, stride_g, sa.stride(1), sa.stride(2), rows


def launch_q(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, splits, *, n, k,
             out_dtype, bias, config=None) -> torch.Tensor:
    """Quantized split M: ``a_codes`` (G, N, K) K-last codes (MXFP4: (G, N, K/2) packed bytes)
    with scales (G,) per tensor, (G, N) per row, (G, N/128, K/128) per block or (G, N, K/32)
    E8M0 bytes, or one group's shapes for a shared weight; ``b_codes`` (M_total, K) with
    per-group per-tensor scales (G,) or the per-row / 1x128 block / MX scales of the M_total
    rows; ``bias`` (G, N)."""
    kind = qgemm_kind(recipe_a)
    device = a_codes.device
    m_total = b_codes.shape[0]
    native = qdense.dot_fp8(recipe_a.fmt, recipe_b.fmt, device)
    typed_a, typed_b = qdense.typed_operands(kind, recipe_a.fmt, recipe_b.fmt, device)
    out = torch.empty((m_total, n), dtype=out_dtype, device=device)
    a, stride_ag = _stacked(a_codes, 2)
    fmt_a = get_format(recipe_a.fmt)
    k_stored = triton.cdiv(k, 2) if fmt_a.packed else k
    require(tuple(a.shape[1:]) == (n, k_stored), f"a codes: ({n}, {k_stored}) per group "
                                                 f"expected, got {tuple(a.shape)}")
    if a.stride(2) != 1:
        a = a.contiguous()
    a = a.view(fmt_a.torch_dtype) if typed_a else a.view(torch.uint8)
    sa, stride_sag, sa_row, sa_k, sa_rows = _weight_scales_operand(recipe_a, kind, a_scales, n, k)
    b = qdense._codes_operand(b_codes, recipe_b.fmt, m_total, k, typed_b, "b")
    per_group = qgemm_kind(recipe_b) == "fp8" and \
        recipe_b.scale_granularity is not Granularity.ROW
    sb, sb_g, sb_row, sb_k = _b_scales(recipe_b, b_scales, m_total, k, per_group)
    cfg = config or qdense.pick_config(kind, native, max(m_total, 1), n, device)
    block_k = min(cfg.block_k, qdense._BLOCK_SCALE_K) if kind == "block" else cfg.block_k
    require(kind != "mx" or block_k % qdense._MX_SCALE_K == 0,
            f"BLOCK_K {block_k} must be a multiple of the MX scale block {qdense._MX_SCALE_K}")
    tiles = tile_table(splits, cfg.block_m, triton.cdiv(n, cfg.block_n))
    if not tiles[-1] or n == 0:
        return out
    bias_c = bias.contiguous() if bias is not None else None
    grid = programs(tiles[-1], device)
    grouped_q_kernel[(grid,)](
        a, b, sa, sb, as_kernel_arg(bias_c) if bias_c is not None else out, as_kernel_arg(out),
        _table(split_offsets(splits), device), _table(tiles, device), n, k,
        triton.cdiv(k, qdense._MX_SCALE_K), tiles[-1], stride_ag, a.stride(1), b.stride(0),
        stride_sag, sa_row, sa_k, sb_g, sb_row, sb_k,
        bias_c.stride(0) if bias_c is not None else 0, out.stride(0), grid,
        KIND=qdense._KINDS[kind], SCALE_K=qdense._scale_k(kind) or 1, SA_ROWS=sa_rows,
        E8M0_BIAS=_E8M0_BIAS, EVEN_LOW=qdense._E2M1_EVEN_IN_LOW_NIBBLE,
        DOT_FP8=native and kind != "mx", F32_OPERANDS=INTERPRET, A_TYPED=typed_a,
        B_TYPED=typed_b, HAS_BIAS=bias is not None,
        **qdense._operand_constants("A", recipe_a.fmt),
        **qdense._operand_constants("B", recipe_b.fmt),
        BIAS_BF16=bias is not None and bias.dtype == torch.bfloat16,
        OUT_BF16=out_dtype == torch.bfloat16,
        I64=max(_span(a), _span(b), _span(out)) + 256 > _INT32_MAX, EVEN_K=k % block_k == 0,
        EVEN_SCALE_K=kind == "mx" and k % qdense._MX_SCALE_K == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
        **cfg.launch_options())
    return out


# ---- registration -----------------------------------------------------------------------------

def _rows_of(parts: list[torch.Tensor]) -> torch.Tensor:
    """The groups' row blocks as one tensor: a view when they already lie back to back in one
    storage (the usual case: one activation tensor cut by m_splits), else a copy."""
    live = [t for t in parts if t.numel()]
    if live and _one_storage(live) and all(t.is_contiguous() for t in live) and all(
            nxt.data_ptr() == cur.data_ptr() + cur.numel() * cur.element_size()
            for cur, nxt in zip(live, live[1:])):
        rows = sum(t.shape[0] for t in live)
        return live[0].as_strided((rows, *live[0].shape[1:]), live[0].stride())
    return torch.cat(parts)


def _one_storage(parts: list[torch.Tensor]) -> bool:
    """Back-to-back addresses are not enough for a view: separate allocations can be adjacent
    (CUDA's caching allocator hands out consecutive blocks of one segment: seen on an H100,
    where the view of the first tensor's storage then ran past its end)."""
    base = parts[0].untyped_storage().data_ptr()
    return all(t.untyped_storage().data_ptr() == base for t in parts)


def _stack_groups(parts: list[torch.Tensor]) -> torch.Tensor:
    """Per-group weights (codes or scales) as one (G, ...) tensor: a view when they are the
    slices of one stacked tensor, else a copy."""
    first = parts[0]
    step = first.numel() * first.element_size()
    if _one_storage(parts) and all(t.is_contiguous() and t.shape == first.shape
                                   for t in parts) and all(
            t.data_ptr() == first.data_ptr() + g * step for g, t in enumerate(parts)):
        return first.as_strided((len(parts), *first.shape), (first.numel(), *first.stride()))
    return torch.stack(parts)


def _why_not(params) -> str | None:
    if max(params["m"], params["n"], params["k"]) >= dense._MAX_STRIDE:
        return "a dimension of 2^23 or more (32-bit K-step offsets)"
    return None


def _numerics(params) -> dict:
    # Each tile is the dense kernel's tile; parity is exact where the configs agree too.
    return {**dense._numerics(params), "grouped_matches_split": INTERPRET}


@BACKEND.implements(Op.GROUPED_GEMM, dtypes=_FLOATS, devices=DEVICES, layouts=GROUPED_LAYOUTS,
                    check=_why_not, numerics=_numerics)
def grouped_gemm(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    if splits_k(layout):
        return launch_split_k(a, b, splits, out_dtype=out_dtype, out=out, accumulate=accumulate)
    return launch_split_m(a, b, splits, layout=layout, out_dtype=out_dtype, bias=bias, out=out,
                          accumulate=accumulate)


def _why_not_q(params) -> str | None:
    # The dense kernel's recipe rules (MX: E8M0 per 32 along K, MXFP8 and MXFP4) hold here too:
    # every split-M tile is a dense tile, and NT runs the dense kernel per group.
    return qdense._why_not(params) or _why_not(params)


def _numerics_q(params) -> dict:
    # NT runs the dense quantized kernel per group: the split path's arithmetic by
    # construction.  Split M: exact parity where the configs agree (the interpreter).
    return {**qdense._numerics(params),
            "grouped_matches_split": INTERPRET or splits_k(params["layout"])}


@BACKEND.implements(Op.GROUPED_QGEMM, dtypes=_FLOATS, devices=DEVICES, layouts=GROUPED_LAYOUTS,
                    check=_why_not_q, numerics=_numerics_q)
def grouped_qgemm(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, k, layout, out_dtype,
                  bias, out, accumulate):
    if splits_k(layout):
        return _per_group_q(recipe_a, a_ops, recipe_b, b_ops, splits, m=m, n=n,
                            out_dtype=out_dtype, out=out, accumulate=accumulate)
    per_group_b = qgemm_kind(recipe_b) == "fp8" and \
        recipe_b.scale_granularity is not Granularity.ROW
    b_codes = _rows_of([op.codes for op in b_ops])
    b_scales = (torch.stack([op.scales.reshape(()) for op in b_ops]) if per_group_b
                else _rows_of([op.scales for op in b_ops]))
    shared = len(a_ops) == 1
    a_codes = a_ops[0].codes if shared else _stack_groups([op.codes for op in a_ops])
    a_scales = _weight_scales(recipe_a, [op.scales for op in a_ops], shared)
    product = launch_q(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, splits, n=n,
                       k=k, out_dtype=torch.float32 if accumulate else out_dtype, bias=bias)
    return _store(product, out, out_dtype, accumulate)


def _weight_scales(recipe, scales: list[torch.Tensor], shared: bool) -> torch.Tensor:
    """Weight scales as launch_q reads them: (G, 1) / (G, N) / (G, nb, kb), or one group's
    shape for a shared weight."""
    if qgemm_kind(recipe) == "fp8":
        scales = [s.reshape(-1) for s in scales]
    return scales[0] if shared else _stack_groups(scales)


def _store(product, out, out_dtype, accumulate) -> torch.Tensor:
    """The grouped qgemm's accumulate rule (tealite/ops/grouped_gemm.py): the fp32 product
    plus the prior output in fp32, rounded once to out_dtype."""
    if accumulate:
        out.copy_((out.float() + product).to(out_dtype))
        return out
    if out is not None:
        out.copy_(product)
        return out
    return product


def _per_group_q(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, out_dtype, out,
                 accumulate) -> torch.Tensor:
    """NT (K split per group, each group with its own scale blocks along K): the dense
    quantized kernel once per group."""
    device = b_ops[0].codes.device
    result = out if out is not None else torch.zeros((len(splits), m, n), dtype=out_dtype,
                                                     device=device)
    for g, rows in enumerate(splits):
        if rows == 0:
            if not accumulate:
                result[g].zero_()
            continue
        product = qdense.launch(recipe_a, a_ops[g].codes, a_ops[g].scales, recipe_b,
                                b_ops[g].codes, b_ops[g].scales, m=m, n=n, k=rows,
                                out_dtype=torch.float32 if accumulate else out_dtype, bias=None)
        _store(product, result[g], out_dtype, accumulate)
    return result
