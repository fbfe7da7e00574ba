"""GEMM front-end with TransformerEngine's layout convention.

``gemm(A, B, layout)`` computes ``D = op_B(B) @ op_A(A)`` with ``D`` of shape (M, N) and
contraction length K.  The layout string is TE's (which is cuBLAS's column-major view): its
first letter says whether A is stored transposed, its second whether B is.

=======  ==============  ==============  ===================  ==========================
layout   A stored as     B stored as     D                    TE use
=======  ==============  ==============  ===================  ==========================
``TN``   (N, K)          (M, K)          B @ A.T              forward: A=weight, B=input
``NN``   (K, N)          (M, K)          B @ A                dgrad: A=weight, B=dY
``NT``   (K, N)          (K, M)          B.T @ A              wgrad: A=input, B=dY
``TT``   (N, K)          (K, M)          B.T @ A.T            (unused by TE; for symmetry)
=======  ==============  ==============  ===================  ==========================

The full computation, evaluated by a fused epilogue or its equivalent, is::

    pre = alpha * (op_B(B) @ op_A(A)) + beta * out_prior + bias
    D   = gelu(pre)  if gelu else pre

``bias`` has shape (N,) and is broadcast over rows.  ``out``, when given, must be (M, N) of
``out_dtype``; its prior contents are scaled by ``beta`` and it is overwritten with D (TE's
``accumulate``).  ``beta != 0`` without ``out`` is an error, never an implicit zero tensor.
With ``gelu=True`` the pre-activation ``pre`` is also returned (in ``out_dtype``), as TE does
for the backward pass.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

import tealite.registry as registry
from tealite._checks import (FLOAT_DTYPES, check_choice, check_dtype_in, check_finite_number,
                             check_same_device, check_shape, check_tensor, require)
from tealite.types import LAYOUTS, Op, gemm_dims  # noqa: F401  (LAYOUTS, gemm_dims re-exported)


class GemmOutput(NamedTuple):
    out: torch.Tensor
    pre_gelu: torch.Tensor | None


def gemm(a: torch.Tensor, b: torch.Tensor, *, layout: str = "TN",
         out_dtype: torch.dtype | None = None, bias: torch.Tensor | None = None,
         gelu: bool = False, out: torch.Tensor | None = None, alpha: float = 1.0,
         beta: float = 0.0, backend: str | None = None) -> GemmOutput:
    check_choice("layout", layout, LAYOUTS)
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    require(a.dtype == b.dtype, f"a and b must share a dtype, got a {a.dtype} and b {b.dtype}")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_dtype_in("out_dtype", out_dtype, FLOAT_DTYPES)
    m, n, k_a, k_b = gemm_dims(a.shape, b.shape, layout)
    require(k_a == k_b, f"contraction dims differ under layout {layout}: a gives K={k_a} "
                        f"(a shape {tuple(a.shape)}), b gives K={k_b} (b shape {tuple(b.shape)})")
    alpha = check_finite_number("alpha", alpha)
    beta = check_finite_number("beta", beta)
    require(isinstance(gelu, bool), f"gelu must be a bool, got {type(gelu).__name__}")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=(a.dtype,))
        check_shape("bias", bias, (n,), "one value per output column N")
    if out is not None:
        check_tensor("out", out, ndim=2, dtypes=(out_dtype,))
        check_shape("out", out, (m, n), f"(M, N) for layout {layout}")
    require(beta == 0.0 or out is not None, "beta != 0 needs out= holding the prior output")
    device = check_same_device(a=a, b=b, bias=bias, out=out)
    params = dict(m=m, n=n, k=k_a, layout=layout, dtype=a.dtype, out_dtype=out_dtype,
                  bias=bias is not None, gelu=gelu, alpha=alpha, beta=beta,
                  device=registry.device_kind(device))
    impl = registry.dispatch(Op.GEMM, params, backend)
    result = impl.fn(a, b, layout=layout, out_dtype=out_dtype, bias=bias, gelu=gelu, out=out,
                     alpha=alpha, beta=beta)
    return GemmOutput(*result)
