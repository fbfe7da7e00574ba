"""Strategies for the training utilities (issue 17).  One block per op family; each block owns
its names (several engineers add blocks side by side)."""
from __future__ import annotations

from hypothesis import strategies as st

from tealite.formats import FP8_FORMATS
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds

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
