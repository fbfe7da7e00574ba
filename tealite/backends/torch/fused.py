"""Fused norm / activation -> quantize, by composition in fp32: the torch backend's own norm
(or activation) run on fp32 copies of the inputs, so its y is the fp32 y and is never rounded
to x's dtype, then the torch backend's quantize of that fp32 y (rows, N).

Upcasting x, gamma and beta to fp32 first is exact, and the torch norm / activation code does
its math in fp32 anyway; with fp32 inputs its final ``.to(x.dtype)`` is the identity.  So y,
mean and rsigma are bit-identical to what ``layernorm_fwd`` computes before its output rounding.

:func:`quantize_rows_fp32` is public: the mutation library (``tealite_verify/mutate/``)
composes it with the torch norm to build the unfused (double-rounding) mutant, so it is part
of this backend's contract with the harness.
"""
from __future__ import annotations

import math

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch import activations as _acts
from tealite.backends.torch import norms as _norms
from tealite.backends.torch import quantize as _quant
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}


def _why_not(params) -> str | None:
    return _quant.recipe_reason(params["recipe"])


def quantize_rows_fp32(y32: torch.Tensor, recipe, scale):
    """Rowwise quantization of the fp32 y as (rows, N), exactly as tealite.quantize does it."""
    y2 = y32.reshape(math.prod(y32.shape[:-1]), y32.shape[-1])
    return _quant.quantize(y2.contiguous(), recipe, rowwise=True, columnwise=False, scale=scale)


@BACKEND.implements(Op.LAYERNORM_FWD_QUANTIZE, dtypes=_FLOATS, check=_why_not, numerics=_NUMERICS)
def layernorm_fwd_quantize(x, gamma, beta, recipe, *, eps, zero_centered_gamma, scale):
    y32, mean, rsigma = _norms.layernorm_fwd(x.float(), gamma.float(), beta.float(), eps=eps,
                                             zero_centered_gamma=zero_centered_gamma)
    return quantize_rows_fp32(y32, recipe, scale), mean, rsigma


@BACKEND.implements(Op.RMSNORM_FWD_QUANTIZE, dtypes=_FLOATS, check=_why_not, numerics=_NUMERICS)
def rmsnorm_fwd_quantize(x, gamma, recipe, *, eps, zero_centered_gamma, scale):
    y32, rsigma = _norms.rmsnorm_fwd(x.float(), gamma.float(), eps=eps,
                                     zero_centered_gamma=zero_centered_gamma)
    return quantize_rows_fp32(y32, recipe, scale), rsigma


@BACKEND.implements(Op.ACT_FWD_QUANTIZE, dtypes=_FLOATS, check=_why_not, numerics=_NUMERICS)
def act_fwd_quantize(x, recipe, *, kind, scale):
    y32 = _acts.act_fwd(x.float(), kind=kind)
    return quantize_rows_fp32(y32, recipe, scale)
