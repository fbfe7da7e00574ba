"""Tolerance tier for fused norm / activation -> quantize outputs ("code-interval").

A fused kernel quantizes its own fp32 y, never the float64 y_ref and never a y rounded to x's
dtype, so its codes cannot be bit-exact against a float64 reference.  What the harness does
know is a per-element bound e on |y_fp32 - y_ref| (the norm / activation specs' own error
models, specs/norms.py and specs/activations.py, evaluated for an fp32 output).  So the kernel's
y lies in [y_ref - e, y_ref + e] (endpoints rounded to nearest fp32: the kernel's y is an fp32
value; this widens the interval by at most half an fp32 ulp per side, and with e = 0 it is
exactly round32(y_ref), the float64 reference's own quantizer input).  From that interval:

scales
    Given-scale FP8 (DelayedScaling): scale_inv = 1/scale exactly.  Per-row FP8: the reported
    row amax must lie in [amax_lo, amax_hi], the range of max|y| over the row's intervals, and
    scale_inv must be exactly what TE's rule gives for *that reported* amax (a scale some amax in
    the interval yields, and consistent with the amax the kernel reports).  MX: each block's
    E8M0 byte must lie in [rule(amax_lo), rule(amax_hi)] (every scale rule is monotone in amax,
    so that is exactly the set of bytes reachable from the block's amax interval, usually one
    or two values); under RCEIL it may also take the bytes the plain quantize tier excuses for
    fp32 rounding of amax * (1/max) (e8m0_adjusted.rceil_allowed_bytes).
amax
    The reported amax (per tensor or per row) lies in its interval; NaN exactly where y_ref
    has a NaN.
codes
    Judged under the backend's OWN scale: an element's code must be one the recipe's rounding
    produces for some fp32 y in its interval, i.e. between the codes of the two endpoints
    (re-quantized with the kernel's scale, never rescaled), inclusive.  Codes of equal value
    (a NaN from overflow, +-0 inside the range) compare by value; an endpoint's own code
    matches bit for bit.  Codes under an MX NaN scale (0xFF) are unspecified, as in quantize.

AITER's scale rule (recipe ``"scale_rule": "amax/fmax"``): the kernel stores
scale_inv = fl32(amax / max) and multiplies by r = fl32(1 / scale_inv); no amax is reported
(it must be absent).  scale_inv must lie in the range the rule reaches from the row's amax
interval, and the codes are judged under the backend's own scale_inv: between the casts of
fl32(y * r) over the y interval's endpoints and r's allowed values (y * r is monotone in each).

Zero-row / zero-block policies apply wherever the amax is within its error bound of zero: a
row's (block's) amax interval starts at 0 exactly when every y interval of the row (block)
holds 0, and there a correct kernel may get amax == 0 from its own fp32 y (underflow, flushed
subnormals) and take the recipe's zero policy, or get the tiny amax and finite codes.  Both
are accepted, by the same checks as any other amax: TE's rule judges scale_inv and codes under
the reported amax (0 -> scale 1), MX byte 0 is rule(0), AITER's scale_inv 0 (or 1 with
``scale_inv_zero_as_one``) lies in its range, and its NaN codes (0 * 1/0) are allowed where 0
lies inside y's interval (:func:`zero_times_inf`).  Where the amax interval starts above 0 the
zero policy fails (scale or amax outside its range, codes outside theirs).  Only the fused ops
compute the amax they scale by; they take per-row FP8 and MX recipes (tensor and 1x128 /
128x128 block current scaling are refused by tealite.ops.fused, as TE does not fuse them), and
a given-scale recipe's tensor amax is only reported, judged by its interval.

Declared numerics read here (``Backend.implements(numerics=...)``), besides the y bound's:

``fp32_div_ulps`` (int, default 0)
    The error, in ulps, of the backend's fp32 divisions amax / max and 1 / scale_inv (and
    1 / scale below): 0 is IEEE (the interpreter); 2 is CUDA's ``div.full.f32`` (Triton's
    ``/``).  The same key as the plain quantize tier's (tiers/fp32_div.py).
``scale_inv_zero_as_one`` (bool)
    AITER's rule with ``scale_inv = 1`` wherever amax / max is 0 (AITER's fused norm kernels:
    ``tl.where(scale == 0, 1, scale)``; its plain quant kernels and tealite.quantize keep the
    0 and write NaN codes).
``amax_floor`` (float)
    AITER's rule on max(amax, floor) (AITER's FP8 group-quant kernels floor amax at 1e-10).
``given_scale_as_scale_inv`` (bool)
    Given-scale FP8 whose kernel takes the dequantization scale: the backend passes
    scale_inv = fl32(1 / scale) and the kernel multiplies by fl32(1 / scale_inv) (within
    ``fp32_div_ulps``), which need not be ``scale`` again.
``mx_nonfinite`` ("nan-scale" default | "ignore-nan")
    As in tiers/e8m0_adjusted.py; the fused judge has only the "nan-scale" rule for blocks
    whose y holds NaN / Inf (the norm / activation specs draw finite y): "ignore-nan" with such a
    block is reported as not judged (a failure), never passed.

Outputs the case does not require (``amax_required=False``: the op was called with
``return_amax=False``) may be absent; when present they are judged.

e = 0 makes every check bit-exact against recipe_rules.quantize of round32(y) (except the
RCEIL byte excuse above, which the plain quantize tier grants for the same input).  Codes that
differ from the quantization of round32(y_ref) under the backend's scale but lie inside the
interval are counted in ``Metrics.excused``.  Pairwise (backend vs backend) each side is
judged against its own bound of the reference: two correct kernels may round y differently.
"""
from __future__ import annotations

import numpy as np
import torch

from tealite.formats import FP8ScaleRule, Saturation
from tealite.recipes import Family
from tealite_verify.references import fused as fref
from tealite_verify.references import quantize as qref
from tealite_verify.tiers import quantized
from tealite_verify.tiers.e8m0_adjusted import mx_block_amax, rceil_allowed_bytes
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import (Metrics, Tier, absent, combine_pair, from_mask,
                                          malformed)

F32 = np.float32


# ---- intervals -----------------------------------------------------------------------------

def y_interval(y_ref, e) -> tuple[np.ndarray, np.ndarray]:
    """fp32 endpoints (lo, hi) of [y_ref - e, y_ref + e], rounded to nearest (NaN stays)."""
    y = np.asarray(y_ref, np.float64)
    e = np.broadcast_to(np.asarray(e, np.float64), y.shape)
    with np.errstate(invalid="ignore"):
        return fref.round_to_f32(y - e), fref.round_to_f32(y + e)


def abs_interval(lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """[min |y|, max |y|] over y in [lo, hi] (0 when the interval holds 0); NaN stays NaN."""
    lo, hi = np.asarray(lo, F32), np.asarray(hi, F32)
    with np.errstate(invalid="ignore"):
        a_lo = np.where(lo > 0, lo, np.where(hi < 0, -hi, F32(0.0)))
        a_hi = np.maximum(np.abs(lo), np.abs(hi))
    nan = np.isnan(lo) | np.isnan(hi)
    return np.where(nan, np.nan, a_lo).astype(F32), np.where(nan, np.nan, a_hi).astype(F32)


def _max(a, axis=None) -> np.ndarray:
    """NaN-propagating max of nonnegative values; 0 for an empty reduction."""
    a = np.asarray(a, F32)
    if a.size == 0:
        shape = () if axis is None else a.shape[:axis] + a.shape[axis + 1:]
        return np.zeros(shape, F32)
    return np.max(a, axis=axis).astype(F32)


def _interval_metrics(tier, ok, actual, lo, hi, central, *, live=None, excused=0) -> Metrics:
    """Metrics for "actual in [lo, hi]" checks; values are float64 arrays of one shape."""
    with np.errstate(invalid="ignore"):
        off = np.asarray(actual, np.float64) - np.asarray(central, np.float64)
    return from_mask(tier, ok, actual, central, err=off, live=live, excused=excused,
                     allowed=(lo, hi))


# ---- amax and FP8 scales -------------------------------------------------------------------

def check_amax(actual, a_lo, a_hi, central) -> Metrics:
    """Reported amax (float32) within [a_lo, a_hi]; NaN exactly where the interval is NaN."""
    a = np.asarray(actual, np.float64)
    lo, hi = np.asarray(a_lo, np.float64), np.asarray(a_hi, np.float64)
    if a.shape != lo.shape:
        return malformed(f"amax shape {a.shape} != expected {lo.shape}")
    nan_ref = np.isnan(lo) | np.isnan(hi)
    with np.errstate(invalid="ignore"):
        ok = np.where(nan_ref, np.isnan(a), (a >= lo) & (a <= hi))
    c = np.asarray(central, np.float64)
    return _interval_metrics(Tier.AMAX_INTERVAL, ok, a, lo, hi, c,
                             excused=int((ok & ~nan_ref & (a != c)).sum()))


def row_scale(amax, recipe) -> np.ndarray:
    """TE's per-row scale (float32) for the given row amaxes."""
    return qref.te_scale_from_amax(amax, recipe.fmt, force_pow2=recipe.force_pow2_scales,
                                   amax_epsilon=recipe.amax_epsilon)


def _ulps(numerics) -> int:
    return int(numerics.fp32_div_ulps or 0)


def _nudge(v, steps: int, toward) -> np.ndarray:
    """fp32 ``v`` moved ``steps`` representable values toward ``toward`` (finite values)."""
    v = np.asarray(v, F32)
    for _ in range(steps):
        v = np.where(np.isfinite(v), np.nextafter(v, F32(toward)), v).astype(F32)
    return v


def aiter_scale_inv_range(a_lo, a_hi, fmt: str, numerics) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of the scale_inv AITER's rule reaches from amax in [a_lo, a_hi]: fl32(amax /
    max) is monotone in amax; widened by ``fp32_div_ulps`` representable values each way."""
    floor = F32(numerics.amax_floor or 0.0)
    lo = qref.aiter_scale_inv(np.maximum(np.asarray(a_lo, F32), floor), fmt)
    hi = qref.aiter_scale_inv(np.maximum(np.asarray(a_hi, F32), floor), fmt)
    ulps = _ulps(numerics)
    return _nudge(lo, ulps, 0.0), _nudge(hi, ulps, np.inf)


def check_aiter_scale_inv(actual, a_lo, a_hi, central, fmt: str, numerics) -> Metrics:
    """scale_inv (rows,) within :func:`aiter_scale_inv_range`; with ``scale_inv_zero_as_one``
    a 0 there reads 1 (and 0 itself is wrong); NaN exactly where the amax interval is NaN."""
    got = np.asarray(actual, F32)
    if got.shape != np.shape(a_lo):
        return malformed(f"scale_inv shape {got.shape} != expected {np.shape(a_lo)}")
    lo, hi = aiter_scale_inv_range(a_lo, a_hi, fmt, numerics)
    with np.errstate(invalid="ignore"):
        ok = (got >= lo) & (got <= hi)
        if numerics.scale_inv_zero_as_one:
            # ftz hardware flushes a subnormal quotient to 0 too (then 1 is right).
            can_be_zero = (lo <= 0) | ((_ulps(numerics) > 0) & (lo < np.finfo(F32).tiny))
            ok = (ok & (got != 0)) | (can_be_zero & (got == 1))
        nan_ref = np.isnan(lo) | np.isnan(hi)
        ok = np.where(nan_ref, np.isnan(got), ok)
    c = qref.aiter_scale_inv(np.asarray(central, F32), fmt)
    return _interval_metrics(Tier.SCALE_INTERVAL, ok, got.astype(np.float64), lo.astype(np.float64),
                             hi.astype(np.float64), c.astype(np.float64),
                             excused=int((ok & (got != c)).sum()))


def recip_range(scale_inv, numerics) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of the fp32 reciprocal a kernel computes of ``scale_inv`` (exact with 0 ulps)."""
    ulps = _ulps(numerics)
    with np.errstate(over="ignore", divide="ignore"):  # 1/0 and 1/subnormal are Inf: right
        if not ulps:
            r = qref.reciprocal(scale_inv)
            return r, r
        return qref.recip_ulp_bounds(scale_inv, ulps)


def check_scale_inv(actual, scale) -> Metrics:
    """scale_inv == fl32(1 / scale) bit for bit (``scale``: the one the codes were made with)."""
    want = qref.reciprocal(scale)
    got = np.asarray(actual, F32)
    if got.shape != want.shape:
        return malformed(f"scale_inv shape {got.shape} != expected {want.shape}")
    return compare_exact(got, want)


# ---- codes ---------------------------------------------------------------------------------

def _ordered(values, endpoint) -> np.ndarray:
    """Decoded endpoint codes for ordering: an overflow NaN lies beyond every finite code on
    the side of the (finite or infinite) value that produced it."""
    with np.errstate(invalid="ignore"):
        beyond = np.where(np.asarray(endpoint) < 0, -np.inf, np.inf)
    return np.where(np.isnan(values), beyond, values)


def codes_within(bits, c_lo, c_hi, c_mid, fmt: str, lo, hi, *, live=None,
                 nan_allowed=None) -> Metrics:
    """The ``code-interval`` verdict on code bits given the endpoint codes c_lo, c_hi (made
    under the backend's scale) and the code of round32(y_ref) c_mid (for reporting);
    ``nan_allowed`` marks elements where a NaN code is also right."""
    bits, c_lo, c_hi, c_mid = (np.asarray(b, np.uint8) for b in (bits, c_lo, c_hi, c_mid))
    va, vlo, vhi, vmid = (qref.decode(b, fmt) for b in (bits, c_lo, c_hi, c_mid))
    nan_ref = np.isnan(np.asarray(lo, F32)) | np.isnan(np.asarray(hi, F32))
    olo, ohi = _ordered(vlo, lo), _ordered(vhi, hi)
    with np.errstate(invalid="ignore"):
        # Inclusive: the only distinct codes equal to an endpoint's value are the two zeros,
        # and an interval that reaches 0 from either side admits both (y = +-tiny rounds to
        # the zero of its sign; the sign of an exact 0 is an artefact of operation order).
        between = np.isfinite(va) & (olo <= va) & (va <= ohi)
        nan_ok = np.isnan(va) & (np.isnan(vlo) | np.isnan(vhi))
        if nan_allowed is not None:
            nan_ok = nan_ok | (np.isnan(va) & nan_allowed)
    ok = np.where(nan_ref, np.isnan(va), (bits == c_lo) | (bits == c_hi) | between | nan_ok)
    live = np.ones(bits.shape, bool) if live is None else live
    excused = int((ok & live & (bits != c_mid) & ~(np.isnan(va) & np.isnan(vmid))).sum())
    return _interval_metrics(Tier.CODE_INTERVAL, ok, va, vlo, vhi, vmid, live=live, excused=excused)


def fp8_code_bounds(lo, hi, y_mid, scale, fmt: str, saturate: bool):
    """Codes (c_lo, c_hi, c_mid) of fl32(y * scale) cast RNE, for y = the interval's endpoints
    and round32(y_ref)."""
    return tuple(qref.scaled_cast(v, scale, fmt, saturate=saturate) for v in (lo, hi, y_mid))


def check_fp8_codes(bits, lo, hi, y_mid, scale, fmt: str, saturate: bool) -> Metrics:
    c_lo, c_hi, c_mid = fp8_code_bounds(lo, hi, y_mid, scale, fmt, saturate)
    return codes_within(bits, c_lo, c_hi, c_mid, fmt, lo, hi)


def zero_times_inf(lo, hi, r_hi) -> np.ndarray:
    """True where fl32(y * r) can be 0 * Inf = NaN with y anywhere inside [lo, hi]: the y
    interval holds 0 and the multiplier may be +Inf.  The corner products miss it when 0 is
    strictly inside (their ends are -Inf and +Inf).  This is AITER's zero-row policy (amax 0,
    scale_inv 0, r = 1/0: NaN codes) reached by a kernel whose fp32 y of a row is all +-0 while
    every y_ref of the row is within its bound of 0 (swiglu of [-92.08, 57.63]: torch's fp32
    silu(-92.08) = x / (1 + exp(92.08)) overflows exp and is -0, y_ref = -5.4e-37 with a bound
    of 5.1e-34; a torch-backend fuzz finding on the CPU)."""
    with np.errstate(invalid="ignore"):
        holds_zero = (np.asarray(lo, F32) <= 0) & (np.asarray(hi, F32) >= 0)
    return holds_zero & np.isposinf(np.asarray(r_hi, F32))


def check_fp8_codes_scaled_by(bits, lo, hi, y_mid, r_lo, r_hi, fmt: str,
                              saturate: bool) -> Metrics:
    """Codes of fl32(y * r) cast RNE for y in [lo, hi] and r in [r_lo, r_hi] (r >= 0, maybe
    Inf): between the casts of the smallest and largest of the four corner products (the
    product is monotone in each factor); a NaN code is allowed where a corner (or
    round32(y_ref) * r) is NaN (0 * Inf), or where 0 lies inside the y interval and r may be
    Inf (:func:`zero_times_inf`)."""
    if np.array_equal(r_lo, r_hi) and np.isfinite(r_lo).all():
        return check_fp8_codes(bits, lo, hi, y_mid, r_lo, fmt, saturate)
    with np.errstate(invalid="ignore", over="ignore"):
        corners = np.stack([(np.asarray(y, F32) * np.asarray(r, F32)).astype(F32)
                            for y in (lo, hi) for r in (r_lo, r_hi)])
        v_mid = (np.asarray(y_mid, F32) * np.asarray(r_lo, F32)).astype(F32)
        v_lo, v_hi = np.nanmin(corners, axis=0), np.nanmax(corners, axis=0)
    c_lo, c_hi, c_mid = (qref.codes_to_bits(qref.round_elements(v, fmt, saturate=saturate))
                         for v in (v_lo, v_hi, v_mid))
    nan_corner = np.isnan(corners).any(axis=0) | np.isnan(v_mid) | zero_times_inf(lo, hi, r_hi)
    # The interval ends for NaN-ness of y_ref itself are the y interval's, not the products'.
    y_nan = np.isnan(np.asarray(lo, F32)) | np.isnan(np.asarray(hi, F32))
    ends = [np.where(y_nan, np.nan, v) for v in (v_lo, v_hi)]
    return codes_within(bits, c_lo, c_hi, c_mid, fmt, *ends, nan_allowed=nan_corner)


# ---- MX ------------------------------------------------------------------------------------

def mx_allowed_bytes(a_lo, a_hi, fmt: str, mode: str, *, rceil_ambiguity: bool = True):
    """[lo, hi] E8M0 bytes a block whose amax lies in [a_lo, a_hi] may get (0xFF for NaN)."""
    b_lo = qref.e8m0_scale(a_lo, fmt, mode).astype(np.int64)
    b_hi = qref.e8m0_scale(a_hi, fmt, mode).astype(np.int64)
    if mode == "rceil" and rceil_ambiguity:
        amb_lo, _ = rceil_allowed_bytes(a_lo, fmt)
        _, amb_hi = rceil_allowed_bytes(a_hi, fmt)
        with np.errstate(invalid="ignore"):
            b_lo = np.where((a_lo > 0) & (b_lo != qref.E8M0_NAN), np.minimum(b_lo, amb_lo), b_lo)
            b_hi = np.where((a_hi > 0) & (b_hi != qref.E8M0_NAN), np.maximum(b_hi, amb_hi), b_hi)
    return b_lo, b_hi


def check_mx_scales(actual, a_lo, a_hi, a_mid, fmt: str, mode: str, *,
                    rceil_ambiguity: bool = True) -> Metrics:
    """Block bytes (rows, nb) within the bytes the blocks' amax intervals reach."""
    a = np.asarray(actual)
    if a.shape != np.shape(a_lo):
        return malformed(f"scale_inv shape {a.shape} != expected {np.shape(a_lo)}")
    a = a.astype(np.int64)
    b_lo, b_hi = mx_allowed_bytes(a_lo, a_hi, fmt, mode, rceil_ambiguity=rceil_ambiguity)
    mid = qref.e8m0_scale(a_mid, fmt, mode).astype(np.int64)
    # The NaN scale is for NaN / Inf in y_ref itself; an interval end that overflows fp32 (a
    # huge bound) only means "up to the largest finite scale".
    nan_ref = mid == qref.E8M0_NAN
    b_hi = np.where(b_hi == qref.E8M0_NAN, 254, b_hi)
    ok = np.where(nan_ref, a == qref.E8M0_NAN, (a >= b_lo) & (a <= b_hi))
    return _interval_metrics(Tier.E8M0_INTERVAL, ok, a, b_lo, b_hi, mid,
                             excused=int((ok & (a != mid)).sum()))


def check_mx_codes(bits, scales, lo, hi, y_mid, fmt: str, element_rounding: str) -> Metrics:
    """Codes re-quantized at the interval endpoints under the backend's own E8M0 bytes."""
    scales = np.asarray(scales, np.uint8)
    c_lo, c_hi, c_mid = (qref.mx_codes_with_scales(v, scales, fmt, element_rounding)
                         for v in (lo, hi, y_mid))
    live = ~np.repeat(scales == qref.E8M0_NAN, 32, axis=-1)[:, : np.shape(bits)[-1]]
    return codes_within(bits, c_lo, c_hi, c_mid, fmt, lo, hi, live=live)


# ---- the whole quantized output ------------------------------------------------------------

class FusedQuantJudge:
    """Judges one backend's (data, scale_inv, amax) for a fused recipe, given y_ref (rows, N)
    and ``bound(numerics)``: the per-element e for that backend's declared numerics."""

    def __init__(self, y_ref, bound, recipe, scale=None, *, amax_required: bool = True):
        """``recipe``: a ``tealite.recipes`` recipe (its typed facts choose the checks);
        ``scale``: the given scale of a recipe whose scale is an input."""
        self.y = np.asarray(y_ref, np.float64)
        self.bound = bound
        self.recipe = recipe
        self.scale = None if scale is None else np.asarray(scale, F32).reshape(1)
        self.y_mid = fref.round_to_f32(self.y)
        self.amax_required = amax_required
        self.mx = recipe.family is Family.MX
        self.aiter_rule = not self.mx and recipe.scale_rule is FP8ScaleRule.AMAX_OVER_FMAX
        self._cache: dict = {}

    def tiers(self) -> dict[str, Tier]:
        """The tier of each output this recipe has (an MX recipe reports no amax)."""
        mx = self.mx
        out = {"data": Tier.CODE_INTERVAL,
               "scale_inv": Tier.E8M0_INTERVAL if mx else
               Tier.SCALE_INTERVAL if self.aiter_rule else Tier.EXACT}
        if not mx:
            out["amax"] = Tier.ABSENT if self.aiter_rule else Tier.AMAX_INTERVAL
        return out

    def check(self, output: str):
        """The check of ``output``: check(outputs, numerics) -> Metrics."""
        return {"data": self.check_data, "scale_inv": self.check_scale_inv,
                "amax": self.check_amax}[output]

    def check_pair(self, output: str):
        """The pair rule of ``output``: each backend judged against its own bound of the
        reference (two correct kernels may round y differently)."""
        check = self.check(output)
        return lambda ox, oy, nx, ny: combine_pair(check(ox, nx), check(oy, ny))

    # The interval for a backend's numerics (cached: three outputs share it).
    def intervals(self, numerics):
        key = numerics  # a frozen Numerics: hashable, equal when the declarations are
        if key not in self._cache:
            e = np.broadcast_to(np.asarray(self.bound(numerics), np.float64), self.y.shape)
            lo, hi = y_interval(self.y, e)
            self._cache[key] = (lo, hi) + abs_interval(lo, hi)
        return self._cache[key]

    def _amax_interval(self, numerics):
        _, _, a_lo, a_hi = self.intervals(numerics)
        _, m_hi = abs_interval(self.y_mid, self.y_mid)
        if self.recipe.scale_given:
            return _max(a_lo).reshape(1), _max(a_hi).reshape(1), _max(m_hi).reshape(1)
        return _max(a_lo, 1), _max(a_hi, 1), _max(m_hi, 1)

    def _codes(self, outputs):
        """Code bits (rows, N), unpacked for e2m1, or the reason they are malformed."""
        rows, n = self.y.shape
        return quantized.code_bits(outputs, "data", self.recipe.fmt, n, rows=rows,
                                   context=f" (y {self.y.shape})")

    def _recips(self, outputs, numerics):
        """(r_lo, r_hi): the fp32 multipliers the backend's codes were made with, per element
        (equal unless a declared approximate division widens them), or a reason."""
        rows = self.y.shape
        if self.recipe.scale_given:
            if numerics.given_scale_as_scale_inv:
                r_lo, r_hi = recip_range(qref.reciprocal(self.scale), numerics)
            else:
                r_lo = r_hi = self.scale
            return np.broadcast_to(r_lo[0], rows), np.broadcast_to(r_hi[0], rows)
        if self.aiter_rule:
            sinv = quantized.array_of(outputs, "scale_inv", torch.float32)
            if isinstance(sinv, str):
                return sinv
            if sinv.shape != rows[:1]:
                return f"scale_inv shape {sinv.shape} != expected {rows[:1]}"
            r_lo, r_hi = recip_range(sinv, numerics)
            return np.broadcast_to(r_lo[:, None], rows), np.broadcast_to(r_hi[:, None], rows)
        amax = quantized.array_of(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return amax + " (the per-row scale under TE's rule is judged from it)"
        if amax.shape != rows[:1]:
            return f"amax shape {amax.shape} != expected {rows[:1]}"
        r = np.broadcast_to(row_scale(amax, self.recipe)[:, None], rows)
        return r, r

    def _nonfinite_unjudged(self, numerics) -> str | None:
        policy = numerics.mx_nonfinite or "nan-scale"
        if policy == "nan-scale" or np.isfinite(self.y).all():
            return None
        return (f"mx_nonfinite={policy!r} with NaN/Inf in y: the fused judge has only the "
                "nan-scale rule (not judged)")

    def _mx_scales(self, outputs, numerics):
        """The backend's E8M0 scale bytes, or why they cannot be judged (a str)."""
        return self._nonfinite_unjudged(numerics) or \
            quantized.array_of(outputs, "scale_inv", torch.uint8)

    def check_data(self, outputs, numerics) -> Metrics:
        bits = self._codes(outputs)
        if isinstance(bits, str):
            return malformed(bits)
        lo, hi, _, _ = self.intervals(numerics)
        r = self.recipe
        if self.mx:
            scales = self._mx_scales(outputs, numerics)
            if isinstance(scales, str):
                return malformed(scales)
            if scales.shape != (self.y.shape[0], -(-self.y.shape[1] // 32)):
                return malformed(f"scale_inv shape {scales.shape} does not fit data "
                                 f"{self.y.shape}")
            return check_mx_codes(bits, scales, lo, hi, self.y_mid, r.fmt,
                                  r.element_rounding.value)
        recips = self._recips(outputs, numerics)
        if isinstance(recips, str):
            return malformed(recips)
        return check_fp8_codes_scaled_by(bits, lo, hi, self.y_mid, *recips, r.fmt,
                                         r.saturation is Saturation.SATURATE)

    def check_scale_inv(self, outputs, numerics) -> Metrics:
        r = self.recipe
        if self.mx:
            scales = self._mx_scales(outputs, numerics)
            if isinstance(scales, str):
                return malformed(scales)
            _, _, a_lo, a_hi = self.intervals(numerics)
            _, m_hi = abs_interval(self.y_mid, self.y_mid)
            blocks = [mx_block_amax(v) for v in (a_lo, a_hi, m_hi)]
            return check_mx_scales(scales, *blocks, r.fmt, r.scale_rounding.value)
        sinv = quantized.array_of(outputs, "scale_inv", torch.float32)
        if isinstance(sinv, str):
            return malformed(sinv)
        if r.scale_given:
            return check_scale_inv(sinv, self.scale)
        if self.aiter_rule:
            return check_aiter_scale_inv(sinv, *self._amax_interval(numerics), r.fmt,
                                         numerics)
        amax = quantized.array_of(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return malformed(amax)
        return check_scale_inv(sinv, row_scale(amax, r))

    def check_amax(self, outputs, numerics) -> Metrics:
        if self.aiter_rule:
            return quantized.check_no_amax(outputs)
        if outputs.get("amax") is None and not self.amax_required:
            return absent("not requested (return_amax=False)")
        amax = quantized.array_of(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return malformed(amax)
        return check_amax(amax, *self._amax_interval(numerics))
