"""|actual - expected| <= tol elementwise, NaN/Inf- and overflow-aware: the comparison under
every value tier (``ulp``, ``gemm``, ``dequantized``), which differ only in how they build tol.

Overflow: where the reference lies beyond the output dtype's overflow threshold by more than
the tolerance, the output must be the signed infinity; where the tolerance band straddles the
threshold, either a finite value within tolerance or the infinity is accepted.

Pair rule (:func:`compare_pair`): the two outputs within the sum of the two backends' bounds,
except that where both are right against the reference they may disagree on overflow.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tealite_verify.tiers.metrics import Metrics, Tier, from_mask, shape_mismatch
from tealite_verify.tiers.primitives import overflow_threshold, to_f64


def judge(actual, expected, tol, out_dtype, tier: Tier) -> Metrics:
    """:func:`compare_bounded` of an output that must have dtype ``out_dtype``."""
    if actual.dtype != out_dtype:
        return Metrics(tier, 0, 0, np.inf, np.inf,
                       shape_error=f"dtype {actual.dtype} != expected {out_dtype}")
    return compare_bounded(actual, expected, tol, out_dtype, tier=tier)


def compare_pair(x, y, expected, tol_x, tol_y, out_dtype, tier: Tier) -> Metrics:
    """Backend x vs backend y (``tier``: the pair's label), ``expected`` the reference and
    ``tol_x`` / ``tol_y`` each backend's bound of it."""
    m = compare_bounded(x, y.detach().cpu().double().numpy(), tol_x + tol_y, out_dtype,
                        tier=tier)
    if m.passed or m.shape_error:
        return m
    # Both may legitimately disagree on overflow where the reference straddles it.
    ref_x = compare_bounded(x, expected, tol_x, out_dtype)
    ref_y = compare_bounded(y, expected, tol_y, out_dtype)
    if ref_x.passed and ref_y.passed and m.nonfinite_mismatches == m.mismatches:
        return Metrics(m.tier, m.numel, 0, m.max_abs_err, 1.0)
    return m


def compare_bounded(actual, expected, tol, out_dtype, *, tier: Tier = Tier.BOUNDED) -> Metrics:
    """|actual - expected| <= tol elementwise, NaN/Inf- and overflow-aware.

    ``expected`` (and ``tol``) may be torch tensors on the reference device: the usual case,
    every element finite and within, is then decided there; anything else is judged on the
    host by the same code as numpy inputs.
    """
    thr = overflow_threshold(out_dtype) if out_dtype in (torch.float16, torch.bfloat16,
                                                          torch.float32) else math.inf
    if isinstance(expected, torch.Tensor):
        bad = shape_mismatch(tier, tuple(actual.shape), tuple(expected.shape))
        if bad:
            return bad
        fast = _all_finite_within_torch(tier, actual, expected, tol, thr)
        if fast is not None:
            return fast
    if isinstance(tol, torch.Tensor):
        tol = tol.detach().cpu().numpy()
    e = to_f64(expected)
    bad = shape_mismatch(tier, tuple(actual.shape), e.shape)
    if bad:
        return bad
    a = to_f64(actual)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), e.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - e)
    fast = _all_finite_within(tier, err, tol, a, e, thr)
    return fast if fast is not None else _bounded_general(tier, err, tol, a, e, thr)


def _bounded_general(tier, err, tol, a, e, thr) -> Metrics:
    """compare_bounded's verdict with every rule: NaN, Inf, overflow."""
    with np.errstate(invalid="ignore", over="ignore"):
        within = np.isfinite(a) & np.isfinite(e) & (err <= tol)
        both_nan = np.isnan(a) & np.isnan(e)
        same_inf = np.isinf(a) & (a == e)
        # Reference finite but past (or straddling) overflow: the signed infinity is right.
        overflow_ok = np.isinf(a) & np.isfinite(e) & (np.sign(a) == np.sign(e)) & (
            np.abs(e) + tol >= thr)
        must_overflow = np.isfinite(e) & (np.abs(e) - tol >= thr) & ~np.isinf(a)
    ok = (within | both_nan | same_inf | overflow_ok) & ~must_overflow
    nonfinite = int(((~np.isfinite(a)) | (~np.isfinite(e)))[~ok].sum())
    err = np.where(np.isfinite(err), err, np.inf)
    err = np.where(ok & ~np.isfinite(err), 0.0, err)
    return from_mask(tier, ok, a, e, err=err, tol=tol, nonfinite=nonfinite)


def _all_finite_within(tier, err, tol, a, e, thr) -> Metrics | None:
    """``_bounded_general``'s Metrics when every element is finite and within ``tol`` (the
    common case, in a third of its array passes), else None.

    A finite ``err`` means ``a`` and ``e`` are finite, so only the must-overflow rule could
    still reject an element, and it cannot while |a| < thr (|e| - tol <= |a|): every element
    is accepted and the ratio is err / tol (0 where tol is 0 or inf), as in ``from_mask``.
    """
    if err.size == 0:
        return None
    with np.errstate(invalid="ignore"):
        if not (np.isfinite(err).all() and (err <= tol).all()):
            return None
    if math.isfinite(thr) and not np.abs(a).max() < thr:
        return None
    ratio = np.zeros(err.shape)
    np.divide(err, tol, out=ratio, where=tol > 0)
    flat = int(np.argmax(ratio))
    idx = tuple(int(i) for i in np.unravel_index(flat, err.shape))
    return Metrics(tier=tier, numel=int(err.size), mismatches=0,
                   max_abs_err=float(err.max()), max_ratio=float(ratio.reshape(-1)[flat]),
                   worst_index=idx, worst_actual=float(a[idx]), worst_expected=float(e[idx]),
                   worst_tol=float(tol[idx]), nonfinite_mismatches=0)


def _all_finite_within_torch(tier, actual, e, tol, thr) -> Metrics | None:
    """``_all_finite_within`` computed on ``e``'s device with torch: the same IEEE operations
    (|a - e|, comparisons, err / tol), argmax's first maximum, one host transfer at the end.
    (Host arrays keep the numpy version: routed through torch on the CPU, this short path and
    ``ulp`` made the comparisons of ``ci`` / ``local`` cases about 2x slower, measured.)"""
    if e.numel() == 0:
        return None
    a = actual.detach().to(e.device, torch.float64)
    tol = torch.as_tensor(tol, dtype=torch.float64, device=e.device).broadcast_to(e.shape)
    err = (a - e).abs()
    ok = torch.isfinite(err).all() & (err <= tol).all()
    if math.isfinite(thr):
        ok = ok & (a.abs().max() < thr)
    if not bool(ok):
        return None
    ratio = torch.where(tol > 0, err / torch.where(tol > 0, tol, 1.0), 0.0)
    flat = torch.argmax(ratio.reshape(-1))
    picked = torch.stack([err.max(), ratio.reshape(-1)[flat], a.reshape(-1)[flat],
                          e.reshape(-1)[flat], tol.reshape(-1)[flat],
                          flat.to(torch.float64)]).tolist()
    idx = tuple(int(i) for i in np.unravel_index(int(picked[5]), tuple(e.shape)))
    return Metrics(tier=tier, numel=int(e.numel()), mismatches=0, max_abs_err=picked[0],
                   max_ratio=picked[1], worst_index=idx, worst_actual=picked[2],
                   worst_expected=picked[3], worst_tol=picked[4], nonfinite_mismatches=0)
