"""LayerNorm / RMSNorm forward and backward in fp32 math; the whole row in registers.

Reusable ``@triton.jit`` helpers (stable names; other kernel modules, e.g. fused
norm -> quantize kernels, import them):

``effective_weight(g, ZERO_CENTERED)``
    ``g + 1`` with TE's zero-centered gamma, else ``g`` (fp32 in, fp32 out).
``norm_row_stats(x, mask, H_F, eps, RMS)``
    ``(xc, mean, rsigma)`` of one row held in registers: ``xc`` is the row centered by its
    mean (LayerNorm) or the row itself (RMSNorm, ``mean`` = 0), zero outside ``mask``.
``norm_row_fwd(x, g, b, mask, H_F, eps, RMS)``
    ``(y, mean, rsigma)`` in fp32 for one row, ``g`` the effective weight (``b`` unused
    with RMS).
``sum_partials(partials, out_dtype)`` (host) / ``_sum_partials_kernel``
    The second stage of a deterministic column reduction: fp32 partial sums, one row per
    first-stage program, summed in a fixed order and rounded once into ``out_dtype``.

Numerics: divisions and square roots are the IEEE-rounded ones (``div_rn``, ``sqrt_rn``):
Triton's ``/`` and ``sqrt`` are approximate on CUDA.  The variance is centered (two passes
over registers, not E[x^2] - E[x]^2, which cancels for rows with a large common offset).

Backward: each program takes a contiguous chunk of rows, writes dx row by row and keeps fp32
running sums of ``dy * xhat`` (dgamma) and ``dy`` (dbeta) for its chunk; the per-program
partials are then summed by ``_sum_partials_kernel`` in a fixed order.  No atomics: the result
is the same on every run for a given shape and GPU (the chunking depends on the SM count).
Any summation order is inside Higham's gamma_rows bound the spec uses, so the declared
numerics are just the fp32 compute dtype.

Block size is the next power of two of H, which suits both NVIDIA warps (32) and AMD
wavefronts (64).  Rows wider than 65536 are rejected (one row per program in registers).
Register use measured with ptxas for sm_90a (bf16 LayerNorm, triton 3.9): backward spills
nothing up to H = 4096, 184 bytes at H = 8192 (16 warps, 128 registers), heavily beyond
(2.2 KB at 16384); forward spills nothing up to 8192.  Wider rows are correct but slower.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MAX_HIDDEN = 65536
# Backward programs per SM on a GPU: two resident row-chunk programs hide load latency while
# keeping the partial buffer (programs x H fp32) small.  In the interpreter a few programs are
# enough to exercise the two-stage reduction.
_BWD_PROGRAMS_PER_SM = 2
_INTERPRET_PROGRAMS = 4
# Second-stage tile: 32 partial rows x 128 columns, 4 warps (32 fp32 per thread on NVIDIA,
# 16 on a 64-wide AMD wavefront).
_SUM_BLOCK_P = 32
_SUM_BLOCK_N = 128

_NUMERICS = {"compute_dtype": torch.float32}


@triton.jit
def effective_weight(g, ZERO_CENTERED: tl.constexpr):
    if ZERO_CENTERED:
        g = g + 1.0
    return g


@triton.jit
def norm_row_stats(x, mask, H_F, eps, RMS: tl.constexpr):
    if RMS:
        mean = 0.0
        xc = x
        var = tl.math.div_rn(tl.sum(x * x, axis=0), H_F)
    else:
        mean = tl.math.div_rn(tl.sum(x, axis=0), H_F)
        xc = tl.where(mask, x - mean, 0.0)
        var = tl.math.div_rn(tl.sum(xc * xc, axis=0), H_F)
    rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
    return xc, mean, rs


@triton.jit
def norm_row_fwd(x, g, b, mask, H_F, eps, RMS: tl.constexpr):
    xc, mean, rs = norm_row_stats(x, mask, H_F, eps, RMS)
    if RMS:
        y = xc * rs * g
    else:
        y = xc * rs * g + b
    return y, mean, rs


@triton.jit
def _norm_fwd_kernel(x_ptr, g_ptr, b_ptr, y_ptr, mean_ptr, rs_ptr, H, H_F, eps,
                     RMS: tl.constexpr, ZERO_CENTERED: tl.constexpr, X_BF16: tl.constexpr,
                     W_BF16: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = load_f32(x_ptr, row * H + cols, mask, X_BF16)
    g = effective_weight(load_f32(g_ptr, cols, mask, W_BF16), ZERO_CENTERED)
    # Written out rather than through norm_row_fwd (the same operations): measured on an H100
    # (triton 3.6, bf16 16384x8192 LayerNorm) the helper version gave the same bits in 392 us
    # instead of 230 us.
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


@triton.jit
def _add_rms_pad_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, H, H_OUT, H_F, eps,
                        HAS_RES: tl.constexpr, X_BF16: tl.constexpr, R_BF16: tl.constexpr,
                        W_BF16: tl.constexpr, BLOCK: tl.constexpr):
    # One row per program; BLOCK covers the padded width H_OUT.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    r = load_f32(x_ptr, row * H + cols, mask, X_BF16)
    if HAS_RES:
        r = r + load_f32(res_ptr, row * H + cols, mask, R_BF16)
        store_f32(res_out_ptr, row * H + cols, r, mask, R_BF16)
    w = load_f32(w_ptr, cols, mask, W_BF16)
    y, _, _ = norm_row_fwd(r, w, w, mask, H_F, eps, True)
    # The padded columns are written as 0, not as 0 * rsigma * 0 (NaN in a row with a NaN).
    store_f32(y_ptr, row * H_OUT + cols, tl.where(mask, y, 0.0), cols < H_OUT, X_BF16)


@triton.jit
def _norm_bwd_kernel(dy_ptr, x_ptr, g_ptr, mean_ptr, rs_ptr, dx_ptr, dg_part_ptr, db_part_ptr,
                     rows, H, H_F, rows_per_prog,
                     RMS: tl.constexpr, ZERO_CENTERED: tl.constexpr, X_BF16: tl.constexpr,
                     W_BF16: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    g = effective_weight(load_f32(g_ptr, cols, mask, W_BF16), ZERO_CENTERED)
    acc_dg = tl.zeros([BLOCK], dtype=tl.float32)
    acc_db = tl.zeros([BLOCK], dtype=tl.float32)
    # int64 row index (the loop variable is a Python int in the interpreter, int32 compiled).
    start = pid.to(tl.int64) * rows_per_prog
    n_rows = tl.minimum(start + rows_per_prog, rows) - start
    for i in range(0, n_rows):
        r = start + i
        base = r * H
        x = load_f32(x_ptr, base + cols, mask, X_BF16)
        dy = load_f32(dy_ptr, base + cols, mask, X_BF16)
        rs = tl.load(rs_ptr + r)
        if RMS:
            xc = x
        else:
            xc = tl.where(mask, x - tl.load(mean_ptr + r), 0.0)
        xhat = xc * rs
        gdy = dy * g  # dy is 0 outside the row, so is gdy (even where g = 0 + 1)
        c_xhat = tl.math.div_rn(tl.sum(gdy * xhat, axis=0), H_F)
        if RMS:
            dx = rs * (gdy - xhat * c_xhat)
        else:
            c_mean = tl.math.div_rn(tl.sum(gdy, axis=0), H_F)
            dx = rs * (gdy - c_mean - xhat * c_xhat)
        store_f32(dx_ptr, base + cols, dx, mask, X_BF16)
        acc_dg += dy * xhat
        acc_db += dy
    out = pid.to(tl.int64) * H + cols
    tl.store(dg_part_ptr + out, acc_dg, mask=mask)
    if not RMS:
        tl.store(db_part_ptr + out, acc_db, mask=mask)


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, P, N, OUT_BF16: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        prow = p0 + tl.arange(0, BLOCK_P)
        offs = prow.to(tl.int64)[:, None] * N + cols[None, :]
        m = (prow[:, None] < P) & cmask[None, :]
        acc += tl.load(part_ptr + offs, mask=m, other=0.0)
    store_f32(out_ptr, cols, tl.sum(acc, axis=0), cmask, OUT_BF16)


def sum_partials(partials: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Column sums of fp32 ``partials`` (P, N), in a fixed order, rounded once to out_dtype."""
    p, n = partials.shape
    out = torch.empty(n, dtype=out_dtype, device=partials.device)
    if n:
        _sum_partials_kernel[(triton.cdiv(n, _SUM_BLOCK_N),)](
            partials, as_kernel_arg(out), p, n, OUT_BF16=out_dtype == torch.bfloat16,
            BLOCK_P=_SUM_BLOCK_P, BLOCK_N=_SUM_BLOCK_N, num_warps=4)
    return out


def target_programs(device: torch.device, per_sm: int) -> int:
    """How many programs to spread a row reduction over: ``per_sm`` per SM/CU on a GPU."""
    if device.type == "cuda":
        return per_sm * torch.cuda.get_device_properties(device).multi_processor_count
    return _INTERPRET_PROGRAMS


def _too_wide(params) -> str | None:
    if params["hidden"] > _MAX_HIDDEN:
        return f"hidden size {params['hidden']} > {_MAX_HIDDEN} (one row per program)"
    return None


def _num_warps(block: int) -> int:
    # Measured on an H100 (benchmarks/norm_warps.py, bf16 16384x8192): 8 warps run RMSNorm at
    # 98.9 % of copy and LayerNorm at 80.0 %, 16 warps at 82.6 % / 79.8 %.  Wider rows keep 16
    # warps so a thread holds at most 128 values.  (The warp count changes the reduction tree,
    # so bits differ between choices; each is inside the fp32 summation bound.)
    return min(8 if block <= 8192 else 16, max(1, block // 256))


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
                                  num_warps=_num_warps(block))
    return y, mean, rs


def _launch_bwd(dy, x, mean, rsigma, gamma, zero_centered_gamma, rms):
    """dx in x's dtype; dgamma (and dbeta unless rms) in gamma's dtype."""
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    x2, dy2 = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x2)
    programs = max(1, min(rows, target_programs(x.device, _BWD_PROGRAMS_PER_SM)))
    rows_per_prog = triton.cdiv(rows, programs) if rows else 0
    programs = triton.cdiv(rows, rows_per_prog) if rows else 0
    dg_part = torch.empty((programs, hidden), dtype=torch.float32, device=x.device)
    db_part = dg_part if rms else torch.empty_like(dg_part)
    if programs:
        block = triton.next_power_of_2(hidden)
        rs = rsigma.contiguous()
        m = rs if rms else mean.contiguous()
        _norm_bwd_kernel[(programs,)](
            as_kernel_arg(dy2), as_kernel_arg(x2), as_kernel_arg(gamma.contiguous()), m, rs,
            as_kernel_arg(dx), dg_part, db_part, rows, hidden, float(hidden), rows_per_prog,
            RMS=rms, ZERO_CENTERED=zero_centered_gamma, X_BF16=x.dtype == torch.bfloat16,
            W_BF16=gamma.dtype == torch.bfloat16, BLOCK=block, num_warps=_num_warps(block))
    dgamma = sum_partials(dg_part, gamma.dtype)
    dbeta = None if rms else sum_partials(db_part, gamma.dtype)
    return dx, dgamma, dbeta


@BACKEND.implements(Op.LAYERNORM_FWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma):
    return _launch(x, gamma, beta, eps, zero_centered_gamma, rms=False)


@BACKEND.implements(Op.RMSNORM_FWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    y, _, rs = _launch(x, gamma, None, eps, zero_centered_gamma, rms=True)
    return y, rs


@BACKEND.implements(Op.LAYERNORM_BWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma):
    return _launch_bwd(dy, x, mean, rsigma, gamma, zero_centered_gamma, rms=False)


@BACKEND.implements(Op.RMSNORM_BWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_NUMERICS)
def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma):
    dx, dgamma, _ = _launch_bwd(dy, x, None, rsigma, gamma, zero_centered_gamma, rms=True)
    return dx, dgamma


def _too_wide_padded(params) -> str | None:
    if params["hidden_out"] > _MAX_HIDDEN:
        return (f"padded hidden size {params['hidden_out']} > {_MAX_HIDDEN} "
                f"(one row per program)")
    return None


@BACKEND.implements(Op.ADD_RMSNORM_PAD, dtypes=_FLOATS, devices=DEVICES,
                    check=_too_wide_padded, numerics=_NUMERICS)
def add_rmsnorm_pad(x, weight, *, eps, residual, pad_to_multiple, hidden_out):
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    x2 = x.contiguous()
    y = torch.empty((*x.shape[:-1], hidden_out), dtype=x.dtype, device=x.device)
    res2 = None if residual is None else residual.contiguous()
    res_out = None if residual is None else torch.empty_like(res2)
    if rows:
        block = triton.next_power_of_2(hidden_out)
        r_arg = x2 if res2 is None else res2  # unread without a residual (HAS_RES=False)
        _add_rms_pad_kernel[(rows,)](
            as_kernel_arg(x2), as_kernel_arg(r_arg), as_kernel_arg(weight.contiguous()),
            as_kernel_arg(y), as_kernel_arg(r_arg if res_out is None else res_out),
            hidden, hidden_out, float(hidden), eps, HAS_RES=res2 is not None,
            X_BF16=x.dtype == torch.bfloat16, R_BF16=r_arg.dtype == torch.bfloat16,
            W_BF16=weight.dtype == torch.bfloat16, BLOCK=block, num_warps=_num_warps(block))
    return y, res_out
