"""The compound modules' bound (tier label ``module-chain``): LayerNormLinear / LayerNormMLP
forward and backward against the float64 composition (references/modules.py), each stage's
own error bound pushed through the later stages with factors evaluated at the float64
intermediates (the scheme of tiers/moe_layer.py; shared pieces in tiers/chain.py).

Derivation.  z_s is stage s's exact value, ẑ_s the backend's, E_s a bound on |ẑ_s - z_s| and
M(z) = |z| + E_z.  Each stage computes ẑ_s = f_s(ẑ_in) + δ_s, so |ẑ_s - z_s| <=
|f_s(ẑ_in) - f_s(z_in)| + |δ_s|: the propagated term (the stage's derivative bound times E_in,
mean-value theorem, evaluated at magnitudes M so it holds at the backend's inputs) plus the
stage's own bound.  u is the accumulator's unit roundoff (fp32), io the stored dtype; every
stored intermediate adds rnd(v) = u_io M(v) + io's smallest normal (chain.rounding).

* norm forward, per row of H (x exact): mean to γ_H mean|x|; the centred d = x - mean to
  e_m + u M(d); the variance to E_v = 3 γ_{H+3} mean(x²) + 2 e_m mean|d| + e_m² (one-pass
  E[x²] - m² or two-pass); rsigma = (v + eps)^-1/2 to the relative ρ = ½ E_v / (v_lo + eps)
  · sqrt((v + eps) / (v_lo + eps)) + 4u (v_lo = max(v - E_v, 0); rsqrt within 2 ulps and
  the eps add).  z = d r g + b: E_z = E_d r |g| (1 + ρ) + |d| r |g| ρ + 3u (|d r g| + |b|)
  + rnd.  RMSNorm: mean 0, E_d = 0, v = mean(x²) to γ_{H+1}.  Zero-centred gamma adds u|g|.
* quantize (the recipe's rule, monotone): codes = RNE_fmt(fl32(v s)) saturating, value =
  codes · fl32(1/s).  The backend quantizes v̂ ∈ [v - E_v, v + E_v] with a scale ŝ from its
  own amax: current scaling ŝ ∈ [s(amax + max E_v), s(amax - max E_v)] (s = fmax/amax in
  fp32, decreasing in amax), delayed ŝ = the given s, MX 2^-e per block from the block amax
  ± the block's max E_v.  So v̂ ŝ lies in [t_lo, t_hi], the extreme products widened by
  fl32's relative 2^-24, and by monotonicity its codes lie in [Q(t_lo), Q(t_hi)]; the
  dequantized value is one of those codes times one of the two reciprocals, and E_q is
  the largest distance of the four corners from the reference's value Q(v s)/s.  This is
  the declared quantization error (2^-(m+1) relative per rounding, or saturation) counted
  only where the backend's input error or scale can move the rounding: an element whose
  interval holds no rounding boundary has the reference's code exactly.  So a module that
  skips a quantization the recipe prescribes is off by a whole quantization error where
  the bound allows almost nothing, while fp32 inputs keep the intervals narrow.
* GEMM (K terms, fp32 accumulation): propagated E_a M(b) + |a| E_b, own (γ_{K+1} + 2u)
  (M(a) M(b) + |bias|) (the 2u: each operand's dequantization / the scale product) + rnd.
* activation: gelu |gelu'| <= 1.13, |gelu''| <= 0.8; own (e + 4) u (M(a) + M(h)) (the
  erf / exp to e ulps; 1 + erf cancels for negative h, hence the |h| term).  swiglu: silu'
  <= 1.1, silu'' <= 0.5, as tiers/moe_layer.py.  Backward dh = act'(h) da: propagated
  E_da (|act'(h)| + c'' E_h) + c'' |da| E_h, own (e + 8) u · M(da) · 1.25 (|Φ| + |h φ| <=
  1.25) + rnd; swiglu as in tiers/moe_layer.py.
* norm backward (stats the backend's forward produced, errors e_m and ρ): x̂ = d r to
  E_x̂ = E_d r + |d| r ρ + u|x̂|; LayerNorm dx = r (g dz - mean(g dz) - x̂ mean(g dz x̂)):
  each mean of n terms γ_n on magnitudes, the products u each, the propagated E_dz |g|, and
  the final factor r (1 + ρ + u); dgamma = Σ_rows dz x̂ (γ_{rows+1}), dbeta = Σ_rows dz
  (γ_rows), each with the propagated E_dz M(x̂) + |dz| E_x̂ summed.
* bias gradients: Σ_rows of dY / dh in fp32 (chain.row_sum).

Every step is an inequality (global derivative bounds, magnitudes carrying the propagated
error), so the bound is first-order in form and rigorous.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tealite_verify.references import modules as ref
from tealite_verify.references.activations import POINTWISE
from tealite_verify.tiers.chain import matmul, rounding, row_sum
from tealite_verify.tiers.primitives import gamma, unit_roundoff

OUTPUTS = ("y", "z", "dx", "dgamma", "dbeta", "dw1", "db1", "dw2", "db2")
U32 = 2.0 ** -24
_ACT_FACTORS = {"gelu": (1.13, 0.8)}   # (max |f'|, max |f''|) of the pointwise kinds judged
SILU_LIPSCHITZ, SILU_CURVATURE = 1.1, 0.5


@dataclass(frozen=True)
class ModuleNumerics:
    """What the module's stages declare: the stored dtype, the accumulator's unit roundoff
    and the transcendental error of the activation (ulps)."""

    io_dtype: torch.dtype
    accumulator_u: float = unit_roundoff(torch.float32)
    exp_ulps: int = 2


def _mag(v, e):
    return np.abs(v) + e


# --- quantize -------------------------------------------------------------------------------

def _scale_bounds(v, e_v, step: ref.QuantStep):
    """(s_a, s_b): elementwise the two extreme scales the backend may use for ``v``."""
    if step.kind == "delayed":
        s = ref.scales_of(v, step)
        return s, s
    if step.kind == "current":
        amax, emax = float(np.max(np.abs(v))), float(np.max(e_v))
        hi = np.full(v.shape, float(ref.rq.te_scale_from_amax(np.float32(amax + emax),
                                                              step.fmt)))
        lo_amax = max(amax - emax, float(np.finfo(np.float32).tiny))
        lo = np.full(v.shape, float(ref.rq.te_scale_from_amax(np.float32(lo_amax), step.fmt)))
        return hi, lo
    bamax, _ = ref.rq._blocks(np.abs(v), 32)
    be, _ = ref.rq._blocks(e_v, 32)
    top, err = bamax.max(axis=-1), be.max(axis=-1)
    return (ref.mx_block_scales(top + err, v.shape, step),
            ref.mx_block_scales(np.maximum(top - err, 0.0), v.shape, step))


def quantize_bound(v, e_v, want, step: ref.QuantStep | None, columnwise: bool = False):
    """E on the dequantized operand a GEMM reads (``want``: the reference's value)."""
    if step is None:
        return e_v
    if columnwise:
        return quantize_bound(v.T, e_v.T, want.T, step).T
    sa, sb = _scale_bounds(v, e_v, step)
    ends = np.stack([(v - e_v) * sa, (v - e_v) * sb, (v + e_v) * sa, (v + e_v) * sb])
    t_lo, t_hi = ends.min(axis=0), ends.max(axis=0)
    t_lo, t_hi = t_lo - U32 * np.abs(t_lo), t_hi + U32 * np.abs(t_hi)
    err = np.zeros_like(v)
    for t in (t_lo, t_hi):
        codes = ref.rounded_codes(t, step.fmt)
        for s in (sa, sb):
            err = np.maximum(err, np.abs(ref.dequantized(codes, s) - want))
    return err


# --- norm -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _NormErr:
    d: np.ndarray       # centred x (x for RMSNorm), exact
    e_d: np.ndarray
    r: np.ndarray       # rsigma (rows, 1)
    rho: np.ndarray     # relative error of the backend's rsigma (rows, 1)
    g: np.ndarray       # |effective weight|


def _norm_errors(x, gamma_w, r: dict, layer_norm: bool, eps: float, zc: bool, u: float):
    h = x.shape[1]
    x2 = np.mean(x * x, axis=1, keepdims=True)
    if layer_norm:
        mean = r["mean"][:, None]
        e_m = gamma(h, u) * np.mean(np.abs(x), axis=1, keepdims=True)
        d = x - mean
        e_d = e_m + u * (np.abs(d) + e_m)
        var = np.mean(d * d, axis=1, keepdims=True)
        e_v = 3 * gamma(h + 3, u) * x2 + 2 * e_m * np.mean(np.abs(d), axis=1,
                                                           keepdims=True) + e_m ** 2
    else:
        d, e_d, var = x, np.zeros_like(x), x2
        e_v = gamma(h + 1, u) * x2
    v_lo = np.maximum(var - e_v, 0.0)
    rho = 0.5 * e_v / (v_lo + eps) * np.sqrt((var + eps) / (v_lo + eps)) + 4 * u
    g = np.abs(gamma_w + 1.0 if zc else gamma_w) * (1 + (u if zc else 0.0))
    return _NormErr(d, e_d, r["rsigma"][:, None], rho, g)


def _norm_fwd_bound(n: _NormErr, beta, z, u: float, io):
    core = np.abs(n.d) * n.r * n.g
    own = 3 * u * (core + (0.0 if beta is None else np.abs(beta)))
    e = n.e_d * n.r * n.g * (1 + n.rho) + core * n.rho + own
    return e + rounding(np.abs(z) + e, io)


def _norm_bwd_bounds(n: _NormErr, dz, e_dz, dx_ref, layer_norm: bool, u: float, io):
    rows, h = dz.shape
    xh = n.d * n.r
    e_xh = n.e_d * n.r + np.abs(xh) * n.rho + u * np.abs(xh)
    m_xh = np.abs(xh) + e_xh
    m_dz = np.abs(dz) + e_dz
    big = n.g * m_dz
    e_t1 = n.g * e_dz + u * big
    c2 = np.mean(n.g * dz * xh, axis=1, keepdims=True)
    e_c2 = np.mean(n.g * e_dz * m_xh + big * e_xh, axis=1, keepdims=True) + \
        gamma(h + 1, u) * np.mean(big * m_xh, axis=1, keepdims=True)
    m_c2 = np.abs(c2) + e_c2
    e_in = e_t1 + e_xh * m_c2 + m_xh * e_c2
    m_in = big + m_xh * m_c2
    if layer_norm:
        e_m1 = np.mean(e_t1, axis=1, keepdims=True) + gamma(h, u) * np.mean(big, axis=1,
                                                                            keepdims=True)
        e_in = e_in + e_m1
        m_in = m_in + np.mean(big, axis=1, keepdims=True) + e_m1
    e_in = e_in + 3 * u * m_in
    e_dx = n.r * e_in + n.r * (n.rho + u) * m_in
    out = {"dx": e_dx + rounding(np.abs(dx_ref) + e_dx, io)}
    prop = (e_dz * m_xh + np.abs(dz) * e_xh).sum(axis=0)
    own = gamma(rows + 1, u) * (m_dz * m_xh).sum(axis=0)
    out["dgamma"] = prop + own + rounding(np.abs((dz * xh).sum(axis=0)) + prop + own, io)
    if layer_norm:
        out["dbeta"] = row_sum(e_dz, m_dz, u, np.abs(dz.sum(axis=0)), io)
    return out


# --- activation -----------------------------------------------------------------------------

def _act_bounds(kind: str, h, e_h, a_ref, num: ModuleNumerics):
    """(forward bound on a, and a function da, e_da -> bound on dh)."""
    u, io, ex = num.accumulator_u, num.io_dtype, num.exp_ulps
    if kind == "swiglu":
        f = h.shape[1] // 2
        g, v, e_g, e_v = h[:, :f], h[:, f:], e_h[:, :f], e_h[:, f:]
        s = np.abs(g / (1 + np.exp(-g)))
        prop = SILU_LIPSCHITZ * e_g * (np.abs(v) + e_v) + s * e_v
        m_a = np.abs(a_ref) + prop
        e_a = prop + (ex + 4) * u * m_a + rounding(m_a, io)

        def backward(da, e_da):
            dam = np.abs(da)
            sig = 1 / (1 + np.exp(-g))
            dsilu = np.abs(sig * (1 + g * (1 - sig)))
            p_dg = SILU_LIPSCHITZ * (e_da * (np.abs(v) + e_v) + dam * e_v) + \
                SILU_CURVATURE * dam * np.abs(v) * e_g
            p_dv = e_da * (s + SILU_LIPSCHITZ * e_g) + SILU_LIPSCHITZ * dam * e_g
            m_dg, m_dv = dam * np.abs(v) * dsilu + p_dg, dam * s + p_dv
            return np.concatenate([p_dg + (ex + 8) * u * m_dg + rounding(m_dg, io),
                                   p_dv + (ex + 8) * u * m_dv + rounding(m_dv, io)], axis=1)
        return e_a, backward
    if kind not in _ACT_FACTORS:
        raise ValueError(f"the module bound covers activations {sorted(_ACT_FACTORS)} and "
                         f"'swiglu', got {kind!r}")
    lip, curv = _ACT_FACTORS[kind]
    prop = lip * e_h
    m_a = np.abs(a_ref) + prop
    e_a = prop + (ex + 4) * u * (m_a + np.abs(h) + e_h) + rounding(m_a, io)

    def backward(da, e_da):
        dact = np.abs(POINTWISE[kind][1](h))
        prop_dh = e_da * (dact + curv * e_h) + curv * np.abs(da) * e_h
        m_dh = np.abs(da) * dact + prop_dh
        own = (ex + 8) * u * 1.25 * (np.abs(da) + e_da)
        return prop_dh + own + rounding(m_dh + own, io)
    return e_a, backward


# --- the chain ------------------------------------------------------------------------------

def bounds(r: dict, inputs: dict, *, normalization: str, eps: float, zero_centered_gamma: bool,
           activation: str | None, steps: dict, num: ModuleNumerics) -> dict:
    """Elementwise bounds on the module's outputs (OUTPUTS present for its configuration)
    from the float64 intermediates ``r`` of references.modules.layer."""
    u, io = num.accumulator_u, num.io_dtype
    x, w1, b1, dy = inputs["x"], inputs["w1"], inputs.get("b1"), inputs["dy"]
    ln = normalization == "LayerNorm"
    q = steps.get
    zero = np.zeros_like
    n = _norm_errors(x, inputs["gamma"], r, ln, eps, zero_centered_gamma, u)
    e_z = _norm_fwd_bound(n, inputs.get("beta"), r["z"], u, io)
    out = {"z": e_z}
    e_zq = quantize_bound(r["z"], e_z, r["zq"], q("input1"))
    e_zq_col = quantize_bound(r["z"], e_z, r["zq_col"], q("input1"), True)
    e_w1q = quantize_bound(w1, zero(w1), r["w1q"], q("weight1"))
    e_w1q_col = quantize_bound(w1, zero(w1), r["w1q_col"], q("weight1"), True)
    bmag = lambda b: 0.0 if b is None else np.abs(b)  # noqa: E731
    e_h = matmul(e_zq, _mag(r["zq"], e_zq), np.abs(r["zq"]), e_w1q.T, _mag(r["w1q"], e_w1q).T,
                 x.shape[1], u, np.abs(r["h"]), io, extra_rel=2 * u, bias_mag=bmag(b1))
    if activation is None:
        out["y"], e_dh, dh = e_h, zero(dy), dy
    else:
        w2, b2 = inputs["w2"], inputs.get("b2")
        e_a, act_back = _act_bounds(activation, r["h"], e_h, r["a"], num)
        e_aq = quantize_bound(r["a"], e_a, r["aq"], q("input2"))
        e_aq_col = quantize_bound(r["a"], e_a, r["aq_col"], q("input2"), True)
        e_w2q = quantize_bound(w2, zero(w2), r["w2q"], q("weight2"))
        e_w2q_col = quantize_bound(w2, zero(w2), r["w2q_col"], q("weight2"), True)
        out["y"] = matmul(e_aq, _mag(r["aq"], e_aq), np.abs(r["aq"]), e_w2q.T,
                          _mag(r["w2q"], e_w2q).T, w2.shape[1], u, np.abs(r["y"]), io,
                          extra_rel=2 * u, bias_mag=bmag(b2))
        e_dyq = quantize_bound(dy, zero(dy), r["dyq"], q("grad2"))
        e_dyq_col = quantize_bound(dy, zero(dy), r["dyq_col"], q("grad2"), True)
        e_da = matmul(e_dyq, _mag(r["dyq"], e_dyq), np.abs(r["dyq"]), e_w2q_col,
                      _mag(r["w2q_col"], e_w2q_col), w2.shape[0], u, np.abs(r["da"]), io,
                      extra_rel=2 * u)
        out["dw2"] = matmul(e_dyq_col.T, _mag(r["dyq_col"], e_dyq_col).T,
                            np.abs(r["dyq_col"]).T, e_aq_col, _mag(r["aq_col"], e_aq_col),
                            dy.shape[0], u, np.abs(r["dw2"]), io, extra_rel=2 * u)
        if b2 is not None:
            out["db2"] = row_sum(zero(dy), np.abs(dy), u, np.abs(r["db2"]), io)
        e_dh, dh = act_back(r["da"], e_da), r["dh"]
    e_dhq = quantize_bound(dh, e_dh, r["dhq"], q("grad1"))
    e_dhq_col = quantize_bound(dh, e_dh, r["dhq_col"], q("grad1"), True)
    dgrad = r["dhq"] @ r["w1q_col"]
    e_dz = matmul(e_dhq, _mag(r["dhq"], e_dhq), np.abs(r["dhq"]), e_w1q_col,
                  _mag(r["w1q_col"], e_w1q_col), w1.shape[0], u, np.abs(dgrad), io,
                  extra_rel=2 * u)
    if inputs.get("dz_out") is not None:  # the sum of two stored values, rounded once
        e_dz = e_dz + u * (np.abs(r["dz"]) + e_dz) + rounding(np.abs(r["dz"]) + e_dz, io)
    out["dw1"] = matmul(e_dhq_col.T, _mag(r["dhq_col"], e_dhq_col).T, np.abs(r["dhq_col"]).T,
                        e_zq_col, _mag(r["zq_col"], e_zq_col), dh.shape[0], u,
                        np.abs(r["dw1"]), io, extra_rel=2 * u)
    if b1 is not None:
        out["db1"] = row_sum(e_dh, np.abs(dh) + e_dh, u, np.abs(r["db1"]), io)
    out.update(_norm_bwd_bounds(n, r["dz"], e_dz, r["dx"], ln, u, io))
    return out
