"""TransformerEngine's fused softmax kinds, forward and backward, over the last dim (keys).

Kinds (:data:`tealite.types.SOFTMAX_KINDS`), as TE's ``transformer_engine/common/fused_softmax``
kernels compute them, with ``s = scale * x`` (in fp32):

``scaled``                 x (b, h, sq, sk):  y = softmax(s) along sk.
``scaled_masked``          x (b, h, sq, sk), ``mask`` bool (b or 1, 1, sq, sk), True = masked
                           out.  A masked logit is *replaced* by -10000 (not scaled; TE's
                           kernel writes ``-10000.0``), and the softmax is taken over the
                           whole row, filled entries included.  A row whose maximum is
                           -10000 (fully masked, or every kept logit <= -10000) outputs zeros
                           (TE multiplies it by 0).
``scaled_upper_triang``    x (attn_batches, sq, sk), sq == sk: causal; key j is kept for query
                           i when j <= i.  Hidden logits are -inf (they take no part), and
                           their outputs are 0.  No row is empty (the diagonal is kept).
``scaled_aligned_causal``  x (b, h, sq, sk), any sq and sk: causal aligned to the bottom-right
                           corner, key j kept when j <= i + (sk - sq).  Hidden logits are
                           filled with -10000 and *do* enter the max and the sum (as TE's
                           kernel does: invisible unless the kept logits are near -10000);
                           their outputs are 0.  With sq > sk the first sq - sk rows keep no
                           key and output zeros.

The softmax subtracts the row maximum before exp (so logits of any size that fp32 holds are
safe) and returns ``y`` in x's dtype.

Backward (every kind): ``dx = scale * (dy * y - y * sum(dy * y))``, i.e.
``scale * y * (dy - sum_j dy_j y_j)`` per row, in dy's dtype.  The causal kinds read only
the kept positions (dx is 0 elsewhere, whatever y holds there); the others read the whole row
(a masked position of the forward's y is 0 or tiny and contributes accordingly).

dtypes: float16, bfloat16 (TE's kernels) and float32 (torch / triton backends).  The scale is
applied in fp32 as given, rounded once to float32.  (TE's forward dispatchers take the scale
as ``const input_t``: a half / bf16 conversion of it, which a backend wrapping TE would
declare; tealite's contract is the fp32 scale.)
"""
from __future__ import annotations

import torch

import tealite.registry as registry
from tealite._checks import (check_choice, check_finite_number, check_same_device,
                             check_shape, check_tensor, require)
from tealite.types import SOFTMAX_KINDS, Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check_x(name: str, x, kind: str) -> None:
    check_choice("kind", kind, SOFTMAX_KINDS)
    ndim = 3 if kind == "scaled_upper_triang" else 4
    layout = "(attn_batches, sq, sk)" if ndim == 3 else "(b, h, sq, sk)"
    check_tensor(name, x, dtypes=_FLOATS)
    require(x.dim() == ndim, f"{name} must be {ndim}-D {layout} for kind {kind!r}, "
                             f"got shape {tuple(x.shape)}")
    if kind == "scaled_upper_triang":
        require(x.shape[-2] == x.shape[-1],
                f"{name} must be square in its last two dims (sq == sk) for kind "
                f"'scaled_upper_triang' (use 'scaled_aligned_causal' for sq != sk), got "
                f"shape {tuple(x.shape)}")


def _check_mask(mask, x, kind: str) -> None:
    if kind != "scaled_masked":
        require(mask is None, f"mask must be None for kind {kind!r} (only 'scaled_masked' "
                              f"takes a mask), got a {type(mask).__name__}")
        return
    require(mask is not None, "mask is required for kind 'scaled_masked' (a bool tensor "
                              "(b or 1, 1, sq, sk), True = masked out)")
    check_tensor("mask", mask, ndim=4, dtypes=(torch.bool,))
    b, _, sq, sk = x.shape
    require(mask.shape[0] in (b, 1) and tuple(mask.shape[1:]) == (1, sq, sk),
            f"mask must have shape ({b} or 1, 1, {sq}, {sk}) (TE's (b or 1, 1, sq, sk)), got "
            f"{tuple(mask.shape)}")


def _params(x, kind: str, scale: float, mask, **tensors) -> dict:
    device = check_same_device(x=x, mask=mask, **tensors)
    sq, sk = x.shape[-2], x.shape[-1]
    return dict(dtype=x.dtype, kind=kind, scale=scale, rows=x.numel() // sk if sk else 0,
                sq=sq, sk=sk,
                mask_batch=None if mask is None else int(mask.shape[0]),
                device=registry.device_kind(device))


def softmax_fwd(x, kind: str, *, scale: float, mask=None, backend: str | None = None):
    """y = softmax(scale * x [masked]) over the last dim, in x's dtype (module docstring)."""
    _check_x("x", x, kind)
    _check_mask(mask, x, kind)
    scale = check_finite_number("scale", scale)
    params = _params(x, kind, scale, mask)
    impl = registry.dispatch(Op.SOFTMAX_FWD, params, backend)
    return impl.fn(x, kind, scale=scale, mask=mask)


def softmax_bwd(dy, y, kind: str, *, scale: float, backend: str | None = None):
    """dx = scale * y * (dy - sum(dy * y)) per row, in dy's dtype (module docstring)."""
    _check_x("y", y, kind)
    check_tensor("dy", dy, dtypes=(y.dtype,))
    check_shape("dy", dy, y.shape, "same as y")
    scale = check_finite_number("scale", scale)
    params = _params(y, kind, scale, None, dy=dy)
    impl = registry.dispatch(Op.SOFTMAX_BWD, params, backend)
    return impl.fn(dy, y, kind, scale=scale)


__all__ = ["softmax_fwd", "softmax_bwd"]
