"""Opt-in probabilistic GEMM bound: the "suspicious" verdict (issue 13, part 5).

Why
---
The deterministic ``gemm`` tier bounds the accumulation by Higham's ``gamma_K(u) |A||B|``,
which is exact worst case but grows like ``K u``.  With zero-mean data |A.B| grows like
``sqrt(K)`` while ``|A||B|`` grows like ``K``, so at large K the bound is many output ulps wide:
an fp16 GEMM at K = 4096 with normal data tolerates ~20 ulps of the output, and a one-ulp scale
error or an undeclared lower-precision partial sum is invisible to it.

Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput.
41(5), 2019: if the rounding errors delta_k are independent random variables of mean zero with
|delta_k| <= u (their model M), then for any lambda > 0 (Theorem 2.4)

    prod_{k=1..n} (1 + delta_k) = 1 + theta_n,   |theta_n| <= gamma~_n(lambda)
    gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1   (~ lambda sqrt(n) u)

holds with probability at least P(lambda) = 1 - 2 exp(-lambda^2 (1 - u)^2 / 2), and an inner
product of length n, in any order of evaluation (Theorem 3.1), satisfies

    |s^ - s| <= gamma~_n(lambda) sum_i |a_i b_i|

with probability at least 1 - n (1 - P(lambda)): a union over its n terms' theta_n.
Connolly, Higham & Mary, "Stochastic Rounding and Its Probabilistic Backward Error Analysis",
SIAM J. Sci. Comput. 43(1), 2021, prove the same bound when the errors are only *mean
independent* (E[delta_k | delta_1..delta_{k-1}] = 0; Azuma-Hoeffding instead of Hoeffding).

How lambda is chosen
--------------------
For a stated per-case false-alarm probability p (default 1e-9) a case with ``numel`` outputs,
each an inner product of K products (K + 1 terms counting an epilogue seeded in the
accumulator; we always count K + 1, which only over-counts), asks for ``numel (K + 1)`` bounds
|theta_n| <= gamma~ at once.  A union bound gives the case's false-alarm probability
<= numel (K + 1) * 2 exp(-lambda^2 (1 - u)^2 / 2) <= p, so

    lambda = sqrt(2 ln(2 numel (K + 1) / p)) / (1 - u).

(The issue's brief wrote 2 exp(-lambda^2 (1-u)^2 / 2) "per inner product"; Theorem 3.1 has the
extra factor n, counted here.)  lambda grows only like sqrt(log): p = 1e-9, a 256 x 256 output
at K = 4096 gives lambda = 9.04.  Where gamma~_K exceeds the deterministic gamma_K (small K:
K < ~lambda^2) the deterministic one is used: it always holds.

What is modelled
----------------
Only the K-term accumulation term of :func:`tiers.gemm.gemm_tolerances` becomes probabilistic;
every other term stays deterministic (and is the same code): the final rounding to the output
dtype (half an ulp), the fp32 epilogue, GELU, declared extra roundings (TF32 inputs, split-K
partial sums, an accumulator rounded before the epilogue, dequantized operands), the
underflow term and flushed subnormal products.  Inputs are exact (the reference reads the
rounded inputs), and FP8 / MX scales are exact in the reference (qgemm dequantizes exactly).

Model M needs mean-zero rounding errors.  A backend that declares ``accumulator_unit_roundoff``
(tensor cores add aligned products with truncation, Fasi, Higham, Mikaitis & Pranesh, PeerJ CS
2021; Hopper FP8 WGMMA keeps ~14 bits) or ``alignment_floor`` does not round to nearest: its
errors have a sign bias and the sqrt(K) growth is not assured, so its accumulation keeps the
deterministic gamma_K (such a backend is never suspicious through this term).

Round to nearest is not random either: for structured data (e.g. one large product followed
by many below half an ulp of the running sum: stagnation) the errors are correlated and a
correct kernel can exceed gamma~.  That is why the verdict is "suspicious", never "fail", and
why its false-alarm rate is measured on correct backends (docs/probabilistic.md).

The FlashAttention-style ratio (Dao et al., FlashAttention 1-3 tests: max|out - ref| <=
2 max|out_torch_lowprec - ref|) is reported beside it as a cross-check: max|backend - ref|
over max|same-precision torch computation - ref|.  When the backend under test is torch the
two computations are the same and the ratio is 1 (0 when both are exact) by construction.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Callable, Mapping

import numpy as np
import torch

from tealite.numerics import Numerics

from tealite_verify.tiers import gemm
from tealite_verify.tiers.metrics import Metrics
from tealite_verify.tiers.primitives import gamma, to_f64, unit_roundoff

ENV_VAR = "TEALITE_VERIFY_PROBABILISTIC"  # per-case false-alarm probability, e.g. 1e-9
DEFAULT_FALSE_ALARM = 1e-9


def check_probability(p, name: str = "false_alarm_probability") -> float:
    """``p`` as a float in the open interval (0, 1), or a ValueError naming ``name``."""
    try:
        v = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a probability in (0, 1), got {p!r}") from None
    if not (0.0 < v < 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be a probability in (0, 1), got {p!r}")
    return v


def target_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """The per-case false-alarm probability in $TEALITE_VERIFY_PROBABILISTIC, or None (off)
    when it is unset or empty.  How ``run --probabilistic`` reaches the fuzz workers."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    return check_probability(raw, ENV_VAR) if raw else None


def failure_probability(lam: float, u: float) -> float:
    """1 - P(lambda) = 2 exp(-lambda^2 (1 - u)^2 / 2): the probability that one |theta_n|
    exceeds gamma~_n(lambda) under model M (Higham & Mary 2019, Theorem 2.4)."""
    return min(1.0, 2.0 * math.exp(-0.5 * (lam * (1.0 - u)) ** 2))


def rounding_events(numel: int, k: int) -> int:
    """How many theta bounds one GEMM case relies on: K + 1 terms per output (Theorem 3.1's
    union over an inner product's terms, counting a seeded epilogue), times the outputs."""
    if numel < 0 or k < 0:
        raise ValueError(f"numel and k must be >= 0, got numel={numel}, k={k}")
    return int(numel) * (int(k) + 1)


def lambda_for(p_case: float, events: int, u: float) -> float:
    """Smallest lambda with events * (1 - P(lambda)) <= p_case (a union bound)."""
    p_case = check_probability(p_case, "p_case")
    if events <= 0:
        return 0.0
    return math.sqrt(2.0 * math.log(2.0 * events / p_case)) / (1.0 - u)


def gamma_tilde(n: int, u: float, lam: float) -> float:
    """Higham & Mary's gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1."""
    if n < 0 or not (0.0 < u < 1.0) or not lam >= 0.0:
        raise ValueError(f"gamma_tilde needs n >= 0, 0 < u < 1, lambda >= 0; got n={n}, u={u}, "
                         f"lambda={lam}")
    return math.expm1(lam * math.sqrt(n) * u + n * u * u / (1.0 - u))


def accumulation_gamma(lam: float) -> Callable[[int, float], float]:
    """The K-term relative bound for :func:`gemm.gemm_tolerances`: the probabilistic
    gamma~_K(lambda), or the deterministic gamma_K where that is smaller (it always holds)."""
    def g(k: int, u: float) -> float:
        return min(gamma(k, u), gamma_tilde(k, u, lam))
    return g


def rounds_to_nearest(numerics: Numerics) -> bool:
    """Whether the declared accumulation fits model M (see the module docstring)."""
    return (numerics.accumulator_unit_roundoff is None
            and numerics.alignment_floor is None)


def gemm_prob_tolerances(p_abs, p, pre, k: int, out_dtype, numerics: Numerics,
                         p_case: float, **kw) -> dict:
    """:func:`gemm.gemm_tolerances` with the accumulation term gamma_K replaced by
    gamma~_K(lambda), lambda chosen for ``p_case`` over this case's outputs; ``kw`` as there."""
    if not rounds_to_nearest(numerics):
        return gemm.gemm_tolerances(p_abs, p, pre, k, out_dtype, numerics, **kw)
    u_acc = unit_roundoff(torch.float32)
    lam = lambda_for(p_case, rounding_events(_numel(p), k), u_acc)
    return gemm.gemm_tolerances(p_abs, p, pre, k, out_dtype, numerics,
                                accumulation_gamma=accumulation_gamma(lam), **kw)


def _numel(x) -> int:
    return int(x.numel()) if isinstance(x, torch.Tensor) else int(np.size(x))


def max_ratio(actual, expected, tol) -> float:
    """max |actual - expected| / tol over the elements where both are finite (NaN / Inf /
    overflow are the deterministic tier's to judge); 0 where there are none, inf where an
    error meets a zero bound."""
    a, e = to_f64(actual), to_f64(expected)
    t = np.broadcast_to(to_f64(tol), e.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
    ok = np.isfinite(err)
    if not ok.any():
        return 0.0
    err, t = err[ok], t[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(t > 0, err / np.where(t > 0, t, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(r.max())


def fa_ratio(actual, expected, baseline) -> float:
    """max|actual - ref| / max|baseline - ref| over elements where all three are finite; 0/0
    (both exact) is 0, x/0 is inf."""
    a, e, b = to_f64(actual), to_f64(expected), to_f64(baseline)
    ok = np.isfinite(a) & np.isfinite(e) & np.isfinite(b)
    if not ok.any():
        return 0.0
    num = float(np.abs(a[ok] - e[ok]).max())
    den = float(np.abs(b[ok] - e[ok]).max())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def with_probabilistic(m: Metrics, actual, expected, prob_tol, baseline=None) -> Metrics:
    """``m`` (the deterministic Metrics) with ``prob_ratio`` and ``fa_ratio`` filled in; a
    shape error leaves it as it is."""
    if m.shape_error is not None or tuple(actual.shape) != tuple(np.shape(expected)):
        return m
    fa = fa_ratio(actual, expected, baseline) if baseline is not None else None
    return replace(m, prob_ratio=max_ratio(actual, expected, prob_tol), fa_ratio=fa)
