"""The ``mykernels`` backend: a GEMM, RMSNorm forward and the activations.

Registered through the ``tealite.backends`` entry point in this package's pyproject.toml:
importing this module registers the backend, and tealite imports it wherever the package is
installed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tealite.registry import Backend, register_backend
from tealite.types import GATED  # gated kind -> the activation of its first half

BACKEND = register_backend(Backend(name="mykernels", description="example kernels "
                                                                  "(examples/mykernels)"))


def _no_epilogue(p):  # a string is the reason the case is refused
    if p["bias"] or p["gelu"] or p["alpha"] != 1.0 or p["beta"] != 0.0:
        return "no epilogue: bias, GELU, alpha and beta are not implemented"
    return None


@BACKEND.implements("gemm", dtypes=(torch.float32,), layouts=("TN", "NN"),
                    check=_no_epilogue, numerics={"compute_dtype": torch.float32})
def gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta):
    d = torch.matmul(b, a.t() if layout == "TN" else a).to(out_dtype)  # D = B @ op(A)
    if out is not None:
        out.copy_(d)
        d = out
    return d, None


@BACKEND.implements("rmsnorm_fwd", like="torch")
def rmsnorm_fwd(x, gamma, *, eps, zero_centered_gamma):
    x32 = x.float()
    rsigma = torch.rsqrt(x32.square().mean(dim=-1) + eps)
    g = gamma.float() + 1 if zero_centered_gamma else gamma.float()
    return (x32 * rsigma.unsqueeze(-1) * g).to(x.dtype), rsigma


_POINTWISE = {
    # THE BUG: "gelu" is the exact, erf-based GELU; this kernel uses the tanh approximation
    # for it (up to ~5e-4 off near |x| = 2), as "gelu_tanh" rightly does.
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x) ** 2,
}


@BACKEND.implements("act_fwd", like="torch")  # fp32 math, one rounding to x's dtype
def act_fwd(x, *, kind):
    x32 = x.float()
    if kind in GATED:
        a, b = x32.chunk(2, dim=-1)
        return (_POINTWISE[GATED[kind]](a) * b).to(x.dtype)
    return _POINTWISE[kind](x32).to(x.dtype)
