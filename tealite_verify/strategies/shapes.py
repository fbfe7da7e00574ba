"""Shape strategies biased toward the sizes that break kernels: primes, one off a multiple of
8/16/32/128, dims of 1, empty token dims, and long reductions."""
from __future__ import annotations

import functools

from hypothesis import strategies as st

# Primes, including the ones TE and AITER tests use (229, 541, 677, 1481, 3571).
PRIMES = (2, 3, 5, 7, 11, 13, 17, 29, 31, 37, 61, 67, 71, 97, 127, 131, 229, 251, 257, 509,
          541, 677, 1021, 1481, 2053, 3571, 4099)


def _misaligned(limit: int) -> list[int]:
    out = set()
    for align in (8, 16, 32, 64, 128, 256):
        for mult in (1, 2, 3):
            for off in (-1, 1):
                v = align * mult + off
                if 1 <= v <= limit:
                    out.add(v)
    return sorted(out)


# Strategy constructors are cached (lru_cache): a composite's body runs on every draw, and a
# strategy object built there anew is re-validated by Hypothesis each time (see choices.py).
@functools.lru_cache(maxsize=None)
def _edge_sizes(max_value: int) -> st.SearchStrategy[int]:
    specials = [1] + [p for p in PRIMES if p <= max_value] + _misaligned(max_value)
    specials += [v for v in (8, 16, 32, 64, 128, 256) if v <= max_value]
    return st.sampled_from(sorted(set(specials)))


_SELECTOR = st.integers(0, 15)


@functools.lru_cache(maxsize=None)
def dim(max_value: int, *, allow_zero: bool = False) -> st.SearchStrategy[int]:
    """One dimension in [0 or 1, max_value]: 0 (when allowed) one draw in 16, an edge size
    (1, a prime, one off a power-of-two multiple) about half the time, otherwise uniform."""
    return _dim(max_value, allow_zero, _edge_sizes(max_value), st.integers(1, max_value))


@st.composite
def _dim(draw, max_value, allow_zero, edges, uniform) -> int:
    selector = draw(_SELECTOR)
    if allow_zero and selector == 0:
        return 0
    if selector < 9:
        return draw(edges)
    return draw(uniform)


@functools.lru_cache(maxsize=None)
def gemm_shapes(max_mn: int = 96, max_k: int = 512, allow_empty_m: bool = True):
    """(M, N, K): M may be 0 (an empty token batch); K may be long (up to ``max_k``)."""
    return st.tuples(dim(max_mn, allow_zero=allow_empty_m), dim(max_mn),
                     st.one_of(dim(min(max_k, 64)), dim(max_k)))


@functools.lru_cache(maxsize=None)
def row_shapes(max_rows: int = 64, max_hidden: int = 512, allow_empty: bool = True):
    """(*leading, H) for row-wise ops: 1 to 3 leading dims, possibly an empty one."""
    return _row_shapes(max_rows, dim(max_hidden), dim(max_rows, allow_zero=allow_empty),
                       dim(max_rows))


_N_LEAD = st.integers(1, 3)


@st.composite
def _row_shapes(draw, max_rows, hidden_dim, first_dim, other_dim):
    hidden = draw(hidden_dim)
    n_lead = draw(_N_LEAD)
    lead = [draw(first_dim if i == 0 else other_dim) for i in range(n_lead)]
    while _prod(lead) > max_rows:
        lead[lead.index(max(lead))] //= 2
    return (*lead, hidden)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p
