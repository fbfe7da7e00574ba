"""AITER's CK / ASM fused MoE (``aiter.fused_moe``, ROCm) as the expert FFN of the composed
MoE layer (issue 16): fc1 -> gated SiLU -> fc2 -> the routing-weighted sum of a token's k
expert rows, forward only (an inference kernel: no dgrad / wgrad).

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

from tealite.backends.aiter import common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase

ENTRY = "fused_moe"
_DTYPES = (torch.bfloat16, torch.float16)

declare(Contract(
    backend="aiter", entry_point=ENTRY, op="moe_layer (expert FFN forward)",
    layouts=("x:(T,H)", "w1:(E,2F,H) gate rows first", "w2:(E,H,F)",
             "topk_weight:(T,k) fp32", "topk_ids:(T,k) int32"),
    notes="activation Silu (gated), quant_type No; fp32 accumulation, the intermediate "
          "stored in the dtype, weighted rows rounded and summed in the dtype (declared "
          "conservatively); inference only (no backward); never run on AMD hardware",
    extra={"weighted_rows_rounded": True, "merge_in_io_dtype": True}))


def why_not(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, kind: str) -> str | None:
    """Why CK's fused MoE cannot run this layer here (None: it can)."""
    why = common_why_not({"device": x.device.type}, ENTRY)
    if why is not None:
        return why
    if kind != "swiglu":
        return (f"activation {kind!r}: aiter.fused_moe is wired here for gated SiLU "
                "(ActivationType.Silu, TE's swiglu) only")
    if x.dtype not in _DTYPES or w1.dtype != x.dtype or w2.dtype != x.dtype:
        return (f"aiter.fused_moe takes bf16 / fp16 x, w1, w2 of one dtype (no fp32 CK MoE "
                f"kernel; quantized weights need scales), got {x.dtype}, {w1.dtype}, "
                f"{w2.dtype}")
    return None


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
