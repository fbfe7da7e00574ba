"""The grouped GEMM bound: tiers/gemm.py's K-aware bound, group by group, with each group's
own contraction length, plus the exact rule of empty groups.

Derivation.  A grouped GEMM is G independent GEMMs (tealite/moe_types.py): no element of the
output mixes two groups, so each element's error is that of one single GEMM and the single
bound applies unchanged with that group's dimensions.

* TN / NN split M: every group contracts the same K, and element (i, j) of group g's rows is
  ``sum_k B[i, k] A_g[.., k]`` (+ bias[g, j]).  Higham: |fl(p) - p| <= gamma_K(u_acc)
  (|B||A_g|)[i, j], plus the declared extra roundings (tiers/gemm.py's ``gemm_error``), then
  the fp32 epilogue and the rounding to the output dtype (``gemm_tolerances``).
* NT splits K: out[g] contracts only group g's k_g rows, so its bound is gamma_{k_g}, not
  gamma_{K_total}: a kernel that summed across a group boundary is off by whole products and
  far outside it.
* accumulate (beta = 1): the prior output enters as the epilogue term ``|C|``:
  gemm_tolerances charges 3 u_c (|p| + e_p + |C| + |bias|) for the fp32 epilogue (the add of
  C, of the bias, one spare) before the one rounding to the output dtype, and a backend that
  rounds the accumulator to the input dtype before that epilogue declares it
  (``accumulator_rounded_to``), which gemm_error charges half an ulp of |p| + e_p.
* quantized operands: the same bound on the dequantized operands, with ``k`` the group's K
  and the declared ``operands_dequantized_to`` / alignment floor as for a single qgemm.
* empty groups: no arithmetic happens, so nothing may be off.  TN / NN: no rows.  NT: out[g]
  is zero (the tolerance there is 0), and with ``accumulate`` the prior out[g] bit for bit
  (:func:`judge` adds that bitwise check: the value check alone cannot see -0 turned into +0
  or a NaN payload rewritten).
"""
from __future__ import annotations

import numpy as np
import torch

from tealite_verify.tiers import bounded
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.gemm import gemm_tolerances
from tealite_verify.tiers.metrics import Metrics, Tier


def group_bound(p_abs, p, value, k: int, out_dtype, numerics, epilogue_abs,
                flushed_abs=None) -> np.ndarray:
    """One group's bound (tiers/gemm.py's, no GELU, alpha 1) for contraction length ``k``;
    ``flushed_abs`` as there (a ``subnormal_inputs: "may_flush"`` backend)."""
    if k == 0:  # nothing to accumulate or round: the output is exact
        return np.zeros(np.shape(p))
    return np.asarray(gemm_tolerances(p_abs, p, value, k, out_dtype, numerics, alpha=1.0,
                                      epilogue_abs=epilogue_abs,
                                      flushed_abs=flushed_abs)["out"])


def grouped_bound(magnitudes, p, value, splits, k: int, layout: str, out_dtype, numerics,
                  epilogue_abs) -> np.ndarray:
    """The whole output's bound, group by group: rows [o_g, o_g + s_g) (split-M, contraction
    ``k``) or out[g] (NT, contraction k_g).  ``numerics``: one declaration for every group (a
    grouped kernel's), or one per group (a split path's single calls; None for a group it did
    not call).  ``magnitudes(numerics) -> (mag, flushed_abs or None)`` over the whole output,
    as tiers/gemm.py takes them for that declaration."""
    per_group = list(numerics) if isinstance(numerics, (list, tuple)) else \
        [numerics] * len(splits)
    off = _offsets(splits)
    parts = []
    for g, num in enumerate(per_group):
        at = g if splits_k(layout) else slice(off[g], off[g + 1])
        k_g = splits[g] if splits_k(layout) else k
        if num is None or splits[g] == 0:
            parts.append(np.zeros(np.shape(p[at])))
            continue
        mag, flushed = magnitudes(num)
        parts.append(group_bound(mag[at], p[at], value[at], k_g, out_dtype, num,
                                 epilogue_abs[at], None if flushed is None else flushed[at]))
    if not parts:
        return np.zeros(np.shape(p))
    return np.stack(parts) if splits_k(layout) else np.concatenate(parts)


def _offsets(splits) -> list[int]:
    out = [0]
    for s in splits:
        out.append(out[-1] + s)
    return out


def splits_k(layout: str) -> bool:
    return layout == "NT"


def empty_groups(splits, layout: str) -> list[int]:
    """The groups whose output the empty-group rule fixes exactly (NT only)."""
    return [g for g, s in enumerate(splits) if s == 0] if splits_k(layout) else []


def judge(got: torch.Tensor, value, tol, out_dtype, splits, layout: str,
          prior: torch.Tensor | None) -> Metrics:
    """The ``gemm`` tier on the whole output, then the empty groups exactly: out[g] zero, or
    with ``prior`` (accumulate) prior[g] bit for bit (tier ``exact``)."""
    m = bounded.judge(got, value, tol, out_dtype, Tier.GEMM)
    if not m.passed:
        return m
    for g in empty_groups(splits, layout):
        want = prior[g] if prior is not None else torch.zeros_like(got[g])
        if prior is None:  # a zero of either sign is a zero
            want = torch.where(got[g] == 0, got[g], want)
        e = compare_exact(got[g], want)
        if not e.passed:
            what = "left unchanged" if prior is not None else "exact zeros"
            return Metrics(Tier.EXACT, e.numel, e.mismatches, e.max_abs_err, e.max_ratio,
                           e.worst_index, e.worst_actual, e.worst_expected, e.worst_tol,
                           e.nonfinite_mismatches, note=f"empty group {g} must be {what}",
                           max_bit_distance=e.max_bit_distance)
    return m
