"""bf16 / fp16 / fp32 GEMM with TE layouts and a fused fp32 epilogue (alpha, beta, bias, GELU).

``D = op_B(B) @ op_A(A)`` (see tealite.ops.gemm) is computed as the textbook ``X @ Y`` with
``X = op_B(B)`` (M, K) and ``Y = op_A(A)`` (K, N).  No operand is copied or transposed: the
host takes the free ``.t()`` view the layout asks for, and the kernel gets, per operand, which
of its two dims has unit stride (a constexpr, so the compiler knows the contiguous dim and
vectorizes loads even where it does not specialize strides equal to 1) and the other stride.
An operand with neither unit stride (a strided slice) is the only one made contiguous.

Numerics (declared to the ``gemm`` tolerance tier, tealite_verify/tiers/gemm.py):
- bf16 / fp16 on a GPU: tensor-core products (exact), fp32 accumulation across all of K.
- fp32: ``input_precision="ieee"`` (Triton's default on NVIDIA is TF32): fp32 FMA products and
  sums, no TF32 input rounding; correct but on the CUDA cores, so slow (not a fast path).
- Under the CPU interpreter bf16 operands are widened to fp32 (exact) before ``tl.dot``,
  because the triton 3.9 interpreter multiplies the raw bf16 bit patterns (garbage); products
  of two widened bf16 values are exact in fp32 (8 + 8 significant bits), so the model is the
  same.  They are read as int16 bits and widened with integer ops, which also avoids the
  interpreter's wrong bf16 loads of subnormals (see _io.py).
- Epilogue in fp32: ``pre = alpha * acc + beta * C + bias`` (the compiler may fuse these into
  FMAs: fewer roundings than the model's three), GELU with erf in fp32, then ONE rounding to
  out_dtype.  The accumulator is never rounded to the input dtype first, whatever the
  epilogue, so no ``accumulator_rounded_to`` is declared.

Reusable ``@triton.jit`` helpers (_tiles.py; imported by qgemm.py and grouped_gemm.py):
``grouped_pid`` (grouped program ordering for L2 reuse), ``gelu_erf_f32``,
``epilogue_store`` (the fp32 epilogue and its single-rounding stores), ``tile_pointers`` and
``tile_k_loop`` (a tile's K walk: the dense and the grouped kernels sum in the same order).

Performance: a classic tiled kernel with grouped ordering; K-loop loads unmasked when
K % BLOCK_K == 0 (EVEN_K), rows/columns past the edge wrapped instead of masked.  Block sizes
per vendor, dtype and size class in ``_CUDA`` / ``_HIP`` (fixed, deterministic choices: one
summation order per shape; the interpreter uses one small config).  On a GPU,
``TEALITE_TRITON_GEMM_AUTOTUNE=1`` lets triton.autotune pick among ``CANDIDATES`` instead;
benchmarks/gemm_configs.py times them.  Portable to ROCm: no TMA, no warp specialization.

Opt-in TMA variant (issue 4), ``GemmConfig(tma=True, ...)``: ``_gemm_tma_kernel`` loads the
operand tiles through host-side TMA descriptors over the operands' storage (out-of-bounds
reads give zeros, so no tail masks), optionally with a persistent grid, tl.range flattening /
warp specialization and a per-tile skewed K walk.  Same numerics (exact products, fp32
accumulation over all of K, same epilogue).  Used only where ``_tma_usable`` holds (NVIDIA
sm_90+, 16-bit operands, 16-byte aligned bases and row strides, K > 0), else the same blocks
run in ``_gemm_kernel``; the interpreter emulates the descriptors, so CI tests it.  No table
entry uses it until benchmarks/gemm_configs.py has measured it on an H100.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET, PLATFORM
from tealite.backends.triton._io import as_kernel_arg
# The tile helpers live in _tiles.py (shared with grouped_gemm.py); qgemm.py and the tests
# import them from here.
from tealite.backends.triton._tiles import (  # noqa: F401
    epilogue_store, gelu_erf_f32, grouped_pid, tile_k_loop, tile_pointers)
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
# The K-loop pointer step BLOCK_K * stride is a 32-bit product (BLOCK_K <= 256).
_MAX_STRIDE = 2**23
_AUTOTUNE = os.environ.get("TEALITE_TRITON_GEMM_AUTOTUNE") == "1" and not INTERPRET


# ---- the kernel -------------------------------------------------------------------------------

@triton.jit
def _gemm_kernel(x_ptr, y_ptr, d_ptr, pre_ptr, bias_ptr, M, N, K, stride_x, stride_y, stride_dm,
                 alpha, beta,
                 X_K_CONTIG: tl.constexpr, Y_K_CONTIG: tl.constexpr, BF16_BITS: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, I64: tl.constexpr,
                 HAS_BETA: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
                 OUT_BF16: tl.constexpr, BIAS_BF16: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """D (M, N) = X (M, K) @ Y (K, N) + epilogue.  X has unit stride along K when X_K_CONTIG
    (else along M), ``stride_x`` being its other stride; likewise Y along K or N."""
    pid_m, pid_n = grouped_pid(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge re-read valid ones (wrap) instead of masking the loads; the
    # store is masked.  Keeps the K loop's loads unmasked when EVEN_K.
    xm = rm % M
    yn = rn % N
    if I64:  # some tensor spans 2^31 elements or more
        xm = xm.to(tl.int64)
        yn = yn.to(tl.int64)
        rm = rm.to(tl.int64)
    # Each tile is loaded in its storage orientation (contiguous dim last) and transposed in
    # registers when it is not already (M, K) / (K, N): measured on an H100 with triton 3.6,
    # loading a K-contiguous Y directly as a (K, N) tile ran the TN layout at 75 % of the
    # N-contiguous NN layout's speed.
    x_ptrs, x_step, y_ptrs, y_step = tile_pointers(x_ptr, y_ptr, xm, yn, rk, stride_x, stride_y,
                                                   X_K_CONTIG, Y_K_CONTIG, BLOCK_K)
    acc = tile_k_loop(x_ptrs, y_ptrs, x_step, y_step, rk, K, X_K_CONTIG, Y_K_CONTIG, BF16_BITS,
                      DOT_PRECISION, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
    epilogue_store(acc, d_ptr, pre_ptr, bias_ptr, rm, rn, M, N, stride_dm, alpha, beta,
                   HAS_BETA, HAS_BIAS, GELU, OUT_BF16, BIAS_BF16)


# ---- TMA variant (opt-in per config, NVIDIA sm_90+ only) ------------------------------------

@triton.jit
def _tma_tile(x_desc, y_desc, d_ptr, pre_ptr, bias_ptr, tile, M, N, K, stride_dm, alpha, beta,
              X_K_CONTIG: tl.constexpr, Y_K_CONTIG: tl.constexpr, BF16_BITS: tl.constexpr,
              DOT_PRECISION: tl.constexpr, I64: tl.constexpr, SKEW_K: tl.constexpr,
              HAS_BETA: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
              OUT_BF16: tl.constexpr, BIAS_BF16: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) output tile from TMA loads.  TMA fills out-of-bounds elements
    with zeros, so M/N/K tails need no masks (zero products are exact)."""
    pid_m, pid_n = grouped_pid(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_blocks = tl.cdiv(K, BLOCK_K)
    # SKEW_K: tiles start their K walk at different blocks, so the programs in flight do not
    # all read the same K offset of power-of-two-strided rows at once (DRAM/L2 partition
    # camping, a hypothesis for the slow K-contiguous Y).  Still one fixed summation order
    # per tile and fp32 accumulation over all of K.
    rot = (pid_m + pid_n) % k_blocks if SKEW_K else 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, k_blocks):
        off_k = ((kb + rot) % k_blocks if SKEW_K else kb) * BLOCK_K
        if X_K_CONTIG:
            x = x_desc.load([off_m, off_k])
        else:
            x = tl.trans(x_desc.load([off_k, off_m]))
        if Y_K_CONTIG:
            y = tl.trans(y_desc.load([off_n, off_k]))
        else:
            y = y_desc.load([off_k, off_n])
        if BF16_BITS:  # interpreter only, as in _gemm_kernel
            x = (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
            y = (y.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        acc = tl.dot(x, y, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    if I64:
        rm = rm.to(tl.int64)
    epilogue_store(acc, d_ptr, pre_ptr, bias_ptr, rm, rn, M, N, stride_dm, alpha, beta,
                   HAS_BETA, HAS_BIAS, GELU, OUT_BF16, BIAS_BF16)


@triton.jit
def _gemm_tma_kernel(x_desc, y_desc, d_ptr, pre_ptr, bias_ptr, M, N, K, stride_dm, alpha, beta,
                     num_programs,
                     X_K_CONTIG: tl.constexpr, Y_K_CONTIG: tl.constexpr, BF16_BITS: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, I64: tl.constexpr, SKEW_K: tl.constexpr,
                     PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr,
                     HAS_BETA: tl.constexpr, HAS_BIAS: tl.constexpr, GELU: tl.constexpr,
                     OUT_BF16: tl.constexpr, BIAS_BF16: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """_gemm_kernel's math with operand tiles loaded by TMA (host-side descriptors over the
    operands' storage, contiguous dim last; tl.trans of a K-major tile stays a shared-memory
    view that wgmma reads directly).  PERSISTENT: ``num_programs`` programs walk the tiles in
    grouped order (FLATTEN / WARP_SPEC: tl.range's loop flattening / warp specialization)."""
    if PERSISTENT:
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=FLATTEN,
                             warp_specialize=WARP_SPEC):
            _tma_tile(x_desc, y_desc, d_ptr, pre_ptr, bias_ptr, tile, M, N, K, stride_dm, alpha,
                      beta, X_K_CONTIG, Y_K_CONTIG, BF16_BITS, DOT_PRECISION, I64, SKEW_K,
                      HAS_BETA, HAS_BIAS, GELU, OUT_BF16, BIAS_BF16,
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _tma_tile(x_desc, y_desc, d_ptr, pre_ptr, bias_ptr, tl.program_id(0), M, N, K,
                  stride_dm, alpha, beta, X_K_CONTIG, Y_K_CONTIG, BF16_BITS, DOT_PRECISION, I64,
                  SKEW_K, HAS_BETA, HAS_BIAS, GELU, OUT_BF16, BIAS_BF16,
                  BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


# ---- configs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # AMD-only launch options (Triton on CUDA rejects them): passed on ROCm only.
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None
    # NVIDIA sm_90+ only (_gemm_tma_kernel; elsewhere, or for operands TMA cannot describe,
    # the same blocks run in _gemm_kernel): TMA loads, a persistent grid of one program per
    # SM, tl.range loop flattening / warp specialization, K walk skewed per tile.
    tma: bool = False
    persistent: bool = False
    flatten: bool = False
    warp_specialize: bool = False
    skew_k: bool = False

    def launch_options(self) -> dict:
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if PLATFORM.get().rocm and not INTERPRET:
            if self.waves_per_eu is not None:
                opts["waves_per_eu"] = self.waves_per_eu
            if self.matrix_instr_nonkdim is not None:
                opts["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
        return opts

    def name(self) -> str:
        flags = "".join(f"_{f}" for f in ("tma", "persistent", "flatten", "warp_specialize",
                                           "skew_k") if getattr(self, f))
        return (f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}_s{self.num_stages}{flags}")

    def source(self) -> str:
        """The ``_C(...)`` expression for this config (to paste into ``_CUDA``)."""
        extra = "".join(f", {f}=True" for f in ("tma", "persistent", "flatten",
                                                 "warp_specialize", "skew_k") if getattr(self, f))
        return (f"_C({self.block_m}, {self.block_n}, {self.block_k}, {self.group_m}, "
                f"{self.num_warps}, {self.num_stages}{extra})")


_C = GemmConfig
# Interpreter: small asymmetric blocks so CI shapes (M, N <= 48) still span several programs,
# a partial GROUP_M group and M/N/K tails, at a few numpy ops per block.
_INTERPRETER = _C(16, 32, 32, 2, 4, 1)
# NVIDIA (chosen for the H100: 132 SMs, 228 KB smem/SM; 128x256x64 bf16 x 3 stages = 144 KB;
# wgmma, 182 registers, no spills for a plain epilogue; ptxas spills ~208 B/thread in the
# GELU + beta + bias epilogue only, once per tile).  fp32 runs on the CUDA cores (ieee dot:
# FMA chains): small tiles.
_CUDA = {
    # Issue 4 switch: paste the winning TMA_CANDIDATES line from benchmarks/gemm_configs.py
    # here (e.g. ``_C(128, 256, 64, 8, 8, 3, tma=True, persistent=True)``) once measured.
    # Measured on an H100 (benchmarks/gemm_configs.py, triton 3.6): TMA + persistent + flattened
    # K loop reaches 98.8 % of torch.matmul at 8192^3 TN (the pointer kernel 71 %) and >= 91 %
    # over {4096^3, 8192^3} x {TN, NN}; operands TMA cannot take fall back to the pointer kernel.
    ("16bit", "large"): _C(128, 256, 64, 8, 8, 3, tma=True, persistent=True, flatten=True),
    ("16bit", "medium"): _C(128, 128, 64, 8, 4, 4),
    ("16bit", "small"): _C(64, 64, 64, 8, 4, 4),
    ("fp32", "large"): _C(64, 64, 32, 8, 4, 3),
    ("fp32", "medium"): _C(64, 64, 32, 8, 4, 3),
    ("fp32", "small"): _C(32, 32, 32, 8, 4, 3),
}
# ROCm (MI300/MI350; compiled here for gfx942/gfx950, not timed): 64 KB LDS on gfx942, so 2
# stages (the AMD stream pipeliner keeps one tile in registers); 16x16 MFMA; num_warps 4/8 =
# 4/8 wavefronts of 64.  256x256 (AITER's plain-GEMM choice) spills ~270 VGPRs once the GELU +
# beta epilogue is fused; 256x128 spills none.
_HIP = {
    ("16bit", "large"): _C(256, 128, 64, 8, 8, 2, waves_per_eu=0, matrix_instr_nonkdim=16),
    ("16bit", "medium"): _C(128, 128, 64, 8, 4, 2, waves_per_eu=0, matrix_instr_nonkdim=16),
    ("16bit", "small"): _C(64, 64, 64, 8, 4, 2, waves_per_eu=0, matrix_instr_nonkdim=16),
    ("fp32", "large"): _C(64, 64, 32, 8, 4, 2),
    ("fp32", "medium"): _C(64, 64, 32, 8, 4, 2),
    ("fp32", "small"): _C(32, 32, 32, 8, 4, 2),
}
# Tried in order when a config does not fit the device (OutOfResources: smaller GPUs).
_FALLBACKS = (_C(128, 128, 64, 8, 4, 3), _C(64, 64, 32, 8, 4, 2), _C(32, 32, 32, 4, 4, 1))
# Candidates for TEALITE_TRITON_GEMM_AUTOTUNE=1 and benchmarks/gemm_configs.py.
CANDIDATES = (
    _C(128, 256, 64, 8, 8, 3), _C(128, 256, 64, 8, 8, 4), _C(256, 128, 64, 8, 8, 3),
    _C(128, 128, 64, 8, 4, 4), _C(128, 128, 64, 8, 8, 4), _C(128, 128, 32, 8, 4, 4),
    _C(128, 64, 64, 8, 4, 4), _C(64, 128, 64, 8, 4, 4), _C(64, 64, 64, 8, 4, 4),
    _C(128, 256, 64, 16, 8, 3),
    # 256-byte K rows per tile row for the K-contiguous (TN) operands.
    _C(128, 256, 128, 8, 8, 2), _C(256, 128, 128, 8, 8, 2), _C(128, 128, 128, 8, 8, 3),
    _C(128, 128, 128, 8, 4, 3),
)
# TMA variants (issue 4: the TN layout ran at 70-80 % of torch.matmul with _gemm_kernel while
# its TTGIR/PTX -- wgmma straight from 128B-swizzled shared memory, 16-byte cp.async -- is the
# NN kernel's but for wgmma's B-transpose flag; see benchmarks/gemm_configs.py).  Not used by
# the autotuner; benchmarks/gemm_configs.py times them in TN and NN.
TMA_CANDIDATES = (
    _C(128, 256, 64, 8, 8, 3, tma=True), _C(128, 256, 64, 8, 8, 4, tma=True),
    _C(256, 128, 64, 8, 8, 3, tma=True),
    _C(128, 256, 64, 8, 8, 3, tma=True, persistent=True),
    _C(128, 256, 64, 8, 8, 4, tma=True, persistent=True),
    _C(256, 128, 64, 8, 8, 3, tma=True, persistent=True),
    _C(128, 256, 64, 8, 8, 3, tma=True, persistent=True, flatten=True),
    _C(128, 256, 64, 8, 8, 3, tma=True, persistent=True, warp_specialize=True),
    _C(128, 128, 64, 8, 8, 4, tma=True, persistent=True, warp_specialize=True),
    _C(128, 256, 64, 8, 8, 3, tma=True, skew_k=True),
    _C(128, 256, 64, 8, 8, 3, tma=True, persistent=True, skew_k=True),
)
_working: dict[tuple, GemmConfig] = {}  # size key -> config that compiled on this device


def _size_class(m: int, n: int, device: torch.device) -> str:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if triton.cdiv(m, 128) * triton.cdiv(n, 256) >= 2 * sms:
        return "large"
    if triton.cdiv(m, 128) * triton.cdiv(n, 128) >= sms:
        return "medium"
    return "small"


def pick_config(m: int, n: int, dtype: torch.dtype, device: torch.device) -> GemmConfig:
    """The fixed config for this problem (the interpreter always uses one small config)."""
    if INTERPRET:
        return _INTERPRETER
    table = _HIP if PLATFORM.get().rocm else _CUDA
    key = ("fp32" if dtype == torch.float32 else "16bit", _size_class(m, n, device))
    return _working.get(key, table[key])


# ---- host side --------------------------------------------------------------------------------

def _k_major(view: torch.Tensor, k_dim: int) -> tuple[torch.Tensor, bool, int]:
    """(tensor, unit stride along K?, the other stride) for an operand view whose dim
    ``k_dim`` is K.  Only a view with no unit stride (or a huge one, see _MAX_STRIDE) is
    copied, never to transpose it."""
    other = 1 - k_dim
    if view.stride(k_dim) == 1 and view.stride(other) < _MAX_STRIDE:
        return view, True, view.stride(other)
    if view.stride(other) == 1 and view.stride(k_dim) < _MAX_STRIDE:
        return view, False, view.stride(k_dim)
    view = view.contiguous()
    return view, k_dim == 1, view.stride(0)


def x_operand(b: torch.Tensor, layout: str):
    """X = op_B(B), (M, K): B itself under ``?N``, the view B.t() under ``?T``."""
    return _k_major(b if layout[1] == "N" else b.t(), k_dim=1)


def y_operand(a: torch.Tensor, layout: str):
    """Y = op_A(A), (K, N): the view A.t() under ``T?``, A itself under ``N?``."""
    return _k_major(a.t() if layout[0] == "T" else a, k_dim=0)


def _span(t: torch.Tensor) -> int:
    """One past the largest element offset a kernel can address in ``t``."""
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def launch(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta, config=None):
    """Run the kernel; ``config`` overrides the fixed choice (benchmarks)."""
    x, x_k_contig, stride_x = x_operand(b, layout)
    y, y_k_contig, stride_y = y_operand(a, layout)
    m, k = x.shape
    n = y.shape[1]
    d = out if out is not None and out.stride(1) == 1 else torch.empty(
        (m, n), dtype=out_dtype, device=a.device)
    if out is not None and d is not out and beta != 0.0:  # out with non-unit column stride
        d.copy_(out)
    pre = torch.empty((m, n), dtype=out_dtype, device=a.device) if gelu else None
    if m and n:
        bias_c = bias.contiguous() if bias is not None else None
        big = max(_span(x), _span(y), _span(d)) + 256 > _INT32_MAX
        _run(x, y, d, pre, bias_c, m, n, k, x_k_contig, y_k_contig, stride_x, stride_y,
             alpha, beta, gelu, big, a.dtype, config)
    if out is not None and d is not out:
        out.copy_(d)
        d = out
    return d, pre


def _run(x, y, d, pre, bias, m, n, k, x_k_contig, y_k_contig, stride_x, stride_y, alpha, beta,
         gelu, big, in_dtype, config):
    bf16_bits = INTERPRET and in_dtype == torch.bfloat16
    fp32_dot = in_dtype == torch.float32 or bf16_bits
    args = (as_kernel_arg(x) if bf16_bits else x, as_kernel_arg(y) if bf16_bits else y,
            as_kernel_arg(d), as_kernel_arg(pre) if pre is not None else d,
            as_kernel_arg(bias) if bias is not None else d,
            m, n, k, stride_x, stride_y, d.stride(0), alpha, beta)
    flags = dict(X_K_CONTIG=x_k_contig, Y_K_CONTIG=y_k_contig, BF16_BITS=bf16_bits,
                 DOT_PRECISION="ieee" if fp32_dot else None, I64=big,
                 HAS_BETA=beta != 0.0, HAS_BIAS=bias is not None, GELU=gelu,
                 OUT_BF16=d.dtype == torch.bfloat16,
                 BIAS_BF16=bias is not None and bias.dtype == torch.bfloat16)
    if _AUTOTUNE and config is None:
        def grid(meta):
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        _autotuned()[grid](*args, **flags)
        return
    chosen = config or pick_config(m, n, in_dtype, x.device)
    tries = (chosen,) if config is not None or INTERPRET else (chosen, *_FALLBACKS)
    for i, cfg in enumerate(tries):
        try:
            _launch_one(cfg, args, flags, m, n, k)
            if i:  # remember what fits this device for this size class
                _working[("fp32" if in_dtype == torch.float32 else "16bit",
                          _size_class(m, n, x.device))] = cfg
            return
        except OutOfResources:
            if i == len(tries) - 1:
                raise


def _launch_one(cfg: GemmConfig, args, flags, m, n, k):
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    if cfg.tma and _tma_usable(args, flags, k):
        _launch_tma(cfg, args, flags, grid[0])
        return
    _gemm_kernel[grid](*args, **flags, EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m,
                       BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                       **cfg.launch_options())


def _tma_usable(args, flags, k) -> bool:
    """TMA needs an sm_90+ NVIDIA GPU (or the interpreter, which emulates it: CI tests the
    kernel there), 16-bit operands (fp32 keeps the ieee CUDA-core path), K > 0, 16-byte
    aligned bases and row strides."""
    if PLATFORM.get().rocm or k == 0:
        return False
    if flags["DOT_PRECISION"] == "ieee" and not flags["BF16_BITS"]:  # fp32 operands
        return False
    if not INTERPRET and torch.cuda.get_device_capability(args[0].device)[0] < 9:
        return False
    (x, y), strides = args[:2], args[8:10]
    return all(t.data_ptr() % 16 == 0 and (s * t.element_size()) % 16 == 0
               for t, s in zip((x, y), strides))


def _descriptor(storage: torch.Tensor, row_stride: int, block: list[int]):
    """A TMA descriptor over an operand's storage (2-D, unit stride along dim 1)."""
    from triton.tools.tensor_descriptor import TensorDescriptor  # triton >= 3.4

    return TensorDescriptor(storage, list(storage.shape), [row_stride, 1], block)


def _launch_tma(cfg: GemmConfig, args, flags, tiles):
    # args: x, y, d, pre, bias, M, N, K, stride_x, stride_y, stride_dm, alpha, beta
    x, y, stride_x, stride_y = args[0], args[1], args[8], args[9]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    # X (M, K) is stored (M, K) when K-contiguous, else (K, M); Y (K, N) as (N, K) or (K, N).
    x_desc = (_descriptor(x, stride_x, [bm, bk]) if flags["X_K_CONTIG"]
              else _descriptor(x.t(), stride_x, [bk, bm]))
    y_desc = (_descriptor(y.t(), stride_y, [bn, bk]) if flags["Y_K_CONTIG"]
              else _descriptor(y, stride_y, [bk, bn]))
    programs = tiles
    if cfg.persistent:
        sms = 4 if INTERPRET else torch.cuda.get_device_properties(
            x.device).multi_processor_count
        programs = min(tiles, sms)
    _gemm_tma_kernel[(programs,)](
        x_desc, y_desc, *args[2:8], *args[10:], programs, **flags, SKEW_K=cfg.skew_k,
        PERSISTENT=cfg.persistent, FLATTEN=cfg.flatten, WARP_SPEC=cfg.warp_specialize,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, **cfg.launch_options())


_autotuned_kernel = None


def _autotuned():
    """triton.autotune over CANDIDATES (GPU only, opt-in): built on first use, never in CI."""
    global _autotuned_kernel
    if _autotuned_kernel is None:
        configs = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n,
                                  "BLOCK_K": c.block_k, "GROUP_M": c.group_m},
                                 num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in CANDIDATES]
        even_k = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
        # restore_value: beta != 0 reads D, and every benchmark run overwrites it.
        _autotuned_kernel = triton.autotune(
            configs, key=["M", "N", "K", "X_K_CONTIG", "Y_K_CONTIG", "GELU", "HAS_BETA"],
            restore_value=["d_ptr"])(even_k(_gemm_kernel))
    return _autotuned_kernel


# ---- registration -----------------------------------------------------------------------------

def _why_not(params) -> str | None:
    # Contiguous operands have strides M, N or K: keep them below _MAX_STRIDE.
    if max(params["m"], params["n"], params["k"]) >= _MAX_STRIDE:
        return "a dimension of 2^23 or more (32-bit K-step offsets)"
    return None


# NVIDIA tensor cores add aligned products with truncation, not round-to-nearest (Fasi, Higham,
# Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021): each addition
# may lose up to one fp32 ulp, so the accumulation's unit roundoff is 2^-23, not 2^-24
# (measured on an H100 by ci/device_probes.py: 1 + 2^-24 + 2^-24 - 0.75 * 2^-24 gives 1.0).
# Subnormal fp16 operands are aligned at the smallest normal exponent (same probe), which the
# ``alignment_floor`` key models.
_TENSOR_CORE_U = 2.0 ** -23


def _numerics(params) -> dict:
    # Tensor-core (or ieee fp32) products, fp32 accumulation over all of K (no split-K), fp32
    # epilogue, one rounding to out_dtype.
    num = {"compute_dtype": torch.float32}
    if params["device"] == "cuda" and params["dtype"] != torch.float32 and not INTERPRET:
        num["accumulator_unit_roundoff"] = _TENSOR_CORE_U
        num["alignment_floor"] = params["dtype"]
    return num


@BACKEND.implements(Op.GEMM, dtypes=_FLOATS, devices=DEVICES, layouts=("TN", "NN", "NT", "TT"),
                    check=_why_not, numerics=_numerics)
def gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta):
    return launch(a, b, layout=layout, out_dtype=out_dtype, bias=bias, gelu=gelu, out=out,
                  alpha=alpha, beta=beta)
