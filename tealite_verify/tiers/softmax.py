"""The ``softmax`` tier: a per-element bound of TE's fused softmax, forward and backward, from a
first-order running-error analysis of the kernel's algorithm (tealite/ops/softmax.py).

Notation: u = unit roundoff of the declared ``compute_dtype`` (fp32: 2^-24), k = declared
``exp_ulps`` (default 1; one ulp is at most 2u relative), n = sk (the row length: every
kind's reduction runs over the whole row, hidden keys adding exact zeros or exp(fill - m)),
gamma_n = n u / (1 - n u).  Values with a hat are computed; everything else is the float64
reference's (references/softmax.py).

Forward, per row, s_j = scale * x_j (or the fill), m = max_j s_j, d_j = s_j - m <= 0:

1. ``s_j = fl(x_j * fl32(scale))``: the scale is rounded once to fp32 and the product once,
   |s^_j - s_j| <= 2u |s_j| (a fill value, -10000 or -inf, is exact).
2. The max is a selection, so m^ is one of the s^_j: |m^ - m| <= 2u |m|.
3. The subtraction d^_j = fl(s^_j - m^) is *not* exact in general: Sterbenz's lemma makes it
   exact only for s^_j in [m^/2, 2m^] (same sign, within a factor 2); a logit far below the max
   (or of the other sign) rounds, |err| <= u |d_j|.  An exp evaluated as 2^(d log2 e)
   (Triton's ``tl.exp`` on CUDA, fast-math expf) rounds its argument once more: another
   u |d_j|, allowed for every backend (an exact exp does not need it).  Together
   delta_j = 2u (|s_j| + |m|) + 2u |d_j| bounds the error of exp's argument (absolute:
   large logits make it large; it is what a kernel without max subtraction cannot achieve
   at all, since its exp overflows once s_j > 88.7 in fp32, 11.1 in fp16).
4. ``e^_j = exp(d^_j)(1 + k 2u)``: relative error eta_j = (exp(delta_j) - 1) + 2 k u
   (exp(d + t) = exp(d) exp(t)); k counts only the exp core's ulps.
5. The row sum S = sum_j e_j of non-negative terms in any order (tree, sequential, blocked):
   |S^ - S| <= sum_j e_j eta_j + gamma_n S, so rho_S = sum_j y_j eta_j + gamma_n relative.
   S >= 1 (the max term is exp(0) = 1 exactly), so no cancellation and no underflow of S.
6. The division y_j = e_j / S adds u (2 n u for a declared ``fp32_div_ulps`` n, e.g.
   CUDA's approximate ``div.full``): rel_j = eta_j + rho_S + u (first order), and
   ``SAFETY`` (2) covers the second-order terms.
7. An e_j that underflows (d_j < -87.3 in fp32) is off by at most the smallest normal
   (flushed or subnormal), which S >= 1 does not amplify: (n + 2) * tiny absolute.
8. The output is rounded once to the output dtype (``ulp.with_output_rounding``).

Positions whose output is 0 by the contract (hidden keys, zeroed rows) get tolerance 0: a
kernel with a wrong diagonal or fill rule is caught exactly there.

Backward, per row, c = sum_k dy_k y_k (over the kept keys), dx_j = scale y_j (dy_j - c);
dy and y are the inputs (exact).  p_k = fl(dy_k y_k) rounds once (u |p_k|); the dot product
has length n: |c^ - c| <= gamma_{n+1} A with A = sum_k |dy_k y_k|; y_j c^ rounds (u |y_j c|)
and carries |y_j| |c^ - c|; the subtraction p_j - y_j c rounds (u |dy_j y_j - y_j c|) and
cancels: the absolute terms above are what bound it, not the (possibly tiny) result; the
scale (rounded to fp32) and the multiply add 2u |dx_j|:

    err_j <= |scale| (u |dy_j y_j| + |y_j| (gamma_{n+1} A + 2u |c|) + u |dy_j y_j - y_j c|)
             + 2u |dx_j|

times ``SAFETY``, plus an underflow term for the n + 3 products, then the output rounding.

Declared numerics read: ``compute_dtype``, ``exp_ulps``, ``fp32_div_ulps`` (forward).  The comparison and the pair rule
(``softmax-pair``: the sum of the two bounds) are tiers/bounded.py's.
"""
from __future__ import annotations

import numpy as np
from tealite.numerics import Numerics

from tealite_verify.tiers import ulp
from tealite_verify.tiers.primitives import compute_dtype, gamma, underflow_error, unit_roundoff

SAFETY = 2.0


def _u_and_exp(numerics: Numerics) -> tuple[float, float]:
    u = unit_roundoff(compute_dtype(numerics))
    k = numerics.exp_ulps if numerics.exp_ulps is not None else 1
    return u, 2.0 * k * u


def forward_bound(y, s, zeroed, out_dtype, numerics: Numerics) -> np.ndarray:
    """Tolerance of the forward output: ``y`` the float64 softmax, ``s`` the filled float64
    logits (references.softmax.filled_logits), ``zeroed`` where y is 0 by the contract."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return np.zeros(y.shape)
    u, e_exp = _u_and_exp(numerics)
    n = y.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        s_fin = np.where(np.isfinite(s), s, 0.0)  # -inf fills: exact, and y = 0 there
        m = s_fin.max(axis=-1, keepdims=True)
        d = np.where(np.isfinite(s), s_fin - m, 0.0)
        delta = 2 * u * (np.abs(s_fin) + np.abs(m) + np.abs(d))
        eta = np.expm1(delta) + e_exp
    rho_s = (y * eta).sum(axis=-1, keepdims=True) + gamma(n, u)
    div = 2 * numerics.fp32_div_ulps * u if numerics.fp32_div_ulps else u
    e_c = SAFETY * (eta + rho_s + div) * y + (n + 2) * underflow_error(compute_dtype(numerics))
    tol = ulp.with_output_rounding(y, e_c, out_dtype)
    return np.where(zeroed, 0.0, tol)


def backward_bound(dy, y, dx, scale: float, keep, out_dtype, numerics: Numerics) -> np.ndarray:
    """Tolerance of dx: ``dy``, ``y`` the float64 inputs, ``dx`` the float64 reference,
    ``keep`` the kept keys of a causal kind (None: all); dx is 0 elsewhere by the contract."""
    dy = np.asarray(dy, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return np.zeros(y.shape)
    if keep is not None:
        dy, y = np.where(keep, dy, 0.0), np.where(keep, y, 0.0)
    u, _ = _u_and_exp(numerics)
    n = y.shape[-1]
    p = dy * y
    c = p.sum(axis=-1, keepdims=True)
    a = np.abs(p).sum(axis=-1, keepdims=True)
    inner = u * np.abs(p) + np.abs(y) * (gamma(n + 1, u) * a + 2 * u * np.abs(c)) \
        + u * np.abs(p - y * c)
    e_c = SAFETY * (abs(scale) * inner + 2 * u * np.abs(dx))
    e_c = e_c + (n + 3) * underflow_error(compute_dtype(numerics)) * max(abs(scale), 1.0) \
        * (1.0 + np.abs(y))
    tol = ulp.with_output_rounding(dx, e_c, out_dtype)
    return tol if keep is None else np.where(keep, tol, 0.0)
