"""Strategies for the MoE family (issue 16).  One block per op family; each block owns its
names (the grouped GEMM, permutation and grouped-quantize blocks live beside this one).
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds

# ---- router (tealite_verify/specs/router.py) --------------------------------------------

# (max tokens, max experts) per size: ci keeps interpreted Triton cases tiny (one program per
# token block, the whole expert row in registers); large is TE's (16384 x 256) regime in rows.
ROUTER_LIMITS = {"ci": (24, 32), "local": (512, 128), "large": (4096, 256)}
# The score kinds a case names (case key "kind", a coverage layout axis): TE's softmax after
# the top-k, softmax before it, and sigmoid.
ROUTER_KINDS = ("softmax", "softmax_pre", "sigmoid")
_EXPERTS = (1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 64, 128, 160, 256)
_BOOL = st.booleans()


@functools.lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


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
