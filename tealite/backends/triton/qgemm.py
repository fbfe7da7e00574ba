"""Quantized GEMM (FP8 per-tensor / per-row, FP8 block-scaled, MXFP8 / MXFP4) with the scales
applied inside the kernel.

Operands arrive in their K-last orientation (see tealite.ops.qgemm): A codes (N, K), B codes
(M, K), ``D = B @ A.T`` (M, N), tiled as ``X @ Y`` with X = a (BM, BK) tile of B and Y = a
(BK, BN) tile of A (K has unit stride: the TN fast path of every FP8 tensor core).

FP8 per-tensor / per-row (``KIND_FP8``): ``acc`` sums code products over all of K; the epilogue
multiplies by ``s_B[i]`` then ``s_A[j]`` (a per-tensor scale is a row scale of stride 0).
FP8 block (``KIND_BLOCK``, 128-long K blocks, fp32 scales): each K step lies inside one scale
block; its partial product (a fresh ``tl.dot``) is added as ``acc += (part * s_B[i]) * s_A[j]``.
Operands of both are native fp8 tiles where the target multiplies the format (``DOT_FP8``:
NVIDIA sm_89+ / gfx950 OCP, gfx942 FNUZ), else the codes' exact values as bf16 (every FP8 /
E2M1 value is a normal bf16 number; fp16 would make e5m2's subnormal codes fp16 subnormals,
which H100 tensor cores align at the smallest normal exponent), fp32 in the interpreter.

MX (``KIND_MX``, E8M0 scales 2^(byte-127) per 32 along K): the scales are powers of two, so
they go on the OPERANDS, exactly: each code is decoded (the hardware's fp8 conversion, or
integer ops) and multiplied by its block's power of two in fp32, which is a normal bf16 number
whenever the byte lies in the format's fast range (``_fast_byte_range``: codes have <= 3
mantissa bits, bf16 has 7 and fp32's exponent range).  Then ONE bf16 ``tl.dot`` chain over
BLOCK_K = 64 / 128 per step, fp32 accumulation (the old path paid a dot plus a full fp32 tile
rescale every 32 K: 8 % of scaled_mm on an H100).  Each tile first checks its scale bytes
(``_mx_tile_is_fast``); a tile with a byte above the range (overflow, NaN 0xFF) or below it
(subnormal / lost values) with any nonzero code there takes the exact fallback: bf16 code
dots per 32-long block, each partial multiplied by 2^(e_B + e_A) split into two normal halves
(``_times_e8m0_pair``), computed in two column halves so its registers peak where the fast
path's do.  Zero blocks (amax == 0 gives byte 0 under every E8M0 rule) keep the fast path.
Interpreter: its bf16 ``tl.dot`` is garbage, so the operands stay fp32 (rounded to bf16 by
integer RNE first, so they are the GPU's values) and the dot uses ``input_precision="ieee"``.
``tl.dot_scaled`` (triton 3.6 and 3.9) was not used: it has no FNUZ formats (gfx942), on sm_90
it is itself a bf16 upcast-and-multiply (the same work, less control), and it handles no
out-of-range scale bytes, so the exactness routing above would be needed anyway.

Numerics (declared to the ``gemm`` tier, tealite_verify/tiers/gemm.py; see ``_numerics``):
products of codes are exact; sums are fp32, except the WGMMA accumulator of native FP8 dots on
NVIDIA (~14 bits between promotions): all of K for per-tensor / per-row (Triton's sm_90
default never promotes, as scaled_mm's fast path), one scale block for block scaling; bf16
tensor-core sums on NVIDIA truncate (u = 2^-23, measured on an H100, as gemm.py declares).
Block scaling rounds each partial twice in fp32 (the tier's operand term).  MX is the tier's
base model: exact products, fp32 sums, no operand or 14-bit term.  One rounding to out_dtype
(bf16 by integer RNE, _io.py).

Performance: a classic tiled kernel with grouped ordering, no TMA or warp specialization
(portable to ROCm); configs in ``_CUDA`` / ``_HIP``; benchmarks/qgemm_configs.py times the
candidates against torch._scaled_mm.  Large dense MX problems on NVIDIA take the staged path
instead (_qgemm_mx_staged.py: operands scaled into bf16 once, tealite's bf16 GEMM, an exact
fixup of the tiles holding rows outside the fast range): the folded loop converts every
operand tile once per output tile, which held MXFP8 at 22 % of the per-tensor FP8 qgemm.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from tealite._checks import require
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET, PLATFORM
from tealite.backends.triton._io import as_kernel_arg
from tealite.backends.triton._qgemm_operands import (_decode_constants, _fast_byte_range,
                                                     dot_fp8, typed_operands)
from tealite.backends.triton import _qgemm_mx_staged as mx_staged_path
from tealite.backends.triton._qgemm_tiles import (_blockwise_loop, _epilogue, _mx_tile,
                                                  _tile_coords)
# VARIANTS: the kernel variants chosen on the host ("mx": "auto", "fold", "acc" or "staged";
# _qgemm_mx_acc.py says which is which).
from tealite.backends.triton._qgemm_mx_acc import (VARIANTS, mx_acc_fits, mx_acc_product,
                                                   mx_acc_runs)
from tealite.backends.triton.gemm import _TENSOR_CORE_U, GemmConfig
from tealite.formats import get_format
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.recipe_facts import outside, qgemm_kind
from tealite.recipes import Family, Granularity, describe
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
KIND_FP8, KIND_BLOCK, KIND_MX = 0, 1, 2
_KINDS = {"fp8": KIND_FP8, "block": KIND_BLOCK, "mx": KIND_MX}
# Scale-block lengths along K: Float8BlockScaling (TE, DeepSeek-V3) and the OCP MX spec.
_BLOCK_SCALE_K = 128
_MX_SCALE_K = 32
_E8M0_BIAS = 127  # OCP MX: scale = 2^(byte - 127)
_E2M1_EVEN_IN_LOW_NIBBLE = True  # TE and AITER pack element 2i in bits 0-3 of byte i
# Hopper FP8 MMA cuts each product toward zero to a multiple of 2^(E - 13), E the largest
# nominal exponent in the sum, a subnormal code counted at its format's smallest normal
# exponent (measured on an H200: tests/test_fp8_mma_accumulator.py; the scaled_mm backend
# declares the same).
_FP8_MMA_UNIT_ROUNDOFF = 2.0**-13
_FP8_CODE_ALIGNMENT = FP8_CODE_ALIGNMENT


# ---- the kernel -------------------------------------------------------------------------------

@triton.jit
def _qgemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, M, N, K, KS,
                  stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                  stride_om,
                  KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                  E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr, DOT_FP8: tl.constexpr,
                  F32_OPERANDS: tl.constexpr, A_TYPED: tl.constexpr, A_EBITS: tl.constexpr,
                  A_MBITS: tl.constexpr, A_BIAS: tl.constexpr, A_SPECIALS: tl.constexpr,
                  A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr, A_MAG: tl.constexpr,
                  A_LO: tl.constexpr, A_HI: tl.constexpr, B_TYPED: tl.constexpr,
                  B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                  B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
                  B_MAG: tl.constexpr, B_LO: tl.constexpr, B_HI: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
                  I64: tl.constexpr, EVEN_K: tl.constexpr, EVEN_SCALE_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, MX_ACC: tl.constexpr):
    """out (M, N) = B (M, K) @ A (N, K)^T with scales; K has unit stride in A and B (a packed
    E2M1 operand holds element k in byte k // 2).  ``KS``: MX scale blocks along K."""
    rm, rn, bm, an, n0 = _tile_coords(tl.program_id(0), M, N, I64, BLOCK_M, BLOCK_N, GROUP_M)
    if MX_ACC:
        acc = mx_acc_product(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, rn < N, rm < M, K, KS,
                             stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row,
                             stride_sb_k, SCALE_K, E8M0_BIAS, A_TYPED, A_EBITS, A_MBITS, A_BIAS,
                             A_SPECIALS, A_MIN_NORMAL, B_TYPED, B_EBITS, B_MBITS, B_BIAS,
                             B_SPECIALS, B_MIN_NORMAL, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        _epilogue(acc, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, M, N, stride_sa_row,
                  stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16, OUT_BF16)
    elif KIND != 2:
        acc = _blockwise_loop(a_ptr, b_ptr, sa_ptr, sb_ptr, an, bm, K, stride_a, stride_b,
                              stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                              KIND, SCALE_K, SA_ROWS, E8M0_BIAS, EVEN_LOW, DOT_FP8,
                              F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS,
                              A_MIN_NORMAL, A_PACKED, B_TYPED, B_EBITS, B_MBITS, B_BIAS,
                              B_SPECIALS, B_MIN_NORMAL, B_PACKED, EVEN_K, BLOCK_M, BLOCK_N,
                              BLOCK_K)
        _epilogue(acc, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, M, N, stride_sa_row,
                  stride_sb_row, stride_om, KIND, HAS_BIAS, BIAS_BF16, OUT_BF16)
    else:
        _mx_tile(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, rm, rn, bm, an, n0, M, N, K,
                 KS, stride_a, stride_b, stride_sa_row, stride_sa_k,
                 stride_sb_row, stride_sb_k, stride_om, SCALE_K, E8M0_BIAS, EVEN_LOW,
                 F32_OPERANDS, A_TYPED, A_EBITS, A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL,
                 A_PACKED, A_MAG, A_LO, A_HI, B_TYPED, B_EBITS, B_MBITS, B_BIAS, B_SPECIALS,
                 B_MIN_NORMAL, B_PACKED, B_MAG, B_LO, B_HI, HAS_BIAS, BIAS_BF16, OUT_BF16, I64,
                 EVEN_K, EVEN_SCALE_K, BLOCK_M, BLOCK_N, BLOCK_K)


# ---- configs ----------------------------------------------------------------------------------

# Same block / warp / stage fields and ROCm-only launch options as the bf16 GEMM's configs
# (its TMA / persistent flags stay off here).
QGemmConfig = GemmConfig
_C = QGemmConfig
# Interpreter: small asymmetric blocks so CI shapes (M, N <= 48, K <= 256) span several
# programs, M/N/K tails, for block scaling several K steps per 128-long scale block, and for
# MX two 32-long scale blocks per K step (the fast path's per-element scale expansion).
_INTERPRETER = _C(16, 32, 64, 2, 4, 1)
# NVIDIA (H100: 132 SMs, 228 KB smem/SM, 255 registers/thread).  Native FP8 per-tensor /
# per-row: 128x256x128 x 3 stages = 144 KB smem, 224 registers (the shape of Triton's FP8
# matmul tutorial config).  Block keeps a second (BM, BN) fp32 tile (the partial product)
# live, which spills at 128x256 (cross-compiled for sm_90 with triton 3.9: 255 registers +
# 160-208 B stack), so 128x128.  Decoded (bf16) operands: half the K depth of FP8.
# MX (bf16 dots on scaled operands; cross-compiled for sm_90 with triton 3.6 and 3.9, not
# yet timed): each step converts both tiles on the CUDA cores, then waits for its wgmma
# (Triton cannot keep a dot in flight whose operand it stored from registers), so one CTA
# alternates between the two units.  128x128x64 with 4 warps: 255 registers, no spill in the
# fast loop, 48 KB smem, so two CTAs fit an SM and overlap one's conversion with the other's
# wgmma.  Alternatives in benchmarks/qgemm_configs.py (8 warps: 128x128x64 ~190 registers,
# 128x256x64 and 128x128x128 255, spill-free fast loops; 128x256x128 spills).  The old MXFP4
# 128x128x32 / 4-warp config hit triton 3.6's "Illegal shared layout" in
# TritonGPUOptimizeDotOperands (reproduced in the cross-compile); every config listed here
# and in the benchmark compiles with triton 3.6.
_CUDA = {
    ("fp8", True, "large"): _C(128, 256, 128, 8, 8, 3),
    ("fp8", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "large"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("mx", True, "large"): _C(128, 128, 64, 8, 4, 3),
    ("mx", True, "small"): _C(128, 128, 64, 8, 4, 3),
    ("fp8", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("fp8", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("mx", False, "large"): _C(128, 128, 64, 8, 4, 3),
    ("mx", False, "small"): _C(128, 128, 64, 8, 4, 3),
    # VARIANTS["mx"] == "acc", cross-compiled with triton 3.9 (benchmarks/qgemm_ptx.py), not
    # timed: a fresh partial tile beside the accumulator; 128x128x32 / 8 warps 200 registers,
    # no spill; BLOCK_K 128 (4 unrolled blocks) spills.  benchmarks/qgemm_configs.py sweeps.
    ("mx-acc", True, "large"): _C(128, 128, 32, 8, 8, 4),
    ("mx-acc", True, "small"): _C(128, 128, 32, 8, 8, 4),
}
# ROCm (MI300 / MI350, unmeasured): 64 KB LDS -> 2 stages (the stream pipeliner keeps one tile
# in registers), 16x16 MFMA, wavefronts of 64.  Cross-compiled with triton 3.9: 256x256x64
# native FP8 spills 32 VGPRs on gfx942, 256x128x128 none (228 VGPRs); MX 128x128x64 with 4
# warps none (gfx942 FNUZ 267 VGPRs incl. AGPRs, gfx950 OCP 204).
_HIP_OPTS = dict(waves_per_eu=0, matrix_instr_nonkdim=16)
_HIP = {
    ("fp8", True): _C(256, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("block", True): _C(128, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("mx", True): _C(128, 128, 64, 8, 4, 2, **_HIP_OPTS),
    ("fp8", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("block", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("mx", False): _C(128, 128, 64, 8, 4, 2, **_HIP_OPTS),
}
# Tried in order when a config does not fit the device (OutOfResources).
_FALLBACKS = (_C(128, 128, 32, 8, 4, 3), _C(64, 64, 32, 8, 4, 2), _C(32, 32, 32, 4, 4, 1))
_working: dict[tuple, QGemmConfig] = {}  # table key -> a config that compiled on this device


def _scale_k(kind: str) -> int | None:
    return {"block": _BLOCK_SCALE_K, "mx": _MX_SCALE_K}.get(kind)


def _table_key(kind: str, native: bool, m: int, n: int, device) -> tuple:
    if PLATFORM.get().rocm:
        return ("hip", kind, native)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    big = triton.cdiv(m, 128) * triton.cdiv(n, 256) >= sms
    return (kind, native, "large" if big else "small")


def pick_config(kind: str, native: bool, m: int, n: int, device) -> QGemmConfig:
    """The fixed config for this problem (the interpreter always uses one small config)."""
    if INTERPRET:
        return _INTERPRETER
    key = _table_key(kind, native, m, n, device)
    return _working.get(key) or (_HIP[key[1:]] if key[0] == "hip" else _CUDA[key])


# ---- host side --------------------------------------------------------------------------------

def _scale_operand(recipe, scales: torch.Tensor, rows: int, k: int, name: str):
    """(scales as the kernel reads them, row stride, K stride, rows per scale row)."""
    kind = qgemm_kind(recipe)
    if kind == "mx":
        want, per = (rows, triton.cdiv(k, _MX_SCALE_K)), 1
        s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    elif kind == "block":
        per = recipe.block[0]
        want = (triton.cdiv(rows, per), triton.cdiv(k, _BLOCK_SCALE_K))
        s = scales
    else:  # "fp8": per tensor or per row (the check admits no other layout)
        row = recipe.scale_granularity is Granularity.ROW
        require(scales.numel() == (rows if row else 1),
                 f"{name} scales: {'one per row' if row else 'one per tensor'} expected "
                 f"({rows if row else 1}), got shape {tuple(scales.shape)}")
        s = scales.reshape(-1)
        return s, (s.stride(0) if row else 0), 0, 1
    require(tuple(s.shape) == want,
             f"{name} scales: shape {want} expected for {describe(recipe)}, got {tuple(s.shape)}")
    return s, s.stride(0), s.stride(1), per


def _codes_operand(codes: torch.Tensor, fmt: str, rows: int, k: int, typed: bool, name: str):
    """The codes as the kernel reads them: their torch FP8 dtype where ``typed`` (the device
    converts / multiplies that format natively), else bytes."""
    f = get_format(fmt)
    want = (rows, triton.cdiv(k, 2) if f.packed else k)
    require(tuple(codes.shape) == want,
             f"{name} codes: shape {want} expected for {fmt}, got {tuple(codes.shape)}")
    if codes.stride(1) != 1 and codes.numel():  # the kernel assumes unit stride along K
        codes = codes.contiguous()
    return codes.view(f.torch_dtype) if typed else codes.view(torch.uint8)


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
           bias, config: QGemmConfig | None = None, mx_acc: bool = False,
           mx_staged: bool = False) -> torch.Tensor:
    """Run the kernel; ``config`` overrides the fixed choice (benchmarks); ``mx_acc`` runs
    the MX accumulator variant (only where ``mx_acc_runs``), ``mx_staged`` the staged MX path
    (_qgemm_mx_staged.py; MX recipes only)."""
    kind = qgemm_kind(recipe_a)
    require(not mx_staged or (kind == "mx" and not mx_acc),
            f"mx_staged: the staged path takes MX recipes (and not mx_acc), got "
            f"{describe(recipe_a)} x {describe(recipe_b)}")
    require(not mx_acc or mx_acc_fits(kind, recipe_a.fmt, recipe_b.fmt, a_codes.device),
            f"mx_acc: the MX accumulator variant takes MX recipes with e4m3 / e5m2 codes "
            f"multiplied natively (or interpreted), got {describe(recipe_a)} x "
            f"{describe(recipe_b)}")
    device = a_codes.device
    native = dot_fp8(recipe_a.fmt, recipe_b.fmt, device)
    typed_a, typed_b = typed_operands(kind, recipe_a.fmt, recipe_b.fmt, device)
    a = _codes_operand(a_codes, recipe_a.fmt, n, k, typed_a, "a")
    b = _codes_operand(b_codes, recipe_b.fmt, m, k, typed_b, "b")
    sa, sa_row, sa_k, sa_rows = _scale_operand(recipe_a, a_scales, n, k, "a")
    sb, sb_row, sb_k, sb_rows = _scale_operand(recipe_b, b_scales, m, k, "b")
    require(sb_rows == 1, "b (activations) must use 1x128 block scaling")
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=device)
    row_flags = ()
    if mx_staged:  # the bf16 GEMM of staged operands writes out; the fixup launch (below)
        # redoes the tiles touching a flagged row
        common = dict(e8m0_bias=_E8M0_BIAS, scale_block=_MX_SCALE_K,
                      even_low=_E2M1_EVEN_IN_LOW_NIBBLE)
        a16, fa = mx_staged_path.stage(a, sa, sa_row, sa_k, n, k, _constants(recipe_a.fmt),
                                       **common)
        b16, fb = mx_staged_path.stage(b, sb, sb_row, sb_k, m, k, _constants(recipe_b.fmt),
                                       **common)
        out = mx_staged_path.multiply_staged(a16, b16, out_dtype, bias)
        del a16, b16
        row_flags = (fa, fb)
    else:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    bias_arg = as_kernel_arg(bias.contiguous()) if bias is not None else out
    args = (a, b, sa, sb, bias_arg, as_kernel_arg(out), *row_flags, m, n, k,
            triton.cdiv(k, _MX_SCALE_K), a.stride(0), b.stride(0), sa_row, sa_k, sb_row, sb_k,
            out.stride(0))
    flags = dict(KIND=_KINDS[kind], SCALE_K=_scale_k(kind) or 1, SA_ROWS=sa_rows,
                 E8M0_BIAS=_E8M0_BIAS, EVEN_LOW=_E2M1_EVEN_IN_LOW_NIBBLE,
                 DOT_FP8=native and kind != "mx", F32_OPERANDS=INTERPRET, A_TYPED=typed_a,
                 B_TYPED=typed_b, HAS_BIAS=bias is not None,
                 BIAS_BF16=bias is not None and bias.dtype == torch.bfloat16,
                 OUT_BF16=out_dtype == torch.bfloat16,
                 I64=max(_span(a), _span(b), _span(out)) + 256 > _INT32_MAX, MX_ACC=mx_acc,
                 **_operand_constants("A", recipe_a.fmt), **_operand_constants("B", recipe_b.fmt))
    table = "mx-acc" if mx_acc else kind  # the variant's configs: their own table rows
    chosen = config or pick_config(table, native, m, n, device)
    tries = (chosen,) if config is not None or INTERPRET else (chosen, *_FALLBACKS)
    for i, cfg in enumerate(tries):
        try:
            _launch_one(cfg, args, flags, kind, m, n, k, staged=mx_staged)
            if i:  # remember what fits this device for this key
                _working[_table_key(table, native, m, n, device)] = cfg
            return out
        except OutOfResources:
            if i == len(tries) - 1:
                raise
    return out


def _constants(fmt: str) -> dict:
    """A code format's kernel constants: its bit layout and fast E8M0 byte range."""
    lo, hi = _fast_byte_range(fmt, _E8M0_BIAS)
    return dict(_decode_constants(fmt), LO=lo, HI=hi)


def _operand_constants(prefix: str, fmt: str) -> dict:
    return {f"{prefix}_{c}": v for c, v in _constants(fmt).items()}


def _launch_one(cfg: QGemmConfig, args, flags, kind: str, m: int, n: int, k: int,
                staged: bool = False) -> None:
    block_k = cfg.block_k
    if kind == "block":  # a K step never straddles two scale blocks
        block_k = min(block_k, _BLOCK_SCALE_K)
        require(_BLOCK_SCALE_K % block_k == 0, f"BLOCK_K {block_k} must divide the scale "
                                                f"block {_BLOCK_SCALE_K}")
    if kind == "mx":  # a K step holds whole scale blocks (its scales expand per element)
        require(block_k % _MX_SCALE_K == 0, f"BLOCK_K {block_k} must be a multiple of the MX "
                                             f"scale block {_MX_SCALE_K}")
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    kernel = _qgemm_kernel
    if staged:  # the fixup kernel: the MX tile only, persistent
        kernel = mx_staged_path.fixup_kernel
        flags = {f: v for f, v in flags.items() if f not in mx_staged_path.DENSE_ONLY_FLAGS}
        grid = (mx_staged_path.fixup_programs(grid[0], args[0].device),)
    kernel[grid](*args, **flags, EVEN_K=k % block_k == 0,
                 EVEN_SCALE_K=kind == "mx" and k % _MX_SCALE_K == 0, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
                 **cfg.launch_options())


# ---- registration -----------------------------------------------------------------------------

def _numerics(params) -> dict:
    numerics = {"compute_dtype": torch.float32}
    kind, k = params["kind"], params["k"]
    if kind == "block":
        # Each K block's partial sum is multiplied by its two scales in fp32 before it is added
        # (two roundings per partial): the tier's "each operand rounded once in fp32" term,
        # 2u * |B||A|.
        numerics["operands_dequantized_to"] = torch.float32
    # MX has no such term: its fast path multiplies exactly scaled operands (bf16 / fp32
    # products are exact); its fallback's code products are exact, summed per 32-long block,
    # and each block sum is multiplied by its power of two exactly (below fp32's normal range
    # it loses less than the smallest normal: inside the tier's underflow term).
    nvidia = params["device"] == "cuda" and not PLATFORM.get().rocm
    if not nvidia or k == 0:
        return numerics  # the interpreter's numpy dots: fp32 round-to-nearest sums
    if kind != "mx" and dot_fp8(params["fmt_a"], params["fmt_b"], torch.device("cuda")):
        if kind == "fp8":
            # acc is the WGMMA accumulator over all of K (Triton's sm_90 default never promotes
            # FP8 dot partial sums), so model the whole sum at 2^-13, as scaled_mm does.
            numerics["accumulator_unit_roundoff"] = _FP8_MMA_UNIT_ROUNDOFF
        else:
            # A fresh dot per scale block: at most min(K, scale block) terms summed at ~14 bits,
            # then at most K partials summed in fp32.  The tier bounds gamma_K(u) |B||A| and
            # gamma_K(u) >= K u, so u = (that sum's bound) / K is a true declaration.
            # The sum per block is also why the aligned (lifted) magnitudes must be summed per
            # block: mma_restart_k (tests/test_fp8_mma_block_restart.py).
            inner = min(k, _scale_k(kind))
            u = (_gamma(inner, _FP8_MMA_UNIT_ROUNDOFF) + _gamma(k, 2.0**-24)) / k
            numerics["accumulator_unit_roundoff"] = max(u, 2.0**-24)
            numerics["mma_restart_k"] = inner
        numerics["alignment_floor"] = _FP8_CODE_ALIGNMENT
    else:
        # bf16 tensor-core dots (MX, decoded FP8) accumulate with truncation (measured on an
        # H100, tealite.backends.triton.gemm._TENSOR_CORE_U): u = 2^-23 over every sum, which
        # also covers the fallback's round-to-nearest fp32 sums of block partials.  Their
        # operands are normal bf16 numbers (or 0), so no alignment floor applies.
        numerics["accumulator_unit_roundoff"] = _TENSOR_CORE_U
    return numerics


def _dense_numerics(params) -> dict:
    """Dense qgemm's declaration: ``_numerics`` (shared with grouped qgemm), except where the
    MX accumulator variant runs on NVIDIA's FP8 MMA (its bound: _qgemm_mx_acc.py)."""
    numerics = _numerics(params)
    kind, k = params["kind"], params["k"]
    device = torch.device(params["device"])
    if k == 0 or device.type != "cuda" or not mx_acc_runs(kind, params["fmt_a"],
                                                          params["fmt_b"], device):
        return numerics
    blocks = math.ceil(k / _MX_SCALE_K)
    inner = _gamma(min(k, _MX_SCALE_K), _FP8_MMA_UNIT_ROUNDOFF)
    u = (blocks * inner + _gamma(blocks, 2.0**-24)) / k
    return dict(numerics, accumulator_unit_roundoff=u, alignment_floor=_FP8_CODE_ALIGNMENT)


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u) if n * u < 1 else math.inf


# The operand facts the kernel is written for, per scaled-GEMM kind: float32 scales per tensor
# or row ("fp8"), per 128-long K block of one row (B) or of 1 or 128 rows (A) ("block"), E8M0
# bytes per 32 along K ("mx").
_A_BLOCKS, _B_BLOCKS = ((1, _BLOCK_SCALE_K), (_BLOCK_SCALE_K, _BLOCK_SCALE_K)), \
    ((1, _BLOCK_SCALE_K),)


def _operand_reason(recipe, name: str, blocks) -> str | None:
    kind = qgemm_kind(recipe)
    if kind == "mx":
        return outside(recipe, f"triton MX qgemm ({name})", family=(Family.MX,),
                       block=(_MX_SCALE_K,))
    why = outside(recipe, f"triton qgemm ({name})", family=(Family.FP8,),
                  scale_granularity=(Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK))
    if why or kind == "fp8":
        return why
    return outside(recipe, f"triton block qgemm ({name})", block=blocks)


def _why_not(params) -> str | None:
    return _operand_reason(params["recipe_a"], "a", _A_BLOCKS) or \
        _operand_reason(params["recipe_b"], "b", _B_BLOCKS)


@BACKEND.implements(Op.QGEMM, dtypes=_FLOATS, devices=DEVICES, check=_why_not,
                    numerics=_dense_numerics)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    kind = qgemm_kind(recipe_a)
    mx_acc = mx_acc_runs(kind, recipe_a.fmt, recipe_b.fmt, a_codes.device)
    mx_staged = not mx_acc and mx_staged_path.staged_runs(kind, m, n, k, a_codes.device)
    out = launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m=m, n=n, k=k,
                 out_dtype=out_dtype, bias=bias, mx_acc=mx_acc, mx_staged=mx_staged)
    return out, {}
