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


def grouped_bound(p_abs, p, value, splits, k: int, layout: str, out_dtype, numerics,
                  epilogue_abs, flushed_abs=None) -> np.ndarray:
    """The whole output's bound: split-M layouts in one piece (a common K), NT group by group
    with each group's k_g (out[g] of the (G, M, N) arrays)."""
    if layout != "NT":
        return group_bound(p_abs, p, value, k, out_dtype, numerics, epilogue_abs, flushed_abs)
    if not len(splits):
        return np.zeros(np.shape(p))
    return np.stack([group_bound(p_abs[g], p[g], value[g], k_g, out_dtype, numerics,
                                 epilogue_abs[g],
                                 None if flushed_abs is None else flushed_abs[g])
                     for g, k_g in enumerate(splits)])


def empty_groups(splits, layout: str) -> list[int]:
    """The groups whose output the empty-group rule fixes exactly (NT only)."""
    return [g for g, s in enumerate(splits) if s == 0] if layout == "NT" else []


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
