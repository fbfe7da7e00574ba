"""AITER's Triton ``softmax`` (``aiter/ops/triton/softmax.py``) as tealite's ``softmax_fwd``.

AITER's entry point is a plain row softmax of a 2-D (M, N) tensor, ``y = softmax(x)`` along
N, y like x: no scale, no mask, no causal fill, and no backward kernel.  It covers exactly
tealite's ``scaled`` kind with ``scale == 1.0``: x (b, h, sq, sk) goes in as its contiguous
(b * h * sq, sk) view and y comes back reshaped.  Nothing of the result is computed here.

Its kernel (``_softmax_kernel_online``) makes two passes over blocks of
min(65536 / element size, next_pow2(N)) columns: an online max and sum (the running sum is
fp32, rescaled by exp(m_old - m_new) per block), then exp(x - m) / sum.  It works in the
input dtype: ``x - m`` and ``exp`` of an fp16 row are fp16 operations and the block's
``tl.sum`` of fp16 values is an fp16 reduction; only the running sum and the division are
fp32.  So the declared ``compute_dtype`` is x's dtype, and the softmax tier's bound (every
operation at that dtype's unit roundoff) is honest for it.

Rejected with the reason (``check``):

* any other kind, or a scale other than 1.0: the kernel has no scale, mask or causal fill;
  pre-scaling or filling x here would compute part of the op with its own roundings;
* bfloat16 under Triton's interpreter (its bf16 loads and stores are wrong; norms.py);
* fp16 / bf16 compiled for NVIDIA: the kernel applies ``tl.exp`` to the input dtype, and
  ``triton.language.math.exp`` of the installed Triton (3.9) accepts fp32 / fp64 only (its
  ``_check_dtype``): the kernel cannot compile there.  AITER's own test runs bf16 on AMD, where
  its pinned Triton allowed it.  (Read from the source; not yet run on a GPU.)
* the entry point missing from the installed AITER.

Backward: none (AITER ships no softmax backward kernel).
"""
from __future__ import annotations

import torch

from tealite.backends import aiter_triton
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import (BACKEND, DEVICES, INTERPRET, NAME, PLATFORM,
                                           why_missing)
from tealite.backends.aiter_triton.norms import interpreter_bf16_reason
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
ENTRY_POINT = "softmax"

declare(Contract(backend=NAME, entry_point=ENTRY_POINT, op=Op.SOFTMAX_FWD,
                 layouts=("x:(M,N) contiguous rows",),
                 notes=("plain row softmax: TE's 'scaled' kind with scale 1 only; x - max, "
                        "exp and block sums in the input dtype, fp32 running sum and division"),
                 extra={"scale": "none (1.0 only)", "mask": "none", "backward": "none",
                        "compute": "input dtype"}))


def _check(params) -> str | None:
    if params["kind"] != "scaled":
        return (f"AITER's softmax is a plain row softmax (no scale, mask or causal fill): "
                f"kind {params['kind']!r} is not covered")
    if params["scale"] != 1.0:
        return (f"AITER's softmax takes no scale: only scale == 1.0 is covered, got "
                f"{params['scale']} (scaling x here would compute part of the op)")
    why = interpreter_bf16_reason(params["dtype"])
    if why is not None:
        return why
    if PLATFORM.get().nvidia and params["dtype"] != torch.float32:
        return ("AITER's softmax applies tl.exp to the input dtype; the installed Triton's "
                "tl.exp accepts fp32 / fp64 only (triton.language.math._check_dtype), so an "
                f"{params['dtype']} row does not compile for NVIDIA")
    return why_missing(ENTRY_POINT)


def _numerics(params) -> dict:
    return {"compute_dtype": params["dtype"], "entry_point": ENTRY_POINT,
            "exp_ulps": 1 if INTERPRET else 2, "fp32_div_ulps": aiter_triton.fp32_div_ulps()}


@BACKEND.implements(Op.SOFTMAX_FWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=_numerics)
def softmax_fwd(x, kind, *, scale, mask):
    from tealite.backends.aiter_triton import kernels
    if x.numel() == 0:
        return torch.empty_like(x)
    y = kernels().softmax(x.contiguous().reshape(-1, x.shape[-1]))
    return y.reshape(x.shape)
