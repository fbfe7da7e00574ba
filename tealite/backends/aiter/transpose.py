"""``transpose`` on AITER's HIP ``partial_transpose`` (never run on AMD hardware; see the package
docstring).

``partial_transpose(out, input, num_rows)`` (aiter/ops/quant.py, csrc/kernels/
quant_kernels.cu) transposes the first ``num_rows[0]`` rows (an int32 device tensor: fused_moe
uses it for the 1x128 activation scales of the local tokens) of a contiguous (rows, cols)
input into ``out``'s buffer laid out (cols, num_rows).  With num_rows = rows it is a plain
transpose, element for element (a copy: no arithmetic, so nothing to declare but the layout).

Limits read from the kernel's launcher, each refused with the reason: the dtype dispatch is
VLLM_DISPATCH_FLOATING_TYPES (float32, float16, bfloat16: no FP8 codes, no uint8); cols above
8192 hit its ``TORCH_CHECK(false, "cols is not supported")``; cols = 0 divides by zero
(rows = numel / cols).
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.training_types import TRANSPOSE_DTYPES
from tealite.types import Op

ENTRY = "partial_transpose"
_FLOATING = (torch.float32, torch.float16, torch.bfloat16)
MAX_COLS = 8192


def _why_not(params) -> str | None:
    why = common_why_not(params, ENTRY)
    if why:
        return why
    if params["dtype"] not in _FLOATING:
        return (f"{ENTRY} dispatches float32 / float16 / bfloat16 only "
                f"(VLLM_DISPATCH_FLOATING_TYPES), not {params['dtype']}")
    if params["cols"] > MAX_COLS:
        return f"{ENTRY} has no launch for more than {MAX_COLS} columns, got {params['cols']}"
    if params["cols"] == 0:
        return f"{ENTRY} computes rows = numel / cols: no launch for 0 columns"
    return None


def _numerics(params) -> dict:
    return {"entry_point": ENTRY}


@BACKEND.implements(Op.TRANSPOSE, dtypes=TRANSPOSE_DTYPES, check=_why_not, numerics=_numerics)
def transpose(x):
    rows, cols = x.shape
    out = torch.empty((cols, rows), dtype=x.dtype, device=x.device)
    num_rows = torch.tensor([rows], dtype=torch.int32, device=x.device)
    runtime().functions[ENTRY](out, x.contiguous(), num_rows)
    return out


declare(Contract(backend="aiter", entry_point=ENTRY, op=Op.TRANSPOSE,
                 layouts=("input:(rows,cols) contiguous", "out:(cols,num_rows)",
                          "num_rows:int32 (1,) on the device"),
                 notes="a copy (exact); float32 / fp16 / bf16 only; cols in 1..8192"))
