"""LayerNorm / RMSNorm in fp32 internal math, written out (no F.layer_norm) so that the
statistics returned are exactly the ones the output was computed with."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}


def _weight(gamma: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    g = gamma.float()
    return g + 1.0 if zero_centered_gamma else g


def _sum_rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).sum(dim=0)


@BACKEND.implements(Op.LAYERNORM_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def layernorm_fwd(x, gamma, beta, *, eps, zero_centered_gamma):
    x32 = x.float()
    mean = x32.mean(dim=-1)
    centered = x32 - mean.unsqueeze(-1)
    var = (centered * centered).mean(dim=-1)
    rsigma = torch.rsqrt(var + eps)
    y = centered * rsigma.unsqueeze(-1) * _weight(gamma, zero_centered_gamma) + beta.float()
    return y.to(x.dtype), mean, rsigma


@BACKEND.implements(Op.LAYERNORM_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def layernorm_bwd(dy, x, mean, rsigma, gamma, *, zero_centered_gamma):
    rs = rsigma.unsqueeze(-1)
    xhat = (x.float() - mean.unsqueeze(-1)) * rs
    dy32 = dy.float()
    gdy = dy32 * _weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - gdy.mean(dim=-1, keepdim=True)
               - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    dgamma = _sum_rows(dy32 * xhat)
    dbeta = _sum_rows(dy32)
    return dx.to(x.dtype), dgamma.to(gamma.dtype), dbeta.to(gamma.dtype)


@BACKEND.implements(Op.RMSNORM_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    x32 = x.float()
    rsigma = torch.rsqrt((x32 * x32).mean(dim=-1) + eps)
    y = x32 * rsigma.unsqueeze(-1) * _weight(gamma, zero_centered_gamma)
    return y.to(x.dtype), rsigma


@BACKEND.implements(Op.RMSNORM_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def rmsnorm_bwd(dy, x, rsigma, gamma, *, zero_centered_gamma):
    rs = rsigma.unsqueeze(-1)
    xhat = x.float() * rs
    dy32 = dy.float()
    gdy = dy32 * _weight(gamma, zero_centered_gamma)
    dx = rs * (gdy - xhat * (gdy * xhat).mean(dim=-1, keepdim=True))
    dgamma = _sum_rows(dy32 * xhat)
    return dx.to(x.dtype), dgamma.to(gamma.dtype)


def _padded_columns(y: torch.Tensor, hidden_out: int) -> torch.Tensor:
    """``y`` (..., H) widened with exact zeros to (..., hidden_out)."""
    if hidden_out == y.shape[-1]:
        return y
    out = y.new_zeros((*y.shape[:-1], hidden_out))
    out[..., :y.shape[-1]] = y
    return out


@BACKEND.implements(Op.ADD_RMSNORM_PAD, dtypes=_FLOATS, numerics=_NUMERICS)
def add_rmsnorm_pad(x, weight, *, eps, residual, pad_to_multiple, hidden_out):
    r = x.float() if residual is None else x.float() + residual.float()
    rsigma = torch.rsqrt((r * r).mean(dim=-1) + eps)
    y = (r * rsigma.unsqueeze(-1) * weight.float()).to(x.dtype)
    res_out = None if residual is None else r.to(residual.dtype)
    return _padded_columns(y, hidden_out), res_out
