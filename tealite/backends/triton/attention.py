"""Flash attention forward and backward on tealite's Triton backend (semantics:
tealite/attention_types.py; kernels: _attention_fwd.py, _attention_bwd.py).

Every layout, mask, sliding window, GQA / MQA, head dims off the 16-grid (tiles padded to a
power of two, masked loads), d_qk != d_v, a post-scale bias tensor and ALiBi, fp16 / bf16 /
fp32.  Tensors are read in place through their strides (only a non-unit stride along the head
dim is copied); bshd / sbhd / thd differ in the strides and per-sequence row offsets the host
passes.

Numerics declared (``_numerics``): fp32 compute; ``exp_ulps`` 2 (``tl.exp2`` is PTX's
``ex2.approx.ftz.f32`` on NVIDIA, max relative error 2 ulp; numpy's exp2 in the interpreter is
within 1); the forward's online softmax over key blocks of ``BLOCK_N``; P rounded to the input
dtype before the P @ V and dV products, dS before the dQ / dK products (16-bit inputs; with
fp32 inputs both stay fp32 and the dots use ``input_precision="ieee"``, not TF32).  Folding
log2(e) into the scale rounds ``softmax_scale * log2(e)`` once more than the natural-base
score: one extra unit roundoff relative to the score, of the same kind as the scale product's
own rounding.

Block configs (``_CONFIGS``): per head-dim class for a GPU, one 16 x 16 config in the
interpreter, so that CI's short sequences (<= 48) still cross several key blocks and exercise
the online rescaling.  Written for ROCm too (no TMA, no NVIDIA-only intrinsics).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from tealite.attention_types import AttentionConfig
from tealite.backends.triton import BACKEND, DEVICES, INTERPRET, PLATFORM
from tealite.backends.triton._attention_bwd import (attn_bwd_delta_kernel, attn_bwd_dkdv_kernel,
                                                    attn_bwd_dq_kernel)
from tealite.backends.triton._attention_fwd import LOG2E, attn_fwd_kernel
from tealite.backends.triton._io import as_kernel_arg
from tealite.scoped import Scoped
from tealite.types import Op

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEAD_DIM = 256
# The exp2 error declared: 2 ulps (PTX ex2.approx.f32's documented bound; see module doc).
_EXP2_ULPS = 2


@dataclass(frozen=True)
class Blocks:
    """One launch's tiles: BLOCK_M query rows x BLOCK_N keys, warps and pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class AttentionBlocks:
    fwd: Blocks
    dkdv: Blocks   # BLOCK_N keys owned, BLOCK_M queries streamed
    dq: Blocks     # BLOCK_M queries owned, BLOCK_N keys streamed


_INTERPRETER = AttentionBlocks(Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1), Blocks(16, 16, 1, 1))
# GPU configs by the larger padded head dim (<= 64, <= 128, <= 256) and 16-bit / fp32 inputs.
_GPU = {
    # d <= 64: not measured; dK/dV avoids (32, 128, 4 warps), the slowest at d = 128.
    64: AttentionBlocks(Blocks(128, 64, 4, 3), Blocks(32, 64, 4, 3), Blocks(128, 32, 4, 3)),
    # d <= 128: H100 sweep of the kernels with unmasked interior blocks (benchmarks/
    # attention_configs.py, docs/benchmarks/2026-11-27-h100-attention-configs-unmasked.txt),
    # bf16 8x4096x32x128: fwd 496 (causal 441), dK/dV 360 (305), dQ 371 (311) TFLOP/s.
    128: AttentionBlocks(Blocks(128, 128, 8, 3), Blocks(64, 128, 8, 3), Blocks(128, 64, 8, 3)),
    256: AttentionBlocks(Blocks(64, 64, 4, 2), Blocks(32, 64, 4, 2), Blocks(64, 32, 4, 2)),
}
_GPU_FP32 = AttentionBlocks(Blocks(64, 32, 4, 2), Blocks(32, 32, 4, 2), Blocks(32, 32, 4, 2))

@dataclass(frozen=True)
class BlockChoice:
    """``forced``: the AttentionBlocks every launch uses (config sweeps, tests); None: the
    table.  Set for one block and thread with ``BLOCKS.override(forced=...)``."""

    forced: AttentionBlocks | None = None


BLOCKS: Scoped[BlockChoice] = Scoped("triton.attention.BLOCKS", BlockChoice)


def pick_blocks(head_dim_qk: int, head_dim_v: int, dtype: torch.dtype) -> AttentionBlocks:
    forced = BLOCKS.get().forced
    if forced is not None:
        return forced
    if INTERPRET:
        return _INTERPRETER
    if dtype == torch.float32:
        return _GPU_FP32
    d = max(_pow2(head_dim_qk), _pow2(head_dim_v))
    return _GPU[64 if d <= 64 else 128 if d <= 128 else 256]


def _pow2(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _d_blocks(d_qk: int, d_v: int) -> tuple[int, int]:
    """(BLOCK_DQK, BLOCK_DV): each head dim padded to a power of two (masked loads), except
    that when *both* are padded to different widths they share the wider one.  Measured on an
    H100 (triton 3.6): with d_qk = 40 (block 64) and d_v = 24 (block 32) the compiled forward
    wrote wrong outputs (its LSE and every backward output were right), while 40 / 64, 64 / 24,
    17 / 17 and 192 / 128 were right; the interpreter is right in every case."""
    bq, bv = _pow2(d_qk), _pow2(d_v)
    if d_qk < bq and d_v < bv and bq != bv:
        bq = bv = max(bq, bv)
    return bq, bv


# ---- support and numerics ---------------------------------------------------------------

def _check(p) -> str | None:
    if max(p["head_dim_qk"], p["head_dim_v"]) > _MAX_HEAD_DIM:
        return (f"head dims up to {_MAX_HEAD_DIM} (one tile of the head dim in registers), got "
                f"d_qk={p['head_dim_qk']}, d_v={p['head_dim_v']}")
    return None


def _numerics(p, *, backward: bool) -> dict:
    dtype = p["dtype"]
    out = {"compute_dtype": torch.float32, "exp_ulps": _EXP2_ULPS,
           "attention_kv_block": pick_blocks(p["head_dim_qk"], p["head_dim_v"],
                                             dtype).fwd.block_n}
    if dtype != torch.float32:
        out["attention_p_rounded_to"] = dtype
        if backward:
            out["attention_ds_rounded_to"] = dtype
    return out


# ---- host helpers ---------------------------------------------------------------------

def _unit_d(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along the head dim (the kernels' only layout requirement)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _bsh_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(batch, sequence, head) strides; thd has no batch dim (offsets come per sequence)."""
    if layout == "bshd":
        return t.stride(0), t.stride(1), t.stride(2)
    if layout == "sbhd":
        return t.stride(1), t.stride(0), t.stride(2)
    return 0, t.stride(0), t.stride(1)


@dataclass(frozen=True)
class _Seqs:
    """Per-sequence row offsets and lengths (int32, on the device) and the launch extents."""

    q_off: torch.Tensor
    q_len: torch.Tensor
    kv_off: torch.Tensor
    kv_len: torch.Tensor
    batch: int
    rows_q: int    # query rows a program grid must cover: padded length, or max thd length
    rows_kv: int
    store_q: int   # S of bshd / sbhd (every row stored); unused for thd
    store_kv: int


def _sequences(q, k, c: AttentionConfig) -> _Seqs:
    dev = q.device
    if c.layout == "thd":
        cu_q, cu_kv = c.cu_seqlens_q, c.cu_seqlens_kv
        len_q = (cu_q[1:] - cu_q[:-1]).to(torch.int32)
        len_kv = (cu_kv[1:] - cu_kv[:-1]).to(torch.int32)
        off_q = (c.cu_seqlens_q_padded if c.cu_seqlens_q_padded is not None else cu_q)[:-1]
        off_kv = (c.cu_seqlens_kv_padded if c.cu_seqlens_kv_padded is not None else cu_kv)[:-1]
        both = torch.stack([len_q, len_kv]).amax(dim=1).tolist()  # one host sync
        return _Seqs(off_q.contiguous(), len_q.contiguous(), off_kv.contiguous(),
                     len_kv.contiguous(), len_q.shape[0], both[0], both[1], 0, 0)
    b = q.shape[0] if c.layout == "bshd" else q.shape[1]
    sq = q.shape[1] if c.layout == "bshd" else q.shape[0]
    skv = k.shape[1] if c.layout == "bshd" else k.shape[0]
    zeros = torch.zeros(b, dtype=torch.int32, device=dev)
    if c.padded:
        len_q, len_kv = c.seqlens_q.contiguous(), c.seqlens_kv.contiguous()
    else:
        len_q = torch.full((b,), sq, dtype=torch.int32, device=dev)
        len_kv = torch.full((b,), skv, dtype=torch.int32, device=dev)
    return _Seqs(zeros, len_q, zeros, len_kv, b, sq, skv, sq, skv)


def _lse_strides(lse: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(batch, head, row) strides of an LSE-shaped fp32 tensor: (b, h, s), or (h, t)."""
    if layout == "thd":
        return 0, lse.stride(0), lse.stride(1)
    return lse.stride(0), lse.stride(1), lse.stride(2)


def _bias_args(q: torch.Tensor, c: AttentionConfig) -> tuple:
    """(bias arg, slopes arg, 4 bias strides, 2 slope strides, BIAS_KIND, BIAS_BF16)."""
    if c.bias is not None:
        t = c.bias
        st = [t.stride(i) if t.shape[i] > 1 else 0 for i in range(4)]
        return (as_kernel_arg(t), q, *st, 0, 0, 1, t.dtype == torch.bfloat16)
    if c.alibi_slopes is not None:
        s = c.alibi_slopes
        sab, sah = (0, s.stride(0)) if s.dim() == 1 else (s.stride(0), s.stride(1))
        return (q, s, 0, 0, 0, 0, sab, sah, 2, False)
    return (q, q, 0, 0, 0, 0, 0, 0, 0, False)


def _flags(q: torch.Tensor, c: AttentionConfig) -> dict:
    left, right = c.window
    bits = INTERPRET and q.dtype == torch.bfloat16
    return dict(THD=c.layout == "thd", BOTTOM_RIGHT=c.bottom_right, HAS_LEFT=left >= 0,
                HAS_RIGHT=right >= 0, BITS=bits,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 or bits else None)


def _even_d(d_qk: int, d_v: int) -> bool:
    """Both head dims fill their tiles: the unmasked key / query blocks load without any
    predicate (vector loads)."""
    return (d_qk, d_v) == _d_blocks(d_qk, d_v)


def _arg(t: torch.Tensor, flags: dict) -> torch.Tensor:
    return as_kernel_arg(t) if flags["BITS"] else t


def _launch_opts(blk: Blocks) -> dict:
    opts = {"num_warps": blk.num_warps, "num_stages": blk.num_stages}
    if PLATFORM.get().rocm and not INTERPRET:
        opts["num_stages"] = min(blk.num_stages, 2)  # AMD's stream pipeliner: 2 stages
    return opts


# ---- forward ----------------------------------------------------------------------------

@BACKEND.implements(Op.ATTENTION_FWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=lambda p: _numerics(p, backward=False))
def attention_fwd(q, k, v, config: AttentionConfig):
    c = config
    q, k, v = _unit_d(q), _unit_d(k), _unit_d(v)
    h, hk = q.shape[-2], k.shape[-2]
    d_qk, d_v = q.shape[-1], v.shape[-1]
    out_shape = tuple(q.shape[:-1]) + (d_v,)
    thd = c.layout == "thd"
    # thd rows outside every sequence (padding gaps) are never visited: pre-filled 0 / -inf.
    out = (torch.zeros if thd else torch.empty)(out_shape, dtype=q.dtype, device=q.device)
    if thd:
        lse = torch.full((h, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    else:
        b, s = (q.shape[0], q.shape[1]) if c.layout == "bshd" else (q.shape[1], q.shape[0])
        lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    if q.numel() == 0 or out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    sq = _sequences(q, k, c)
    blk = pick_blocks(d_qk, d_v, q.dtype).fwd
    flags = _flags(q, c)
    bias = _bias_args(q, c)
    grid = (triton.cdiv(sq.rows_q, blk.block_m), sq.batch * h)
    if grid[0] == 0:
        return out, lse
    attn_fwd_kernel[grid](
        _arg(q, flags), _arg(k, flags), _arg(v, flags), _arg(out, flags), lse, *bias[:2],
        sq.q_off, sq.q_len, sq.kv_off, sq.kv_len,
        *_bsh_strides(q, c.layout), *_bsh_strides(k, c.layout), *_bsh_strides(v, c.layout),
        *_bsh_strides(out, c.layout), *_lse_strides(lse, c.layout), *bias[2:8],
        h, h // hk, d_qk, d_v, sq.store_q, c.softmax_scale * LOG2E, *c.window,
        BIAS_KIND=bias[8], BIAS_BF16=bias[9], **flags, EVEN_D=_even_d(d_qk, d_v),
        BLOCK_M=blk.block_m, BLOCK_N=blk.block_n, BLOCK_DQK=_d_blocks(d_qk, d_v)[0],
        BLOCK_DV=_d_blocks(d_qk, d_v)[1], **_launch_opts(blk))
    return out, lse


# ---- backward ---------------------------------------------------------------------------

@BACKEND.implements(Op.ATTENTION_BWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=lambda p: _numerics(p, backward=True))
def attention_bwd(dout, q, k, v, out, lse, config: AttentionConfig):
    c = config
    # dq / dk / dv are written through q's / k's / v's strides and do through out's: dense
    # inputs (the usual case) are used as they are, anything else is copied once.
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    thd = c.layout == "thd"
    alloc = torch.zeros if thd else torch.empty  # thd gap rows are never visited
    dq, dk, dv = (alloc(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if dq.numel() == 0 or dk.numel() == 0 or dv.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    h, hk = q.shape[-2], k.shape[-2]
    d_qk, d_v = q.shape[-1], v.shape[-1]
    sq = _sequences(q, k, c)
    blocks = pick_blocks(d_qk, d_v, q.dtype)
    flags = _flags(q, c)
    bias = _bias_args(q, c)
    lse = lse.contiguous()
    delta = torch.zeros_like(lse)  # rows outside every sequence keep D = 0
    strides_l = _lse_strides(lse, c.layout)
    strides_o = _bsh_strides(out, c.layout)
    bd = blocks.dq
    grid_q = (triton.cdiv(sq.rows_q, bd.block_m), sq.batch * h)
    if grid_q[0] > 0:
        attn_bwd_delta_kernel[grid_q](
            _arg(out, flags), _arg(dout, flags), delta, sq.q_off, sq.q_len,
            *strides_o, *strides_l, h, d_v,
            BITS=flags["BITS"], BLOCK_M=bd.block_m, BLOCK_DV=_d_blocks(d_qk, d_v)[1])
    common = (*_bsh_strides(q, c.layout), *_bsh_strides(k, c.layout), *_bsh_strides(v, c.layout),
              *strides_o, *strides_l, *bias[2:8])
    consts = dict(BIAS_KIND=bias[8], BIAS_BF16=bias[9], **flags, EVEN_D=_even_d(d_qk, d_v),
                  BLOCK_DQK=_d_blocks(d_qk, d_v)[0], BLOCK_DV=_d_blocks(d_qk, d_v)[1])
    scale2 = c.softmax_scale * LOG2E
    seq_args = (sq.q_off, sq.q_len, sq.kv_off, sq.kv_len)
    bk = blocks.dkdv
    grid_kv = (triton.cdiv(sq.rows_kv, bk.block_n), sq.batch * hk)
    if grid_kv[0] > 0:
        attn_bwd_dkdv_kernel[grid_kv](
            _arg(q, flags), _arg(k, flags), _arg(v, flags), _arg(dout, flags), lse, delta,
            _arg(dk, flags), _arg(dv, flags), *bias[:2], *seq_args, *common,
            hk, h // hk, d_qk, d_v, sq.store_kv, scale2, c.softmax_scale, *c.window,
            **consts, BLOCK_M=bk.block_m, BLOCK_N=bk.block_n, **_launch_opts(bk))
    if grid_q[0] > 0:
        attn_bwd_dq_kernel[grid_q](
            _arg(q, flags), _arg(k, flags), _arg(v, flags), _arg(dout, flags), lse, delta,
            _arg(dq, flags), *bias[:2], *seq_args, *common,
            h, h // hk, d_qk, d_v, sq.store_q, scale2, c.softmax_scale, *c.window,
            **consts, BLOCK_M=bd.block_m, BLOCK_N=bd.block_n, **_launch_opts(bd))
    return dq, dk, dv


__all__ = ["attention_fwd", "attention_bwd", "pick_blocks", "AttentionBlocks", "Blocks",
           "BLOCKS", "BlockChoice"]
