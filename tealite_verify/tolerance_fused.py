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
    fp32 rounding of amax * (1/max) (tolerance_quant.rceil_allowed_bytes).
amax
    The reported amax (per tensor or per row) lies in its interval; NaN exactly where y_ref
    has a NaN.
codes
    Judged under the backend's OWN scale: an element's code must be one the recipe's rounding
    produces for some fp32 y in its interval, i.e. between the codes of the two endpoints
    (re-quantized with the kernel's scale, never rescaled), inclusive.  Codes of equal value
    (a NaN from overflow, +-0 inside the range) compare by value; an endpoint's own code
    matches bit for bit.  Codes under an MX NaN scale (0xFF) are unspecified, as in quantize.

e = 0 makes every check bit-exact against references/fused.py's quantize_rows (except the
RCEIL byte excuse above, which the plain quantize tier grants for the same input).  Codes that
differ from the quantization of round32(y_ref) under the backend's scale but lie inside the
interval are counted in ``Metrics.excused``.  Pairwise (backend vs backend) each side is
judged against its own bound of the reference: two correct kernels may round y differently.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tealite.formats import get_format
from tealite_verify import tolerance, tolerance_quant
from tealite_verify.references import fused as fref
from tealite_verify.references import quantize as qref
from tealite_verify.tolerance import Metrics

F32 = np.float32
TIER = "code-interval"


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


# ---- metrics -------------------------------------------------------------------------------

def _interval_metrics(tier, ok, actual, lo, hi, central, *, live=None, excused=0) -> Metrics:
    """Metrics for "actual in [lo, hi]" checks; values are float64 arrays of one shape."""
    ok = np.asarray(ok, bool)
    live = np.ones(ok.shape, bool) if live is None else np.asarray(live, bool)
    bad = ~ok & live
    numel = int(live.sum())
    if not bad.any():
        return Metrics(tier, numel, 0, 0.0, 0.0, excused=int(excused))
    with np.errstate(invalid="ignore"):
        off = np.abs(np.asarray(actual, np.float64) - np.asarray(central, np.float64))
    off = np.where(bad, np.where(np.isnan(off), np.inf, off), -1.0)
    flat = int(np.argmax(off))
    idx = tuple(int(i) for i in np.unravel_index(flat, ok.shape))
    half = max(abs(float(hi[idx]) - float(central[idx])), abs(float(central[idx]) - float(lo[idx])))
    return Metrics(tier, numel, int(bad.sum()), float(off.reshape(-1)[flat]), math.inf,
                   worst_index=idx, worst_actual=float(actual[idx]),
                   worst_expected=float(central[idx]),
                   worst_tol=half if math.isfinite(half) else math.inf,
                   excused=int(excused), note=f"allowed [{float(lo[idx])!r}, {float(hi[idx])!r}]")


def malformed(reason: str) -> Metrics:
    return Metrics("malformed", 0, 0, math.inf, math.inf, shape_error=reason)


def combine_pair(mx: Metrics, my: Metrics) -> Metrics:
    """Backend vs backend: both sides judged against their own bounds of the reference."""
    if mx.shape_error or my.shape_error:
        return mx if mx.shape_error else my
    worse = mx if mx.mismatches >= my.mismatches else my
    return Metrics(f"{mx.tier}-pair", mx.numel, mx.mismatches + my.mismatches, worse.max_abs_err,
                   worse.max_ratio, worse.worst_index, worse.worst_actual, worse.worst_expected,
                   worse.worst_tol, excused=mx.excused + my.excused, note=worse.note)


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
    return _interval_metrics("amax-interval", ok, a, lo, hi, c,
                             excused=int((ok & ~nan_ref & (a != c)).sum()))


def row_scale(amax, recipe: dict) -> np.ndarray:
    """TE's per-row scale (float32) for the given row amaxes."""
    return qref.te_scale_from_amax(amax, recipe["fmt"],
                                   force_pow2=recipe.get("force_pow2_scales", False),
                                   amax_epsilon=recipe.get("amax_epsilon", 0.0))


def check_scale_inv(actual, scale) -> Metrics:
    """scale_inv == fl32(1 / scale) bit for bit (``scale``: the one the codes were made with)."""
    want = qref.reciprocal(scale)
    got = np.asarray(actual, F32)
    if got.shape != want.shape:
        return malformed(f"scale_inv shape {got.shape} != expected {want.shape}")
    return tolerance.compare_exact(got, want)


# ---- codes ---------------------------------------------------------------------------------

def _ordered(values, endpoint) -> np.ndarray:
    """Decoded endpoint codes for ordering: an overflow NaN lies beyond every finite code on
    the side of the (finite or infinite) value that produced it."""
    with np.errstate(invalid="ignore"):
        beyond = np.where(np.asarray(endpoint) < 0, -np.inf, np.inf)
    return np.where(np.isnan(values), beyond, values)


def codes_within(bits, c_lo, c_hi, c_mid, fmt: str, lo, hi, *, live=None) -> Metrics:
    """The ``code-interval`` verdict on code bits given the endpoint codes c_lo, c_hi (made
    under the backend's scale) and the code of round32(y_ref) c_mid (for reporting)."""
    bits, c_lo, c_hi, c_mid = (np.asarray(b, np.uint8) for b in (bits, c_lo, c_hi, c_mid))
    va, vlo, vhi, vmid = (qref.decode(b, fmt) for b in (bits, c_lo, c_hi, c_mid))
    nan_ref = np.isnan(np.asarray(lo, F32)) | np.isnan(np.asarray(hi, F32))
    olo, ohi = _ordered(vlo, lo), _ordered(vhi, hi)
    with np.errstate(invalid="ignore"):
        between = np.isfinite(va) & (olo < va) & (va < ohi)
        nan_ok = np.isnan(va) & (np.isnan(vlo) | np.isnan(vhi))
    ok = np.where(nan_ref, np.isnan(va), (bits == c_lo) | (bits == c_hi) | between | nan_ok)
    live = np.ones(bits.shape, bool) if live is None else live
    excused = int((ok & live & (bits != c_mid) & ~(np.isnan(va) & np.isnan(vmid))).sum())
    return _interval_metrics(TIER, ok, va, vlo, vhi, vmid, live=live, excused=excused)


def fp8_code_bounds(lo, hi, y_mid, scale, fmt: str, saturate: bool):
    """Codes (c_lo, c_hi, c_mid) of fl32(y * scale) cast RNE, for y = the interval's endpoints
    and round32(y_ref)."""
    return tuple(qref.scaled_cast(v, scale, fmt, saturate=saturate) for v in (lo, hi, y_mid))


def check_fp8_codes(bits, lo, hi, y_mid, scale, fmt: str, saturate: bool) -> Metrics:
    c_lo, c_hi, c_mid = fp8_code_bounds(lo, hi, y_mid, scale, fmt, saturate)
    return codes_within(bits, c_lo, c_hi, c_mid, fmt, lo, hi)


# ---- MX ------------------------------------------------------------------------------------

def mx_allowed_bytes(a_lo, a_hi, fmt: str, mode: str, *, rceil_ambiguity: bool = True):
    """[lo, hi] E8M0 bytes a block whose amax lies in [a_lo, a_hi] may get (0xFF for NaN)."""
    b_lo = qref.e8m0_scale(a_lo, fmt, mode).astype(np.int64)
    b_hi = qref.e8m0_scale(a_hi, fmt, mode).astype(np.int64)
    if mode == "rceil" and rceil_ambiguity:
        amb_lo, _ = tolerance_quant.rceil_allowed_bytes(a_lo, fmt)
        _, amb_hi = tolerance_quant.rceil_allowed_bytes(a_hi, fmt)
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
    return _interval_metrics("e8m0-interval", ok, a, b_lo, b_hi, mid,
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

    def __init__(self, y_ref, bound, recipe: dict, scale=None):
        self.y = np.asarray(y_ref, np.float64)
        self.bound = bound
        self.recipe = recipe
        self.scale = None if scale is None else np.asarray(scale, F32).reshape(1)
        self.y_mid = fref.round_to_f32(self.y)
        self._cache: dict = {}

    # The interval for a backend's numerics (cached: three outputs share it).
    def intervals(self, numerics):
        key = repr(sorted((str(k), str(v)) for k, v in dict(numerics).items()))
        if key not in self._cache:
            e = np.broadcast_to(np.asarray(self.bound(numerics), np.float64), self.y.shape)
            lo, hi = y_interval(self.y, e)
            self._cache[key] = (lo, hi) + abs_interval(lo, hi)
        return self._cache[key]

    def _amax_interval(self, numerics):
        _, _, a_lo, a_hi = self.intervals(numerics)
        _, m_hi = abs_interval(self.y_mid, self.y_mid)
        if self.recipe["kind"] == "delayed":
            return _max(a_lo).reshape(1), _max(a_hi).reshape(1), _max(m_hi).reshape(1)
        return _max(a_lo, 1), _max(a_hi, 1), _max(m_hi, 1)

    def _codes(self, outputs):
        data = outputs.get("data")
        fmt = get_format(self.recipe["fmt"])
        if data is None:
            return "output 'data' missing"
        if data.dtype != fmt.torch_dtype:
            return f"data dtype {data.dtype} != {fmt.torch_dtype} for {fmt.name}"
        if tuple(data.shape) != self.y.shape:
            return f"data shape {tuple(data.shape)} != expected {self.y.shape}"
        return data.detach().cpu().contiguous().view(torch.uint8).numpy()

    def _tensor(self, outputs, name, dtype):
        t = outputs.get(name)
        if t is None:
            return f"output {name!r} missing"
        if t.dtype != dtype:
            return f"{name} dtype {t.dtype} != {dtype}"
        return t.detach().cpu().numpy()

    def _backend_scale(self, outputs):
        """The fp32 scale the backend's codes were made with (per element), or a reason."""
        if self.recipe["kind"] == "delayed":
            return np.broadcast_to(self.scale[0], self.y.shape)
        amax = self._tensor(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return amax
        if amax.shape != self.y.shape[:1]:
            return f"amax shape {amax.shape} != expected {self.y.shape[:1]}"
        return np.broadcast_to(row_scale(amax, self.recipe)[:, None], self.y.shape)

    def check_data(self, outputs, numerics) -> Metrics:
        bits = self._codes(outputs)
        if isinstance(bits, str):
            return malformed(bits)
        lo, hi, _, _ = self.intervals(numerics)
        r = self.recipe
        if r["kind"] == "mx":
            scales = self._tensor(outputs, "scale_inv", torch.uint8)
            if isinstance(scales, str):
                return malformed(scales)
            if scales.shape != (self.y.shape[0], -(-self.y.shape[1] // 32)):
                return malformed(f"scale_inv shape {scales.shape} does not fit data "
                                 f"{self.y.shape}")
            return check_mx_codes(bits, scales, lo, hi, self.y_mid, r["fmt"],
                                  r["element_rounding"])
        scale = self._backend_scale(outputs)
        if isinstance(scale, str):
            return malformed(scale)
        return check_fp8_codes(bits, lo, hi, self.y_mid, scale, r["fmt"],
                               r.get("saturation", "saturate") == "saturate")

    def check_scale_inv(self, outputs, numerics) -> Metrics:
        r = self.recipe
        if r["kind"] == "mx":
            scales = self._tensor(outputs, "scale_inv", torch.uint8)
            if isinstance(scales, str):
                return malformed(scales)
            _, _, a_lo, a_hi = self.intervals(numerics)
            _, m_hi = abs_interval(self.y_mid, self.y_mid)
            blocks = [tolerance_quant.block_amax(v) for v in (a_lo, a_hi, m_hi)]
            return check_mx_scales(scales, *blocks, r["fmt"], r["scale_rounding"])
        sinv = self._tensor(outputs, "scale_inv", torch.float32)
        if isinstance(sinv, str):
            return malformed(sinv)
        if r["kind"] == "delayed":
            return check_scale_inv(sinv, self.scale)
        amax = self._tensor(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return malformed(amax)
        return check_scale_inv(sinv, row_scale(amax, r))

    def check_amax(self, outputs, numerics) -> Metrics:
        amax = self._tensor(outputs, "amax", torch.float32)
        if isinstance(amax, str):
            return malformed(amax)
        return check_amax(amax, *self._amax_interval(numerics))

    def expected(self, reference: dict) -> dict:
        """Spec entries (tealite_verify.specs.Expected) for data, scale_inv and amax;
        ``reference`` is references.fused.quantize_rows of round32(y_ref) (the e = 0 answer)."""
        from tealite_verify.specs import Expected

        def pair(check):
            return lambda ox, oy, nx, ny: combine_pair(check(ox, nx), check(oy, ny))

        mx = self.recipe["kind"] == "mx"
        out = {"data": Expected(reference["bits"], torch.uint8, TIER, check=self.check_data,
                                check_pair=pair(self.check_data)),
               "scale_inv": Expected(reference["scale_inv"], torch.uint8 if mx else torch.float32,
                                     "e8m0-interval" if mx else "exact",
                                     check=self.check_scale_inv,
                                     check_pair=pair(self.check_scale_inv))}
        if not mx:
            out["amax"] = Expected(reference["amax"], torch.float32, "amax-interval",
                                   check=self.check_amax, check_pair=pair(self.check_amax))
        return out
