"""FP8 current scaling under AITER's rule (``scale_rule`` "amax/fmax") with an approximate fp32
division: the ``div-<n>ulp`` (scale_inv) and ``recip-<n>ulp`` (codes) tiers.

A backend declares ``fp32_div_ulps`` (0 / absent: IEEE-rounded; 2: CUDA's ``div.full.f32``,
what Triton's ``/`` compiles to).  Without it, codes and scale_inv are bit-exact
(tiers/quantized.py).  With it, scale_inv must lie within the bound of amax / max, and every
code must be the cast of x * r for an fp32 r within the bound of 1 / (the backend's own
scale_inv): the codes are re-quantized under the kernel's scale, as for MX, with the
reciprocal's documented error as the only slack.

Pair rule: both sides IEEE, bit-exact against each other; otherwise each side against the
reference under its own bound (``fp32-div-pair``), so where both are exact they agree bit for
bit.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tealite_verify.references import quantize as ref
from tealite_verify.tiers import quantized
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair, from_mask, malformed


def declared_ulps(numerics) -> int:
    return int(numerics.fp32_div_ulps or 0)


def check_scale_inv(got, amax, fmt: str, ulps: int) -> Metrics:
    """scale_inv from an approximate fp32 division: within ``ulps`` of amax / max (special
    values exact: 0, Inf, NaN)."""
    g = np.asarray(got)
    if g.dtype != np.float32 or g.shape != np.shape(amax):
        return malformed(f"scale_inv {g.dtype}{g.shape} != float32{np.shape(amax)}")
    exact = np.asarray(amax, np.float64) / ref.fmt_max(fmt)
    g64 = g.astype(np.float64)
    finite = np.isfinite(exact) & (exact != 0)
    safe = np.where(finite, np.abs(exact), 1.0)
    ulp = np.ldexp(1.0, np.maximum(np.frexp(safe)[1] - 1, -126) - 23)
    with np.errstate(invalid="ignore"):
        ok = np.where(finite, np.abs(g64 - exact) <= ulps * ulp,
                      (g64 == exact) | (np.isnan(g64) & np.isnan(exact)))
    return from_mask(Tier.div_ulps("div", ulps), ok, g64, exact, numel=int(g.size))


def check_codes(codes, x, scale_inv, fmt: str, per_row: bool, ulps: int) -> Metrics:
    """Codes re-quantized under the backend's own scale_inv: each must be the cast of
    fl32(x * r) for an fp32 r within ``ulps`` of 1 / scale_inv.  x * r is monotone in r and the
    cast is monotone, so the allowed codes are those between the casts at the two extreme r
    (both NaN: NaN; equal: that code, bit for bit)."""
    s = np.asarray(scale_inv)
    want_shape = (x.shape[0],) if per_row else (1,)
    if s.dtype != np.float32 or s.shape != want_shape:
        return malformed(f"scale_inv {s.dtype}{s.shape} != float32{want_shape}")
    lo, hi = ref.recip_ulp_bounds(s, ulps)
    if per_row:
        lo, hi = lo[:, None], hi[:, None]
    bounds = [ref.codes_to_bits(ref.round_elements(ref.aiter_scaled(x, None, recip=r), fmt))
              for r in (lo, hi)]
    vals = [ref.decode(b, fmt) for b in bounds]
    got = ref.decode(codes, fmt)
    with np.errstate(invalid="ignore"):
        low, high = np.fmin(vals[0], vals[1]), np.fmax(vals[0], vals[1])
        nan = np.isnan(vals[0])
        same = bounds[0] == bounds[1]
        ok = np.where(nan, np.isnan(got),
                      np.where(same, codes == bounds[0], (got >= low) & (got <= high)))
    return from_mask(Tier.div_ulps("recip", ulps), ok, got, ref.decode(bounds[0], fmt),
                     numel=int(codes.size))


@dataclasses.dataclass(frozen=True)
class AiterRuleOutput:
    """Judges one direction's ``data`` / ``scale_inv`` outputs (names) of a quantizer of x
    (rows, n) under AITER's rule; ``bits`` / ``scale_inv_ref`` / ``amax``: the reference's."""

    x: np.ndarray
    fmt: str
    per_row: bool
    data: str
    scale_inv: str
    bits: np.ndarray
    scale_inv_ref: np.ndarray
    amax: np.ndarray

    def check_codes(self, outs, numerics) -> Metrics:
        ulps = declared_ulps(numerics)
        n = self.x.shape[1]
        if not ulps:
            return quantized.check_fp8_codes(outs, self.data, self.fmt, n, self.bits)
        codes = quantized.code_bits(outs, self.data, self.fmt, n)
        if isinstance(codes, str):
            return malformed(codes)
        return check_codes(codes, self.x, quantized.host(outs[self.scale_inv]), self.fmt,
                           self.per_row, ulps)

    def check_scales(self, outs, numerics) -> Metrics:
        ulps = declared_ulps(numerics)
        if not ulps:
            return compare_exact(outs[self.scale_inv], self.scale_inv_ref)
        return check_scale_inv(quantized.host(outs[self.scale_inv]), self.amax, self.fmt, ulps)

    def pair_codes(self, ox, oy, nx, ny) -> Metrics:
        if not declared_ulps(nx) and not declared_ulps(ny):
            return quantized.pair_fp8_codes(ox, oy, self.data, self.fmt, self.x.shape[1])
        return combine_pair(self.check_codes(ox, nx), self.check_codes(oy, ny),
                            Tier.FP32_DIV_PAIR)

    def pair_scales(self, ox, oy, nx, ny) -> Metrics:
        if not declared_ulps(nx) and not declared_ulps(ny):
            return compare_exact(ox[self.scale_inv], oy[self.scale_inv])
        return combine_pair(self.check_scales(ox, nx), self.check_scales(oy, ny),
                            Tier.FP32_DIV_PAIR)
