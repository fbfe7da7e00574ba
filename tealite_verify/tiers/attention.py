"""The ``attention`` tier: per-element bounds for dot-product attention, derived from what the
backend declares it rounds (``tealite.numerics.Numerics``).

Notation (one sequence, one head, query row i, visible key j, n_i visible keys, first order
in the unit roundoff u of the compute dtype; ``exp_ulps`` = e, default 1; P_ij, lse_i, out_i
the exact values, s_ij the exact scores, m_i their row max):

Forward
-------
1. Scores.  s^_ij = fl(scale * fl(q_i . k_j)) + bias_ij: a d_qk-term reduction, the scale and
   the bias add, so |s^ - s| <= gamma_{d_qk+2} A_ij with A_ij = scale |q_i||k_j| + |bias_ij|.
2. Probabilities.  p^_ij = fl(exp(fl(s^_ij - m^_i))).  m^ is one of the computed scores, and
   a common shift of every score of a row cancels in out and in lse, so only the relative
   error of each p^ relative to the others counts: the exponent is off by |s^ - s| plus
   the subtraction's u |s - m| (and one more u |s - m| for an exp2-based kernel's log2(e)
   multiply; online softmax's rescaling factors exp(m_old - m_new) add at most
   u (m_final - s_ij) more over all blocks, as their exponents telescope), and exp is off
   by 2 e u relatively (e ulps, an ulp being at most 2u of the value).  So
   p^_ij = p_ij (1 + rho_ij) with |rho_ij| <= r_ij = gamma_{d_qk+2} A_ij + 3u |s_ij - m_i| + 2eu.
3. Normalization.  out = sum_j p^_j v_j / sum_j p^_j.  Perturbing every p by rho changes it
   by sum_j P_j rho_j (v_j - out) / (1 + sum_j P_j rho_j), at most (first order)
       sum_j P_ij r_ij (|v_j| + |out_i|),
   the centred form: an error common to all p (the max, a shared rescaling) costs nothing.
   Not linearized: rho bounds an error *in the exponent*, so |p^ - p| <= P (e^r - 1) and
   sum_j p^_j >= sum_j P_j e^-r (= den_i), giving sum_j P_ij (e^r - 1)(|v_j| + |out_i|) /
   den_i, and never more than max_j |v_j| + |out_i| (out^ is a convex combination of the
   v_j).  To first order this is the sum above; it stays a bound where the score error is
   not small (FP8 scores of large inputs: an H100 fuzz of the FP8 backward had exponents off
   by ~40 within the declared accumulator, e^40 times P).
4. The two reductions of length n_i (numerator P V and the row sum) add
   gamma_{n'} (sum_j P_ij |v_j| + |out_i|), with n' = n_i + 2 n_blocks for a kernel that
   declares ``attention_kv_block`` (per key block one rounding of the rescaled running
   output and of the running sum, n_blocks = ceil(lk / block) + 1); the final division u |out|.
5. P rounded to ``attention_p_rounded_to`` (u_p) before the PV product: u_p sum_j P|v_j|
   (only the numerator sees it; the row sum is kept in fp32), plus, per probability that
   underflows that format (or fp32), half its subnormal step (or fp32's smallest normal)
   times |v_j| (+ |out| for the sum).
6. A factor 2 (``SAFETY``) covers the dropped second-order terms; then half an ulp of the
   output dtype (``ulp.with_output_rounding``).
lse = m + log(sum_j p^_j): the exponent errors' log(1 + sum_j P (e^r - 1)) (first order
sum_j P r; it bounds both signs by Jensen), the row sum's gamma_{n'},
log's 2eu |log l| (l = sum_j exp(s_j - m), log l = lse - m), 2u |lse| for the add (and an
exp2 / log2 kernel's conversion), doubled, then fp32's half ulp.  A row that sees no key
must be exactly out 0 and lse -inf (bound 0).

Backward
--------
The backward is judged at the *exact* forward: the reference's gradients use the exact P
and out.  A backend is handed ``out`` and ``lse`` (the spec gives it the reference's, rounded
to q's dtype and to fp32; a backend's own forward would do as well) and their deviations
from the exact ones, Delta_out and Delta_lse, are measured and propagated, not assumed:
1. P^ = exp(s^ - lse_given): exponent error rho_ij = gamma_{d_qk+2} A + 3u |s - lse| + 2eu +
   Delta_lse_i, so |P^ - P| <= P (e^rho - 1) (first order P rho; P^ itself is then at most
   P + that), plus eta (fp32's smallest normal: exp underflowing) absolutely.
2. dP = dout v^T: gamma_{d_v+2} DPabs_ij, DPabs = |dout||v|^T; D_i = <dout_i, out_given_i>:
   gamma_{d_v+2} <|dout|,|out|> + <|dout|, Delta_out>.
3. dS = P (dP - D): |dS^ - dS| <= (P rho + eta) |dP - D| + (P + eta)(gamma_{d_v+2}
   (DPabs + Dabs) + Delta_D) =: E_ds (the cancellation in dP - D is bounded on
   |P|(|dP| + |D|), never on |dS|); rounded to ``attention_ds_rounded_to``: + u_ds |dS|,
   plus half that format's subnormal step absolutely (a tiny dS rounds into its subnormals).
4. dq = scale dS k, dk = scale dS^T q (summed over the query group), dv = P^T dout: GEMM-like
   reductions (tiers/gemm.py's gamma, length lk for dq, the group's query rows for dk / dv):
   scale (E_ds |k| + (gamma_n + u_ds + u) |dS||k|), the transposed form for dk, and for dv
   (P rho + eta)^T |dout| + (gamma_n + u_p) P^T |dout|; doubled, then the output rounding.

GQA: a backend that rounds each query head's dK / dV to ``partial_sums_rounded_to`` before
summing the group (FlashAttention-2) adds g (u_part |magnitude| + half a subnormal step) to
dK and dV, g the group size: g partial roundings and the additions.

FP8 (the recipe's forward and backward, specs ``attention_fwd_fp8`` / ``attention_bwd_fp8``)
--------------------------------------------------------------------------------------------
The reference is taken of the dequantized (dout,) q, k, v (codes * scale_inv, exact in
float64), so the operands' own quantization costs nothing here: a wrong scale or descale
changes those values, which no bound absorbs.  What a backend adds (``code_floors`` given;
the forward takes item 1 and the floors, its P term being the unscaled one above):
1. Descales.  Every product's operands are dequantized FP8 codes.  A backend either rounds
   each dequantized operand to fp32 (the torch emulation: u per operand) or multiplies the
   fp32 sum of code products by the two descales (AITER: two roundings), and a re-quantized
   P / dS operand carries its scale and descale, each rounded in fp32 (their product is
   1 +- 2u): at most 4u per product, relative to |a||b|, added to every reduction's
   relative bound (the scores, dP and D, dQ, dK, dV).
2. P^T and dS^T rounded to FP8 (``attention_p_rounded_to`` / ``attention_ds_rounded_to``,
   u_fp8 = 2^-4 for E4M3) as in the bf16 backward above: u_fp8 relatively per element above
   the format's subnormal range, plus half a subnormal step absolutely.  With
   ``attention_dynamic_block_scale`` (AITER: x * fmax / max(|block|, amax_floor) rounded,
   the product * max(|block|, amax_floor) / fmax after) the relative term is unchanged and
   the absolute one is scaled back by the block's descale, max(amax, floor) / fmax.  The
   block amax is bounded without knowing the kernel's blocks: P <= 1, and
   |dS_ij| = P_ij |dP_ij - D_i| <= ||dout_i|| (||v_j|| + ||out_i||) (Cauchy-Schwarz), the
   largest over the whole case; both doubled (the computed P and dS carry their own errors,
   which the bounds above keep far below the values).

Tensor cores (the declarations tiers/gemm.py reads too): ``accumulator_unit_roundoff``
replaces u in every matmul reduction's gamma (QK^T, PV and the row sum, dP, dQ, dK, dV), and
``matmul_input_rounding = "tf32"`` adds 2 u_tf32 to each of those relative bounds (both
operands of every product rounded to TF32 first: NVIDIA's default for fp32 ``tl.dot`` and
cuBLAS; the scores' share enters the probabilities through A_ij above).

Hopper's FP8 MMA aligns a product of a subnormal code as if the code had the format's
smallest normal exponent (measured: tests/test_fp8_mma_accumulator.py), so a backend declaring
``alignment_floor = FP8_CODE_ALIGNMENT`` has the magnitudes of its code-by-code products --
|q||k|^T in the scores, |dout||v|^T in dP -- taken with every nonzero operand below twice the
smallest normal code raised to it (``code_floors``: that value times the operand's descale, as
the qgemm tier lifts codes).  P and dS carry their own absolute terms above.

The comparison is tiers/bounded.py's; the pair rule (``attention-pair``) is the sum of the two
backends' bounds.  ``accumulation_gamma`` is Higham's gamma_n by default; the opt-in
probabilistic check passes Higham-Mary's (tiers/probabilistic.py).  Every bound is computed
per block of query rows (references.attention.blocks), on the reference device when the
case runs on the GPU.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from tealite.numerics import FP8_CODE_ALIGNMENT, Numerics

from tealite_verify.references import attention as ref
from tealite_verify.tiers.primitives import (compute_dtype, gamma, ulp, underflow_error,
                                             unit_roundoff)
from tealite_verify.tiers.ulp import with_output_rounding

SAFETY = 2.0
F32 = torch.float32


@dataclass(frozen=True)
class Rounding:
    """What the bounds read of a declaration."""

    u: float          # compute dtype's unit roundoff
    exp_rel: float    # exp's relative error: 2 * exp_ulps * u
    u_p: float        # P rounded before the PV / dV products (0: kept in the compute dtype)
    eta_p: float      # absolute error of a probability that underflows
    u_ds: float       # dS rounded before the dQ / dK products (0: not)
    kv_block: int | None
    eta: float        # absolute error of one operation underflowing (its smallest normal)
    eta_ds: float = 0.0  # absolute error of a dS rounded into its format's subnormals
    u_acc: float = 0.0   # the matmuls' accumulator (declared accumulator_unit_roundoff, else u)
    u_in: float = 0.0    # each matmul operand rounded first (matmul_input_rounding "tf32")
    u_op: float = 0.0    # FP8 operands' descales per product (module doc, "FP8")

    @classmethod
    def of(cls, numerics: Numerics) -> "Rounding":
        c = compute_dtype(numerics)
        u = unit_roundoff(c)
        p_dt, ds_dt = numerics.attention_p_rounded_to, numerics.attention_ds_rounded_to
        eta_p = float(torch.finfo(c).tiny)
        if p_dt is not None:
            eta_p += 0.5 * float(ulp(p_dt, 0.0))
        exp_ulps = 1 if numerics.exp_ulps is None else numerics.exp_ulps
        # Tensor-core matmuls: fp32 operands read as TF32 (NVIDIA's default for tl.dot and
        # cuBLAS on fp32), products accumulated with the declared accumulator roundoff (the
        # same declarations the gemm tier reads).
        u_in = unit_roundoff("tf32") if numerics.matmul_input_rounding == "tf32" else 0.0
        u_acc = numerics.accumulator_unit_roundoff or u
        return cls(u, 2.0 * exp_ulps * u, 0.0 if p_dt is None else unit_roundoff(p_dt), eta_p,
                   0.0 if ds_dt is None else unit_roundoff(ds_dt), numerics.attention_kv_block,
                   underflow_error(c), 0.0 if ds_dt is None else 0.5 * float(ulp(ds_dt, 0.0)),
                   max(u_acc, u), u_in)

    def dot(self, n: int, acc_gamma) -> float:
        """Relative bound of one n-term matmul reduction: accumulation plus both operands'
        input rounding (the 2 u_in of a product of two rounded operands)."""
        return acc_gamma(n, self.u_acc) + 2 * self.u_in + self.u_op

    def blocks(self, lk: int) -> int:
        return 0 if not self.kv_block else math.ceil(lk / self.kv_block) + 1


@dataclass(frozen=True)
class CodeFloors:
    """Per operand, the magnitude a nonzero FP8 code below twice the format's smallest normal
    counts at in a declared ``alignment_floor = FP8_CODE_ALIGNMENT`` MMA (0: not lifted)."""
    q: float = 0.0
    k: float = 0.0
    v: float = 0.0
    dout: float = 0.0

    def of(self, numerics: Numerics) -> "CodeFloors":
        return self if numerics.alignment_floor == FP8_CODE_ALIGNMENT else CodeFloors()


def _aligned(xp, x, floor: float):
    """|x| with its nonzero elements raised to ``floor`` (tiers/gemm.aligned_magnitude)."""
    ax = xp.abs(x)
    return xp.where(ax != 0, xp.maximum(ax, floor), ax) if floor else ax


def _exponent_error(blk: ref.Block, st: ref.Structure, r: Rounding, centre, acc_gamma,
                    floors: CodeFloors):
    """rho: the bound on each probability's error in its exponent, from the score error and
    the exponent's distance to ``centre`` (the row max, or the lse); 0 where not visible."""
    xp = blk.ops.xp
    a = (_aligned(xp, blk.q, floors.q) @ _aligned(xp, blk.k, floors.k).swapaxes(-1, -2)
         ) * st.scale
    if blk.bias is not None:
        a = a + xp.where(blk.vis, xp.abs(blk.bias), 0.0)
    c_s = r.dot(blk.q.shape[-1], acc_gamma) + 2 * r.u
    dist = xp.where(blk.vis, xp.abs(blk.s - centre[..., None]), 0.0)
    return xp.where(blk.vis, c_s * a + 3 * r.u * dist + r.exp_rel, 0.0)


def _scaled(xp, p, factor):
    """p * factor, 0 where p is 0 (an infinite factor times a probability that underflowed)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return xp.where(p > 0, p * factor, 0.0)


def _nan_to_inf(xp, e):
    """An error bound that came out NaN (an infinite term times 0) is no bound: inf."""
    return xp.where(e != e, float("inf"), e)


def _inverse_row_sum(xp, p, rho, n_vis):
    """1 / sum_j P_j e^-rho_j: the inverse of a lower bound on the computed row sum (P sums
    to 1 over a row's visible keys); inf where that bound underflows, 1 for a row that sees
    no key (its terms are all 0)."""
    with np.errstate(under="ignore"):
        den = _scaled(xp, p, xp.exp(-rho)).sum(-1)[..., None]
    safe = xp.where(den > 0, den, 1.0)
    return xp.where(den > 0, 1.0 / safe, xp.where(n_vis > 0, float("inf"), 1.0))


def _prob_error(xp, p, rho):
    """|p^ - p| <= p (e^rho - 1): rho bounds an error in the exponent (module doc)."""
    with np.errstate(over="ignore"):
        return _scaled(xp, p, xp.expm1(rho))


def _finite_or_zero(xp, x, seen):
    return xp.where(seen, x, 0.0)


def forward_tolerances(q, k, v, st: ref.Structure, numerics: Numerics, out_dtype, *,
                       bias=None, alibi=None, accumulation_gamma=gamma,
                       code_floors: CodeFloors | None = None):
    """(tol of out, tol of lse) for a backend declaring ``numerics``; 0 where a row sees
    no key (out must be exactly 0 there, lse exactly -inf).  ``code_floors``: q, k, v are
    dequantized FP8 codes (the recipe's forward: descales per product, and the floors)."""
    r = Rounding.of(numerics)
    floors = CodeFloors()
    if code_floors is not None:
        r, floors = dataclasses.replace(r, u_op=4 * r.u), code_floors.of(numerics)
    ops = ref.ops_of(q)
    tol_out, tol_lse = ref.empty_outputs(q, v, st)
    tol_lse = ops.zeros(tuple(tol_lse.shape))
    ov = ref.bshd_view(tol_out, st.layout)
    for blk in ref.blocks(q, k, v, st, bias=bias, alibi=alibi):
        if blk.span.lk == 0:
            continue
        xp = blk.ops.xp
        seen = blk.lse > -np.inf
        m = _finite_or_zero(xp, blk.ops.amax(blk.s, -1), seen)
        rho = _exponent_error(blk, st, r, m, accumulation_gamma, floors)
        pr = _prob_error(xp, blk.p, rho)
        vis = xp.where(blk.vis, 1.0, 0.0)
        n_vis = vis.sum(-1)[..., None]
        inv_den = _inverse_row_sum(xp, blk.p, rho, n_vis)
        with np.errstate(over="ignore", invalid="ignore"):
            p_hat = _scaled(xp, blk.p, xp.exp(rho) * inv_den)   # >= each normalized p^
        av, ao = xp.abs(blk.v), xp.abs(blk.out)
        pv = p_hat @ av
        g_red = r.dot(blk.span.lk + 2 * r.blocks(blk.span.lk), accumulation_gamma)
        with np.errstate(invalid="ignore"):
            e = ((pr @ av + ao * pr.sum(-1)[..., None]) * inv_den  # centred probability errors
                 + g_red * (pv + ao)                             # numerator and row sum
                 + r.u_p * pv + r.u * ao                         # P rounded; the division
                 + r.eta_p * (vis @ av + n_vis * ao)             # underflowed probabilities
                 + r.eta * n_vis)                                # underflowed products
        # out^ is (to within its roundings, which SAFETY covers) an average of the v_j.
        e = xp.minimum(_nan_to_inf(xp, e), xp.amax(av, -2, keepdims=True) + ao)
        ov[blk.span.q_rows(blk.r0, blk.r1)] = with_output_rounding(
            blk.out, SAFETY * e, out_dtype).swapaxes(0, 1)
        lse = _finite_or_zero(xp, blk.lse, seen)
        shift = xp.minimum(xp.log1p(pr.sum(-1)), xp.amax(rho, -1))  # |lse^ - lse| <= max rho
        e_lse = (shift + g_red + r.exp_rel * xp.abs(lse - m) + 2 * r.u * xp.abs(lse)
                 + r.eta_p * n_vis[..., 0])
        tol = with_output_rounding(lse, SAFETY * e_lse, F32)
        tol_lse[blk.span.lse_rows(blk.r0, blk.r1)] = _finite_or_zero(xp, tol, seen)
    return tol_out, tol_lse


def _row_norm_max(t) -> float:
    """max over rows of the Euclidean norm over the last dim (0 for an empty tensor)."""
    return float((t * t).sum(-1).max()) ** 0.5 if math.prod(t.shape) else 0.0


def _half_subnormal(dt, amax: float, floor: float) -> float:
    """Half a subnormal step of FP8 ``dt`` scaled back by a dynamic block descale."""
    return 0.5 * float(ulp(dt, 0.0)) * max(amax, floor) / float(torch.finfo(dt).max)


def fp8_rounding(r: Rounding, numerics: Numerics, dout, v, out_given) -> Rounding:
    """``r`` for the FP8 recipe's backward (module doc, "FP8"): 4u per product for the
    operands' descales; P's and dS's absolute terms scaled back by their block descale where
    the backend declares a dynamic per-block scale."""
    r = dataclasses.replace(r, u_op=4 * r.u)
    p_dt, ds_dt = numerics.attention_p_rounded_to, numerics.attention_ds_rounded_to
    if not numerics.attention_dynamic_block_scale:
        return r
    floor = numerics.amax_floor or 0.0
    ds_amax = 2 * _row_norm_max(dout) * (_row_norm_max(v) + _row_norm_max(out_given))
    return dataclasses.replace(
        r, eta_p=r.eta + (0.0 if p_dt is None else _half_subnormal(p_dt, 2.0, floor)),
        eta_ds=0.0 if ds_dt is None else _half_subnormal(ds_dt, ds_amax, floor))


def backward_tolerances(dout, q, k, v, out_given, lse_given, st: ref.Structure,
                        numerics: Numerics, exact, dtype, *, bias=None, alibi=None,
                        accumulation_gamma=gamma, code_floors: CodeFloors | None = None):
    """(tol of dq, dk, dv) for a backend declaring ``numerics``, handed ``out_given`` and
    ``lse_given`` (their deviations from the exact forward are propagated); ``exact``: the
    reference's (dq, dk, dv), whose dtype-rounding the bounds include (q's dtype).
    ``code_floors``: dout, q, k, v are dequantized FP8 codes (the recipe's backward)."""
    r = Rounding.of(numerics)
    floors = CodeFloors()
    if code_floors is not None:
        r, floors = fp8_rounding(r, numerics, dout, v, out_given), code_floors.of(numerics)
    ops = ref.ops_of(q)
    xp = ops.xp
    e_q, e_k, e_v = ops.zeros(q.shape), ops.zeros(k.shape), ops.zeros(v.shape)
    m_k, m_v = ops.zeros(k.shape), ops.zeros(v.shape)     # |dS|^T|q|, P^T|dout|
    eqv, ekv, evv, mkv, mvv = (ref.bshd_view(t, st.layout) for t in (e_q, e_k, e_v, m_k, m_v))
    dov, oov = ref.bshd_view(dout, st.layout), ref.bshd_view(out_given, st.layout)
    n_rows = 1
    c_d = r.dot(v.shape[-1], accumulation_gamma) + 2 * r.u
    for blk in ref.blocks(q, k, v, st, bias=bias, alibi=alibi):
        if blk.span.lk == 0:
            continue
        rows = blk.span.q_rows(blk.r0, blk.r1)
        do, dp, d, ds = ref.backward_block(blk, dov[rows])
        seen = blk.lse > -np.inf
        given = lse_given[blk.span.lse_rows(blk.r0, blk.r1)]
        d_lse = _finite_or_zero(xp, xp.abs(_finite_or_zero(xp, given, seen)
                                           - _finite_or_zero(xp, blk.lse, seen)), seen)
        lse = _finite_or_zero(xp, blk.lse, seen)
        rho = _exponent_error(blk, st, r, lse, accumulation_gamma, floors)
        rho = xp.where(blk.vis, rho + d_lse[..., None], 0.0)
        pr = _prob_error(xp, blk.p, rho) + xp.where(blk.vis, r.eta_p, 0.0)
        ado = xp.abs(do)
        d_out = xp.abs(oov[rows].swapaxes(0, 1) - blk.out)
        dp_abs = _aligned(xp, do, floors.dout) @ _aligned(xp, blk.v, floors.v).swapaxes(-1, -2)
        d_abs = (ado * xp.abs(blk.out)).sum(-1)[..., None]
        d_delta = (ado * d_out).sum(-1)[..., None]
        p_eta = xp.where(blk.vis, blk.p + pr, 0.0)               # >= |P^|
        under = 2 * v.shape[-1] * r.eta                      # underflowed products in dP, D
        e_ds = (pr * xp.abs(dp - d[..., None])
                + p_eta * (c_d * (dp_abs + d_abs) + d_delta + under)
                + 2 * r.u * blk.p * (xp.abs(dp) + xp.abs(d[..., None]))
                + xp.where(blk.vis, r.eta_ds, 0.0))              # dS rounded to subnormals
        ads = xp.abs(ds) + e_ds
        n = blk.span.lk
        g_q = r.dot(n, accumulation_gamma) + r.u_ds + r.u
        eqv[rows] = ((e_ds @ xp.abs(blk.k) + g_q * (ads @ xp.abs(blk.k)) + n * r.eta)
                     * st.scale).swapaxes(0, 1)
        kv = blk.span.kv_rows()
        ekv[kv] += ops.group_sum(e_ds.swapaxes(-1, -2) @ xp.abs(blk.q), blk.group
                                 ).swapaxes(0, 1) * st.scale
        mkv[kv] += ops.group_sum(ads.swapaxes(-1, -2) @ xp.abs(blk.q), blk.group
                                 ).swapaxes(0, 1) * st.scale
        evv[kv] += ops.group_sum(pr.swapaxes(-1, -2) @ ado, blk.group).swapaxes(0, 1)
        mvv[kv] += ops.group_sum(p_eta.swapaxes(-1, -2) @ ado, blk.group).swapaxes(0, 1)
        n_rows = max(n_rows, blk.span.lq * blk.group)
    g_k = r.dot(n_rows, accumulation_gamma) + r.u_ds + r.u
    g_v = r.dot(n_rows, accumulation_gamma) + r.u_p
    errors = [e_q, e_k + g_k * m_k + n_rows * r.eta * st.scale, e_v + g_v * m_v + n_rows * r.eta]
    group = q.shape[-2] // max(k.shape[-2], 1)
    part = numerics.partial_sums_rounded_to
    if part is not None and group > 1:
        # Per-query-head dK / dV rounded to ``part`` before the group sum (FlashAttention-2's
        # GQA backward: dk_expanded in q's dtype, then summed): each of the g partials and
        # each addition costs u_part of the group's magnitude, or half a subnormal step.
        u_part, eta_part = unit_roundoff(part), 0.5 * float(ulp(part, 0.0))
        errors[1] = errors[1] + group * (u_part * m_k + eta_part)
        errors[2] = errors[2] + group * (u_part * m_v + eta_part)
    return tuple(with_output_rounding(x, SAFETY * _nan_to_inf(xp, e), dtype)
                 for x, e in zip(exact, errors))
