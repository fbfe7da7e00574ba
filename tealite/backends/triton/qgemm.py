"""Quantized GEMM (FP8 per-tensor / per-row, FP8 block-scaled, MXFP8 / MXFP4) with the scales
applied inside the kernel.

Operands arrive in their K-last orientation (see tealite.ops.qgemm): A codes (N, K), B codes
(M, K), ``D = B @ A.T`` (M, N).  The kernel is the textbook tiled ``X @ Y`` with X = a (BM, BK)
tile of B and Y = a (BK, BN) tile of A read through its strides (K has unit stride: the TN
fast path of every FP8 tensor core).  Scales:

* per-tensor / per-row (``KIND_FP8``): ``acc`` sums code products over all of K; the epilogue
  multiplies by ``s_B[i]`` then ``s_A[j]`` (a per-tensor scale is a row scale of stride 0).
* block (``KIND_BLOCK``, 128-long K blocks) and MX (``KIND_MX``, 32-long K blocks, E8M0
  scales 2^(byte-127), byte 0xFF = NaN): each K step is inside one scale block (BLOCK_K
  divides the scale block), its partial product is taken from a fresh ``tl.dot`` and added
  as ``acc += (part * s_B[i]) * s_A[j]`` in fp32.  A's 128x128 weight blocks index their scale
  row by ``j // 128``.  Multiplying by the two scales one after the other (not by their
  product) keeps an intermediate inside fp32's range unless the two scales sit at opposite
  ends of it (then the true result is out of range too, or within the underflow term).

Dot operands (one constexpr choice, ``DOT_FP8``, same kernel source everywhere):

* native FP8 where the target has it (``_native_fp8_formats``): the codes are passed as
  their torch FP8 dtype, so the loaded tile *is* the Triton fp8 type (tl.float8e4nv /
  tl.float8e5 on NVIDIA sm_89+ and gfx950, tl.float8e4b8 / tl.float8e5b16 on gfx942), with no
  op between the pipelined load and the tensor-core dot.
* otherwise codes travel as uint8 and ``_decode_f16`` turns them into fp16 with integer ops
  (exact for all four FP8 formats and E2M1, NaN/Inf codes included); fp16 dot, fp32 acc.
  Always so in Triton's CPU interpreter, whose fp8 handling is not trusted (NUMERICS.md) and
  whose bf16 ``tl.dot`` is garbage; its fp16 dot is exact products + fp32 sums.
* E2M1 (MXFP4) is always decoded: two codes per byte, low nibble = even element (TE, AITER).

Numerics (declared to the ``gemm`` tier, tealite_verify/tolerance.py; see ``_numerics``):
products of codes are exact; sums are fp32, except the WGMMA accumulator of native FP8 dots on
NVIDIA (~14 bits between promotions): all of K for per-tensor / per-row (Triton's sm_90
default never promotes, as scaled_mm's fast path), one scale block for block / MX (each block
is a fresh dot).  Per-tensor / per-row scales and the bias cost three fp32 roundings in the
epilogue (inside the tier's epilogue term); block / MX scale each partial with two.  One
rounding to out_dtype (bf16 by integer RNE, _io.py).

Performance: a classic tiled kernel with grouped ordering, no TMA or warp specialization
(portable to ROCm); configs in ``_CUDA`` / ``_HIP``; benchmarks/qgemm_configs.py times the
candidates against torch._scaled_mm.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from tealite import recipes as R
from tealite._checks import require
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.backends.triton.gemm import grouped_pid
from tealite.formats import get_format

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1
KIND_FP8, KIND_BLOCK, KIND_MX = 0, 1, 2
_KINDS = {"fp8": KIND_FP8, "block": KIND_BLOCK, "mx": KIND_MX}
# Scale-block lengths along K: Float8BlockScaling (TE, DeepSeek-V3) and the OCP MX spec.
_BLOCK_SCALE_K = 128
_MX_SCALE_K = 32
_E8M0_BIAS = 127  # OCP MX: scale = 2^(byte - 127)
_E2M1_EVEN_IN_LOW_NIBBLE = True  # TE and AITER pack element 2i in bits 0-3 of byte i
# Code specials, per format family (see _decode_f16).
_NO_SPECIALS, _OCP_E4M3, _IEEE, _FNUZ = 0, 1, 2, 3
# Hopper FP8 WGMMA keeps ~14 mantissa bits in its accumulator between promotions (DeepSeek-V3
# report; the scaled_mm backend declares the same).
_FP8_MMA_UNIT_ROUNDOFF = 2.0**-14


# ---- in-kernel codecs -------------------------------------------------------------------------

@triton.jit
def _decode_f16(c, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr):
    """fp16 values of FP8 / E2M1 codes ``c`` (int32), built with integer ops: exact, as every
    value of these formats is an fp16 value (NaN / Inf codes included)."""
    sign = (c >> (EBITS + MBITS)) & 1
    e = (c >> MBITS) & ((1 << EBITS) - 1)
    m = c & ((1 << MBITS) - 1)
    # fp32 bits of 2^(max(e,1) - BIAS) * (1 + m / 2^MBITS); a subnormal (e == 0) is that minus
    # the implicit 2^(1 - BIAS), an exact subtraction.
    bits = ((tl.maximum(e, 1) + (127 - BIAS)) << 23) | (m << (23 - MBITS))
    v = bits.to(tl.float32, bitcast=True)
    v = tl.where(e == 0, v - MIN_NORMAL, v)
    if SPECIALS == 1:  # OCP E4M3: S.1111.111 is NaN, no infinities
        v = tl.where((c & 0x7F) == 0x7F, float("nan"), v)
    if SPECIALS == 2:  # OCP E5M2: IEEE-like, all-ones exponent is Inf (m == 0) or NaN
        special = tl.where(m == 0, float("inf"), float("nan"))
        v = tl.where(e == (1 << EBITS) - 1, special, v)
    if SPECIALS == 3:  # FNUZ: the "negative zero" code 0x80 is the single NaN
        v = tl.where(c == 0x80, float("nan"), v)
    # The sign goes in as a bit: triton 3.6 lowers ``-v`` to ``0 - v`` on CUDA, which turns the
    # -0 codes into +0 (measured on an H100).
    v = (v.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
    return v.to(tl.float16)


@triton.jit
def _load_u8(ptrs, mask, EVEN_K: tl.constexpr):
    """int32 codes of a uint8 tile (0 where masked: a zero code adds nothing to a dot)."""
    if EVEN_K:
        c = tl.load(ptrs)
    else:
        c = tl.load(ptrs, mask=mask, other=0)
    return c.to(tl.int32)


@triton.jit
def _load_e2m1_f16(ptrs, rkh, k_left, EVEN_K: tl.constexpr, EVEN_LOW: tl.constexpr):
    """fp16 (R, 2H) tile of a packed E2M1 operand from a (R, H) byte tile (``rkh`` the byte
    index along K, broadcast to (1, H)): element 2p is one nibble of byte p, 2p + 1 the other.
    Bytes load contiguously; the nibbles are decoded apart and interleaved in registers."""
    if EVEN_K:
        c = tl.load(ptrs).to(tl.int32)
        lo = c & 0xF
        hi = c >> 4
    else:
        c = tl.load(ptrs, mask=2 * rkh < k_left, other=0).to(tl.int32)
        lo = c & 0xF
        hi = tl.where(2 * rkh + 1 < k_left, c >> 4, 0)  # not the padding nibble of odd K
    if not EVEN_LOW:
        lo, hi = hi, lo
    even = _decode_f16(lo, 2, 1, 1, 0, 1.0)
    odd = _decode_f16(hi, 2, 1, 1, 0, 1.0)
    return tl.reshape(tl.join(even, odd), (even.shape[0], 2 * even.shape[1]))


@triton.jit
def _e8m0_f32(byte, E8M0_BIAS: tl.constexpr):
    """fp32 2^(byte - E8M0_BIAS) from integer bits (byte 0 is the subnormal 2^-127); 0xFF NaN."""
    f = byte.to(tl.int32) + (127 - E8M0_BIAS)  # fp32 exponent field
    sub = 0x400000 >> tl.minimum(tl.maximum(-f, 0), 31)
    v = tl.where(f >= 1, f << 23, sub).to(tl.float32, bitcast=True)
    return tl.where(byte.to(tl.int32) == 255, float("nan"), v)


@triton.jit
def _load_scales(ptr, rows, sk, stride_row, stride_k, KIND: tl.constexpr,
                 E8M0_BIAS: tl.constexpr):
    """fp32 scales of ``rows`` in scale block ``sk`` (fp32 block scales or E8M0 bytes)."""
    raw = tl.load(ptr + rows * stride_row + sk * stride_k)
    if KIND == 2:
        s = _e8m0_f32(raw, E8M0_BIAS)
    else:
        s = raw
    return s


# ---- the kernel -------------------------------------------------------------------------------

@triton.jit
def _qgemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, M, N, K,
                  stride_a, stride_b, stride_sa_row, stride_sa_k, stride_sb_row, stride_sb_k,
                  stride_om,
                  KIND: tl.constexpr, SCALE_K: tl.constexpr, SA_ROWS: tl.constexpr,
                  E8M0_BIAS: tl.constexpr, EVEN_LOW: tl.constexpr, DOT_FP8: tl.constexpr,
                  A_EBITS: tl.constexpr, A_MBITS: tl.constexpr, A_BIAS: tl.constexpr,
                  A_SPECIALS: tl.constexpr, A_MIN_NORMAL: tl.constexpr, A_PACKED: tl.constexpr,
                  B_EBITS: tl.constexpr, B_MBITS: tl.constexpr, B_BIAS: tl.constexpr,
                  B_SPECIALS: tl.constexpr, B_MIN_NORMAL: tl.constexpr, B_PACKED: tl.constexpr,
                  HAS_BIAS: tl.constexpr, BIAS_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
                  I64: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out (M, N) = B (M, K) @ A (N, K)^T with scales; K has unit stride in A and B (a packed
    E2M1 operand holds element k in byte k // 2)."""
    pid_m, pid_n = grouped_pid(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows / columns past the edge re-read valid ones (wrap) instead of masking the loads; the
    # store is masked.
    bm = rm % M
    an = rn % N
    if I64:
        bm = bm.to(tl.int64)
        an = an.to(tl.int64)
        rm = rm.to(tl.int64)
    rkh = tl.arange(0, BLOCK_K // 2)  # byte index along K of a packed E2M1 tile
    if B_PACKED:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rkh[None, :]
    else:
        b_ptrs = b_ptr + bm[:, None] * stride_b + rk[None, :]
    if A_PACKED:  # loaded (BN, BK/2) K-last, unpacked, then transposed for the dot
        a_ptrs = a_ptr + an[:, None] * stride_a + rkh[None, :]
    else:
        a_ptrs = a_ptr + rk[:, None] + an[None, :] * stride_a
    b_step = BLOCK_K // 2 if B_PACKED else BLOCK_K
    a_step = BLOCK_K // 2 if A_PACKED else BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        if DOT_FP8:  # fp8-typed pointers: the tiles are the tensor cores' fp8 operands
            if EVEN_K:
                b = tl.load(b_ptrs)
                a = tl.load(a_ptrs)
            else:
                b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
                a = tl.load(a_ptrs, mask=rk[:, None] < k_left, other=0.0)
        else:
            # uint8 codes -> exact fp16 (no native dot for this format pair here, or the
            # interpreter: see the module docstring).
            if B_PACKED:
                b = _load_e2m1_f16(b_ptrs, rkh[None, :], k_left, EVEN_K, EVEN_LOW)
            else:
                b = _decode_f16(_load_u8(b_ptrs, rk[None, :] < k_left, EVEN_K), B_EBITS,
                                B_MBITS, B_BIAS, B_SPECIALS, B_MIN_NORMAL)
            if A_PACKED:
                a = tl.trans(_load_e2m1_f16(a_ptrs, rkh[None, :], k_left, EVEN_K, EVEN_LOW))
            else:
                a = _decode_f16(_load_u8(a_ptrs, rk[:, None] < k_left, EVEN_K), A_EBITS,
                                A_MBITS, A_BIAS, A_SPECIALS, A_MIN_NORMAL)
        if KIND == 0:
            acc = tl.dot(b, a, acc, out_dtype=tl.float32)
        else:
            # A fresh dot per scale block: its partial sum is scaled in fp32 before joining acc.
            part = tl.dot(b, a, out_dtype=tl.float32)
            sk = (kb * BLOCK_K) // SCALE_K
            s_b = _load_scales(sb_ptr, bm, sk, stride_sb_row, stride_sb_k, KIND, E8M0_BIAS)
            s_a = _load_scales(sa_ptr, an // SA_ROWS, sk, stride_sa_row, stride_sa_k, KIND,
                               E8M0_BIAS)
            acc += (part * s_b[:, None]) * s_a[None, :]
        b_ptrs += b_step
        a_ptrs += a_step
    if KIND == 0:  # per-tensor scales are row scales of stride 0
        acc = (acc * tl.load(sb_ptr + bm * stride_sb_row)[:, None]) * \
            tl.load(sa_ptr + an * stride_sa_row)[None, :]
    mask_n = rn < N
    if HAS_BIAS:
        acc += load_f32(bias_ptr, rn, mask_n, BIAS_BF16)[None, :]
    store_f32(out_ptr, rm[:, None] * stride_om + rn[None, :], acc,
              (rm[:, None] < M) & mask_n[None, :], OUT_BF16)


# ---- formats and targets ----------------------------------------------------------------------

def _decode_constants(fmt_name: str) -> dict:
    """Bit layout of a code format for ``_decode_f16`` (kernel constexprs, without prefix)."""
    f = get_format(fmt_name)
    ebits = f.bits - 1 - f.mbits
    bias = {"e4m3fnuz": 8, "e5m2fnuz": 16}.get(f.name, (1 << (ebits - 1)) - 1)
    specials = _FNUZ if f.fnuz else {"e4m3": _OCP_E4M3, "e5m2": _IEEE}.get(f.name, _NO_SPECIALS)
    return dict(EBITS=ebits, MBITS=f.mbits, BIAS=bias, SPECIALS=specials,
                MIN_NORMAL=float(2.0 ** (1 - bias)), PACKED=f.packed)


def _native_fp8_formats(device) -> frozenset:
    """FP8 formats this device's tensor cores multiply natively (through Triton's fp8 types)."""
    if INTERPRET or torch.device(device).type != "cuda":
        return frozenset()
    if torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        if arch.startswith("gfx942"):
            return frozenset({"e4m3fnuz", "e5m2fnuz"})
        if arch.startswith("gfx950"):
            return frozenset({"e4m3", "e5m2"})
        return frozenset()
    if torch.cuda.get_device_capability(device) >= (8, 9):
        return frozenset({"e4m3", "e5m2"})
    return frozenset()


def dot_fp8(fmt_a: str, fmt_b: str, device) -> bool:
    """Whether the kernel multiplies these formats natively (else decodes both to fp16)."""
    native = _native_fp8_formats(device)
    return fmt_a in native and fmt_b in native


# ---- configs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class QGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # AMD-only launch options (Triton on CUDA rejects them): passed on ROCm only.
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None

    def launch_options(self) -> dict:
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if torch.version.hip is not None and not INTERPRET:
            if self.waves_per_eu is not None:
                opts["waves_per_eu"] = self.waves_per_eu
            if self.matrix_instr_nonkdim is not None:
                opts["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
        return opts

    def name(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}"
                f"_w{self.num_warps}_s{self.num_stages}")


_C = QGemmConfig
# Interpreter: small asymmetric blocks so CI shapes (M, N <= 48, K <= 256) span several
# programs, M/N/K tails and, for block scaling, several K steps per 128-long scale block.
_INTERPRETER = _C(16, 32, 32, 2, 4, 1)
# NVIDIA (H100: 132 SMs, 228 KB smem/SM, 255 registers/thread).  Native FP8 per-tensor /
# per-row: 128x256x128 x 3 stages = 144 KB smem, 224 registers (the shape of Triton's FP8
# matmul tutorial config).  Block / MX keep a second (BM, BN) fp32 tile (the partial
# product) live, which spills at 128x256 (cross-compiled for sm_90 with triton 3.9: 255
# registers + 160-208 B stack), so 128x128.  MX steps 32 along K (one E8M0 scale per step),
# hence deeper pipelines.  Decoded (fp16) operands: half the K depth of FP8.
_CUDA = {
    ("fp8", True, "large"): _C(128, 256, 128, 8, 8, 3),
    ("fp8", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "large"): _C(128, 128, 128, 8, 8, 4),
    ("block", True, "small"): _C(128, 128, 128, 8, 8, 4),
    ("mx", True, "large"): _C(128, 128, 32, 8, 8, 6),
    ("mx", True, "small"): _C(128, 128, 32, 8, 8, 6),
    ("fp8", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("fp8", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "large"): _C(128, 128, 64, 8, 8, 3),
    ("block", False, "small"): _C(128, 128, 64, 8, 8, 3),
    ("mx", False, "large"): _C(128, 128, 32, 8, 8, 4),
    ("mx", False, "small"): _C(128, 128, 32, 8, 8, 4),
}
# ROCm (MI300 / MI350, unmeasured): 64 KB LDS -> 2 stages (the stream pipeliner keeps one tile
# in registers), 16x16 MFMA, wavefronts of 64.  Cross-compiled with triton 3.9: 256x256x64
# native FP8 spills 32 VGPRs on gfx942, 256x128x128 none (228 VGPRs).
_HIP_OPTS = dict(waves_per_eu=0, matrix_instr_nonkdim=16)
_HIP = {
    ("fp8", True): _C(256, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("block", True): _C(128, 128, 128, 8, 8, 2, **_HIP_OPTS),
    ("mx", True): _C(128, 128, 32, 8, 8, 2, **_HIP_OPTS),
    ("fp8", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("block", False): _C(128, 128, 64, 8, 8, 2, **_HIP_OPTS),
    ("mx", False): _C(128, 128, 32, 8, 8, 2, **_HIP_OPTS),
}
# Tried in order when a config does not fit the device (OutOfResources).
_FALLBACKS = (_C(128, 128, 32, 8, 4, 3), _C(64, 64, 32, 8, 4, 2), _C(32, 32, 32, 4, 4, 1))
_working: dict[tuple, QGemmConfig] = {}  # table key -> a config that compiled on this device


def _scale_k(kind: str) -> int | None:
    return {"block": _BLOCK_SCALE_K, "mx": _MX_SCALE_K}.get(kind)


def _table_key(kind: str, native: bool, m: int, n: int, device) -> tuple:
    if torch.version.hip is not None:
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
    if isinstance(recipe, R.MXBlockScaling):
        want, per = (rows, triton.cdiv(k, _MX_SCALE_K)), 1
        s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    elif isinstance(recipe, R.Float8BlockScaling):
        per = recipe.block[0]
        want = (triton.cdiv(rows, per), triton.cdiv(k, _BLOCK_SCALE_K))
        s = scales
    else:
        row = isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row"
        require(scales.numel() == (rows if row else 1),
                 f"{name} scales: {'one per row' if row else 'one per tensor'} expected "
                 f"({rows if row else 1}), got shape {tuple(scales.shape)}")
        s = scales.reshape(-1)
        return s, (s.stride(0) if row else 0), 0, 1
    require(tuple(s.shape) == want,
             f"{name} scales: shape {want} expected for {R.describe(recipe)}, got {tuple(s.shape)}")
    return s, s.stride(0), s.stride(1), per


def _codes_operand(codes: torch.Tensor, fmt: str, rows: int, k: int, native: bool, name: str):
    f = get_format(fmt)
    want = (rows, triton.cdiv(k, 2) if f.packed else k)
    require(tuple(codes.shape) == want,
             f"{name} codes: shape {want} expected for {fmt}, got {tuple(codes.shape)}")
    if codes.stride(1) != 1 and codes.numel():  # the kernel assumes unit stride along K
        codes = codes.contiguous()
    return codes.view(f.torch_dtype) if native else codes.view(torch.uint8)


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
           bias, config: QGemmConfig | None = None) -> torch.Tensor:
    """Run the kernel; ``config`` overrides the fixed choice (benchmarks)."""
    kind = "mx" if isinstance(recipe_a, R.MXBlockScaling) else \
        "block" if isinstance(recipe_a, R.Float8BlockScaling) else "fp8"
    device = a_codes.device
    native = dot_fp8(recipe_a.fmt, recipe_b.fmt, device)
    a = _codes_operand(a_codes, recipe_a.fmt, n, k, native, "a")
    b = _codes_operand(b_codes, recipe_b.fmt, m, k, native, "b")
    sa, sa_row, sa_k, sa_rows = _scale_operand(recipe_a, a_scales, n, k, "a")
    sb, sb_row, sb_k, sb_rows = _scale_operand(recipe_b, b_scales, m, k, "b")
    require(sb_rows == 1, "b (activations) must use 1x128 block scaling")
    out = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return out
    bias_arg = as_kernel_arg(bias.contiguous()) if bias is not None else out
    args = (a, b, sa, sb, bias_arg, as_kernel_arg(out), m, n, k, a.stride(0), b.stride(0),
            sa_row, sa_k, sb_row, sb_k, out.stride(0))
    flags = dict(KIND=_KINDS[kind], SCALE_K=_scale_k(kind) or 1, SA_ROWS=sa_rows,
                 E8M0_BIAS=_E8M0_BIAS, EVEN_LOW=_E2M1_EVEN_IN_LOW_NIBBLE, DOT_FP8=native,
                 HAS_BIAS=bias is not None,
                 BIAS_BF16=bias is not None and bias.dtype == torch.bfloat16,
                 OUT_BF16=out_dtype == torch.bfloat16,
                 I64=max(_span(a), _span(b), _span(out)) + 256 > _INT32_MAX,
                 **{f"A_{c}": v for c, v in _decode_constants(recipe_a.fmt).items()},
                 **{f"B_{c}": v for c, v in _decode_constants(recipe_b.fmt).items()})
    chosen = config or pick_config(kind, native, m, n, device)
    tries = (chosen,) if config is not None or INTERPRET else (chosen, *_FALLBACKS)
    for i, cfg in enumerate(tries):
        try:
            _launch_one(cfg, args, flags, kind, m, n, k)
            if i:  # remember what fits this device for this key
                _working[_table_key(kind, native, m, n, device)] = cfg
            return out
        except OutOfResources:
            if i == len(tries) - 1:
                raise
    return out


def _launch_one(cfg: QGemmConfig, args, flags, kind: str, m: int, n: int, k: int) -> None:
    block_k = cfg.block_k
    scale_k = _scale_k(kind)
    if scale_k is not None:  # a K step never straddles two scale blocks
        block_k = min(block_k, scale_k)
        require(scale_k % block_k == 0, f"BLOCK_K {block_k} must divide the scale block "
                                         f"{scale_k}")
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _qgemm_kernel[grid](*args, **flags, EVEN_K=k % block_k == 0, BLOCK_M=cfg.block_m,
                        BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
                        **cfg.launch_options())


# ---- registration -----------------------------------------------------------------------------

def _numerics(params) -> dict:
    numerics = {"compute_dtype": torch.float32}
    kind, k = params["kind"], params["k"]
    if kind in ("block", "mx"):
        # Each K block's partial sum is multiplied by its two scales in fp32 before it is added
        # (two roundings per partial; none for MX's powers of two): the tier's "each operand
        # rounded once in fp32" term, 2u * |B||A|.
        numerics["operands_dequantized_to"] = torch.float32
    if (params["device"] == "cuda" and torch.version.hip is None
            and dot_fp8(params["fmt_a"], params["fmt_b"], torch.device("cuda"))):
        if kind == "fp8":
            # acc is the WGMMA accumulator over all of K (Triton's sm_90 default never promotes
            # FP8 dot partial sums), so model the whole sum at ~14 bits, as scaled_mm does.
            numerics["accumulator_unit_roundoff"] = _FP8_MMA_UNIT_ROUNDOFF
        elif k > 0:
            # A fresh dot per scale block: at most min(K, scale block) terms summed at ~14 bits,
            # then at most K partials summed in fp32.  The tier bounds gamma_K(u) |B||A| and
            # gamma_K(u) >= K u, so u = (that sum's bound) / K is a true declaration.
            inner = min(k, _scale_k(kind))
            u = (_gamma(inner, _FP8_MMA_UNIT_ROUNDOFF) + _gamma(k, 2.0**-24)) / k
            numerics["accumulator_unit_roundoff"] = max(u, 2.0**-24)
    return numerics


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u) if n * u < 1 else math.inf


@BACKEND.implements("qgemm", dtypes=_FLOATS, devices=DEVICES, numerics=_numerics)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    out = launch(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m=m, n=n, k=k,
                 out_dtype=out_dtype, bias=bias)
    return out, {}
