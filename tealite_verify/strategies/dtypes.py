"""Dtype strategies (by name, so drawn cases stay JSON-serializable)."""
from __future__ import annotations

from hypothesis import strategies as st

FLOAT_DTYPES = ("float32", "bfloat16", "float16")


_FLOAT_DTYPES = st.sampled_from(FLOAT_DTYPES)


def float_dtypes() -> st.SearchStrategy[str]:
    return _FLOAT_DTYPES
