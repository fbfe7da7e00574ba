"""Gated activations forward on AITER's HIP ``*_and_mul`` kernels (never run on AMD hardware;
see the package docstring).

``silu_and_mul(out, input)`` / ``gelu_and_mul(out, input)`` take input (..., 2d) = [a | b] and
write ``act(a) * b`` (csrc/kernels/activation_kernels.cu): TE's convention, so ``swiglu`` and
``geglu`` map directly.  Per element: fp32 math (module_activation is built with
``-ffast-math``; silu's reciprocal is ``__builtin_amdgcn_rcpf``, about 1 ulp), one conversion
to the input dtype.  That conversion is ck_tile's ``type_convert``: RNE for float16, but
*truncation* for bfloat16 (``CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT`` is truncate in
ck_tile/core/config.hpp and module_activation does not override it) -- tealite's tolerance
model has no truncating-output rounding, so bfloat16 is rejected.

The kernel stores ``VEC`` outputs per step without a bound check, ``VEC =
min(8, nextPow2(d / 64))``: a d that is not a multiple of VEC writes past its row (the next
row's first outputs, or past the tensor for the last row).  Such d are rejected.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.types import Op

ENTRY = {"swiglu": "silu_and_mul", "geglu": "gelu_and_mul"}


def store_vector(d: int) -> int:
    """AITER's VEC_SIZE for a gated row of d outputs (LAUNCH_ACTIVATION_GATE_KERNEL)."""
    q = d // 64
    p = 1 if q <= 1 else 1 << (q - 1).bit_length()
    return min(8, p)


def _why_not(params) -> str | None:
    ep = ENTRY.get(params["kind"])
    if ep is None:
        return f"no AITER HIP entry point for act_fwd kind {params['kind']!r} (only " \
               f"{sorted(ENTRY)}: {sorted(ENTRY.values())})"
    why = common_why_not(params, ep)
    if why:
        return why
    if params["dtype"] == torch.bfloat16:
        return (f"{ep} truncates its bfloat16 output (ck_tile's default float->bf16 "
                "conversion), which tealite's tolerance model cannot express")
    if params["dtype"] != torch.float16:
        return f"{ep} takes float16 / bfloat16 only, not {params['dtype']}"
    if params["numel"] == 0:
        return f"{ep} launches one block per row: no kernel for an empty input"
    d = params["hidden"] // 2
    vec = store_vector(d)
    if d % vec:
        return (f"{ep} writes {vec} outputs per step without a bound check: d={d} is not a "
                f"multiple of {vec}, so it would write past the row")
    return None


def _numerics(params) -> dict:
    return {"entry_point": ENTRY.get(params["kind"], "-"), "compute_dtype": torch.float32}


@BACKEND.implements(Op.ACT_FWD, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                    check=_why_not, numerics=_numerics)
def act_fwd(x, *, kind):
    fn = runtime().functions[ENTRY[kind]]
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d).contiguous()  # [a | b] per row, as the kernel indexes it
    out = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    fn(out, x2)
    return out.reshape(*x.shape[:-1], d)


_NOTES = ("fp32 math under -ffast-math; one conversion to the input dtype (fp16 RNE, bf16 "
          "truncation: rejected); d must be a multiple of min(8, nextPow2(d/64)) (unchecked "
          "vector stores)")
declare(Contract(backend="aiter", entry_point="silu_and_mul", op=Op.ACT_FWD,
                 element_rounding="bf16:rtz, fp16:rne",
                 layouts=("input:(...,2d) [act|gate]", "out:(...,d)"),
                 notes=_NOTES + "; silu = x * rcp(1 + exp(-x)) with the hardware rcp"))
declare(Contract(backend="aiter", entry_point="gelu_and_mul", op=Op.ACT_FWD,
                 element_rounding="bf16:rtz, fp16:rne",
                 layouts=("input:(...,2d) [act|gate]", "out:(...,d)"),
                 notes=_NOTES + "; gelu = x/2 (1 + erf(x/sqrt2)) (erf under -ffast-math)"))
