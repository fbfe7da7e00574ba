"""Activations, forward and backward, including TE's gated forms and fused dbias + dact.

Pointwise kinds (output shape = input shape):

============  ==========================================================
``gelu``      x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
``gelu_tanh`` 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
``relu``      max(x, 0)             (derivative at 0 taken as 0)
``silu``      x * sigmoid(x)
``qgelu``     x * sigmoid(1.702 x)  (quick GELU)
``srelu``     relu(x)^2             (squared ReLU)
============  ==========================================================

Gated kinds take x of shape (..., 2N) and return (..., N).  As in TransformerEngine, the
*first* half ``a = x[..., :N]`` goes through the activation and the *second* half
``b = x[..., N:]`` is the linear (gate) multiplier::

    swiglu = silu(a) * b,  geglu = gelu(a) * b,  reglu = relu(a) * b,
    qgeglu = qgelu(a) * b, sreglu = srelu(a) * b

Backward takes ``dy`` shaped like the forward output and returns ``dx`` shaped like ``x``
(for gated kinds: [d a, d b] concatenated on the last dim).  ``dbias_dact`` returns
``(dx, dbias)`` with ``dbias = dx summed over every leading dim`` (shape (H,), x's dtype), for
the pointwise kinds only.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import tealite.registry as registry
from tealite._checks import check_choice, check_same_device, check_shape, check_tensor, require
from tealite.types import ACTIVATION_KINDS as KINDS
from tealite.types import GATED, POINTWISE, Op


class DbiasDact(NamedTuple):
    dx: torch.Tensor
    dbias: torch.Tensor


def output_shape(x_shape, kind: str) -> tuple[int, ...]:
    if kind in GATED:
        return (*x_shape[:-1], x_shape[-1] // 2)
    return tuple(x_shape)


def _check_x(x: torch.Tensor, kind: str) -> None:
    check_choice("kind", kind, KINDS)
    check_tensor("x", x, min_ndim=1)
    if kind in GATED:
        require(x.shape[-1] % 2 == 0,
                f"x's last dim must be even for gated kind {kind} (it holds [act | gate]), "
                f"got shape {tuple(x.shape)}")


def _params(x: torch.Tensor, kind: str, **tensors) -> dict:
    device = check_same_device(x=x, **tensors)
    return dict(kind=kind, dtype=x.dtype, numel=x.numel(), hidden=x.shape[-1],
                device=registry.device_kind(device))


def act_fwd(x: torch.Tensor, kind: str, *, backend: str | None = None) -> torch.Tensor:
    _check_x(x, kind)
    impl = registry.dispatch(Op.ACT_FWD, _params(x, kind), backend)
    return impl.fn(x, kind=kind)


def act_bwd(dy: torch.Tensor, x: torch.Tensor, kind: str, *,
            backend: str | None = None) -> torch.Tensor:
    _check_x(x, kind)
    check_tensor("dy", dy, dtypes=(x.dtype,))
    check_shape("dy", dy, output_shape(x.shape, kind), f"the forward output shape of {kind}")
    impl = registry.dispatch(Op.ACT_BWD, _params(x, kind, dy=dy), backend)
    return impl.fn(dy, x, kind=kind)


def dbias_dact(dy: torch.Tensor, x: torch.Tensor, kind: str, *,
               backend: str | None = None) -> DbiasDact:
    _check_x(x, kind)
    require(kind in POINTWISE,
            f"kind must be a pointwise kind {POINTWISE} for dbias_dact, got {kind!r}")
    check_tensor("dy", dy, dtypes=(x.dtype,))
    check_shape("dy", dy, x.shape, "same as x")
    impl = registry.dispatch(Op.DBIAS_DACT, _params(x, kind, dy=dy), backend)
    return DbiasDact(*impl.fn(dy, x, kind=kind))


def _fwd(kind):
    def f(x, *, backend=None):
        return act_fwd(x, kind, backend=backend)
    f.__name__ = kind
    f.__doc__ = f"``act_fwd(x, {kind!r})``; see the module docstring for the formula."
    return f


def _bwd(kind):
    def f(dy, x, *, backend=None):
        return act_bwd(dy, x, kind, backend=backend)
    f.__name__ = "d" + kind
    f.__doc__ = f"``act_bwd(dy, x, {kind!r})``."
    return f


gelu, gelu_tanh, relu, silu, qgelu, srelu = (_fwd(k) for k in POINTWISE)
swiglu, geglu, reglu, qgeglu, sreglu = (_fwd(k) for k in GATED)
dgelu, dgelu_tanh, drelu, dsilu, dqgelu, dsrelu = (_bwd(k) for k in POINTWISE)
dswiglu, dgeglu, dreglu, dqgeglu, dsreglu = (_bwd(k) for k in GATED)
