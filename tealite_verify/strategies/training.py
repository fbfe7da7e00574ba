"""Strategies for the training utilities (issue 17).  One block per op family; each block owns
its names (the multi-tensor block first).
"""
from __future__ import annotations

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick

# ---- multi-tensor apply (tealite/ops/multi_tensor.py) --------------------------------------

# (most tensors, most elements in all) per size.  ci keeps interpreted Triton cases tiny.
MTA_LIMITS = {"ci": (8, 4096), "local": (300, 600_000), "large": (1000, 4_000_000)}
# Sizes around TE's 65536-element chunk and its 512-element ILP tiles, and odd primes.
MTA_EDGE_SIZES = (0, 1, 3, 127, 555, 4096, 33333, 65535, 65536, 65537)
MTA_LIST_KINDS = ("edges", "many_small", "uniform", "with_empty")


@st.composite
def mta_sizes(draw, size: str = "ci") -> list[int]:
    """1..N tensor sizes summing to at most the size's budget:

    * ``edges``: chunk-edge sizes (555, 33333, 65537 ... where they fit the budget);
    * ``many_small``: hundreds of 0-40-element tensors at ``local`` / ``large`` (a table of
      many entries, most smaller than one block);
    * ``uniform``: sizes drawn uniformly;
    * ``with_empty``: empty tensors first, in the middle and last.
    """
    most, budget = MTA_LIMITS[size]
    kind = draw(pick(*MTA_LIST_KINDS))
    count = draw(st.integers(1, most))
    share = max(1, budget // count)
    if kind == "edges":
        fitting = [s for s in MTA_EDGE_SIZES if s <= budget // 2] or [1]
        sizes = [draw(pick(*fitting)) for _ in range(min(count, 12))]
    elif kind == "many_small":
        sizes = [draw(st.integers(0, min(40, share))) for _ in range(most)]
    elif kind == "uniform":
        sizes = [draw(st.integers(0, share)) for _ in range(count)]
    else:
        inner = [draw(st.integers(1, share)) for _ in range(max(1, count - 2))]
        sizes = [0] + inner[:1] + [0] + inner[1:] + [0]
    while sum(sizes) > budget:
        sizes[sizes.index(max(sizes))] //= 2
    return sizes


def mta_values() -> st.SearchStrategy[str]:
    """How an optimizer case's values are drawn: plain, huge gradients (|g| up to 2^50, so
    g*g stays finite in fp32), or zero second moments with zero gradients (v = 0: the
    denominator is eps alone)."""
    return pick("plain", "plain", "huge", "zero_v")


def mta_adam_options() -> st.SearchStrategy[dict]:
    """AdamOptions fields.  beta in [0.5, 1) or 0: there ``1 - beta`` is exact in fp32."""
    return st.fixed_dictionaries({
        "lr": pick(1e-3, 0.1, 1.0), "beta1": pick(0.9, 0.5, 0.0, 0.95),
        "beta2": pick(0.999, 0.95, 0.5), "eps": pick(1e-8, 1e-6, 1e-3),
        "step": pick(1, 2, 10, 1000), "weight_decay": pick(0.0, 0.01, 0.5),
        "bias_correction": st.booleans()})


def mta_sgd_options() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "lr": pick(1e-3, 0.1, 1.0), "momentum": pick(0.9, 0.5, 0.99),
        "dampening": pick(0.0, 0.1), "weight_decay": pick(0.0, 0.01, 0.5),
        "first_run": st.booleans(), "wd_after_momentum": st.booleans(),
        "scale": pick(1.0, 0.5, 2.0 ** -10)})
