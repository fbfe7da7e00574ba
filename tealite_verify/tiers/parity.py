"""The ``parity`` tier: a backend's fused grouped path against its own split path (issue 16).

The split path is the same backend's single op run group by group (a loop of ``gemm`` /
``qgemm`` calls, specs/grouped_gemm.py builds it), so parity needs no reference: it asks
whether fusing the groups changed anything.  Where the backend declares
``grouped_matches_split`` (tealite/numerics.py) the grouped path promises the split path's
arithmetic, and the two must agree bit for bit; a grouped kernel that drops the last group's
rows, multiplies a group by its neighbour's weight or reads a stale workspace cannot.
Otherwise the two paths may round differently (a different tiling or accumulation order), and
each is within its own bound of the float64 reference, so they may differ by the sum of the
two bounds (the pair rule of tiers/bounded.py): the grouped one under the grouped op's
declaration, the split one group by group under what the single op declared for that
group's call (the spec records it while running the split path).

A parity failure is reported as a finding of its own kind ("parity", tealite_verify/fuzz),
even where the grouped output also misses the reference: that the split path does not is the
diagnosis (the fused path, not the arithmetic, is wrong).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tealite_verify.tiers import bounded
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier, absent


def judge(grouped: torch.Tensor, split: torch.Tensor | None, expected, tol_grouped,
          tol_split, out_dtype, *, matches_split: bool) -> Metrics:
    """``grouped`` vs ``split``: bitwise when ``matches_split``, else within the sum of the
    two paths' bounds against ``expected`` (the float64 reference): ``tol_grouped()`` under
    the grouped declaration, ``tol_split()`` under the single op's (callables: only a bounded
    comparison computes them)."""
    if split is None:
        return absent("no split path: the backend's single op refused a group")
    if matches_split:
        return replace(compare_exact(grouped, split), tier=Tier.PARITY)
    return bounded.compare_pair(grouped, split, expected, tol_grouped(), tol_split(),
                                out_dtype, Tier.PARITY)
