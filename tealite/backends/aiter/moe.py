"""AITER's CK / ASM fused MoE (``aiter.fused_moe``, ROCm) as ``moe_ffn_fwd``
(tealite/ops/moe_ffn.py), the expert FFN of the composed MoE layer (issue 16): fc1 -> gated
SiLU -> fc2 -> the routing-weighted sum of a token's k expert rows, forward only (an inference
kernel: no dgrad / wgrad).

Written from amd-aiter 0.1.7.post2's ``aiter/fused_moe.py`` (``fused_moe`` -> ``fused_moe_``:
moe sorting, then the 1-stage ASM kernel or CK's 2-stage ``ck_moe_stage1`` / ``_stage2``
chosen by a tuned table) and its torch reference ``torch_moe``; never run on AMD hardware,
tested against a fake ``aiter`` (tests/test_aiter_moe.py).  The call:

    aiter.fused_moe(x (T, H), w1 (E, 2F, H), w2 (E, H, F), topk_weight (T, k) fp32,
                    topk_ids (T, k) int32, activation=ActivationType.Silu,
                    quant_type=QuantType.No) -> (T, H)

``w1``'s rows are gate first: ``silu(x @ w1[:F].T) * (x @ w1[F:].T)`` (``torch_moe_act``'s
split), TE's swiglu.  Declared numerics (what the harness's bound assumes, conservatively): fp32
accumulation; the activated intermediate stored in the dtype; each weighted row rounded to the
dtype and the k rows summed in the dtype (stage 2 adds its rows into the output).

Refused, with the reason: activations other than swiglu (``ActivationType`` has Silu and
Gelu gated only, and TE's other gated kinds do not map), fp32 (CK's MoE kernels take bf16 /
fp16), bias, quantized weights (their scales are not part of the layer here).
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.moe_types import MoEMerge
from tealite.types import Op

ENTRY = "fused_moe"
_DTYPES = (torch.bfloat16, torch.float16)

declare(Contract(
    backend="aiter", entry_point=ENTRY, op=Op.MOE_FFN_FWD.value,
    layouts=("x:(T,H)", "w1:(E,2F,H) gate rows first", "w2:(E,H,F)",
             "topk_weight:(T,k) fp32", "topk_ids:(T,k) int32"),
    notes="activation Silu (gated), quant_type No; fp32 accumulation, the intermediate "
          "stored in the dtype, weighted rows rounded and summed in the dtype (declared "
          "conservatively); inference only (no backward); never run on AMD hardware",
    extra={"moe_merge": MoEMerge.ROWS_ROUNDED_DTYPE_SUM.value}))


def why_not_params(params) -> str | None:
    """Why CK's fused MoE cannot run this case here (None: it can)."""
    why = common_why_not(params, ENTRY)
    if why is not None:
        return why
    if params["kind"] != "swiglu":
        return (f"activation {params['kind']!r}: aiter.fused_moe is wired here for gated "
                "SiLU (ActivationType.Silu, TE's swiglu) only")
    if params["dtype"] not in _DTYPES:
        return (f"aiter.fused_moe takes bf16 / fp16 x, w1, w2 (no fp32 CK MoE kernel; "
                f"quantized weights need scales), got {params['dtype']}")
    return None


def why_not(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, kind: str) -> str | None:
    """:func:`why_not_params` of tensors (the harness's direct call)."""
    if w1.dtype != x.dtype or w2.dtype != x.dtype:
        return f"x, w1 and w2 must share a dtype, got {x.dtype}, {w1.dtype}, {w2.dtype}"
    return why_not_params({"kind": kind, "dtype": x.dtype, "device": x.device.type})


def fused_experts(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  kind: str = "swiglu") -> torch.Tensor:
    """y (T, H) = sum_s topk_weights[t, s] * ffn_{topk_ids[t, s]}(x[t]); an UnsupportedCase
    says why not."""
    why = why_not(x, w1, w2, kind)
    if why is not None:
        raise UnsupportedCase(why)
    rt = runtime()
    return rt.functions[ENTRY](
        x.contiguous(), w1.contiguous(), w2.contiguous(),
        topk_weights.to(torch.float32).contiguous(), topk_ids.to(torch.int32).contiguous(),
        activation=rt.module.ActivationType.Silu, quant_type=rt.module.QuantType.No)


@BACKEND.implements(Op.MOE_FFN_FWD, dtypes=_DTYPES, check=why_not_params,
                    numerics={"entry_point": ENTRY, "compute_dtype": torch.float32,
                              "moe_merge": MoEMerge.ROWS_ROUNDED_DTYPE_SUM})
def moe_ffn_fwd(x, w1, w2, topk_weights, topk_ids, *, kind):
    return fused_experts(x, w1, w2, topk_weights, topk_ids, kind=kind)
