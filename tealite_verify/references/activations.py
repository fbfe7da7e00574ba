"""Activation references and their analytic derivatives, float64.

Gated kinds follow TE: the first half of the last dim is activated, the second half is the
linear multiplier.
"""
from __future__ import annotations

import numpy as np

from tealite_verify.references._special import SQRT_2_OVER_PI, normal_cdf, normal_pdf, sigmoid

GELU_TANH_C = 0.044715
QGELU_ALPHA = 1.702


def gelu(x):
    return x * normal_cdf(x)


def dgelu(x):
    return normal_cdf(x) + x * normal_pdf(x)


def _tanh_inner(x):
    return SQRT_2_OVER_PI * (x + GELU_TANH_C * x**3)


def gelu_tanh(x):
    # 0.5 * (1 + tanh(u)) == sigmoid(2u), without the cancellation for u << 0.
    return x * sigmoid(2.0 * _tanh_inner(x))


def dgelu_tanh(x):
    t = np.tanh(_tanh_inner(x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (
        1.0 + 3.0 * GELU_TANH_C * x * x)


def relu(x):
    return np.maximum(x, 0.0)  # propagates NaN, as max(x, 0) does in torch


def drelu(x):
    return np.where(x > 0, 1.0, 0.0)


def silu(x):
    return x * sigmoid(x)


def dsilu(x):
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def qgelu(x):
    return x * sigmoid(QGELU_ALPHA * x)


def dqgelu(x):
    s = sigmoid(QGELU_ALPHA * x)
    return s + QGELU_ALPHA * x * s * (1.0 - s)


def srelu(x):
    r = np.maximum(x, 0.0)
    return r * r


def dsrelu(x):
    return np.where(x > 0, 2.0 * x, 0.0)


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


def act_fwd(x, kind: str):
    if kind in GATED:
        a, b = _split(x)
        return POINTWISE[GATED[kind]][0](a) * b
    return POINTWISE[kind][0](x)


def act_bwd(dy, x, kind: str):
    if kind in GATED:
        f, df = POINTWISE[GATED[kind]]
        a, b = _split(x)
        return np.concatenate([dy * df(a) * b, dy * f(a)], axis=-1)
    return dy * POINTWISE[kind][1](x)


def dbias_dact(dy, x, kind: str):
    dx = act_bwd(dy, x, kind)
    return dx, dx.reshape(-1, dx.shape[-1]).sum(axis=0)
