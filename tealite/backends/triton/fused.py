"""Fused LayerNorm / RMSNorm / activation forward -> FP8 or MXFP8 quantize.

Each program holds whole rows in registers, a (BLOCK_R, BLOCK) tile: the norm (the row
formulas of ``norms.norm_row_fwd``, for BLOCK_R rows at once) or the activation
(``activations.act_f32``; gated kinds f(a) * b) is computed in fp32 and that fp32 y is
quantized in the same program, never stored and never rounded to x's dtype:

* given scale (DelayedScaling): codes of y * scale; each row's amax goes to a (rows,) buffer
  whose max the host takes (NaN-propagating, no host synchronisation), as tealite.quantize;
* per row (Float8CurrentScaling(granularity="row")): row amax -> TE's scale rule
  (``_codecs._te_scale``) -> codes of y * scale; amax and scale_inv = div_rn(1, scale) per row;
* MXFP8: each row viewed as (BLOCK/32, 32) blocks -> block amax -> ``_codecs._e8m0_scale``
  -> ``_codecs._mx_descale`` -> codes (RNE or ties-away).

Amaxes are the integer max of the magnitude bits (exact and NaN-propagating in one reduction:
NaN bit patterns sort above Inf).  FP8 codes come from the integer encoders in ``_codecs``
(bit-identical on NVIDIA, AMD OCP / FNUZ and the interpreter), so the outputs follow exactly
the conventions of ``tealite.quantize`` for the same recipe.

Launch (``_tile``): BLOCK = next power of two of the row; BLOCK_R rows per program so that a
tile holds about _TILE = 4096 elements (one row per program from 4096 up), num_warps =
tile / 256 in [1, 16] (8 fp32 values per thread on NVIDIA, 4 per lane of a 64-wide AMD
wavefront pair).  Several rows per program keeps narrow rows from launching tiny programs on a
GPU, and the interpreter, whose cost is per program, fast.  Rows wider than 65536 are rejected.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, PLATFORM
from tealite.backends.triton._codecs import (_e8m0_scale, _encode_fp8_rounded, _encode_fp8_sat,
                                             _fmt_constants, _mx_descale, _mx_scale_constants,
                                             _mag_max, _overflow_constants, _te_scale)
from tealite.backends.triton._io import as_kernel_arg, load_f32
from tealite.backends.triton.activations import act_f32
from tealite.backends.triton.norms import effective_weight
from tealite.backends.triton.quantize import shared_reason
from tealite.formats import ElementRounding, Saturation, get_format
from tealite.recipe_facts import outside
from tealite.recipes import Family, Granularity
from tealite.types import GATED, Op, QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}
_TILE = 4096
MX_BLOCK = 32
_GIVEN, _PER_ROW, _MX = 0, 1, 2


@triton.jit
def _quantize_tile(y, rows, n_rows, N, q_ptr, s_ptr, amax_ptr, scale_ptr, fmax, eps,
                   QMODE: tl.constexpr, POW2: tl.constexpr, SATURATE: tl.constexpr,
                   TIES_AWAY: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr,
                   FMAX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                   BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                   SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                   OVF_CODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    """Quantize the fp32 tile ``y`` (rows ``rows`` x BLOCK lanes of an (n_rows, N) output) and
    store its codes, scales and amax as tealite.quantize lays them out."""
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols < N)[None, :]
    y = tl.where(mask, y, 0.0)
    if QMODE == 2:
        yb = tl.reshape(y, (BLOCK_R, BLOCK // 32, 32))
        byte = _e8m0_scale(_mag_max(yb, 2), MODE, EMAX, MBITS, FMAX)  # (BLOCK_R, BLOCK // 32)
        v = _mx_descale(yb, byte[:, :, None])
        code = tl.reshape(_encode_fp8_rounded(v, FMAX, MBITS, EMIN, BIAS, FNUZ, NAN_CODE,
                                              SUB_SCALE, TIES_AWAY), (BLOCK_R, BLOCK))
        nb = N // 32
        kb = tl.arange(0, BLOCK // 32)
        tl.store(s_ptr + rows[:, None] * nb + kb[None, :], byte.to(tl.uint8),
                 mask=rmask[:, None] & (kb < nb)[None, :])
    else:
        amax = _mag_max(y, 1)  # (BLOCK_R,)
        if QMODE == 1:
            scale = _te_scale(amax, fmax, eps, POW2)
            tl.store(s_ptr + rows, tl.math.div_rn(1.0, scale), mask=rmask)
        else:
            scale = tl.zeros([BLOCK_R], dtype=tl.float32) + tl.load(scale_ptr)
        tl.store(amax_ptr + rows, amax, mask=rmask)
        code = _encode_fp8_sat(y * scale[:, None], fmax, SATURATE, MBITS, EMIN, BIAS, FNUZ,
                               NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE)
    tl.store(q_ptr + rows[:, None] * N + cols[None, :], code, mask=mask)


@triton.jit
def _norm_tile(x, g, b, mask, H_F, eps, RMS: tl.constexpr, BLOCK_R: tl.constexpr):
    """(y, mean, rsigma) of BLOCK_R rows at once, with norms.norm_row_fwd's row formulas
    (two-pass centered variance, IEEE div / sqrt); statistics are (BLOCK_R,)."""
    if RMS:
        xc = x
        mean = tl.zeros([BLOCK_R], dtype=tl.float32)
    else:
        mean = tl.math.div_rn(tl.sum(x, axis=1), H_F)
        xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.math.div_rn(tl.sum(xc * xc, axis=1), H_F)
    rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
    if RMS:
        y = xc * rs[:, None] * g[None, :]
    else:
        y = xc * rs[:, None] * g[None, :] + b[None, :]
    return y, mean, rs


@triton.jit
def _norm_quant_kernel(x_ptr, g_ptr, b_ptr, mean_ptr, rs_ptr, q_ptr, s_ptr, amax_ptr,
                       scale_ptr, n_rows, H, H_F, norm_eps, fmax, amax_eps,
                       RMS: tl.constexpr, ZERO_CENTERED: tl.constexpr, X_BF16: tl.constexpr,
                       W_BF16: tl.constexpr, QMODE: tl.constexpr, POW2: tl.constexpr,
                       SATURATE: tl.constexpr, TIES_AWAY: tl.constexpr, MODE: tl.constexpr,
                       EMAX: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr,
                       EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                       NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                       OVF_THRESH: tl.constexpr, OVF_TIE: tl.constexpr,
                       OVF_CODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    rmask = rows < n_rows
    mask = rmask[:, None] & cmask[None, :]
    x = load_f32(x_ptr, rows[:, None] * H + cols[None, :], mask, X_BF16)
    g = effective_weight(load_f32(g_ptr, cols, cmask, W_BF16), ZERO_CENTERED)
    if RMS:
        b = g  # unused
    else:
        b = load_f32(b_ptr, cols, cmask, W_BF16)
    y, mean, rs = _norm_tile(x, g, b, mask, H_F, norm_eps, RMS, BLOCK_R)
    if not RMS:
        tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rs_ptr + rows, rs, mask=rmask)
    _quantize_tile(y, rows, n_rows, H, q_ptr, s_ptr, amax_ptr, scale_ptr, fmax, amax_eps,
                   QMODE, POW2, SATURATE, TIES_AWAY, MODE, EMAX, FMAX, MBITS, EMIN, BIAS,
                   FNUZ, NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, BLOCK_R, BLOCK)


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, amax_ptr, scale_ptr, n_rows, N, fmax, amax_eps,
                      KIND: tl.constexpr, GATE: tl.constexpr, X_BF16: tl.constexpr,
                      QMODE: tl.constexpr, POW2: tl.constexpr, SATURATE: tl.constexpr,
                      TIES_AWAY: tl.constexpr, MODE: tl.constexpr, EMAX: tl.constexpr,
                      FMAX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                      BIAS: tl.constexpr, FNUZ: tl.constexpr, NAN_CODE: tl.constexpr,
                      SUB_SCALE: tl.constexpr, OVF_THRESH: tl.constexpr,
                      OVF_TIE: tl.constexpr, OVF_CODE: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK: tl.constexpr):
    """x is (rows, 2N) = [a | b] for a gated kind (y = f(a) * b, TE's order) or (rows, N)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    if GATE:
        offs = rows[:, None] * (2 * N) + cols[None, :]
        y = act_f32(load_f32(x_ptr, offs, mask, X_BF16), KIND) * \
            load_f32(x_ptr, offs + N, mask, X_BF16)
    else:
        y = act_f32(load_f32(x_ptr, rows[:, None] * N + cols[None, :], mask, X_BF16), KIND)
    _quantize_tile(y, rows, n_rows, N, q_ptr, s_ptr, amax_ptr, scale_ptr, fmax, amax_eps,
                   QMODE, POW2, SATURATE, TIES_AWAY, MODE, EMAX, FMAX, MBITS, EMIN, BIAS,
                   FNUZ, NAN_CODE, SUB_SCALE, OVF_THRESH, OVF_TIE, OVF_CODE, BLOCK_R, BLOCK)


# ---- host side -------------------------------------------------------------------------

def _qmode(recipe) -> int:
    if recipe.family is Family.MX:
        return _MX
    return _GIVEN if recipe.scale_given else _PER_ROW


def _tile(rows: int, n: int) -> dict:
    """Launch shape: whole rows of BLOCK = next_pow2(n) lanes, as many rows per program as
    fit in _TILE elements (at least one)."""
    block = max(1, triton.next_power_of_2(n))
    block_r = max(1, min(_TILE // block, triton.next_power_of_2(max(rows, 1))))
    return dict(BLOCK=block, BLOCK_R=block_r, num_warps=min(16, max(1, block_r * block // 256)))


def _constants(recipe, rows: int, n: int) -> dict:
    fmt = get_format(recipe.fmt)
    mode = _qmode(recipe)
    consts = dict(_fmt_constants(fmt), **_overflow_constants(fmt), **_tile(rows, n),
                  QMODE=mode)
    if mode == _MX:  # MX always saturates (OCP)
        consts.update(_mx_scale_constants(fmt.name, recipe.scale_rounding), POW2=False,
                      SATURATE=True,
                      TIES_AWAY=recipe.element_rounding is ElementRounding.TIES_AWAY)
    else:  # FP8 elements round to nearest even; a given scale takes no pow2 rounding
        consts.update(MODE=0, EMAX=fmt.emax, FMAX=float(fmt.max), TIES_AWAY=False,
                      POW2=mode == _PER_ROW and recipe.force_pow2_scales,
                      SATURATE=recipe.saturation is Saturation.SATURATE)
    return consts


def _grid(consts: dict, rows: int) -> tuple[int]:
    return (triton.cdiv(rows, consts["BLOCK_R"]),)


class _Outputs:
    """Device buffers of one fused quantize, laid out as tealite.quantize's outputs."""

    def __init__(self, recipe, rows: int, n: int, device):
        self.recipe, self.rows, self.n = recipe, rows, n
        self.mode = _qmode(recipe)
        self.codes = torch.empty((rows, n), dtype=torch.uint8, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        if self.mode == _MX:
            self.scales = torch.empty((rows, n // MX_BLOCK), dtype=torch.uint8, device=device)
            self.amax = torch.empty(1, **f32)  # unused
        else:
            self.scales = torch.empty(rows, **f32) if self.mode == _PER_ROW else \
                torch.empty(1, **f32)  # unused
            self.amax = torch.empty(rows, **f32)

    def kernel_args(self, scale):
        return (self.codes, self.scales, self.amax, scale if scale is not None else self.amax)

    def result(self, scale) -> QuantizedTensor:
        fmt = get_format(self.recipe.fmt)
        q = QuantizedTensor(recipe=self.recipe, shape=(self.rows, self.n),
                            data=self.codes.view(fmt.torch_dtype))
        if self.mode == _MX:
            q.scale_inv = self.scales
        elif self.mode == _PER_ROW:
            q.scale_inv, q.amax = self.scales, self.amax
        else:
            # torch's reciprocal is an IEEE division on the CPU, CUDA and ROCm (no fast-math
            # builds), so this is fl32(1 / scale), as tealite.quantize stores it.
            q.scale_inv = torch.reciprocal(scale)
            q.amax = self.amax.amax().reshape(1) if self.rows else \
                torch.zeros(1, dtype=torch.float32, device=scale.device)
        if self.recipe.amax_granularity is None:  # the recipe reports none
            q.amax = None
        return q


def _quant_args(recipe) -> tuple[float, float]:
    """Runtime scalars of the scale rule: (format max, amax_epsilon; none for a given scale
    or MX)."""
    per_row = recipe.family is Family.FP8 and not recipe.scale_given
    return float(get_format(recipe.fmt).max), float(recipe.amax_epsilon) if per_row else 0.0


def _recipe_reason(recipe) -> str | None:
    """Why these kernels do not fuse ``recipe`` (None: they do), from its facts: what every
    Triton quantizer requires, then per-row scales (a fused kernel sees one row at a time)."""
    decided, why = shared_reason(recipe, fused=True)
    if decided:
        return why
    return outside(recipe, "triton fused quantize", scale_granularity=(Granularity.ROW,),
                   amax_granularity=(Granularity.ROW, None))


def _why_not(params) -> str | None:
    recipe = params.get("recipe")
    why = _recipe_reason(recipe)
    if why:
        return why
    if params["fmt"] == "e2m1":
        return "MXFP4 (e2m1 elements) is not fused here: these kernels encode FP8 elements"
    n = params["n_out"]
    limit = PLATFORM.get().max_row_in_registers
    if n > limit:
        return f"row of {n} outputs > {limit} (whole rows are held in registers)"
    return None


def _norm(x, gamma, beta, recipe, eps, zero_centered_gamma, scale, rms):
    hidden = x.shape[-1]
    rows = math.prod(x.shape[:-1])
    out = _Outputs(recipe, rows, hidden, x.device)
    mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    rs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows:
        consts = _constants(recipe, rows, hidden)
        g = gamma.contiguous()
        b = g if beta is None else beta.contiguous()
        _norm_quant_kernel[_grid(consts, rows)](
            as_kernel_arg(x.contiguous()), as_kernel_arg(g), as_kernel_arg(b), mean, rs,
            *out.kernel_args(scale), rows, hidden, float(hidden), eps,
            *_quant_args(recipe), RMS=rms, ZERO_CENTERED=zero_centered_gamma,
            X_BF16=x.dtype == torch.bfloat16, W_BF16=gamma.dtype == torch.bfloat16, **consts)
    return out.result(scale), mean, rs


@BACKEND.implements(Op.LAYERNORM_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not,
                    numerics=_NUMERICS)
def layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
    return _norm(x, gamma, beta, recipe, eps, zero_centered_gamma, scale, rms=False)


@BACKEND.implements(Op.RMSNORM_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not,
                    numerics=_NUMERICS)
def rmsnorm_fwd_quantize(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
    q, _, rs = _norm(x, gamma, None, recipe, eps, zero_centered_gamma, scale, rms=True)
    return q, rs


@BACKEND.implements(Op.ACT_FWD_QUANTIZE, dtypes=_FLOATS, devices=DEVICES, check=_why_not,
                    numerics=_NUMERICS)
def act_fwd_quantize(x, recipe, *, kind, scale):
    gated = kind in GATED
    n = x.shape[-1] // 2 if gated else x.shape[-1]
    rows = math.prod(x.shape[:-1])
    out = _Outputs(recipe, rows, n, x.device)
    # An empty row (n == 0) still gets its amax (0) and per-row scale: launch with no lanes.
    if rows and (n or out.mode != _MX):
        consts = _constants(recipe, rows, n)
        _act_quant_kernel[_grid(consts, rows)](
            as_kernel_arg(x.contiguous()), *out.kernel_args(scale), rows, n,
            *_quant_args(recipe), KIND=GATED.get(kind, kind), GATE=gated,
            X_BF16=x.dtype == torch.bfloat16, **consts)
    return out.result(scale)
