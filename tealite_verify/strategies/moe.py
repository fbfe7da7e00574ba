"""Strategies for the MoE family (issue 16).  One block per op family; each block owns its
names (the grouped GEMM, router, permutation and grouped-quantize blocks live side by side).
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import PRIMES, dim
from tealite_verify.strategies.values import distributions, seeds

# ---- token splits (m_splits), shared by every grouped op ----------------------------------

# How a split is drawn; each is a shape that breaks grouped kernels.
SPLIT_KINDS = ("zeros", "primes", "one_group", "many_small", "uniform")

_BOOL = st.booleans()


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


# ---- router (tealite_verify/specs/router.py) --------------------------------------------

# (max tokens, max experts) per size: ci keeps interpreted Triton cases tiny (one program per
# token block, the whole expert row in registers); large is TE's (16384 x 256) regime in rows.
ROUTER_LIMITS = {"ci": (24, 32), "local": (512, 128), "large": (4096, 256)}
# The score kinds a case names (case key "kind", a coverage layout axis): TE's softmax after
# the top-k, softmax before it, and sigmoid.
ROUTER_KINDS = ("softmax", "softmax_pre", "sigmoid")
_EXPERTS = (1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 64, 128, 160, 256)


@functools.lru_cache(maxsize=None)
def router_logit_distributions(dtype: str) -> st.SearchStrategy[dict]:
    """Ordinary values, exact ties (small integers: repeated logits), huge logits (softmax
    underflows all but the largest, sigmoid saturates at 0 and 1) and near-ties."""
    huge = 2.0 ** (9 if dtype == "float16" else 12)
    return st.one_of(distributions(dtype, wide=False),
                     pick({"kind": "integers", "hi": 1}, {"kind": "integers", "hi": 3}),
                     pick({"kind": "normal", "scale": huge, "sample_dtype": "float32"}),
                     pick({"kind": "normal", "scale": 2.0 ** -10, "sample_dtype": "float32"}))


def group_options(experts: int, topk: int) -> list[tuple[int, int]]:
    """Every legal (num_groups, group_topk) for ``experts`` and ``topk``."""
    out = []
    for g in range(2, experts + 1):
        if experts % g:
            continue
        size = experts // g
        for gk in range(1, g + 1):
            if topk % gk == 0 and topk // gk <= size and topk <= gk * size:
                out.append((g, gk))
    return out


@st.composite
def router_cases(draw, dtype: str | None = None, size: str = "ci", *, aux: bool = False):
    """A router case: ``shape`` (tokens, experts), ``topk`` 1..8, ``kind``, groups, the
    scaling factor and an expert bias (sigmoid), logits' distribution and seed.  ``aux``:
    the aux-score ops' cases (no groups, bias, scaling or pre-softmax)."""
    max_t, max_e = ROUTER_LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    tokens = draw(dim(max_t, allow_zero=True))
    experts = draw(st.one_of(pick(*[e for e in _EXPERTS if e <= max_e]), _ints(1, max_e)))
    topk = draw(_ints(1, min(8, experts)))
    kinds = ("softmax", "sigmoid") if aux else ROUTER_KINDS
    case = {"shape": [tokens, experts], "topk": topk, "kind": draw(pick(*kinds)),
            "dtype": dtype, "dist": draw(router_logit_distributions(dtype)), "seed": draw(seeds())}
    if aux:
        return case
    options = group_options(experts, topk)
    case["groups"] = list(draw(pick(*options))) if options and draw(_BOOL) else None
    case["scaling_factor"] = draw(pick(None, None, 1.2, 2.5))
    case["bias"] = case["kind"] == "sigmoid" and draw(_BOOL)
    if case["bias"]:
        case["bias_ties"] = draw(_BOOL)
        # a learned bias (aux-loss-free balancing) drifts: shifted down by 2 every s + bias
        # is negative, where the scores' order-preserving keys must flip the sign
        case["bias_shift"] = draw(pick(0.0, 0.0, -2.0))
    return case


@st.composite
def aux_loss_cases(draw, dtype: str | None = None, size: str = "ci"):
    """TE's aux loss: probs (tokens, experts), tokens per expert, the global token count
    (>= the local one: sequence parallelism), topk and the coefficient."""
    max_t, max_e = ROUTER_LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    tokens = draw(dim(max_t, allow_zero=True))
    experts = draw(st.one_of(pick(*[e for e in _EXPERTS if e <= max_e]), _ints(1, max_e)))
    return {"shape": [tokens, experts], "topk": draw(_ints(1, min(8, experts))),
            "total_num_tokens": max(1, tokens) * draw(pick(1, 1, 2, 7)),
            "coeff": draw(pick(0.01, 1e-3, 1.0)), "max_count": draw(pick(3, 1000, 100000)),
            "dtype": dtype, "dist": draw(pick({"kind": "uniform", "lo": 0.0, "hi": 1.0},
                                               {"kind": "normal", "scale": 1.0},
                                               {"kind": "integers", "hi": 3})),
            "seed": draw(seeds())}


# ---- token permutation (tealite_verify/specs/permute.py) -----------------------------------

# (max tokens, max experts, max hidden) per size.  The ci size keeps interpreted Triton cases
# tiny (one program per token and hidden block); experts reach 64 from the local size on.
PERMUTE_LIMITS = {"ci": (48, 8, 64), "local": (512, 64, 512), "large": (4096, 128, 2048)}
# Quantized inputs: None (plain values) or the scale layout that moves with the codes.
PERMUTE_QUANT = ("tensor", "row", "block", "mx", "mx-fp4")
MAP_TYPES = ("mask", "index")
PAD_ALIGNS = (16, 128, 1, 3, 32)


@functools.lru_cache(maxsize=None)
def _tokens(max_tokens: int) -> st.SearchStrategy[int]:
    """0, 1, primes and sizes one off a power of two (shapes.dim), and the top."""
    return st.one_of(dim(max_tokens, allow_zero=True), pick(0, max_tokens))


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


# ---- grouped quantize (tealite_verify/specs/grouped_quantize.py) ---------------------------

# (max total rows, max K, max groups) per size: interpreted Triton runs one launch per group
# in the split path, so the ci size stays tiny.
GQ_LIMITS = {"ci": (48, 96, 5), "local": (512, 512, 16), "large": (4096, 4096, 64)}


@functools.lru_cache(maxsize=None)
def gq_directions() -> st.SearchStrategy[tuple[bool, bool]]:
    return pick((True, False), (False, True), (True, True))


@st.composite
def gq_splits(draw, max_rows: int, max_groups: int, unit: int = 1) -> list[int]:
    """:func:`m_splits` in multiples of ``unit`` rows (MX columnwise: whole 32-row blocks per
    group), summing to at most ``max(max_rows, unit)``."""
    return [s * unit for s in draw(m_splits(max(1, max_rows // unit), max_groups))]
