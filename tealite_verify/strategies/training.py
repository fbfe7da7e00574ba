"""Strategies for the training utilities (issue 17).  One block per op family; each block owns
its names (the multi-tensor, dropout, bulk-scaling and transpose blocks live side by side)."""
from __future__ import annotations

from hypothesis import strategies as st

from tealite.formats import FP8_FORMATS
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds

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



# ---- dropout (dropout_fwd / dropout_bwd) ----------------------------------------------------

# x's shape: rows x hidden, by size (elementwise, so tiny shapes cover the kernels' tails).
DROPOUT_LIMITS = {"ci": (16, 48), "local": (64, 512), "large": (1024, 4096)}
# The statistical tier's sample (rows, cols) by size: n = 4096 catches patterns and reused
# streams; a drop probability off by 0.01 needs n >= 2^18 (tiers/statistical.py's power).
DROPOUT_STATS_SHAPES = {"ci": ((64, 64), (32, 128)), "local": ((512, 512), (256, 1024)),
                        "large": ((1024, 1024), (2048, 1024))}
# 0 and 1 (identity / all dropped), TE's usual 0.1, a binary fraction, an inexact one.
DROPOUT_PROBS = (0.0, 0.1, 0.5, 0.125, 1.0 / 3.0, 0.9, 1.0)
# Seeds and offsets across the 32-bit word boundary (Philox keys and counters are 32-bit words).
DROPOUT_COUNTERS = (0, 1, 2**31 - 1, 2**32, 2**32 + 1, 2**62 - 1)
DROPOUT_SHAPE_KINDS = ("1d", "2d", "3d")


@st.composite
def dropout_cases(draw, dtype: str | None = None, size: str = "ci") -> dict:
    max_rows, max_hidden = DROPOUT_LIMITS[size]
    kind = draw(pick(*DROPOUT_SHAPE_KINDS))
    hidden = draw(st.integers(0 if kind == "1d" else 1, max_hidden))
    rows = draw(st.integers(0, max_rows))
    shape = {"1d": (hidden,), "2d": (rows, hidden),
             "3d": (max(1, rows // 2), 2, hidden)}[kind]
    p = draw(st.one_of(pick(*DROPOUT_PROBS), st.floats(0.0, 1.0)))
    return {"shape": list(shape), "p": p,
            "drop_seed": draw(st.one_of(pick(*DROPOUT_COUNTERS), st.integers(0, 2**63 - 1))),
            "offset": draw(st.one_of(pick(*DROPOUT_COUNTERS), st.integers(0, 2**63 - 2))),
            "stats_shape": list(draw(pick(*DROPOUT_STATS_SHAPES[size]))),
            "dtype": dtype or draw(pick("float32", "bfloat16", "float16")),
            "dist": draw(distributions(dtype or "float32")), "seed": draw(seeds())}


# ---- bulk delayed-scaling update (delayed_scaling_update_bulk) -----------------------------

# The most tensors one case updates, by size: interpreted Triton runs one program per tensor.
BULK_SCALING_LIMITS = {"ci": 6, "local": 64, "large": 2000}
# History lengths: 1 (no history), short, odd, TE's default 1024.
BULK_HISTORY_LENS = (1, 2, 3, 16, 37, 1024)
# The newest amax (slot 0) of tensor 0: a skipped step (0), NaN or Inf keeps the old scale.
BULK_NEWEST = ("drawn", "zero", "nan", "inf")
# One recipe for every tensor (TE's grouping) or one per tensor (formats, margins mixed).
BULK_KINDS = ("shared_recipe", "per_tensor_recipes")


@st.composite
def bulk_scaling_entry(draw) -> dict:
    """One tensor's recipe fields and scale in use."""
    return {"history_len": draw(pick(*BULK_HISTORY_LENS)), "fmt": draw(pick(*FP8_FORMATS)),
            "margin": draw(pick(0, 1, 3)), "algo": draw(pick("max", "most_recent")),
            "scale": draw(pick(1.0, 0.5, 3.0, 448.0))}


@st.composite
def bulk_scaling_cases(draw, size: str = "ci") -> dict:
    """``count`` tensors, one shared recipe (``entries[0]``'s fields for every tensor) or one
    per tensor (``kind``); every tensor's history drawn from ``dist`` with its own seed."""
    count = draw(st.integers(1, BULK_SCALING_LIMITS[size]))
    return {"count": count, "kind": draw(pick(*BULK_KINDS)),
            "entries": [draw(bulk_scaling_entry()) for _ in range(count)],
            "newest": draw(pick(*BULK_NEWEST, "drawn")),
            "dist": draw(distributions("float32")), "seed": draw(seeds())}


# ---- transpose / fp8_transpose -------------------------------------------------------------

# The largest dim by size (interpreted Triton: one program per 32x32 tile); >128 in ci so that
# 128x128 scale blocks come more than one to a side.
TRANSPOSE_LIMITS = {"ci": 160, "local": 1024, "large": 8192}
# A plain tensor, or FP8 codes with the scales fp8_transpose accepts (per tensor, 128x128).
TRANSPOSE_KINDS = ("plain", "fp8_tensor", "fp8_block128")
TRANSPOSE_LAYOUTS = ("contiguous", "column_major")  # x's strides


@st.composite
def transpose_cases(draw, dtype: str | None = None, size: str = "ci") -> dict:
    """A plain tensor (any strides) or the rowwise FP8 codes of one: 0 rows one draw in 16,
    primes, one-off-alignment sizes."""
    limit = TRANSPOSE_LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    return {"dtype": dtype,
            "shape": [draw(dim(limit, allow_zero=True)), draw(dim(limit))],
            "kind": draw(pick(*TRANSPOSE_KINDS)), "fmt": draw(pick(*FP8_FORMATS)),
            "layout": draw(pick(*TRANSPOSE_LAYOUTS)),
            "dist": draw(distributions(dtype)), "seed": draw(seeds())}
