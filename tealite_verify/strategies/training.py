"""Strategies for the training utilities (issue 17).  One block per op family; each block owns
its names (several engineers add blocks side by side)."""
from __future__ import annotations

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.values import distributions, seeds

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
