"""The composed MoE layer check (issue 16 part 5): router -> permute -> grouped GEMM (fc1) ->
gated activation -> grouped GEMM (fc2) -> unpermute merging the probabilities, forward and
backward, run end to end by one backend's stages and judged against the float64 composition
(references/moe_layer.py) under the propagated bound (tiers/moe_layer.py, the derivation).

A backend enters as :class:`LayerStages`, one callable per stage with TE's semantics
(tealite/moe_types.py): :func:`run_layer` drives them in the one order every backend shares,
and :func:`check_layer` judges the outputs.  :func:`torch_stages` is the plain-torch
composition (fp32 compute, intermediates stored in the input dtype, activations through
``tealite.act_fwd`` / ``act_bwd``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import tealite
from tealite.moe_types import split_offsets
from tealite_verify.references import moe_layer as ref
from tealite_verify.tiers import bounded
from tealite_verify.tiers.metrics import Metrics, Tier, from_mask
from tealite_verify.tiers.moe_layer import LayerNumerics, bounds, numerics_of
from tealite_verify.tiers.primitives import to_f64

OUTPUTS = ("y", "dx", "dw1", "dw2", "dlogits", "probs")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LayerCase:
    tokens: int
    hidden: int
    ffn: int
    experts: int
    topk: int
    dtype: str = "bfloat16"
    seed: int = 0
    kind: str = "swiglu"

    def __post_init__(self):
        if not 1 <= self.topk <= self.experts:
            raise ValueError(f"topk must be in [1, experts={self.experts}], got {self.topk}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


def make_inputs(case: LayerCase, device: str = "cpu") -> dict:
    """x (T, H), logits (T, E) with distinct values per row (no top-k tie), w1 (E, 2F, H),
    w2 (E, H, F), dy (T, H), all in the case's dtype; weights scaled by 1/sqrt(fan-in)."""
    g = torch.Generator().manual_seed(case.seed)
    dt = case.torch_dtype
    t, h, f, e = case.tokens, case.hidden, case.ffn, case.experts
    perm = torch.argsort(torch.rand(t, e, generator=g), dim=1).float()
    logits = perm * 0.25 + 0.1 * torch.rand(t, e, generator=g)  # rows of distinct values
    return {
        "x": torch.randn(t, h, generator=g).to(dt).to(device),
        "logits": logits.to(dt).to(device),
        "w1": (torch.randn(e, 2 * f, h, generator=g) / h ** 0.5).to(dt).to(device),
        "w2": (torch.randn(e, h, f, generator=g) / f ** 0.5).to(dt).to(device),
        "dy": torch.randn(t, h, generator=g).to(dt).to(device),
    }


@dataclass(frozen=True)
class LayerStages:
    """One backend's stages.  ``row_map`` is whatever permute returns for unpermute to read.

    router_fwd(logits, topk) -> (probs (T, E), routing_map (T, E) bool)
    router_bwd(dprobs, probs, routing_map, logits, topk) -> dlogits (logits' dtype)
    permute(x, routing_map) -> (xp, row_map, m_splits)
    unpermute(h, row_map, probs | None, tokens) -> (T, H)   (probs: merged; None: summed)
    unpermute_bwd(dy, h, row_map, probs) -> (dh, dprobs)
    grouped_gemm(a, b, m_splits, layout) -> out   (TE's layouts, tealite/moe_types.py)
    act_fwd(h, kind) / act_bwd(da, h, kind)
    """

    router_fwd: Callable
    router_bwd: Callable
    permute: Callable
    unpermute: Callable
    unpermute_bwd: Callable
    grouped_gemm: Callable
    act_fwd: Callable
    act_bwd: Callable
    # What the stages declare, per input dtype (tiers/moe_layer.py).
    numerics: Callable[[torch.dtype], LayerNumerics] = LayerNumerics
    # A fused expert FFN, forward only (AITER's fused MoE): fused_forward(x, w1, w2,
    # topk_weights (T, k), topk_ids (T, k), kind) -> y.  With it run_layer runs the router and
    # this, and the layer is judged on y, probs and the routing map.
    fused_forward: Callable | None = None


def run_layer(stages: LayerStages, inputs: dict, case: LayerCase) -> dict:
    """Forward and backward of the layer through ``stages``; the outputs of OUTPUTS plus the
    routing map."""
    x, logits, w1, w2, dy = (inputs[k] for k in ("x", "logits", "w1", "w2", "dy"))
    probs, rmap = stages.router_fwd(logits, case.topk)
    if stages.fused_forward is not None:
        ids, weights = topk_slots(probs, rmap, case.topk)
        y = stages.fused_forward(x, w1, w2, weights, ids, case.kind)
        return {"y": y, "probs": probs, "routing_map": rmap}
    xp, row_map, splits = stages.permute(x, rmap)
    h1 = stages.grouped_gemm(w1, xp, splits, "TN")
    a = stages.act_fwd(h1, case.kind)
    h2 = stages.grouped_gemm(w2, a, splits, "TN")
    y = stages.unpermute(h2, row_map, probs, x.shape[0])
    dh2, dprobs = stages.unpermute_bwd(dy, h2, row_map, probs)
    da = stages.grouped_gemm(w2, dh2, splits, "NN")
    dw2 = stages.grouped_gemm(a, dh2, splits, "NT")
    dh1 = stages.act_bwd(da, h1, case.kind)
    dxp = stages.grouped_gemm(w1, dh1, splits, "NN")
    dw1 = stages.grouped_gemm(xp, dh1, splits, "NT")
    dx = stages.unpermute(dxp, row_map, None, x.shape[0])
    dlogits = stages.router_bwd(dprobs, probs, rmap, logits, case.topk)
    return {"y": y, "dx": dx, "dw1": dw1, "dw2": dw2, "dlogits": dlogits, "probs": probs,
            "routing_map": rmap}


def topk_slots(probs: torch.Tensor, rmap: torch.Tensor, topk: int):
    """(topk_ids (T, k) int32, topk_weights (T, k) float32) of a routing map, each token's
    experts in ascending order: the form fused-MoE kernels take."""
    ids = torch.nonzero(rmap)[:, 1].view(rmap.shape[0], topk)
    return ids.to(torch.int32), torch.gather(probs, 1, ids).float()


def _routing_metrics(got_map: np.ndarray, logits: np.ndarray, topk: int) -> Metrics:
    """The backend's map against the exact top-k; rows with a tie on the k-th logit accept
    any selection the tie allows (same count, every chosen logit >= the k-th, every
    unchosen <= it)."""
    want = ref.topk_map(logits, topk)
    kth = np.sort(logits, axis=1)[:, ::-1][:, topk - 1:topk]
    chosen_ok = np.where(got_map, logits >= kth, logits <= kth)
    ok = (got_map == want) | (chosen_ok & (got_map.sum(axis=1, keepdims=True) == topk))
    return from_mask(Tier.EXACT, ok, got_map.astype(np.float64), want.astype(np.float64),
                     excused=int((ok & (got_map != want)).sum()))


def check_layer(outputs: dict, inputs: dict, case: LayerCase,
                numerics: LayerNumerics) -> dict[str, Metrics]:
    """Each output's Metrics: the routing map (exact, tie-tolerant), then OUTPUTS under the
    propagated bound of the float64 composition given the backend's routing map."""
    f64 = {k: to_f64(v) for k, v in inputs.items()}
    got_map = outputs["routing_map"].detach().cpu().numpy().astype(bool)
    out = {"routing_map": _routing_metrics(got_map, f64["logits"], case.topk)}
    r = ref.layer(f64["x"], f64["logits"], f64["w1"], f64["w2"], f64["dy"], got_map, case.kind)
    tol = bounds(r, f64["x"], f64["logits"], f64["w1"], f64["w2"], f64["dy"], case.topk,
                 numerics)
    want = {"y": r["y"], "dx": r["dx"], "dw1": r["dw1"], "dw2": r["dw2"],
            "dlogits": r["dlogits"], "probs": r["probs"]}
    for name in (n for n in OUTPUTS if n in outputs):  # a fused forward has y and probs
        dtype = numerics.probs_dtype if name == "probs" else numerics.io_dtype
        out[name] = bounded.judge(outputs[name], want[name], tol[name], dtype, Tier.MOE_LAYER)
    return out


# --- the plain-torch composition ----------------------------------------------------------

def _router_fwd(logits, topk):
    l32 = logits.float()
    idx = torch.topk(l32, topk, dim=1, sorted=True).indices
    rmap = torch.zeros_like(l32, dtype=torch.bool).scatter_(1, idx, True)
    sel = torch.where(rmap, l32, torch.full_like(l32, -torch.inf))
    return torch.softmax(sel, dim=1), rmap


def _router_bwd(dprobs, probs, rmap, logits, topk):
    dp, p = dprobs.float(), probs.float()
    inner = (p * dp).sum(dim=1, keepdim=True)
    return torch.where(rmap, p * (dp - inner), torch.zeros_like(dp)).to(logits.dtype)


def _permute(x, rmap):
    experts, tokens = torch.nonzero(rmap.T, as_tuple=True)  # expert-major, tokens ascending
    splits = [int(s) for s in rmap.sum(dim=0)]
    return x[tokens], (tokens, experts), splits


def _unpermute(h, row_map, probs, tokens_count):
    tokens, experts = row_map
    rows = h.float()
    if probs is not None:
        rows = rows * probs[tokens, experts].float()[:, None]
    y = torch.zeros(tokens_count, h.shape[1], dtype=torch.float32, device=h.device)
    return y.index_add_(0, tokens, rows).to(h.dtype)


def _unpermute_bwd(dy, h, row_map, probs):
    tokens, experts = row_map
    p = probs[tokens, experts].float()[:, None]
    dh = (dy[tokens].float() * p).to(dy.dtype)
    dprobs = torch.zeros_like(probs)
    dprobs[tokens, experts] = (dy[tokens].float() * h.float()).sum(dim=1).to(probs.dtype)
    return dh, dprobs


def _grouped_gemm(a, b, splits, layout):
    """TE's grouped layouts in fp32, one rounding to b's dtype (tealite/moe_types.py)."""
    offs = split_offsets(splits)
    if layout == "NT":
        out = torch.zeros(len(splits), b.shape[1], a.shape[1], dtype=torch.float32,
                          device=a.device)
        for g in range(len(splits)):
            rows = slice(offs[g], offs[g + 1])
            out[g] = b[rows].float().T @ a[rows].float()
        return out.to(b.dtype)
    n = a.shape[1] if layout == "TN" else a.shape[2]
    out = torch.zeros(b.shape[0], n, dtype=torch.float32, device=b.device)
    for g in range(len(splits)):
        rows = slice(offs[g], offs[g + 1])
        w = a[g].float().T if layout == "TN" else a[g].float()
        out[rows] = b[rows].float() @ w
    return out.to(b.dtype)


def torch_stages(backend: str = "torch") -> LayerStages:
    """The plain-torch composition; the activation through tealite's ``backend``."""
    return LayerStages(
        router_fwd=_router_fwd, router_bwd=_router_bwd, permute=_permute,
        unpermute=_unpermute, unpermute_bwd=_unpermute_bwd, grouped_gemm=_grouped_gemm,
        act_fwd=lambda h, kind: tealite.act_fwd(h, kind, backend=backend),
        act_bwd=lambda da, h, kind: tealite.act_bwd(da, h, kind, backend=backend))


# --- tealite's ops, one backend end to end ----------------------------------------------------

def tealite_stages(backend: str = "torch") -> LayerStages:
    """The layer through tealite's front-ends (router_fwd / bwd, moe_permute, moe_unpermute /
    _bwd, grouped_gemm, act_fwd / bwd), every stage on ``backend``.  The router's probs are in
    the logits' dtype (tealite.ops.router), so is everything the backward derives from them."""
    def permute(x, rmap):
        p = tealite.moe_permute(x, rmap, map_type="mask", backend=backend)
        return p.out, p.row_id_map, list(p.row_id_map.tokens_per_expert)

    def unpermute(h, row_map, probs, tokens):
        return tealite.moe_unpermute(h, row_map, merging_probs=probs, backend=backend)

    def unpermute_bwd(dy, h, row_map, probs):
        g = tealite.moe_unpermute_bwd(dy, row_map, permuted=h, merging_probs=probs,
                                      backend=backend)
        return g.grad_permuted, g.grad_probs

    return LayerStages(
        router_fwd=lambda logits, k: tealite.router_fwd(logits, k, backend=backend),
        router_bwd=lambda dp, probs, rmap, logits, k: tealite.router_bwd(
            dp, logits, rmap, k, backend=backend),
        permute=permute, unpermute=unpermute, unpermute_bwd=unpermute_bwd,
        grouped_gemm=lambda a, b, splits, layout: tealite.grouped_gemm(
            a, b, splits, layout=layout, backend=backend),
        act_fwd=lambda h, kind: tealite.act_fwd(h, kind, backend=backend),
        act_bwd=lambda da, h, kind: tealite.act_bwd(da, h, kind, backend=backend),
        numerics=lambda dtype: LayerNumerics(dtype, probs_dtype=dtype))


# --- AITER's fused expert FFN (forward only) --------------------------------------------------

def fused_stages(fused_experts: Callable, numerics: Callable[[torch.dtype], LayerNumerics]
                 ) -> LayerStages:
    """The torch router and a backend's fused expert FFN ``fused_experts(x, w1, w2,
    topk_weights, topk_ids, kind=)``; judged forward only."""
    base = torch_stages()
    return dataclasses.replace(
        base, numerics=numerics,
        fused_forward=lambda x, w1, w2, w, ids, kind: fused_experts(x, w1, w2, w, ids,
                                                                    kind=kind))


def aiter_triton_stages() -> LayerStages:
    """AITER's Triton ``fused_moe`` (tealite/backends/aiter_triton/moe.py): each weighted row
    rounded before the slot sum, as its contract declares."""
    from tealite.backends.aiter_triton.moe import fused_experts
    return fused_stages(fused_experts, lambda dt: numerics_of(dt, "rows_rounded"))


def aiter_ck_stages() -> LayerStages:
    """AITER's CK / ASM ``fused_moe`` (tealite/backends/aiter/moe.py, ROCm): weighted rows
    rounded and summed in the dtype (stage 2 adds them into the output), as declared."""
    from tealite.backends.aiter.moe import fused_experts
    return fused_stages(fused_experts, lambda dt: numerics_of(dt, "rows_rounded_dtype_sum"))
