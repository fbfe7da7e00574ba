"""AITER's Triton MoE routing top-k (``aiter/ops/triton/moe_routing/topk.py``, the
``triton_kernels`` routing AITER carries) as tealite's ``router_fwd``.

``topk(logits, k, apply_softmax=True)`` takes the k largest logits of each row and a softmax
over them: TE's router with ``score_function="softmax"`` after the top-k (no groups, no bias,
no scaling factor).  It returns the chosen values (softmaxed, in logits' dtype), their expert
indices (int16, ascending) and a bitmatrix; the adapter scatters the values and indices into
tealite's dense ``probs`` and ``routing_map`` (a copy: nothing of the result is computed here).

Its kernel packs each logit's order-preserving bit key above ``N_EXPTS_PAD - index`` into an
integer twice the logit's width (no bits of the value are dropped), so among equal logits the
lowest index wins (declared ``topk_ties = lowest_index``); the softmax is ``tl.softmax`` of
the fp32 values (max, exp, sum, division), stored in logits' dtype.

Rejected with the reason (``check``): pre-softmax, sigmoid, groups, an expert bias or a
scaling factor (the kernel has none; doing them here would compute part of the op); topk not
a power of two (``tl.arange`` over the top-k); 32768 experts or more (int16 indices); bf16
under the interpreter (its casts truncate); the entry point missing from the installed AITER.

Not mapped: backward (AITER has no router backward kernel), the aux-loss scores (a softmax
over all experts: the kernel softmaxes the chosen ones), AITER's FlagGems ``topk``
(``aiter/ops/triton/topk.py``: values and indices only, no score function) and
``routing_sigmoid_top1`` (it fuses the router GEMM ``hidden @ w`` before a sigmoid top-1; TE's
router starts from the logits).
"""
from __future__ import annotations

import torch

from tealite.backends import aiter_triton
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, INTERPRET, NAME, why_missing
from tealite.backends.aiter_triton.norms import interpreter_bf16_reason
from tealite.moe_types import RouterConfig, TieRule
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
ENTRY_POINT = "topk"
_MAX_EXPERTS = 32768

declare(Contract(backend=NAME, entry_point=ENTRY_POINT, op=Op.ROUTER_FWD,
                 layouts=("logits:(T,E) contiguous rows", "out: (T,k) values, int16 indices "
                          "ascending, bitmatrix"),
                 notes=("moe_routing topk with apply_softmax: top-k of the logits, softmax over "
                        "the chosen; equal logits by lowest index; no groups, bias or scaling"),
                 extra={"score_function": "softmax after the top-k only", "ties": "lowest index",
                        "topk": "power of two", "backward": "none"}))


def _check(params) -> str | None:
    if params["score_function"] != "softmax" or params["use_pre_softmax"]:
        return ("AITER's moe_routing topk softmaxes the chosen logits: only score_function="
                "'softmax' after the top-k maps onto it (pre-softmax and sigmoid scores are "
                "not computed by the kernel)")
    if params["num_groups"] is not None:
        return "AITER's moe_routing topk has no group-limited top-k"
    if params["expert_bias"]:
        return "AITER's moe_routing topk takes no expert bias"
    if params["scaling_factor"] is not None:
        return ("AITER's moe_routing topk has no scaling factor (multiplying here would compute "
                "part of the op)")
    k = params["topk"]
    if k & (k - 1):
        return f"AITER's moe_routing topk needs topk a power of two (tl.arange), got {k}"
    if params["experts"] >= _MAX_EXPERTS:
        return f"AITER's moe_routing topk indexes experts in int16: {params['experts']} >= 32768"
    why = interpreter_bf16_reason(params["dtype"])
    if why is not None:
        return why
    return why_missing(ENTRY_POINT)


def _numerics(params) -> dict:
    return {"compute_dtype": torch.float32, "entry_point": ENTRY_POINT,
            "exp_ulps": 1 if INTERPRET else 2, "fp32_div_ulps": aiter_triton.fp32_div_ulps(),
            "topk_ties": TieRule.LOWEST_INDEX}


@BACKEND.implements(Op.ROUTER_FWD, dtypes=_FLOATS, devices=DEVICES, check=_check,
                    numerics=_numerics)
def router_fwd(logits, config: RouterConfig, *, expert_bias):
    from tealite.backends.aiter_triton import kernels
    t, e = logits.shape
    probs = torch.zeros_like(logits)
    chosen = torch.zeros((t, e), dtype=torch.bool, device=logits.device)
    if t == 0:
        return probs, chosen
    values, indices, _ = kernels().topk(logits.contiguous(), config.topk, apply_softmax=True)
    idx = indices.long()
    return probs.scatter_(1, idx, values), chosen.scatter_(1, idx, True)
