"""``pick(*values)``: ``st.sampled_from(values)``, built once per distinct value list.

A composite strategy runs its body on every draw, so a ``st.sampled_from([...])`` written
inside it is a new strategy object each time, and Hypothesis validates each new object
(walking its tree, checking emptiness) before drawing from it.  Measured in a fuzz worker
(CPU, quantize at ``ci`` shapes) that validation was about 40 % of the time Hypothesis spent
per case.  Strategies are immutable, so one object per value list is enough.

Hypothesis's own strategy cache would also serve a tuple argument, but it keys tuples by
equality: ``(False, True)`` and ``(0, 1)``, or ``(0.0,)`` and ``(-0.0,)``, share one entry.
This cache keys each value by its type and ``repr``.
"""
from __future__ import annotations

from hypothesis import strategies as st


def pick(*values) -> st.SearchStrategy:
    """One of ``values`` (duplicates weight the draw), as ``st.sampled_from`` does."""
    if not values:
        raise ValueError("pick() needs at least one value")
    return _sampled(tuple((type(v), repr(v)) for v in values), values)


_STRATEGIES: dict[tuple, st.SearchStrategy] = {}


def _sampled(key: tuple, values: tuple) -> st.SearchStrategy:
    s = _STRATEGIES.get(key)
    if s is None:
        s = _STRATEGIES[key] = st.sampled_from(list(values))
    return s
