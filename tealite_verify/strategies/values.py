"""Value-distribution strategies: ordinary and hostile (wide range, outliers, subnormals,
all-zero rows, exact ties).  Each draws a small dict consumed by tensors.generate."""
from __future__ import annotations

import functools

from hypothesis import strategies as st

# Half of the largest finite value, so |x| stays representable in every float dtype we test.
_SAFE_LOG2 = {"float32": 60, "bfloat16": 60, "float16": 7}


_SEEDS = st.integers(0, 2**31 - 1)


def seeds() -> st.SearchStrategy[int]:
    return _SEEDS


@functools.lru_cache(maxsize=None)  # strategies are immutable; building them is not free
def distributions(dtype: str, *, wide: bool = True, max_log2: int | None = None,
                  ) -> st.SearchStrategy[dict]:
    """Distributions for inputs of ``dtype``.

    ``max_log2`` caps magnitudes for ops that grow them (a GEMM sums K products, so its
    inputs in fp16 must stay well under 2^8 to avoid overflowing the output).
    """
    cap = _SAFE_LOG2[dtype] if max_log2 is None else max_log2
    scale = st.sampled_from([2.0**e for e in (-6, -2, 0, 2) if e <= cap])
    # Sampled in float32 (see tensors.py: the float64 sampler costs most of the input time).
    f32 = {"sample_dtype": "float32"}
    options = [
        st.builds(lambda s: {"kind": "normal", "scale": s, **f32}, scale),
        st.builds(lambda lo, w: {"kind": "uniform", "lo": lo, "hi": lo + w, **f32},
                  st.sampled_from([-2.0, -1.0, 0.0, 0.5]), st.sampled_from([0.5, 1.0, 3.0])),
        st.builds(lambda f, k: {"kind": "outliers", "scale": 1.0, "frac": f,
                                "factor": min(k, 2.0 ** (cap - 3)), **f32},
                  st.sampled_from([0.001, 0.01, 0.1]), st.sampled_from([64.0, 1024.0])),
        st.builds(lambda f: {"kind": "zero_rows", "scale": 1.0, "frac": f, **f32},
                  st.sampled_from([0.25, 1.0])),
        st.builds(lambda h: {"kind": "integers", "hi": h}, st.sampled_from([1, 3, 15])),
        st.builds(lambda: {"kind": "tiny", **f32}),
    ]
    if wide:
        options.append(st.builds(lambda lo, hi: {"kind": "wide", "log2_lo": lo, "log2_hi": hi,
                                                            **f32},
                                 st.sampled_from([-24, -12, -4]),
                                 st.sampled_from([min(c, cap - 2) for c in (2, 6, 12)])))
    return st.one_of(*options)
