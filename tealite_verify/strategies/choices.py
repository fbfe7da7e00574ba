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


_BUILT: dict[tuple, st.SearchStrategy] = {}


def pick(*values) -> st.SearchStrategy:
    """One of ``values`` (duplicates weight the draw), as ``st.sampled_from`` does."""
    if not values:
        raise ValueError("pick() needs at least one value")
    key = tuple((type(v), repr(v)) for v in values)
    if key not in _BUILT:
        _BUILT[key] = st.sampled_from(list(values))
    return _BUILT[key]
