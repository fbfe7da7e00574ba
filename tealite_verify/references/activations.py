"""Activation references and their analytic derivatives, float64.

Gated kinds follow TE: the first half of the last dim is activated, the second half is the
linear multiplier.  Written against the array namespace ``xp`` of the input: numpy, or torch
float64 on the reference device (references._device); numpy in, numpy out for callers.
"""
from __future__ import annotations

from tealite_verify.references._device import namespace, on_reference_device
from tealite_verify.references._special import SQRT_2_OVER_PI, normal_cdf, normal_pdf, sigmoid

GELU_TANH_C = 0.044715
QGELU_ALPHA = 1.702


@on_reference_device
def gelu(x):
    return x * normal_cdf(x)


@on_reference_device
def dgelu(x):
    return normal_cdf(x) + x * normal_pdf(x)


def _tanh_inner(x):
    return SQRT_2_OVER_PI * (x + GELU_TANH_C * x**3)


@on_reference_device
def gelu_tanh(x):
    # 0.5 * (1 + tanh(u)) == sigmoid(2u), without the cancellation for u << 0.
    return x * sigmoid(2.0 * _tanh_inner(x))


@on_reference_device
def dgelu_tanh(x):
    t = namespace(x).tanh(_tanh_inner(x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (
        1.0 + 3.0 * GELU_TANH_C * x * x)


@on_reference_device
def relu(x):
    return namespace(x).maximum(x, 0.0)  # propagates NaN, as max(x, 0) does in torch


@on_reference_device
def drelu(x):
    return namespace(x).where(x > 0, 1.0, 0.0)


@on_reference_device
def silu(x):
    return x * sigmoid(x)


@on_reference_device
def dsilu(x):
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


@on_reference_device
def qgelu(x):
    return x * sigmoid(QGELU_ALPHA * x)


@on_reference_device
def dqgelu(x):
    s = sigmoid(QGELU_ALPHA * x)
    return s + QGELU_ALPHA * x * s * (1.0 - s)


@on_reference_device
def srelu(x):
    r = namespace(x).maximum(x, 0.0)
    return r * r


@on_reference_device
def dsrelu(x):
    return namespace(x).where(x > 0, 2.0 * x, 0.0)


POINTWISE = {"gelu": (gelu, dgelu), "gelu_tanh": (gelu_tanh, dgelu_tanh),
             "relu": (relu, drelu), "silu": (silu, dsilu), "qgelu": (qgelu, dqgelu),
             "srelu": (srelu, dsrelu)}
GATED = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu",
         "sreglu": "srelu"}


def _split(x):
    if x.shape[-1] % 2:
        raise ValueError(f"gated kinds need an even last dim, got shape {x.shape}")
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


@on_reference_device
def act_fwd(x, kind: str):
    if kind in GATED:
        a, b = _split(x)
        return POINTWISE[GATED[kind]][0](a) * b
    return POINTWISE[kind][0](x)


@on_reference_device
def act_bwd(dy, x, kind: str):
    if kind in GATED:
        f, df = POINTWISE[GATED[kind]]
        a, b = _split(x)
        return namespace(x).concatenate([dy * df(a) * b, dy * f(a)], axis=-1)
    return dy * POINTWISE[kind][1](x)


@on_reference_device
def dbias_dact(dy, x, kind: str):
    dx = act_bwd(dy, x, kind)
    return dx, namespace(dx).sum(dx.reshape(-1, dx.shape[-1]), axis=0)
