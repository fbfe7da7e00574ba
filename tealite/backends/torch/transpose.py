"""torch ``transpose``: the transposed view made contiguous (a copy, bit for bit)."""
from __future__ import annotations

from tealite.backends.torch import BACKEND
from tealite.training_types import TRANSPOSE_DTYPES
from tealite.types import Op


@BACKEND.implements(Op.TRANSPOSE, dtypes=TRANSPOSE_DTYPES)
def transpose(x):
    return x.t().contiguous()
