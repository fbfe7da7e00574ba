"""FP8 quantization kernels (per-tensor / per-row current scaling, delayed scaling) and amax.

Codes come from the integer encoders in ``_codecs`` (see there why not ``.to(fp8)``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite import recipes as R
from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._codecs import _encode_fp8, _fmt_constants, _te_scale
from tealite.backends.triton._io import as_kernel_arg, load_f32
from tealite.formats import Saturation, get_format
from tealite.ops.quantize import QuantizedTensor

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK = 1024
_WARPS = 4
_MAX_ROW = 65536


@triton.jit
def _partial_amax_kernel(x_ptr, out_ptr, n, X_BF16: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = load_f32(x_ptr, offs, offs < n, X_BF16)
    a = tl.max(tl.abs(x), axis=0)
    # tl.max drops NaN; the amax contract propagates it.
    has_nan = tl.max((x != x).to(tl.int32), axis=0) > 0
    tl.store(out_ptr + pid, tl.where(has_nan, float("nan"), a))


@triton.jit
def _quantize_tensor_kernel(x_ptr, q_ptr, scale_ptr, amax_ptr, sinv_ptr, n, fmax, eps,
                            GIVEN: tl.constexpr, POW2: tl.constexpr, MBITS: tl.constexpr,
                            EMIN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr,
                            NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                            X_BF16: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if GIVEN:
        scale = tl.load(scale_ptr)
    else:
        scale = _te_scale(tl.load(amax_ptr), fmax, eps, POW2)
    if pid == 0:
        tl.store(sinv_ptr, tl.math.div_rn(1.0, scale))
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = load_f32(x_ptr, offs, mask, X_BF16)
    code = _encode_fp8(x * scale, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE)
    tl.store(q_ptr + offs, code, mask=mask)


@triton.jit
def _quantize_row_kernel(x_ptr, q_ptr, sinv_ptr, amax_ptr, K, fmax, eps, POW2: tl.constexpr,
                         MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                         FNUZ: tl.constexpr, NAN_CODE: tl.constexpr, SUB_SCALE: tl.constexpr,
                         X_BF16: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    x = load_f32(x_ptr, row * K + cols, mask, X_BF16)
    amax = tl.max(tl.abs(x), axis=0)
    amax = tl.where(tl.max((x != x).to(tl.int32), axis=0) > 0, float("nan"), amax)
    scale = _te_scale(amax, fmax, eps, POW2)
    tl.store(amax_ptr + row, amax)
    tl.store(sinv_ptr + row, tl.math.div_rn(1.0, scale))
    code = _encode_fp8(x * scale, fmax, MBITS, EMIN, BIAS, FNUZ, NAN_CODE, SUB_SCALE)
    tl.store(q_ptr + row * K + cols, code, mask=mask)


def _amax(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    if n == 0:
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    grid = triton.cdiv(n, _BLOCK)
    partial = torch.empty(grid, dtype=torch.float32, device=x.device)
    _partial_amax_kernel[(grid,)](as_kernel_arg(x.contiguous().reshape(-1)), partial, n,
                                  X_BF16=x.dtype == torch.bfloat16, BLOCK=_BLOCK,
                                  num_warps=_WARPS)
    return partial.amax().reshape(1)  # NaN-propagating, and no host synchronisation


def _rowwise(x: torch.Tensor, recipe, scale, amax):
    """(codes, scale_inv, row amax or None) of x; ``amax`` is the tensor amax (per-tensor)."""
    fmt = get_format(recipe.fmt)
    m, k = x.shape
    x = x.contiguous()
    codes = torch.empty((m, k), dtype=torch.uint8, device=x.device)
    consts = dict(_fmt_constants(fmt), X_BF16=x.dtype == torch.bfloat16)
    xk = as_kernel_arg(x)
    pow2 = getattr(recipe, "force_pow2_scales", False)
    eps = getattr(recipe, "amax_epsilon", 0.0)
    if isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row":
        sinv = torch.empty(m, dtype=torch.float32, device=x.device)
        row_amax = torch.empty(m, dtype=torch.float32, device=x.device)
        if m:  # K == 0 still needs the scale rule (amax 0, or amax_epsilon)
            block = max(1, triton.next_power_of_2(k))
            _quantize_row_kernel[(m,)](xk, codes, sinv, row_amax, k, fmt.max, eps, POW2=pow2,
                                       BLOCK=block, num_warps=min(16, max(4, block // 256)),
                                       **consts)
        return codes.view(fmt.torch_dtype), sinv, row_amax
    sinv = torch.empty(1, dtype=torch.float32, device=x.device)
    given = isinstance(recipe, R.DelayedScaling)
    n = x.numel()
    grid = max(1, triton.cdiv(n, _BLOCK))
    _quantize_tensor_kernel[(grid,)](xk.reshape(-1), codes.reshape(-1), scale if given else sinv,
                                     sinv if given else amax, sinv, n, fmt.max, eps,
                                     GIVEN=given, POW2=pow2, BLOCK=_BLOCK, num_warps=_WARPS,
                                     **consts)
    return codes.view(fmt.torch_dtype), sinv, None


def _why_not(params) -> str | None:
    recipe = params["recipe"]
    if not isinstance(recipe, (R.Float8CurrentScaling, R.DelayedScaling)):
        return "triton quantize covers FP8 per-tensor / per-row / delayed scaling so far"
    if recipe.saturation is not Saturation.SATURATE:
        return "only saturating casts"
    if isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row" and (
            params["k"] > _MAX_ROW or (params["columnwise"] and params["m"] > _MAX_ROW)):
        return f"per-row scaling keeps a row in registers (<= {_MAX_ROW})"
    return None


@BACKEND.implements("quantize", dtypes=_FLOATS, devices=DEVICES, check=_why_not)
def quantize(x, recipe, *, rowwise, columnwise, scale):
    out = QuantizedTensor(recipe=recipe, shape=tuple(x.shape))
    per_row = isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row"
    amax = None if per_row else _amax(x)  # one pass, shared by both directions
    if rowwise:
        out.data, out.scale_inv, row_amax = _rowwise(x, recipe, scale, amax)
    if columnwise:
        out.columnwise_data, out.columnwise_scale_inv, _ = _rowwise(x.t().contiguous(), recipe,
                                                                    scale, amax)
    if per_row:
        # The row amax comes from the rowwise kernel; columnwise-only needs its own pass.
        out.amax = row_amax if rowwise else _rowwise(x, recipe, scale, None)[2]
    else:
        out.amax = amax
    return out


@BACKEND.implements("amax", dtypes=_FLOATS, devices=DEVICES)
def amax(x):
    return _amax(x)
