"""Strategies for the MoE family (issue 16): token splits and the grouped ops' cases.

One block per op family; each block owns its own names.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.shapes import PRIMES

# ---- token splits (m_splits) ---------------------------------------------------------------

SPLIT_KINDS = ("zeros", "primes", "one_group", "many_small", "uniform")


@functools.lru_cache(maxsize=None)
def _split_kind() -> st.SearchStrategy[str]:
    return st.sampled_from(SPLIT_KINDS)


@st.composite
def m_splits(draw, max_total: int, max_groups: int, *, multiple_of: int = 1):
    """A list of G >= 1 non-negative group sizes whose sum is at most ``max_total``, each a
    multiple of ``multiple_of``.  The shapes that break grouped kernels, by kind:

    * ``zeros``: empty groups among non-empty ones (first, last and middle);
    * ``primes``: prime group sizes (blocks straddle the group boundaries);
    * ``one_group``: every token in one group of several (the others empty);
    * ``many_small``: many groups of 0-3 rows;
    * ``uniform``: sizes drawn uniformly.
    """
    kind = draw(_split_kind())
    unit = multiple_of
    cap = max(1, max_total // unit)  # in units
    groups = draw(st.integers(1, max_groups))
    if kind == "zeros":
        sizes = [draw(st.integers(0, max(1, cap // groups))) for _ in range(groups)]
        for g in draw(st.lists(st.integers(0, groups - 1), min_size=1, max_size=groups)):
            sizes[g] = 0
    elif kind == "primes":
        primes = [p for p in PRIMES if p * unit <= max_total // max(1, groups)] or [1]
        sizes = [draw(st.sampled_from(primes)) for _ in range(groups)]
    elif kind == "one_group":
        sizes = [0] * groups
        sizes[draw(st.integers(0, groups - 1))] = draw(st.integers(1, cap))
    elif kind == "many_small":
        groups = max(groups, min(max_groups, cap))
        sizes = [draw(st.integers(0, min(3, cap // groups))) for _ in range(groups)]
    else:
        sizes = [draw(st.integers(0, max(1, cap // groups))) for _ in range(groups)]
    while sum(sizes) > cap:  # keep the total within the cap (shrink the largest)
        sizes[sizes.index(max(sizes))] -= 1
    return [s * unit for s in sizes]


# ---- grouped quantize (tealite_verify/specs/grouped_quantize.py) ---------------------------

# (max total rows, max K, max groups) per size: interpreted Triton runs one launch per group
# in the split path, so the ci size stays tiny.
GQ_LIMITS = {"ci": (48, 96, 5), "local": (512, 512, 16), "large": (4096, 4096, 64)}


@functools.lru_cache(maxsize=None)
def gq_directions() -> st.SearchStrategy[tuple[bool, bool]]:
    return pick((True, False), (False, True), (True, True))


def gq_dbias() -> st.SearchStrategy[bool]:
    return st.booleans()
