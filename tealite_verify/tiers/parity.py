"""The ``parity`` tier (issue 16): a backend's fused grouped path against its own split path.

A grouped op (grouped quantize; grouped GEMM where both paths declare one accumulation order)
must give, for every group, exactly what the backend's single-tensor op gives for that group
alone.  This is a property of one backend, so the tier compares two sets of that backend's own
outputs, never a reference: ``fused`` maps output names to the grouped op's tensors and
``split`` the same names to the per-group calls' tensors.  Each pair is compared bitwise
(tiers/exact.py, NaN matching NaN, as the exact tier does), and the verdict aggregates every
pair: the mismatches and elements summed, the worst pair's report kept with its name in
``note``.  A name on one side only is malformed (a group the fused path lost or invented).

There is no pair rule: two backends' parity verdicts are independent, and their outputs are
compared with each other by the op's own tiers.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier, malformed


def check_parity(fused: Mapping, split: Mapping) -> Metrics:
    """Bitwise parity of every output the two paths name (see the module docstring)."""
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
