"""Quantize / dequantize / amax for every recipe in :mod:`tealite.recipes`.

``quantize(x, recipe, rowwise=True, columnwise=False)`` takes a 2-D x (M, K) (flatten leading
dims first, as TE does) of fp32 / bf16 / fp16 and returns a :class:`QuantizedTensor`:

=====================  ==================================================================
field                  contents
=====================  ==================================================================
``data``               rowwise codes (M, K) in the format's torch dtype; for e2m1 uint8
                       (M, ceil(K/2)), two codes per byte, low nibble = even element
``scale_inv``          rowwise dequantization scales: float32 (1,) per tensor, (M,) per row,
                       (ceil(M/bm), ceil(K/bn)) per block; MX: uint8 E8M0 (M, ceil(K/32))
``columnwise_data``    the rowwise quantization of x.T, stored transposed: (K, M) codes
``columnwise_scale_inv``  its scales, laid out as for rowwise on x.T
``amax``               float32 amax of x: (1,) per tensor / delayed, (M,) per row; None for
                       block and MX recipes, and for current scaling under AITER's scale
                       rule (``FP8ScaleRule.AMAX_OVER_FMAX``: its kernels report none)
=====================  ==================================================================

``DelayedScaling`` needs ``scale`` (float32, shape (1,)): the scale from the amax history.
MX recipes need the blocked dim (K rowwise, M columnwise) to be a multiple of 32, and e2m1 an
even one, unless ``pad=True``: a partial last block then takes its amax over its real elements
and an odd e2m1 row is padded with a zero nibble.  Block-scaled FP8 always allows partial
edge blocks (TE does).  NaN in x: amax is NaN-propagating; per-tensor/row/block scales fall back
to 1 (TE's rule) and the NaN element's code is the format's NaN; an MX block containing NaN or
Inf gets the NaN scale 0xFF and its codes are unspecified.

``dequantize(q, out_dtype)`` returns codes x scale (fp32 math) for the rowwise data, or for the
columnwise data (shape (K, M)) with ``columnwise=True``.
"""
from __future__ import annotations

import torch

import tealite.recipes as R
import tealite.registry as registry
from tealite._checks import FLOAT_DTYPES, check_dtype_in, check_shape, check_tensor, require
from tealite.formats import get_format
from tealite.types import Op, QuantizedTensor  # noqa: F401  (QuantizedTensor re-exported)


def check_given_scale(recipe, scale, device: torch.device) -> None:
    """``scale`` is given exactly when the recipe takes its scale as an input (DelayedScaling:
    the scale its amax history produced), as float32 of shape (1,) on ``device``."""
    if recipe.scale_given:
        require(scale is not None,
                f"{type(recipe).__name__} needs scale= (float32, shape (1,))")
        check_tensor("scale", scale, dtypes=(torch.float32,))
        check_shape("scale", scale, (1,), "one per-tensor scale")
        require(scale.device == device, f"scale must be on x's device {device}, "
                                        f"got {scale.device}")
    else:
        given = ", ".join(t.__name__ for t in R.RECIPES if t.scale_given)
        require(scale is None, f"scale= is only for {given}, not {type(recipe).__name__}")


def _check_mx_dims(recipe, m: int, k: int, rowwise: bool, columnwise: bool, pad: bool) -> None:
    if pad or recipe.scale_granularity is not R.Granularity.MX_BLOCK:
        return
    packed = get_format(recipe.fmt).packed
    for flag, name, size in ((rowwise, "K (x.shape[1]) for rowwise", k),
                             (columnwise, "M (x.shape[0]) for columnwise", m)):
        if flag:
            require(size % recipe.block == 0,
                    f"{name} MX quantization must be a multiple of {recipe.block}, got {size} "
                    "(pass pad=True to quantize a partial last block)")
            require(not packed or size % 2 == 0,
                    f"{name} e2m1 packing must be even, got {size} (pass pad=True)")


def quantize(x: torch.Tensor, recipe, *, rowwise: bool = True, columnwise: bool = False,
             scale: torch.Tensor | None = None, pad: bool = False,
             backend: str | None = None) -> QuantizedTensor:
    check_tensor("x", x, ndim=2)
    # Every recipe class R.RECIPES registers (read per call: a CustomRecipe is resolved to one
    # per tensor before it gets here).
    require(isinstance(recipe, R.RECIPES),
            f"recipe must be one of {[t.__name__ for t in R.RECIPES]}, got "
            f"{type(recipe).__name__}")
    require(rowwise or columnwise, "at least one of rowwise / columnwise must be True")
    check_given_scale(recipe, scale, x.device)
    m, k = x.shape
    _check_mx_dims(recipe, m, k, rowwise, columnwise, pad)
    params = dict(op=Op.QUANTIZE, dtype=x.dtype, recipe=recipe, kind=recipe.kind, fmt=recipe.fmt,
                  m=m, k=k, rowwise=rowwise, columnwise=columnwise,
                  device=registry.device_kind(x.device))
    impl = registry.dispatch(Op.QUANTIZE, params, backend)
    return impl.fn(x, recipe, rowwise=rowwise, columnwise=columnwise, scale=scale)


def dequantize(q: QuantizedTensor, *, out_dtype: torch.dtype = torch.float32,
               columnwise: bool = False, backend: str | None = None) -> torch.Tensor:
    require(isinstance(q, QuantizedTensor), f"q must be a QuantizedTensor, got {type(q).__name__}")
    check_dtype_in("out_dtype", out_dtype, FLOAT_DTYPES)
    data = q.columnwise_data if columnwise else q.data
    which = "columnwise" if columnwise else "rowwise"
    require(data is not None, f"q has no {which} data (quantize with {which}=True)")
    params = dict(dtype=out_dtype, recipe=q.recipe, kind=q.recipe.kind, fmt=q.recipe.fmt,
                  device=registry.device_kind(data.device))
    impl = registry.dispatch(Op.DEQUANTIZE, params, backend)
    return impl.fn(q, out_dtype=out_dtype, columnwise=columnwise)


def amax(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """max |x| as a float32 tensor of shape (1,), NaN-propagating (0 for an empty x)."""
    check_tensor("x", x)
    params = dict(dtype=x.dtype, numel=x.numel(), device=registry.device_kind(x.device))
    return registry.dispatch(Op.AMAX, params, backend).fn(x)


def delayed_scaling_update(amax_history: torch.Tensor, scale: torch.Tensor, recipe, *,
                           backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One DelayedScaling step, as TE's amax_and_scale_update.

    ``amax_history`` (H,) float32 holds the newest amax in slot 0 (written by the cast);
    ``scale`` (1,) float32 is the scale in use.  Returns (new_history, new_scale)::

        amax      = history[0] if amax_compute_algo == "most_recent" else max(history)
        new_scale = (fmt.max / amax) / 2^margin      (two fp32 divisions)
        new_scale = scale  where amax is 0, negative, NaN or Inf
        new_history = roll(history, -1); new_history[0] = 0

    max(history) is NaN-propagating.
    """
    require(isinstance(recipe, R.DelayedScaling),
            f"recipe must be DelayedScaling, got {type(recipe).__name__}")
    check_tensor("amax_history", amax_history, ndim=1, dtypes=(torch.float32,))
    check_shape("amax_history", amax_history, (recipe.amax_history_len,),
                "recipe.amax_history_len")
    check_tensor("scale", scale, dtypes=(torch.float32,))
    check_shape("scale", scale, (1,), "one per-tensor scale")
    require(scale.device == amax_history.device, "scale and amax_history must share a device")
    params = dict(dtype=torch.float32, fmt=recipe.fmt,
                  device=registry.device_kind(scale.device))
    impl = registry.dispatch(Op.DELAYED_SCALING_UPDATE, params, backend)
    return impl.fn(amax_history, scale, recipe)
