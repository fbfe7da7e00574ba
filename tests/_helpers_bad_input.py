"""Shared helpers of the bad-input tests (test_bad_input_gemm.py, test_bad_input_norms_acts.py,
test_bad_input_registry.py): a tensor factory, the argument-error matcher, and valid baseline
calls for GEMM and the norms that the bad cases perturb.
"""
from __future__ import annotations

import re

import pytest
import torch

import tealite
from tealite.errors import TealiteArgumentError

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
M, N, K = 5, 6, 8


def t(*shape, dtype=F32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def raises(match: str):
    return pytest.raises(TealiteArgumentError, match=match)


def esc(text: str) -> str:
    return re.escape(text)


def stored(layout: str, m=M, n=N, k_a=K, k_b=K, dtype=F32):
    """a, b stored for ``layout`` (a gives K=k_a, b gives K=k_b)."""
    a = t(n, k_a, dtype=dtype) if layout[0] == "T" else t(k_a, n, dtype=dtype)
    b = t(m, k_b, dtype=dtype) if layout[1] == "N" else t(k_b, m, dtype=dtype)
    return a, b


H = 16
X_SHAPE = (3, 4, H)
ROWS = X_SHAPE[:-1]


def ln_fwd(x=None, gamma=None, beta=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    gamma = t(H) if gamma is None else gamma
    beta = t(*gamma.shape, dtype=gamma.dtype) if beta is None else beta
    return tealite.layernorm_fwd(x, gamma, beta, **kw)


def rms_fwd(x=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    gamma = t(H) if gamma is None else gamma
    return tealite.rmsnorm_fwd(x, gamma, **kw)


def ln_bwd(dy=None, x=None, mean=None, rsigma=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    return tealite.layernorm_bwd(t(*x.shape, dtype=x.dtype) if dy is None else dy, x,
                                 t(*x.shape[:-1]) if mean is None else mean,
                                 t(*x.shape[:-1]) if rsigma is None else rsigma,
                                 t(*x.shape[-1:]) if gamma is None else gamma, **kw)


def rms_bwd(dy=None, x=None, rsigma=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    return tealite.rmsnorm_bwd(t(*x.shape, dtype=x.dtype) if dy is None else dy, x,
                               t(*x.shape[:-1]) if rsigma is None else rsigma,
                               t(*x.shape[-1:]) if gamma is None else gamma, **kw)
