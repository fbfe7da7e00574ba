"""The composed MoE layer's bound (tier label ``moe-layer``): each stage's own error bound,
propagated through the later stages to first order with rigorous Lipschitz factors evaluated
at the float64 intermediates (references/moe_layer.py); issue 16 part 5.

Derivation.  Write z_s for the exact float64 value of stage s and ẑ_s for the backend's, and
E_s for an elementwise bound on |ẑ_s - z_s|, M(z) = |z| + E_z (a bound on |ẑ|).  Each stage
computes ẑ_s = f_s(ẑ_in) + δ_s, so

    |ẑ_s - z_s| <= |f_s(ẑ_in) - f_s(z_in)| + |δ_s|,

the first term *propagated* (the stage's Lipschitz / condition factor times E_in) and the
second the stage's *own* bound, evaluated at magnitudes M so that it bounds the error at the
backend's actual inputs.  Stages and their factors (u_c: the accumulator's unit roundoff, fp32
2^-24 unless declared; u_io: the stored dtype's; every stored intermediate adds one rounding
rnd(v) = u_io M(v) + the dtype's smallest normal):

* router (inputs exact): p = softmax over the k selected logits, exp with ``exp_ulps`` ulps,
  the shifted argument d = l - max rounded (relative |d| u_c in exp), a k-term positive sum
  and a division: E_p = (2 ((exp_ulps + 1) + max|d|) u_c + γ_k + u_c) p + rnd(p).
* permute: exact copies (E_xp = 0); unpermute without probs: sums of k rows, γ_k.
* grouped GEMM, K terms: propagated E_A |B| + |A| E_B (the linear map, exact); own
  γ_K M(A) M(B) (Higham, fp32 accumulation) + rnd(out); operands rounded before the
  products (TF32: Triton's fp32 ``tl.dot`` on NVIDIA, declared ``matmul_input_rounding``) add
  2 u_in M(A) M(B), u_in = 2^-10 (twice TF32's unit roundoff: the MMA may truncate).
  Split-K wgrad has K = the group's rows m_e.
* swiglu a = silu(g) v: |silu'| <= 1.1 so |Δa| <= 1.1 E_g M(v) + |silu(g)| E_v; own
  (exp_ulps + 4) u_c M(a) + rnd.  Backward dg = da v silu'(g), dv = da silu(g), |silu''| <=
  0.5: E_dg <= 1.1 (E_da M(v) + |da| E_v) + 0.5 |da| |v| E_g, E_dv <= E_da (|silu(g)| +
  1.1 E_g) + 1.1 |da| E_g; own (exp_ulps + 8) u_c M + rnd.
* unpermute with probs, y = Σ_e p h2: propagated Σ (E_p M(h2) + |p| E_h2); own γ_{k+1} Σ M(p)
  M(h2) + rnd; a fused FFN that rounds each weighted row first adds u_io Σ M(p) M(h2)
  (``weighted_rows_rounded``), one that sums in the dtype uses γ_{k+1}(u_io)
  (``merge_in_io_dtype``).  Its backward dh2 = p dy (E_p |dy| + u_c M + rnd) and dprobs = <dy, h2> over
  H (|dy| E_h2 summed + γ_H |dy| M(h2) + rnd).
* router backward dl = p (dp - Σ p dp): propagated E_p (M(dp) + M(s)) + |p| (E_dp + E_s)
  with E_s = Σ (E_p M(dp) + |p| E_dp); own (γ_k + 2 u_c) M(p) (M(dp) + M(s)) + rnd.

Each step is an inequality, not a linearisation: the Lipschitz factors are global derivative
bounds (mean-value theorem), and the magnitudes M carry the propagated error, so the
propagation is first-order in form (each stage's bound pushed through the next stage's
factors) but rigorous; each rounding also adds the dtype's smallest normal (underflow).  With
``probs_given`` (the expert FFN op) the weights are exact inputs (E_p = 0).  The routing map is
discrete: the layer is judged given the backend's map, which must equal the exact top-k except
at a tie on the k-th logit (tie-tolerant: any selection the tie allows).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tealite_verify.references import moe_layer as ref
from tealite_verify.tiers.chain import rounding
from tealite_verify.tiers.primitives import gamma, underflow_error, unit_roundoff

SILU_LIPSCHITZ = 1.1    # max |silu'(x)| = 1.0998 (x ~ 2.4)
SILU_CURVATURE = 0.5    # max |silu''(x)| = 0.5 (x = 0)


@dataclass(frozen=True)
class LayerNumerics:
    """What the stages of one backend declare: the stored dtype of the intermediates and of
    the outputs (``io_dtype``), of the router's probabilities (``probs_dtype``), the
    accumulator's unit roundoff and the exp error of the softmax / SiLU."""

    io_dtype: torch.dtype
    probs_dtype: torch.dtype = torch.float32
    accumulator_u: float = unit_roundoff(torch.float32)
    exp_ulps: int = 2
    # A fused expert FFN (AITER's fused MoE) rounds each weighted row p * h2 to the dtype
    # before a token's rows are summed; and may sum them in the dtype itself (atomic adds).
    weighted_rows_rounded: bool = False
    merge_in_io_dtype: bool = False
    # unit roundoff of the GEMM operands' rounding before the products (0: exact products)
    input_u: float = 0.0


_rnd = rounding  # one idiom for a stored intermediate's rounding (tiers/chain.py)


def _gemm(e_in, m_in, w_abs, k: int, u: float, out_mag, dtype, grouped, u_in: float = 0.0):
    """Propagated E_in through |w| plus the GEMM's own γ_K (+ 2 u_in) bound and its output
    rounding; ``grouped(a, w)`` applies the per-row expert weights."""
    prop = grouped(e_in, w_abs)
    own = (gamma(k, u) + 2 * u_in) * grouped(m_in, w_abs)
    return prop + own + _rnd(out_mag + prop + own, dtype)


def _wgrad(e_d, m_d, e_a, m_a, experts, groups, u, dtype, d_abs, a_abs, u_in: float = 0.0):
    """E of out[e] = d[rows]^T a[rows] (K = the group's row count)."""
    prop = ref.grouped_nt(e_d, m_a, experts, groups) + ref.grouped_nt(d_abs, e_a, experts,
                                                                        groups)
    own = np.zeros_like(prop)
    for e in range(groups):
        sel = experts == e
        own[e] = (gamma(max(int(sel.sum()), 1), u) + 2 * u_in) * (m_d[sel].T @ m_a[sel])
    exact = np.abs(ref.grouped_nt(d_abs, a_abs, experts, groups))  # >= |out| (a magnitude)
    return prop + own + _rnd(exact + prop + own, dtype)


def numerics_of(io_dtype, merge=None, probs_dtype=torch.float32,
                input_rounding: str | None = None) -> LayerNumerics:
    """The layer numerics of a backend declaring ``numerics.moe_merge`` = ``merge`` (a
    tealite.moe_types.MoEMerge value or None) and ``matmul_input_rounding``."""
    merge = None if merge is None else str(merge)
    return LayerNumerics(io_dtype, probs_dtype=probs_dtype,
                         # twice the format's unit roundoff: an MMA fed fp32 registers (Triton
                         # on NVIDIA) truncates to TF32 rather than rounding (an H100 fp32 case
                         # was 1.07 times the round-to-nearest bound)
                         input_u=2 * unit_roundoff(input_rounding) if input_rounding else 0.0,
                         weighted_rows_rounded=merge in ("rows_rounded",
                                                         "rows_rounded_dtype_sum"),
                         merge_in_io_dtype=merge == "rows_rounded_dtype_sum")


def bounds(r: dict, x, logits, w1, w2, dy, topk: int, num: LayerNumerics, *,
           probs_given: bool = False) -> dict:
    """Elementwise bounds on the layer's outputs (y, dx, dw1, dw2, dlogits, probs) from the
    float64 intermediates ``r`` of references.moe_layer.layer.  ``probs_given``: the routing
    weights are an exact input (the expert FFN op), not the router's output."""
    u, io, pdt = num.accumulator_u, num.io_dtype, num.probs_dtype
    rt: ref.Routing = r["routing"]
    ex, groups, tokens = rt.experts, w1.shape[0], len(x)
    w1a, w2a = np.abs(w1), np.abs(w2)
    def tn(a, w):  # row r times w[expert of r].T; dgrads pass w transposed
        return ref.grouped_tn(a, w, ex)
    p = r["probs"]
    routed = np.zeros(p.shape, bool)
    routed[rt.tokens, ex] = True
    # router
    if probs_given:
        e_p = np.zeros_like(p)
    else:
        shifted = np.where(routed, np.abs(logits - np.where(routed, logits, -np.inf).max(
            axis=1, keepdims=True)), 0.0).max(axis=1, keepdims=True)
        rel_p = 2 * ((num.exp_ulps + 1) + shifted) * u + gamma(topk, u) + u
        e_p = np.where(routed, rel_p * np.abs(p) + _rnd(np.abs(p), pdt), 0.0)
    pa = np.abs(p)  # a given weight may be negative; the router's never are
    m_p = pa + e_p
    pr, e_pr = pa[rt.tokens, ex], e_p[rt.tokens, ex]
    # fc1 (inputs exact), activation, fc2
    xp = np.abs(r["xp"])
    h1 = r["h1"]
    e_h1 = _gemm(np.zeros_like(xp), xp, w1a, x.shape[1], u, np.abs(h1), io, tn, num.input_u)
    f = h1.shape[1] // 2
    g, v, e_g, e_v = h1[:, :f], h1[:, f:], e_h1[:, :f], e_h1[:, f:]
    s = np.abs(g / (1 + np.exp(-g)))
    a = r["a"]
    prop_a = SILU_LIPSCHITZ * e_g * (np.abs(v) + e_v) + s * e_v
    m_a0 = np.abs(a) + prop_a
    e_a = prop_a + (num.exp_ulps + 4) * u * m_a0 + _rnd(m_a0, io)
    m_a = np.abs(a) + e_a
    h2 = r["h2"]
    e_h2 = _gemm(e_a, m_a, w2a, f, u, np.abs(h2), io, tn, num.input_u)
    m_h2 = np.abs(h2) + e_h2
    y_prop = ref.unpermute(e_pr[:, None] * m_h2 + pr[:, None] * e_h2, rt, None, tokens)
    terms = ref.unpermute((pr + e_pr)[:, None] * m_h2, rt, None, tokens)
    u_merge = unit_roundoff(io) if num.merge_in_io_dtype else u
    y_own = (gamma(topk + 1, max(u, u_merge)) +
             (unit_roundoff(io) if num.weighted_rows_rounded else 0.0)) * terms
    if num.weighted_rows_rounded:
        y_own = y_own + topk * underflow_error(io)
    e_y = y_prop + y_own + _rnd(np.abs(r["y"]) + y_prop + y_own, io)
    # backward: unpermute's, fc2's, the activation's, fc1's, permute's, the router's
    dya = np.abs(dy)
    dh2 = r["dh2"]
    e_dh2 = e_pr[:, None] * dya[rt.tokens]
    e_dh2 = e_dh2 + u * (np.abs(dh2) + e_dh2) + _rnd(np.abs(dh2) + e_dh2, io)
    m_dh2 = np.abs(dh2) + e_dh2
    dp_rows_prop = (dya[rt.tokens] * e_h2).sum(axis=1)
    dp_rows_own = gamma(dy.shape[1], u) * (dya[rt.tokens] * m_h2).sum(axis=1)
    e_dp = np.zeros_like(p)
    e_dp[rt.tokens, ex] = dp_rows_prop + dp_rows_own + _rnd(
        np.abs(r["dprobs"][rt.tokens, ex]) + dp_rows_prop + dp_rows_own, pdt)
    da = r["da"]
    e_da = _gemm(e_dh2, m_dh2, np.swapaxes(w2a, 1, 2), w2.shape[1], u, np.abs(da), io, tn,
                 num.input_u)
    e_dw2 = _wgrad(e_dh2, m_dh2, e_a, m_a, ex, groups, u, io, np.abs(dh2), np.abs(a),
                   num.input_u)
    dam = np.abs(da)
    sig = 1 / (1 + np.exp(-g))
    dsilu = np.abs(sig * (1 + g * (1 - sig)))
    prop_dg = SILU_LIPSCHITZ * (e_da * (np.abs(v) + e_v) + dam * e_v) + \
        SILU_CURVATURE * dam * np.abs(v) * e_g
    prop_dv = e_da * (s + SILU_LIPSCHITZ * e_g) + SILU_LIPSCHITZ * dam * e_g
    m_dg0 = dam * np.abs(v) * dsilu + prop_dg
    m_dv0 = dam * s + prop_dv
    e_dh1 = np.concatenate([
        prop_dg + (num.exp_ulps + 8) * u * m_dg0 + _rnd(m_dg0, io),
        prop_dv + (num.exp_ulps + 8) * u * m_dv0 + _rnd(m_dv0, io)], axis=1)
    dh1 = r["dh1"]
    m_dh1 = np.abs(dh1) + e_dh1
    e_dxp = _gemm(e_dh1, m_dh1, np.swapaxes(w1a, 1, 2), 2 * f, u, np.abs(r["dxp"]), io, tn,
                  num.input_u)
    e_dw1 = _wgrad(e_dh1, m_dh1, np.zeros_like(xp), xp, ex, groups, u, io, np.abs(dh1), xp,
                   num.input_u)
    m_dxp = np.abs(r["dxp"]) + e_dxp
    dx_prop = ref.unpermute(e_dxp, rt, None, tokens)
    dx_own = gamma(topk, u) * ref.unpermute(m_dxp, rt, None, tokens)
    e_dx = dx_prop + dx_own + _rnd(np.abs(r["dx"]) + dx_prop + dx_own, io)
    dpa = np.abs(r["dprobs"])
    m_dp = dpa + e_dp
    e_s = (e_p * m_dp + pa * e_dp).sum(axis=1, keepdims=True)
    m_s = np.abs((p * r["dprobs"]).sum(axis=1, keepdims=True)) + e_s
    dl_prop = e_p * (m_dp + m_s) + pa * (e_dp + e_s)
    dl_own = (gamma(topk, u) + 2 * u) * m_p * (m_dp + m_s)
    e_dl = np.where(routed, dl_prop + dl_own + _rnd(np.abs(r["dlogits"]) + dl_prop + dl_own,
                                                    io), 0.0)
    return {"y": e_y, "dx": e_dx, "dw1": e_dw1, "dw2": e_dw2, "dlogits": e_dl, "probs": e_p}
