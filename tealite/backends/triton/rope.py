"""RoPE forward and backward (semantics: tealite/ops/rope.py): every format, interleaved or
not, partial rotary, start positions and TE's two-chunk context parallelism, in one kernel.

Each program takes ``BLOCK_S`` consecutive tokens of one sequence (the grid is flattened:
sequence-major, then token blocks of the longest sequence; blocks past a shorter sequence
return at once).  It computes each token's position in-kernel (start offset, or the
two-chunk formula), loads the float32 angles of the rotated columns once, takes cos / sin,
and then loops over the heads: per head one load of the head, one gathered load of the
partner columns, the FMA pair, one store.  The cos / sin of a (token, column) are computed
once for all heads, so the kernel is load/store bound for any head count.

The tile holds the whole head (``BLOCK_D = next_power_of_2(d)``): columns ``k < d2`` are
rotated, the tail is copied bit for bit (loaded and stored through the same fp32 widening,
which is exact for every input dtype).  Addressing is by strides, so sbhd, bshd and thd are
the same code: a token's row starts at ``seq_base + i * stride_s`` where ``seq_base`` is
``b * stride_b`` (sbhd / bshd) or ``(cu_seqlens[b] / cp_size) * stride_s`` (thd).

Numerics: fp32 math, one FMA pair per element (the contraction of ``x * c + xr * s`` is the
compiler's choice; tiers/rotary.py's gamma_2 covers both), cos / sin of the float32 angle:
on a GPU through libdevice's ``cosf`` / ``sinf`` (CUDA documents 2 ulp; Triton's ``tl.cos``
may lower to the approximate ``cos.approx.f32``, whose error grows with the argument: long
contexts have arguments of 1e5 and more), in the interpreter numpy's float32 cos / sin
(measured within 1.2 units of 2^-24 up to |f| = 3e7).  Declared ``trig_ulps`` = 2.
bf16 travels as int16 bits (``_io``: the interpreter's bf16 conversions are wrong).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.types import Op, TensorFormat

if not INTERPRET:
    from triton.language.extra import libdevice

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32, "trig_ulps": 2}
_MAX_HEAD_DIM = 1024
# Tokens per program: enough rows to keep every lane busy for small heads, few enough that
# the (BLOCK_S, BLOCK_D) fp32 tiles (x, partner, cos, sin) stay in registers at d = 256.
_BLOCK_S = {64: 16, 128: 8, 256: 4}
_BLOCK_S_MAX_D = 2


@triton.jit
def _cos_sin(f, ACCURATE: tl.constexpr):
    if ACCURATE:
        return libdevice.cos(f), libdevice.sin(f)
    else:
        return tl.cos(f), tl.sin(f)


@triton.jit
def _rope_kernel(x_ptr, y_ptr, f_ptr, cu_ptr, start_ptr,
                 S, H, D, D2, n_blocks, stride_f,
                 sx_b, sx_s, sx_h, sy_b, sy_s, sy_h,
                 cp_size, cp_rank,
                 THD: tl.constexpr, CP: tl.constexpr, HAS_START: tl.constexpr,
                 INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, IS_BF16: tl.constexpr,
                 ACCURATE_TRIG: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // n_blocks
    i = (pid % n_blocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    if THD:
        begin = tl.load(cu_ptr + b) // cp_size
        length = tl.load(cu_ptr + b + 1) // cp_size - begin
        x_base = begin.to(tl.int64) * sx_s
        y_base = begin.to(tl.int64) * sy_s
    else:
        length = S
        x_base = b.to(tl.int64) * sx_b
        y_base = b.to(tl.int64) * sy_b
    if (pid % n_blocks) * BLOCK_S >= length:
        return
    rows = i < length
    # The token's position: TE's two-chunk layout under context parallelism, else the
    # sequence's start offset.
    if CP:
        c = length // 2
        pos = tl.where(i < c, i + cp_rank * c, (2 * cp_size - 1 - cp_rank) * c + i - c)
    else:
        pos = i
        if HAS_START:
            pos = pos + tl.load(start_ptr + b)
    k = tl.arange(0, BLOCK_D)
    rot = k < D2
    half = D2 // 2
    if INTERLEAVED:
        partner = k ^ 1
        first = (k % 2) == 0
    else:
        partner = tl.where(k < half, k + half, k - half)
        first = k < half
    # sign[k] of the forward rotation: -1 on the first element of each pair.
    sign = tl.where(first, -1.0, 1.0)
    fmask = rows[:, None] & rot[None, :]
    frow = pos.to(tl.int64)[:, None] * stride_f
    c_k, s_k = _cos_sin(tl.load(f_ptr + frow + k[None, :], mask=fmask, other=0.0),
                        ACCURATE_TRIG)
    if BACKWARD:
        # dx[k] = dy[k] cos f[k] + sign[q] dy[q] sin f[q], q the partner; sign[q] = -sign[k].
        _, s_q = _cos_sin(tl.load(f_ptr + frow + partner[None, :], mask=fmask, other=0.0),
                          ACCURATE_TRIG)
        s_eff = -sign[None, :] * s_q
    else:
        s_eff = sign[None, :] * s_k
    dmask = rows[:, None] & (k < D)[None, :]
    x_rows = x_base + i.to(tl.int64)[:, None] * sx_s
    y_rows = y_base + i.to(tl.int64)[:, None] * sy_s
    for h in range(0, H):
        xo = x_rows + h * sx_h
        x = load_f32(x_ptr, xo + k[None, :], dmask, IS_BF16)
        xq = load_f32(x_ptr, xo + partner[None, :], fmask, IS_BF16)
        y = tl.where(rot[None, :], x * c_k + xq * s_eff, x)
        store_f32(y_ptr, y_rows + h * sy_h + k[None, :], y, dmask, IS_BF16)


def _block_s(d: int) -> int:
    for limit, rows in sorted(_BLOCK_S.items()):
        if d <= limit:
            return rows
    return _BLOCK_S_MAX_D


def _layout(t: torch.Tensor, tensor_format: TensorFormat):
    """(S, nseq, H, stride_b, stride_s, stride_h) of a contiguous t (the head dim stride 1)."""
    if tensor_format == TensorFormat.THD:
        return 0, 0, t.shape[1], 0, t.stride(0), t.stride(1)
    if tensor_format == TensorFormat.SBHD:
        return t.shape[0], t.shape[1], t.shape[2], t.stride(1), t.stride(0), t.stride(2)
    return t.shape[1], t.shape[0], t.shape[2], t.stride(0), t.stride(1), t.stride(2)


def _launch(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
            start_positions, *, backward: bool):
    x = t.contiguous()
    y = torch.empty_like(x)
    s, nseq, heads, sb, ss, sh = _layout(x, tensor_format)
    thd = tensor_format == TensorFormat.THD
    if thd:
        cu = cu_seqlens.contiguous()
        nseq = cu.shape[0] - 1
        lens = (cu[1:] - cu[:-1]) // cp_size
        s = int(lens.max()) if nseq else 0
    else:
        cu = torch.zeros(1, dtype=torch.int32, device=t.device)
    if x.numel() == 0 or nseq == 0 or s == 0:
        return y
    d, d2 = x.shape[-1], freqs.shape[-1]
    block_s = _block_s(d)
    n_blocks = triton.cdiv(s, block_s)
    f = freqs.contiguous()
    start = start_positions.contiguous() if start_positions is not None else cu
    _rope_kernel[(nseq * n_blocks,)](
        as_kernel_arg(x), as_kernel_arg(y), f, cu, start, s, heads, d, d2, n_blocks,
        f.stride(0), sb, ss, sh, sb, ss, sh, cp_size, cp_rank,
        THD=thd, CP=cp_size > 1, HAS_START=start_positions is not None,
        INTERLEAVED=interleaved, BACKWARD=backward, IS_BF16=x.dtype == torch.bfloat16,
        ACCURATE_TRIG=not INTERPRET, BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(d),
        num_warps=4)
    return y


def _check(params) -> str | None:
    if params["d"] > _MAX_HEAD_DIM:
        return f"head dim {params['d']} > {_MAX_HEAD_DIM} (the whole head is one tile)"
    return None


@BACKEND.implements(Op.ROPE_FWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=_NUMERICS)
def rope_fwd(t, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _launch(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                   start_positions, backward=False)


@BACKEND.implements(Op.ROPE_BWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=_NUMERICS)
def rope_bwd(dy, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _launch(dy, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                   start_positions, backward=True)
