"""The MoE expert FFN forward with the routing folded in: ``moe_ffn_fwd`` (issue 16), the op
AITER's fused MoE kernels (Triton ``fused_moe``, CK ``aiter.fused_moe``) and vLLM-style
``fused_experts`` implement; TE composes the same from permute, grouped GEMM, activation,
grouped GEMM and unpermute (tealite_verify's composed layer check judges that composition).

``moe_ffn_fwd(x, w1, w2, topk_weights, topk_ids, kind="swiglu")`` -> y (T, H) in x's dtype:

    y[t] = sum_s topk_weights[t, s] * act(x[t] @ w1[e].T) @ w2[e].T,   e = topk_ids[t, s]

* x (T, H); w1 (E, 2F, H) for a gated ``kind`` (first half of its output activated, as
  ``act_fwd``), (E, F, H) for a pointwise one; w2 (E, H, F); all one dtype (fp32 / bf16 /
  fp16).  T = 0 is legal.
* topk_ids (T, k) int32 / int64, each row k distinct experts in [0, E); topk_weights (T, k)
  float32 (the router's probabilities).
* Arithmetic (the undeclared default): both GEMMs accumulate in fp32; the fc1 output and the
  activation are stored in x's dtype; the weighted rows and their sum in fp32, one rounding.
  A backend declares otherwise through ``numerics.moe_merge`` (tealite.moe_types.MoEMerge).
"""
from __future__ import annotations

import torch

import tealite.registry as registry
from tealite._checks import check_choice, check_same_device, check_tensor, require
from tealite.types import ACTIVATION_KINDS, GATED, Op

_IDS = (torch.int32, torch.int64)


def _check_weights(x, w1, w2, kind: str) -> tuple[int, int, int]:
    """(experts, ffn, hidden) after checking the weights against x and the kind."""
    check_tensor("w1", w1, ndim=3)
    check_tensor("w2", w2, ndim=3)
    require(w1.dtype == x.dtype and w2.dtype == x.dtype,
            f"x, w1 and w2 must share a dtype, got {x.dtype}, {w1.dtype}, {w2.dtype}")
    experts, rows, hidden = w1.shape
    require(hidden == x.shape[1], f"w1 must be (E, N, H) with H = x's hidden size "
                                  f"{x.shape[1]}, got {tuple(w1.shape)}")
    gated = kind in GATED
    require(not gated or rows % 2 == 0,
            f"w1's rows must be even for the gated kind {kind!r} (gate and up halves), got "
            f"{rows}")
    ffn = rows // 2 if gated else rows
    require(tuple(w2.shape) == (experts, hidden, ffn),
            f"w2 must have shape {(experts, hidden, ffn)} (E, H, F) to match w1 "
            f"{tuple(w1.shape)}, got {tuple(w2.shape)}")
    return experts, ffn, hidden


def _check_routing(topk_weights, topk_ids, tokens: int, experts: int) -> int:
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=_IDS)
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=(torch.float32,))
    require(topk_ids.shape[0] == tokens, f"topk_ids must have one row per token ({tokens}), "
                                         f"got {tuple(topk_ids.shape)}")
    require(topk_weights.shape == topk_ids.shape,
            f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got "
            f"{tuple(topk_weights.shape)}")
    k = topk_ids.shape[1]
    require(1 <= k <= experts, f"topk (topk_ids' columns) must be in [1, experts={experts}], "
                               f"got {k}")
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        require(lo >= 0 and hi < experts,
                f"topk_ids must be expert ids in [0, {experts}), got values in [{lo}, {hi}]")
        distinct = torch.sort(topk_ids, dim=1).values
        require(bool((distinct[:, 1:] != distinct[:, :-1]).all()),
                "topk_ids must name k distinct experts in every row")
    return k


def moe_ffn_fwd(x, w1, w2, topk_weights, topk_ids, *, kind: str = "swiglu",
                backend: str | None = None) -> torch.Tensor:
    """y (T, H): the routing-weighted sum of each token's expert FFNs (module docstring)."""
    check_tensor("x", x, ndim=2)
    check_choice("kind", kind, ACTIVATION_KINDS)
    experts, ffn, hidden = _check_weights(x, w1, w2, kind)
    k = _check_routing(topk_weights, topk_ids, x.shape[0], experts)
    device = check_same_device(x=x, w1=w1, w2=w2, topk_weights=topk_weights,
                               topk_ids=topk_ids)
    params = dict(dtype=x.dtype, tokens=x.shape[0], hidden=hidden, ffn=ffn, experts=experts,
                  topk=k, kind=kind, device=registry.device_kind(device))
    impl = registry.dispatch(Op.MOE_FFN_FWD, params, backend)
    return impl.fn(x, w1, w2, topk_weights, topk_ids, kind=kind)
