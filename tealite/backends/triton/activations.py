"""Activations (every kind of tealite.ops.activations): forward, backward and dbias + dact, in
fp32 math with one rounding to the output dtype.

Reusable ``@triton.jit`` helpers (stable names; other kernel modules, e.g. fused
gated-activation -> quantize kernels, import them).  ``KIND`` is a *pointwise* kind name as a
``tl.constexpr`` string ("gelu", "gelu_tanh", "relu", "silu", "qgelu", "srelu"); a gated kind
is its base kind (``tealite.ops.activations.GATED``) applied to the first half times the
second half::

    act_f32(x, KIND)    f(x)   for fp32 x
    dact_f32(x, KIND)   f'(x)  for fp32 x (relu'(0) = srelu'(0) = 0)
    sigmoid_f32(z)      (sigmoid(z), 1 - sigmoid(z)), both without cancellation or overflow
    exp_f32(x)          tl.exp (one place to model the GPU's approximate exp)

Numerics.  ``tl.exp`` on NVIDIA lowers to ``ex2.approx.f32(fl(x * log2e))`` (Triton's
ExpOpConversionApprox; 2 + 1.17|x| ulp, the documented error of CUDA's ``__expf``); on AMD to
``llvm.exp2.f32`` (1 ulp).  The |x|-proportional part is the rounded argument (|x| u
relative), which the spec's condition magnitudes already carry: e.g. silu's
``|x| s (1 + |x|(1 - s))`` gives a bound of about 8u(2 + |x|)|y| against the approximate exp's
(4 + 2.35|x|)u|y| (likewise the ``|inner|(1 - t^2)`` and ``|x| phi (1 + x^2)`` terms), so the
declared numerics are just the fp32 compute dtype.  Checked under the interpreter by swapping
that error model into ``exp_f32`` (argument rounded to fp32, then a 2^-22 bias either way):
worst error/tolerance 0.35 over 60 fp32 'local'-profile cases per op (0.26 with an exact exp),
while a 1e-5 bias already fails (> 5).  ``tl.math.erf`` lowers to libdevice
``__nv_erff`` / ``__ocml_erf_f32`` (2 ulp) and to ``math.erf`` in the interpreter; it exists
in triton 3.6 and 3.9.  Divisions are ``div_rn`` (Triton's ``/`` is approximate on CUDA).
tanh is written through the sigmoid: 0.5 (1 + tanh u) = sigmoid(2u), and
1 - tanh(u)^2 = 4 s (1 - s), which avoid the cancellation of 1 - t*t near |t| = 1 and need
no tanh (absent from ``tl.math``; libdevice calls do not run in the interpreter).

Kernels: pointwise kinds use 1-D blocks of 1024 elements over the flattened tensor (4 warps:
8 elements per thread on NVIDIA, 4 on a 64-wide AMD wavefront).  Gated kinds use one program
per (row chunk, column block) tile of BLOCK_R x BLOCK_N outputs reading both halves.  dbias:
each program sums its (row chunk, column block) of dx in fp32 registers; the per-chunk partials
are summed in a fixed order by ``norms.sum_partials`` (deterministic, no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.backends.triton.norms import sum_partials, target_programs
from tealite.types import GATED, Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}

# Formula constants (float64 values; rounded once to fp32 where they meet fp32 operands, as
# in torch's fp32 kernels).  Globals read inside @triton.jit code must be tl.constexpr, and
# in the interpreter ``constexpr * tensor`` wraps the tensor in a constexpr (breaking later
# tl calls), so every product below puts the tensor on the left: ``x * C``.
INV_SQRT2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
GELU_TANH_C = tl.constexpr(0.044715)
QGELU_ALPHA = tl.constexpr(1.702)

_BLOCK = 1024          # pointwise elements per program
_TILE = 1024           # gated / dbias outputs per program (BLOCK_R x BLOCK_N)
_MAX_BLOCK_N = 256
_DBIAS_PROGRAMS_PER_SM = 4


@triton.jit
def exp_f32(x):
    # Every exp goes through here: NVIDIA ex2.approx.f32(fl(x * log2e)), AMD exp2 (module
    # docstring).  tests/test_triton_norms_acts.py swaps in that error model to check the spec.
    return tl.exp(x)


@triton.jit
def sigmoid_f32(z):
    # Split by sign, as the reference does: e = exp(-|z|) never overflows, the smaller of
    # s and 1 - s is e / (1 + e) (relatively accurate however small), the larger 1 / (1 + e).
    e = exp_f32(-tl.abs(z))
    big = tl.math.div_rn(1.0, 1.0 + e)
    small = e * big
    s = tl.where(z >= 0, big, small)
    sc = tl.where(z >= 0, small, big)
    return s, sc


@triton.jit
def _gelu_tanh_inner(x):
    return (x + (x * x * x) * GELU_TANH_C) * SQRT_2_OVER_PI


@triton.jit
def act_f32(x, KIND: tl.constexpr):
    if KIND == "gelu":
        y = 0.5 * x * (1.0 + tl.math.erf(x * INV_SQRT2))
    elif KIND == "gelu_tanh":
        s, _ = sigmoid_f32(2.0 * _gelu_tanh_inner(x))
        y = x * s
    elif KIND == "relu":
        y = tl.where(x < 0, 0.0, x)  # keeps NaN, as max(x, 0) does in torch
    elif KIND == "silu":
        s, _ = sigmoid_f32(x)
        y = x * s
    elif KIND == "qgelu":
        s, _ = sigmoid_f32(x * QGELU_ALPHA)
        y = x * s
    else:
        tl.static_assert(KIND == "srelu", "unknown activation kind")
        r = tl.where(x < 0, 0.0, x)
        y = r * r
    return y


@triton.jit
def dact_f32(x, KIND: tl.constexpr):
    if KIND == "gelu":
        cdf = 0.5 * (1.0 + tl.math.erf(x * INV_SQRT2))
        pdf = exp_f32(-0.5 * (x * x)) * INV_SQRT_2PI
        d = cdf + x * pdf
    elif KIND == "gelu_tanh":
        s, sc = sigmoid_f32(2.0 * _gelu_tanh_inner(x))
        sech2 = 4.0 * (s * sc)              # 1 - tanh(inner)^2
        poly = 1.0 + (x * x) * (3.0 * GELU_TANH_C)
        slope = (0.5 * x * sech2) * SQRT_2_OVER_PI * poly
        # sech2 == 0 exactly for large |x|: keep 0 * (x^2 overflowing to inf) from being NaN.
        d = s + tl.where(sech2 > 0, slope, 0.0)
    elif KIND == "relu":
        d = tl.where(x > 0, 1.0, 0.0)
    elif KIND == "silu":
        s, sc = sigmoid_f32(x)
        d = s + x * s * sc
    elif KIND == "qgelu":
        s, sc = sigmoid_f32(x * QGELU_ALPHA)
        d = s + x * QGELU_ALPHA * s * sc
    else:
        tl.static_assert(KIND == "srelu", "unknown activation kind")
        d = tl.where(x > 0, 2.0 * x, 0.0)
    return d


# ---- kernels ---------------------------------------------------------------------------

@triton.jit
def _pointwise_kernel(x_ptr, dy_ptr, out_ptr, numel, KIND: tl.constexpr, BWD: tl.constexpr,
                      IO_BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = load_f32(x_ptr, offs, mask, IO_BF16)
    if BWD:
        out = load_f32(dy_ptr, offs, mask, IO_BF16) * dact_f32(x, KIND)
    else:
        out = act_f32(x, KIND)
    store_f32(out_ptr, offs, out, mask, IO_BF16)


@triton.jit
def _gated_kernel(x_ptr, dy_ptr, out_ptr, rows, N, KIND: tl.constexpr, BWD: tl.constexpr,
                  IO_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """x is (rows, 2N) = [a | b]; forward writes y = f(a) b (rows, N); backward writes
    dx = [dy f'(a) b | dy f(a)] (rows, 2N)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (r[:, None] < rows) & (c[None, :] < N)
    a_offs = r[:, None] * (2 * N) + c[None, :]
    a = load_f32(x_ptr, a_offs, mask, IO_BF16)
    b = load_f32(x_ptr, a_offs + N, mask, IO_BF16)
    if BWD:
        dy = load_f32(dy_ptr, r[:, None] * N + c[None, :], mask, IO_BF16)
        store_f32(out_ptr, a_offs, dy * dact_f32(a, KIND) * b, mask, IO_BF16)
        store_f32(out_ptr, a_offs + N, dy * act_f32(a, KIND), mask, IO_BF16)
    else:
        store_f32(out_ptr, r[:, None] * N + c[None, :], act_f32(a, KIND) * b, mask, IO_BF16)


@triton.jit
def _dbias_dact_kernel(x_ptr, dy_ptr, dx_ptr, part_ptr, rows, H, rows_per_prog,
                       KIND: tl.constexpr, IO_BF16: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx = dy f'(x) for rows [pid0 * rows_per_prog, +rows_per_prog) (a multiple of BLOCK_R)
    and the fp32 column sums of that chunk into partial row pid0."""
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = c < H
    start = tl.program_id(0).to(tl.int64) * rows_per_prog
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rows_per_prog, BLOCK_R):
        r = start + r0 + tl.arange(0, BLOCK_R)
        mask = (r[:, None] < rows) & cmask[None, :]
        offs = r[:, None] * H + c[None, :]
        x = load_f32(x_ptr, offs, mask, IO_BF16)
        dx = load_f32(dy_ptr, offs, mask, IO_BF16) * dact_f32(x, KIND)
        store_f32(dx_ptr, offs, dx, mask, IO_BF16)
        acc += tl.where(mask, dx, 0.0)
    tl.store(part_ptr + tl.program_id(0).to(tl.int64) * H + c, tl.sum(acc, axis=0), mask=cmask)


# ---- host side -------------------------------------------------------------------------

def _tile(n_cols: int) -> tuple[int, int]:
    block_n = min(_MAX_BLOCK_N, triton.next_power_of_2(max(n_cols, 1)))
    return max(1, _TILE // block_n), block_n


def _pointwise(x, dy, kind, bwd):
    x2 = x.contiguous()
    out = torch.empty_like(x2)
    if x2.numel():
        dy2 = x2 if dy is None else dy.contiguous()
        _pointwise_kernel[(triton.cdiv(x2.numel(), _BLOCK),)](
            as_kernel_arg(x2), as_kernel_arg(dy2), as_kernel_arg(out), x2.numel(),
            KIND=kind, BWD=bwd, IO_BF16=x.dtype == torch.bfloat16, BLOCK=_BLOCK, num_warps=4)
    return out


def _gated(x, dy, kind, bwd):
    n = x.shape[-1] // 2
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    x2 = x.contiguous()
    out = torch.empty_like(x2) if bwd else torch.empty((*x.shape[:-1], n), dtype=x.dtype,
                                                        device=x.device)
    if rows and n:
        dy2 = x2 if dy is None else dy.contiguous()
        block_r, block_n = _tile(n)
        grid = (triton.cdiv(rows, block_r), triton.cdiv(n, block_n))
        _gated_kernel[grid](as_kernel_arg(x2), as_kernel_arg(dy2), as_kernel_arg(out), rows, n,
                            KIND=GATED[kind], BWD=bwd, IO_BF16=x.dtype == torch.bfloat16,
                            BLOCK_R=block_r, BLOCK_N=block_n, num_warps=4)
    return out


@BACKEND.implements(Op.ACT_FWD, dtypes=_FLOATS, devices=DEVICES, numerics=_NUMERICS)
def act_fwd(x, *, kind):
    if kind in GATED:
        return _gated(x, None, kind, bwd=False)
    return _pointwise(x, None, kind, bwd=False)


@BACKEND.implements(Op.ACT_BWD, dtypes=_FLOATS, devices=DEVICES, numerics=_NUMERICS)
def act_bwd(dy, x, *, kind):
    if kind in GATED:
        return _gated(x, dy, kind, bwd=True)
    return _pointwise(x, dy, kind, bwd=True)


def _dbias_chunks(rows: int, n_col_blocks: int, block_r: int, device) -> tuple[int, int]:
    """(programs along rows, rows per program): enough programs to fill the GPU, each row
    chunk a multiple of BLOCK_R."""
    want = triton.cdiv(target_programs(device, _DBIAS_PROGRAMS_PER_SM), n_col_blocks)
    tiles = triton.cdiv(rows, block_r)
    per_prog = triton.cdiv(tiles, max(1, min(want, tiles))) * block_r
    return triton.cdiv(rows, per_prog), per_prog


@BACKEND.implements(Op.DBIAS_DACT, dtypes=_FLOATS, devices=DEVICES, numerics=_NUMERICS)
def dbias_dact(dy, x, *, kind):
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    x2, dy2 = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x2)
    if not rows:
        return dx, torch.zeros(hidden, dtype=x.dtype, device=x.device)
    block_r, block_n = _tile(hidden)
    n_col = triton.cdiv(hidden, block_n)
    programs, per_prog = _dbias_chunks(rows, n_col, block_r, x.device)
    partials = torch.empty((programs, hidden), dtype=torch.float32, device=x.device)
    _dbias_dact_kernel[(programs, n_col)](
        as_kernel_arg(x2), as_kernel_arg(dy2), as_kernel_arg(dx), partials, rows, hidden,
        per_prog, KIND=kind, IO_BF16=x.dtype == torch.bfloat16, BLOCK_R=block_r,
        BLOCK_N=block_n, num_warps=4)
    return dx, sum_partials(partials, x.dtype)
