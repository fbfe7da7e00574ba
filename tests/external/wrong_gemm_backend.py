"""A deliberately wrong third-party backend, registered from outside the tealite package.

Its GEMM reads a transposed A by reinterpreting the storage (``reshape``) instead of
transposing it: a transpose-convention bug that is invisible whenever N == 1 or K == 1 (a
vector's reshape is its transpose) and wrong for every other shape.  Only GEMM is provided.
"""
import torch

from tealite.registry import Backend, get_backend, register_backend

BACKEND = register_backend(Backend(name="wrong_gemm", description="seeded transpose bug"),
                           replace=True)


@BACKEND.implements("gemm", dtypes=(torch.float32, torch.bfloat16, torch.float16))
def gemm(a, b, *, layout, out_dtype, bias, gelu, out, alpha, beta):
    if layout[0] == "T":
        n, k = a.shape
        a = a.reshape(k, n).t()  # the bug: should be a itself, read as (N, K)
    return get_backend("torch").impls["gemm"].fn(a, b, layout=layout, out_dtype=out_dtype,
                                                  bias=bias, gelu=gelu, out=out, alpha=alpha,
                                                  beta=beta)
