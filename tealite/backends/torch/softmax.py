"""TE's fused softmax kinds in fp32 math (every kind, fp16 / bf16 / fp32, any device), written
out as TE's kernels compute them: scale in fp32, fill, row max, exp(s - max), row sum,
division; fully masked rows zeroed (tealite/ops/softmax.py states the contract)."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.types import SOFTMAX_MASK_FILL, Op, softmax_visible

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# torch.exp on fp32: within 1 ulp on the CPU (SLEEF / libm) and on CUDA (expf, 2 ulp at most
# per CUDA's programming guide); 2 covers both.
_NUMERICS = {"compute_dtype": torch.float32, "exp_ulps": 2}


def _scaled_filled(x32: torch.Tensor, kind: str, scale: float, mask):
    """(filled logits, kept positions or None) of one batch of rows."""
    s = x32 * scale
    if kind == "scaled_masked":
        return s.masked_fill(mask, SOFTMAX_MASK_FILL), None
    visible = softmax_visible(kind, s.shape[-2], s.shape[-1], s.device)
    if visible is None:
        return s, None
    fill = float("-inf") if kind == "scaled_upper_triang" else SOFTMAX_MASK_FILL
    return s.masked_fill(~visible, fill), visible


@BACKEND.implements(Op.SOFTMAX_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def softmax_fwd(x, kind, *, scale, mask):
    if x.numel() == 0:
        return torch.empty_like(x)
    s, visible = _scaled_filled(x.float(), kind, scale, mask)
    row_max = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - row_max)
    y = e / e.sum(dim=-1, keepdim=True)
    if kind == "scaled_masked":
        y = torch.where(row_max == SOFTMAX_MASK_FILL, 0.0, y)  # TE's fully-masked rule
    if visible is not None:
        y = torch.where(visible, y, 0.0)
    return y.to(x.dtype)


@BACKEND.implements(Op.SOFTMAX_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def softmax_bwd(dy, y, kind, *, scale):
    if y.numel() == 0:
        return torch.empty_like(dy)
    y32, dy32 = y.float(), dy.float()
    visible = softmax_visible(kind, y.shape[-2], y.shape[-1], y.device)
    if visible is not None:  # the causal kinds read only the kept positions
        y32 = torch.where(visible, y32, 0.0)
        dy32 = torch.where(visible, dy32, 0.0)
    dyy = dy32 * y32
    dx = scale * (dyy - y32 * dyy.sum(dim=-1, keepdim=True))
    return dx.to(dy.dtype)
