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

Grouped quantize (specs/grouped_quantize.py) has no such choice: its contract is bit
equality with the backend's own per-group ``quantize`` for every output (codes, scales, amax
of every group), so :func:`judge_outputs` compares each named output bitwise and aggregates
them into one verdict (mismatches and elements summed, the worst output named in ``note``; an
output on one path only is malformed: a group the fused path lost or invented).

A parity failure is reported as a finding of its own kind ("parity", tealite_verify/fuzz),
even where the grouped output also misses the reference: that the split path does not is the
diagnosis (the fused path, not the arithmetic, is wrong).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import torch

from tealite_verify.tiers import bounded
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier, absent, malformed


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


def judge_outputs(fused: Mapping, split: Mapping) -> Metrics:
    """Every output ``fused`` and ``split`` name, bitwise (NaN matching NaN, as the exact tier
    does), as one parity verdict (see the module docstring)."""
    lost = sorted(set(fused) ^ set(split))
    if lost:
        return replace(malformed(f"outputs on one path only: {lost} (fused {sorted(fused)}, "
                                 f"split {sorted(split)})"), tier=Tier.PARITY)
    numel = mismatches = 0
    worst, worst_name = None, None
    for name in sorted(fused):
        m = compare_exact(fused[name], split[name])
        if m.shape_error:
            return replace(m, tier=Tier.PARITY, shape_error=f"{name}: {m.shape_error}")
        numel, mismatches = numel + m.numel, mismatches + m.mismatches
        if m.mismatches and (worst is None or m.mismatches > worst.mismatches):
            worst, worst_name = m, name
    if worst is None:
        return Metrics(Tier.PARITY, numel, 0, 0.0, 0.0, note=f"{len(fused)} outputs bitwise equal")
    return replace(worst, tier=Tier.PARITY, numel=numel, mismatches=mismatches,
                   note=f"worst: {worst_name} ({worst.mismatches} of {worst.numel} differ)")
