"""What kernels read of a recipe: its typed facts (tealite.recipes), never its class.

A kernel is written for particular facts (the scale layout, whether the scale is given, the
scale rule, ...), so a backend branches on them, and a recipe class it was never told about
runs wherever its facts are ones a kernel was written for.  Where a kernel takes only some
values of a fact, its ``check`` refuses every other value positively with :func:`outside`
(an allow-list naming what the kernel takes), so no ``else`` arm written for one recipe ever
computes another.

:func:`qgemm_kind` is the scaled-GEMM kind of a qgemm operand, read by the qgemm front-end
(which pairs operands by it) and by the qgemm backends (which lay out the scales by it).
"""
from __future__ import annotations

import enum

from tealite.recipes import Granularity

# The scaled-GEMM kind each scale layout takes: float32 scales per tensor or per row ("fp8"),
# float32 scales per K block ("block"), E8M0 scales per 32 along K ("mx").
QGEMM_KINDS = {Granularity.TENSOR: "fp8", Granularity.ROW: "fp8",
               Granularity.BLOCK: "block", Granularity.MX_BLOCK: "mx"}

_MISSING = object()


def qgemm_kind(recipe) -> str | None:
    """The scaled-GEMM kind an operand of ``recipe`` takes (None: no qgemm takes its scale
    layout)."""
    return QGEMM_KINDS.get(getattr(recipe, "scale_granularity", None))


def _shown(value) -> str:
    if value is _MISSING:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple) and value and isinstance(value[0], int):
        return "x".join(map(str, value))  # a block shape
    return repr(value) if isinstance(value, str) else str(value)


def outside(recipe, kernel: str, **takes) -> str | None:
    """None when every fact ``takes`` names has one of the values given for it there; else the
    reason, naming the first fact outside them and what ``kernel`` takes, e.g.
    ``"triton block quantize takes block 1x128 or 128x128; the recipe's is 2x64"``."""
    for fact, allowed in takes.items():
        value = getattr(recipe, fact, _MISSING)
        if value is _MISSING or value not in allowed:
            what = " or ".join(_shown(v) for v in allowed)
            return f"{kernel} takes {fact} {what}; the recipe's is {_shown(value)}"
    return None
