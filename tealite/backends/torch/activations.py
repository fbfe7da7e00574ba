"""Activations: forward with torch's own pointwise functions in fp32, backward by autograd
through those same fp32 functions (one rounding to the output dtype at the end)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tealite.backends.torch import BACKEND
from tealite.types import GATED, Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}

_POINTWISE_FP32 = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x) ** 2,
}


def _apply(x32: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in GATED:
        a, b = x32.chunk(2, dim=-1)
        return _POINTWISE_FP32[GATED[kind]](a) * b
    return _POINTWISE_FP32[kind](x32)


@BACKEND.implements(Op.ACT_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def act_fwd(x, *, kind):
    return _apply(x.float(), kind).to(x.dtype)


def _grad_fp32(dy, x, kind) -> torch.Tensor:
    with torch.enable_grad():
        x32 = x.detach().float().requires_grad_(True)
        (dx,) = torch.autograd.grad(_apply(x32, kind), x32, dy.float())
    return dx


@BACKEND.implements(Op.ACT_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def act_bwd(dy, x, *, kind):
    return _grad_fp32(dy, x, kind).to(x.dtype)


@BACKEND.implements(Op.DBIAS_DACT, dtypes=_FLOATS, numerics=_NUMERICS)
def dbias_dact(dy, x, *, kind):
    dx32 = _grad_fp32(dy, x, kind)
    dbias = dx32.reshape(-1, dx32.shape[-1]).sum(dim=0)
    return dx32.to(x.dtype), dbias.to(x.dtype)
