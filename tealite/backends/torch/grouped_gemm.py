"""Grouped GEMM and grouped quantized GEMM as a loop over groups of this backend's own single
``gemm`` / ``qgemm`` (the same functions, so the same arithmetic group for group: the
backend declares ``grouped_matches_split``, and the harness's parity oracle holds it to bit
equality with the split path).  Semantics: tealite/moe_types.py, tealite/ops/grouped_gemm.py.

Accumulate: ``gemm`` with ``beta = 1`` into the group's slice of ``out``; for ``qgemm``, which
has no beta, the fp32 product plus the prior output in fp32, rounded once to ``out_dtype``
(the split path the harness runs does the same).  Empty groups are skipped: NT writes exact
zeros, or with accumulate leaves the group's ``out`` untouched (no ``-0 + 0`` to flip a sign).
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch import gemm as single
from tealite.backends.torch import qgemm as single_q
from tealite.moe_types import GROUPED_LAYOUTS, split_offsets, splits_k
from tealite.types import Op

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _numerics(params) -> dict:
    """The single gemm's declaration for one group's call (no GELU, alpha 1, beta 1 when
    accumulating), plus the parity promise."""
    one_group = dict(params, gelu=False, alpha=1.0, beta=1.0 if params["accumulate"] else 0.0)
    return {**single._numerics(one_group), "grouped_matches_split": True}


def _empty_output(out, shape, dtype, device, zero: bool) -> torch.Tensor:
    if out is not None:
        return out
    return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)


@BACKEND.implements(Op.GROUPED_GEMM, dtypes=_DTYPES, layouts=GROUPED_LAYOUTS,
                    numerics=_numerics)
def grouped_gemm(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    offsets = split_offsets(splits)
    beta = 1.0 if accumulate else 0.0
    if splits_k(layout):
        result = _empty_output(out, (len(splits), b.shape[1], a.shape[1]), out_dtype, a.device,
                               zero=True)
    else:
        result = _empty_output(out, (b.shape[0], a.shape[-2] if layout[0] == "T" else
                                     a.shape[-1]), out_dtype, a.device, zero=False)
    for g, rows in enumerate(splits):
        lo, hi = offsets[g], offsets[g + 1]
        if splits_k(layout):
            if rows == 0:
                if not accumulate:
                    result[g].zero_()
                continue
            single.gemm(a[lo:hi], b[lo:hi], layout=layout, out_dtype=out_dtype, bias=None,
                        gelu=False, out=result[g], alpha=1.0, beta=beta)
        elif rows:
            weight = a[g] if a.dim() == 3 else a
            single.gemm(weight, b[lo:hi], layout=layout, out_dtype=out_dtype,
                        bias=None if bias is None else bias[g], gelu=False,
                        out=result[lo:hi], alpha=1.0, beta=beta)
    return result


@BACKEND.implements(Op.GROUPED_QGEMM, dtypes=_DTYPES, layouts=GROUPED_LAYOUTS,
                    check=single_q._why_not,
                    numerics={**single_q._NUMERICS, "grouped_matches_split": True})
def grouped_qgemm(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, k, layout, out_dtype,
                  bias, out, accumulate):
    offsets = split_offsets(splits)
    device = b_ops[0].codes.device
    by_k = splits_k(layout)
    result = _empty_output(out, (len(splits), m, n) if by_k else (m, n), out_dtype, device,
                           zero=by_k)
    for g, rows in enumerate(splits):
        if rows == 0:
            if by_k and not accumulate:
                result[g].zero_()
            continue
        a_g, b_g = a_ops[g if len(a_ops) > 1 else 0], b_ops[g]
        target = result[g] if by_k else result[offsets[g]:offsets[g + 1]]
        product, _ = single_q.qgemm(
            recipe_a, a_g.codes, a_g.scales, recipe_b, b_g.codes, b_g.scales,
            m=m if by_k else rows, n=n, k=rows if by_k else k,
            out_dtype=torch.float32 if accumulate else out_dtype,
            bias=None if bias is None else bias[g])
        target.copy_((target.float() + product).to(out_dtype) if accumulate else product)
    return result
