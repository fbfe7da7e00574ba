"""LayerNorm / RMSNorm forward: one program per row, the whole row in registers (fp32 math).

Divisions and square roots are the IEEE-rounded ones (``div_rn``, ``sqrt_rn``): Triton's
``/`` and ``sqrt`` are approximate on CUDA.  The row is read once; mean, centered variance (two-pass over registers, not E[x^2] - E[x]^2,
which cancels for rows with a large common offset), rsqrt, scale.  Block size is the next
power of two of H, which suits both NVIDIA warps (32) and AMD wavefronts (64).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MAX_HIDDEN = 65536


@triton.jit
def _norm_fwd_kernel(x_ptr, g_ptr, b_ptr, y_ptr, mean_ptr, rs_ptr, H, H_F, eps,
                     RMS: tl.constexpr, ZERO_CENTERED: tl.constexpr, X_BF16: tl.constexpr,
                     W_BF16: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = load_f32(x_ptr, row * H + cols, mask, X_BF16)
    g = load_f32(g_ptr, cols, mask, W_BF16)
    if ZERO_CENTERED:
        g = g + 1.0
    if RMS:
        ms = tl.math.div_rn(tl.sum(x * x, axis=0), H_F)
        rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps))
        y = x * rs * g
    else:
        mean = tl.math.div_rn(tl.sum(x, axis=0), H_F)
        xc = tl.where(mask, x - mean, 0.0)
        var = tl.math.div_rn(tl.sum(xc * xc, axis=0), H_F)
        rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
        b = load_f32(b_ptr, cols, mask, W_BF16)
        y = xc * rs * g + b
        tl.store(mean_ptr + row, mean)
    tl.store(rs_ptr + row, rs)
    store_f32(y_ptr, row * H + cols, y, mask, X_BF16)


def _too_wide(params) -> str | None:
    if params["hidden"] > _MAX_HIDDEN:
        return f"hidden size {params['hidden']} > {_MAX_HIDDEN} (one row per program)"
    return None


_NUMERICS = {"compute_dtype": torch.float32}


def _launch(x, gamma, beta, eps, zero_centered_gamma, rms):
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    x2 = x.contiguous()
    y = torch.empty_like(x2)
    mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    rs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(hidden)
        g = gamma.contiguous()
        b = g if beta is None else beta.contiguous()
        _norm_fwd_kernel[(rows,)](as_kernel_arg(x2), as_kernel_arg(g), as_kernel_arg(b),
                                  as_kernel_arg(y), mean, rs, hidden, float(hidden), eps,
                                  RMS=rms,
                                  ZERO_CENTERED=zero_centered_gamma,
                                  X_BF16=x.dtype == torch.bfloat16,
                                  W_BF16=gamma.dtype == torch.bfloat16, BLOCK=block,
                                  num_warps=min(16, max(1, block // 256)))
    return y, mean, rs


@BACKEND.implements("layernorm_fwd", dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma):
    return _launch(x, gamma, beta, eps, zero_centered_gamma, rms=False)


@BACKEND.implements("rmsnorm_fwd", dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    y, _, rs = _launch(x, gamma, None, eps, zero_centered_gamma, rms=True)
    return y, rs
