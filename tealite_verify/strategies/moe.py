"""Strategies for the MoE family (issue 16).  One block per op family; each block owns its
names (the router, permutation and grouped-quantize blocks live beside this one).
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.shapes import PRIMES, dim

# ---- token splits (m_splits), shared by every grouped op ----------------------------------

# How a split is drawn; each is a shape that breaks grouped kernels.
SPLIT_KINDS = ("zeros", "primes", "one_group", "many_small", "uniform")


@functools.lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@st.composite
def m_splits(draw, max_total: int, max_groups: int = 8) -> list[int]:
    """G in 1..``max_groups`` non-negative group sizes summing to at most ``max_total``:

    * ``zeros``: empty groups among non-empty ones (first, last or middle);
    * ``primes``: prime sizes, so tiles straddle group boundaries;
    * ``one_group``: every token in one group of several, the others empty;
    * ``many_small``: many groups of 0-3 rows;
    * ``uniform``: sizes drawn uniformly.
    """
    kind = draw(pick(*SPLIT_KINDS))
    groups = draw(st.one_of(pick(1, max_groups), _ints(1, max_groups)))
    share = max(1, max_total // groups)
    if kind == "zeros":
        sizes = [draw(_ints(0, share)) for _ in range(groups)]
        for g in draw(st.lists(_ints(0, groups - 1), min_size=1, max_size=groups)):
            sizes[g] = 0
    elif kind == "primes":
        primes = [p for p in PRIMES if p <= share] or [1]
        sizes = [draw(pick(*primes)) for _ in range(groups)]
    elif kind == "one_group":
        sizes = [0] * groups
        sizes[draw(_ints(0, groups - 1))] = draw(st.one_of(pick(max_total), _ints(0, max_total)))
    elif kind == "many_small":
        groups = max_groups
        sizes = [draw(_ints(0, min(3, max(0, max_total // groups)))) for _ in range(groups)]
    else:
        sizes = [draw(_ints(0, share)) for _ in range(groups)]
    while sum(sizes) > max_total:  # a prime or uniform draw may overshoot: trim the largest
        sizes[sizes.index(max(sizes))] -= 1
    return sizes


# ---- grouped GEMM (tealite_verify/specs/grouped_gemm.py, grouped_qgemm.py) ----------------

# (max split total, max M / N, max K) per size.  The ci size keeps interpreted Triton
# cases tiny: a grouped kernel runs one program per (group, tile), the split path one GEMM
# launch per group.
GROUPED_GEMM_LIMITS = {"ci": (64, 64, 64), "local": (512, 256, 1024),
                       "large": (4096, 2048, 4096)}


def grouped_gemm_dims(size: str = "ci") -> st.SearchStrategy[tuple[list[int], int, int, int]]:
    """(m_splits, M, N, K) of a grouped GEMM case, valid under every layout: the splits cut
    the tokens (TN / NN: rows, summing to M_total; NT: the contraction, summing to K_total);
    M is NT's output rows, K the split-M contraction; N (and K) often off the 16-grid."""
    total, max_mn, max_k = GROUPED_GEMM_LIMITS[size]
    return st.tuples(m_splits(total, 8), dim(max_mn), dim(max_mn), dim(max_k))
