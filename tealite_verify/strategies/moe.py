"""Strategies for the MoE family (issue 16).  One block per op family; each block owns its
own names.
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import PRIMES, dim
from tealite_verify.strategies.values import distributions, seeds

# ---- token permutation (tealite_verify/specs/permute.py) -----------------------------------

# (max tokens, max experts, max hidden) per size.  The ci size keeps interpreted Triton cases
# tiny (one program per token and hidden block); experts reach 64 from the local size on.
PERMUTE_LIMITS = {"ci": (48, 8, 64), "local": (512, 64, 512), "large": (4096, 128, 2048)}
# Quantized inputs: None (plain values) or the scale layout that moves with the codes.
PERMUTE_QUANT = ("tensor", "row", "block", "mx", "mx-fp4")
MAP_TYPES = ("mask", "index")
PAD_ALIGNS = (16, 128, 1, 3, 32)


@functools.lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=None)
def _tokens(max_tokens: int) -> st.SearchStrategy[int]:
    """0, 1, primes and sizes one off a power of two (shapes.dim), and the top."""
    return st.one_of(dim(max_tokens, allow_zero=True), pick(0, max_tokens))


_BOOL = st.booleans()
_QUANT = pick(None, None, None, *PERMUTE_QUANT)
_NOBODY = pick(0.0, 0.0, 0.25, 1.0)
# Router probs: float32 mostly (TE's recommendation), bf16 / fp16 as a router may emit them.
_PROBS_DTYPES = pick("float32", "float32", "bfloat16", "float16")


@st.composite
def permute_routing(draw, size: str = "ci") -> dict:
    """Routing of a permute case: map type, tokens, experts, top-k, the tokens routed to
    nobody (mask maps: a fraction of all-zero rows) and how many routed rows are dropped
    (0, a few, or all)."""
    max_t, max_e, _ = PERMUTE_LIMITS[size]
    experts = draw(st.one_of(pick(1, 2, max_e), _ints(1, max_e)))
    topk = draw(st.one_of(pick(1, min(2, experts), experts), _ints(1, experts)))
    tokens = draw(_tokens(max_t))
    map_type = draw(pick(*MAP_TYPES))
    drop = draw(st.one_of(pick(0, 0, 0, 1), _ints(0, max(0, tokens * topk))))
    return {"map_type": map_type, "tokens": tokens, "experts": experts, "topk": topk,
            "nobody": draw(_NOBODY) if map_type == "mask" else 0.0, "drop": drop,
            "routing_seed": draw(seeds()), "probs_dtype": draw(_PROBS_DTYPES)}


@st.composite
def permute_rows(draw, dtype: str | None = None, size: str = "ci", *,
                 quantized: bool = True) -> dict:
    """The rows that move: ``shape`` [tokens, hidden] (hidden off the 16-grid often), dtype,
    value distribution, and (``quantized``) sometimes codes with their scales instead."""
    _, _, max_h = PERMUTE_LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    case = {"dtype": dtype, "hidden": draw(dim(max_h)), "dist": draw(distributions(dtype)),
            "seed": draw(seeds())}
    quant = draw(_QUANT) if quantized else None
    if quant is not None:
        case["quant"] = quant
        case["fmt"] = draw(pick("e4m3", "e5m2"))
    return case


@st.composite
def permute_splits(draw, size: str = "ci") -> list[int]:
    """Group sizes for pad / unpad / sort-chunks: zeros, primes, one group, many small."""
    max_t, max_e, _ = PERMUTE_LIMITS[size]
    groups = draw(st.one_of(pick(1, max_e), _ints(1, max_e)))
    cap = max(1, max_t // groups)
    primes = [p for p in PRIMES if p <= cap] or [1]
    kind = draw(pick("uniform", "zeros", "primes", "one"))
    if kind == "one":
        sizes = [0] * groups
        sizes[draw(_ints(0, groups - 1))] = draw(_ints(1, max_t))
        return sizes
    elem = {"uniform": _ints(0, cap), "zeros": pick(0, 0, 1, cap),
            "primes": st.sampled_from(primes)}[kind]
    return draw(st.lists(elem, min_size=groups, max_size=groups))


def probs_dtypes() -> st.SearchStrategy[str]:
    return _PROBS_DTYPES


def pad_aligns() -> st.SearchStrategy[int]:
    return _ALIGNS


_ALIGNS = pick(*PAD_ALIGNS)
