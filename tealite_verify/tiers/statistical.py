"""The ``statistical`` tier: a dropout mask judged as a sample of independent Bernoulli(1 - p)
draws, by exact binomial tests with a stated false-alarm probability.

Why not bitwise: every backend owns its generator (tealite/ops/dropout.py), so two correct
backends produce different masks; what they share is the distribution.  Deterministic facts
(y from the backend's own mask, the backward's mask, same seed -> same mask) are judged
exactly elsewhere; this tier judges the generator.

Null hypothesis H0: the n kept flags are independent, each kept with probability q in
[q0 - eps, q0 + eps], q0 = 1 - p.  eps = 2^-22 covers the generators' discretisation: torch's
float32 uniforms are multiples of 2^-24; Triton's are a 31-bit integer times an fp32 constant,
rounded (spacing <= 2^-24 below 1); and p itself is compared as an fp32 (|fl32(p) - p| <=
2^-25).  Each of those moves P(u >= p) by at most 2^-23.

Tests (each a count that is exactly binomial under H0):

1. kept fraction: K = number kept ~ Bin(n, q);
2. periodic patterns: for each period k in PERIODS and residue r < k, the kept count of the
   positions i = r (mod k) ~ Bin(n_r, q) (an "every k-th element" generator fails its class);
3. serial dependence: for each lag d in LAGS (plus the row length), the agreements
   mask[i] == mask[i + d] over *disjoint* pairs (i mod 2d < d) ~ Bin(n_d, q^2 + (1-q)^2) (a
   mask repeating with period d agrees everywhere at lag d);
4. streams: the mask of offset + 1 against this one, position by position and shifted by one
   element: agreements ~ Bin(n, q^2 + (1-q)^2) (a generator that ignores the offset, or
   treats it as a shift of one stream, agrees everywhere).

The agreement probability a(q) = q^2 + (1-q)^2 has |a'(q)| = |4q - 2| <= 2, so its composite
null gets twice the slack, 2 eps.  Pairs are disjoint, so their agreements are independent.

p-values: two-sided by doubling the smaller tail, P = min(1, 2 min(P(X <= x), P(X >= x))),
with each tail taken at the q in [q0 - eps, q0 + eps] that makes it largest (the composite
null).  Under H0, P(P <= a) <= a for every a (each tail is a valid p-value and a union bound
covers the two).  Alpha budget: the case's false-alarm probability ``alpha`` (default 1e-6)
is split equally over the m tests of the case (Bonferroni): test i rejects iff P_i <= alpha/m,
so P(any rejection | H0) <= sum alpha/m = alpha, whatever the dependence between tests.

Tails: summed exactly from the pmf, log pmf(x) from ``math.lgamma`` (absolute error about
2.2e-16 * lgamma(n + 1) <= 6e-8 for n <= 2^24, i.e. a relative error < 1e-7 in each term),
successive terms by the ratio recurrence in a cumulative sum, over a window of 40 standard
deviations + 64 terms from x, for x <= n q (above the mean, 1 minus the other tail: it is then
>= ~1/2, far from any rejection); the terms beyond the window are each below the last summed
one (x <= floor(n q) <= floor((n + 1) q), the mode, and the pmf is unimodal, so the window
runs away from the mode), so their sum is at most x times it, which is added (the tail is
over-estimated, never under: no false alarm from truncation).
scipy is not installed, so nothing else is used.

p = 0 or p = 1 (q0 = 0 or 1): no randomness is allowed; the mask must be all kept / all
dropped exactly (a one-test verdict, no alpha spent).

Power (the shapes the strategies draw at the ``local`` size: a stats sample of n >= 2^18):
a case has m ~ 55 tests, so at alpha = 1e-6 each rejects at P <= 1.8e-8, a deviation of about
5.7 standard deviations.  A drop probability off by 0.01 moves the kept count by 0.01 n, which
at n = 2^18 is >= 10.2 sd (the worst case, p = 0.5): caught with probability > 0.999.  A
period-k pattern or a reused stream puts a count hundreds of sd from its mean, caught at the
``ci`` size (n ~ 4096) already.  tests/test_dropout.py shows both: the mutants caught, and the
observed false-alarm rate of correct generators within alpha over many seeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair

# The generators' discretisation of P(kept) (module docstring).
Q_SLACK = 2.0 ** -22
DEFAULT_ALPHA = 1e-6
PERIODS = (2, 3, 4, 5, 6, 7, 8)
LAGS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512, 1024)
_WINDOW_SD = 40.0


def _log_pmf(n: int, x: int, q: float) -> float:
    if q <= 0.0:
        return 0.0 if x == 0 else -math.inf
    if q >= 1.0:
        return 0.0 if x == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
            + x * math.log(q) + (n - x) * math.log1p(-q))


def lower_tail(n: int, x: int, q: float) -> float:
    """P(X <= x) for X ~ Bin(n, q), over-estimated by at most the truncation bound."""
    if x >= n:
        return 1.0
    if x < 0:
        return 0.0
    if q <= 0.0:
        return 1.0
    if q >= 1.0:
        return 0.0
    if x > n * q:
        # Above the mean the tail is >= ~1/2 and the summation below would run towards the
        # mode: take the complement, whose count n - x - 1 < n (1 - q) is below its mean.
        return max(0.0, 1.0 - lower_tail(n, n - x - 1, 1.0 - q))
    w = int(_WINDOW_SD * math.sqrt(n * q * (1 - q)) + 64)
    lo = max(0, x - w)
    j = np.arange(x, lo, -1, dtype=np.float64)  # pmf(j - 1) / pmf(j), j = x .. lo + 1
    log_ratio = np.log(j) - np.log(n - j + 1) + math.log1p(-q) - math.log(q)
    logs = _log_pmf(n, x, q) + np.concatenate(([0.0], np.cumsum(log_ratio)))
    terms = np.exp(logs)
    total = float(terms.sum())
    if lo > 0:
        total += lo * float(terms[-1])  # the terms below the window, each <= the last
    return min(1.0, total)


def upper_tail(n: int, x: int, q: float) -> float:
    """P(X >= x) for X ~ Bin(n, q) (the lower tail of the complementary count)."""
    return lower_tail(n, n - x, 1.0 - q)


def two_sided_p(n: int, x: int, q0: float, slack: float = Q_SLACK) -> float:
    """The composite-null two-sided p-value of x successes in n trials (module docstring)."""
    if n == 0:
        return 1.0
    lo_q, hi_q = max(0.0, q0 - slack), min(1.0, q0 + slack)
    # P(X <= x) grows as q falls; P(X >= x) grows as q rises.
    return min(1.0, 2.0 * min(lower_tail(n, x, lo_q), upper_tail(n, x, hi_q)))


@dataclass(frozen=True)
class Test:
    """One binomial test of a case: its name, trials, successes and success probability."""

    name: str
    n: int
    x: int
    q: float
    slack: float = Q_SLACK  # the composite null's half-width around q (module docstring)

    def p_value(self) -> float:
        return two_sided_p(self.n, self.x, self.q, self.slack)


def _flat(mask) -> np.ndarray:
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    return np.asarray(mask, dtype=bool).reshape(-1)


def _disjoint_pairs(n: int, d: int) -> np.ndarray:
    """Starts i of the disjoint pairs (i, i + d): i mod 2d < d, i + d < n."""
    i = np.arange(max(n - d, 0))
    return i[(i % (2 * d)) < d]


def mask_tests(mask, p: float, *, row: int | None = None, next_mask=None) -> list[Test]:
    """The binomial tests of one mask (and the next offset's mask) under H0 (0 < p < 1)."""
    m = _flat(mask)
    n, q = m.size, 1.0 - p
    agree = q * q + (1 - q) * (1 - q)
    tests = [Test("kept fraction", n, int(m.sum()), q)]
    for k in PERIODS:
        for r in range(k):
            cls = m[r::k]
            if cls.size:
                tests.append(Test(f"kept in class {r} mod {k}", cls.size, int(cls.sum()), q))
    lags = sorted(set(LAGS) | ({row} if row and row > 1 else set()))
    for d in lags:
        i = _disjoint_pairs(n, d)
        if i.size:
            tests.append(Test(f"agreement at lag {d}", i.size, int((m[i] == m[i + d]).sum()),
                              agree, 2 * Q_SLACK))
    if next_mask is not None:
        m2 = _flat(next_mask)
        tests.append(Test("agreement with offset + 1", n, int((m == m2).sum()), agree,
                          2 * Q_SLACK))
        tests.append(Test("agreement with offset + 1 shifted by one", n - 1,
                          int((m[1:] == m2[:-1]).sum()), agree, 2 * Q_SLACK))
    return tests


def judge_mask(mask, p: float, *, alpha: float = DEFAULT_ALPHA, row: int | None = None,
               next_mask=None, tier: Tier = Tier.STATISTICAL) -> Metrics:
    """The tier's verdict on a kept mask drawn with drop probability p."""
    m = _flat(mask)
    if p in (0.0, 1.0):
        want = p == 0.0
        bad = int((m != want).sum())
        if next_mask is not None:
            bad += int((_flat(next_mask) != want).sum())
        what = "kept" if want else "dropped"
        note = None if not bad else f"p = {p}: every element must be {what}"
        return Metrics(tier, m.size, bad, float(bad), math.inf if bad else 0.0, note=note)
    tests = mask_tests(m, p, row=row, next_mask=next_mask)
    per_test = alpha / len(tests)
    pvals = [t.p_value() for t in tests]
    rejected = [i for i, pv in enumerate(pvals) if pv <= per_test]
    worst = int(np.argmin(pvals))
    t = tests[worst]
    ratio = per_test / pvals[worst] if pvals[worst] > 0 else math.inf
    note = (f"worst: {t.name}: {t.x} of {t.n} (expected {t.n * t.q:.1f}), p-value "
            f"{pvals[worst]:.3g} vs alpha/m = {alpha:g}/{len(tests)}")
    return Metrics(tier, len(tests), len(rejected), abs(t.x - t.n * t.q), ratio, note=note)


def judge_pair(mask_x, mask_y, p: float, *, alpha: float = DEFAULT_ALPHA, row=None,
               next_x=None, next_y=None) -> Metrics:
    """Backend vs backend: each mask judged on its own (alpha each); never bitwise."""
    return combine_pair(judge_mask(mask_x, p, alpha=alpha, row=row, next_mask=next_x),
                        judge_mask(mask_y, p, alpha=alpha, row=row, next_mask=next_y),
                        Tier.STATISTICAL_PAIR)
