"""The ``e8m0-adjusted`` tier: MX scales and codes (every MX recipe, quantize and its columnwise
direction).

Scales: a block's E8M0 byte may differ from the reference by exactly one exponent only where
the scale rule is RCEIL and amax * (1/max) lies within fp32 rounding (2^-22 relative) of a power
of two -- the one place where a correct GPU and a correct CPU computation can disagree.  Only
the exponents that ceil(log2(amax/max)) can take under that error are excused
(:func:`rceil_allowed_bytes`), not any +-1.  Any other scale difference fails.

Codes: every block's codes are checked against the *re-quantization of the block's original
values with the backend's own scale* (never by rescaling the reference codes: quantization is
nonlinear at subnormals and saturation); tiers/fp4_ties.py refines this for a backend that
declares hardware FP4 ties.  Codes under a NaN scale (0xFF) are unspecified by every recipe and
are not compared; padding nibbles of an odd e2m1 row are not compared either.

Blocks holding NaN / Inf follow the backend's declared ``mx_nonfinite`` policy: "nan-scale"
(OCP, TE: byte 0xFF, codes unspecified) or "ignore-nan" (AITER's Triton MXFP4: NaN left out of
the block amax, an Inf amax takes byte 0xFE, NaN and Inf elements encode as +-max; see
references.quantize.mx_scales_nan_ignoring); the reference follows the declared policy, with no
slack.

Pair rules: scales judged both ways (each side's byte one the other side's rule could reach);
codes of each side re-quantized under its own scales (so where the scales agree, the codes
agree), label ``e8m0-adjusted-pair``.  Where the two sides declare different nonfinite
policies, blocks with NaN / Inf are judged per side only.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from tealite_verify.references import quantize as ref
from tealite_verify.tiers import fp4_ties
from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair, from_mask, malformed
from tealite_verify.tiers.quantized import code_bits, host

RCEIL_AMBIGUITY = 2.0 ** -22
NAN_SCALE, IGNORE_NAN = "nan-scale", "ignore-nan"


def rceil_ambiguous(block_amax, fmt: str) -> np.ndarray:
    """True where amax/max is within fp32 rounding of a power of two."""
    a = np.asarray(block_amax, dtype=np.float64)
    r = a / ref.fmt_max(fmt)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.exp2(np.round(np.log2(np.where(r > 0, r, 1.0))))
        return np.isfinite(r) & (r > 0) & (np.abs(r / p - 1.0) <= RCEIL_AMBIGUITY)


def rceil_allowed_bytes(block_amax, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] biased bytes that ceil(log2(amax/max)) can take when the ratio carries an
    fp32 rounding error of up to 2^-22 relative (lo == hi outside the ambiguity zone)."""
    a = np.asarray(block_amax, dtype=np.float64)
    r = np.where(np.isfinite(a) & (a > 0), a / ref.fmt_max(fmt), 1.0)
    with np.errstate(divide="ignore"):
        lo = np.ceil(np.log2(r * (1 - RCEIL_AMBIGUITY)))
        hi = np.ceil(np.log2(r * (1 + RCEIL_AMBIGUITY)))
    clamp = lambda e: (np.clip(e, -127, 127) + 127).astype(np.int64)  # noqa: E731
    return clamp(lo), clamp(hi)


def mx_block_amax(x, block: int = 32) -> np.ndarray:
    """amax of each 1 x ``block`` MX block of a 2-D array (the reference's block_amax)."""
    return ref.block_amax(x, (1, block))


def check_mx_scales(actual, expected, x, fmt: str, scale_mode: str) -> Metrics:
    """Scale bytes (M, nb) of the backend against the reference's."""
    a = np.asarray(actual, np.uint8)
    e = np.asarray(expected, np.uint8)
    if a.shape != e.shape:
        return Metrics(Tier.E8M0_ADJUSTED, 0, 0, math.inf, math.inf,
                       shape_error=f"scale shape {a.shape} != expected {e.shape}")
    d = a.astype(np.int64) - e.astype(np.int64)
    adjustable = (np.abs(d) == 1) & (e != ref.E8M0_NAN) & (a != ref.E8M0_NAN)
    if scale_mode == "rceil":
        amax = mx_block_amax(x)
        lo, hi = rceil_allowed_bytes(amax, fmt)
        adjustable &= rceil_ambiguous(amax, fmt) & (a >= lo) & (a <= hi)
    else:
        adjustable &= False
    ok = (d == 0) | adjustable
    return from_mask(Tier.E8M0_ADJUSTED, ok, a, e, err=d, excused=int(adjustable.sum()))


def check_mx_codes(actual_bits, actual_scales, x, fmt: str, element_rounding: str, *,
                   tie_tolerant: bool = False, block: int = 32) -> Metrics:
    """Codes (M, K unpacked) against the re-quantization of x with the backend's scales;
    ``tie_tolerant``: the fp4-ties tier."""
    a = np.asarray(actual_bits, np.uint8)
    scales = np.asarray(actual_scales, np.uint8)
    m, k = np.shape(x)
    want_scales = (m, -(-k // block))
    if scales.shape != want_scales:
        return Metrics(Tier.E8M0_ADJUSTED, 0, 0, math.inf, math.inf,
                       shape_error=f"scale shape {scales.shape} != expected {want_scales}")
    want = ref.mx_codes_with_scales(x, scales, fmt, element_rounding, block)
    if a.shape != want.shape:
        return Metrics(Tier.E8M0_ADJUSTED, 0, 0, math.inf, math.inf,
                       shape_error=f"codes shape {a.shape} != expected {want.shape}")
    live = ~np.repeat(scales == ref.E8M0_NAN, block, axis=-1)[:, : a.shape[1]]
    ok = (a == want) | ~live
    excused = 0
    if tie_tolerant and not ok.all():
        tie = fp4_ties.ties(ok, a, want, x, scales, fmt, block)
        excused = int(tie.sum())
        ok |= tie
    tier = Tier.FP4_TIES if tie_tolerant else Tier.E8M0_ADJUSTED
    return from_mask(tier, ok, a, want, err=a.astype(np.int64) - want.astype(np.int64),
                     numel=int(live.sum()), excused=excused)


def check_mx_codes_pair(bits_x, scales_x, bits_y, scales_y, x, fmt: str, element_rounding: str,
                        *, tie_tolerant: bool = False, block: int = 32) -> Metrics:
    """Backend vs backend: each side's codes must be the re-quantization of x under its own
    scales (so blocks whose scales differ are judged too), and where the scales agree the
    codes must agree (up to declared FP4 ties)."""
    mx = check_mx_codes(bits_x, scales_x, x, fmt, element_rounding, tie_tolerant=tie_tolerant,
                        block=block)
    my = check_mx_codes(bits_y, scales_y, x, fmt, element_rounding, tie_tolerant=tie_tolerant,
                        block=block)
    return combine_pair(mx, my, Tier.E8M0_ADJUSTED_PAIR)


# ---- a backend's declared nonfinite policy -------------------------------------------------

def mx_policy(numerics) -> str:
    policy = numerics.mx_nonfinite or NAN_SCALE
    if policy not in (NAN_SCALE, IGNORE_NAN):
        raise ValueError(f"unknown mx_nonfinite policy {policy!r}")
    return policy


def _excuse(m: Metrics, n: int, why: str) -> Metrics:
    return dataclasses.replace(m, excused=m.excused + n, note=why) if n else m


def codes_under_policy(codes, scales, x, fmt, er, policy, tie_ok) -> Metrics:
    """check_mx_codes under a nonfinite policy: with "ignore-nan" a NaN element must encode
    as max (its sign bit is not a value: NaN has no sign to keep), i.e. as +Inf would."""
    if policy == IGNORE_NAN:
        nan = np.isnan(x)
        sign = 0x08 if fmt == "e2m1" else 0x80
        codes = np.where(nan, codes & ~np.uint8(sign), codes).astype(np.uint8)
        x = np.where(nan, np.float32(np.inf), x).astype(np.float32)
    return check_mx_codes(codes, scales, x, fmt, er, tie_tolerant=tie_ok)


def nonfinite_blocks(x, block: int = 32) -> np.ndarray:
    """MX blocks of x holding a NaN or an Inf."""
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(mx_block_amax(np.where(np.isinf(x), np.nan, x), block))


# ---- one direction's quantized output ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MXOutput:
    """Judges one direction's MX outputs ``data`` and ``scale_inv`` (output names) of a
    quantizer of ``x`` (rows, K: already transposed for the columnwise direction).
    ``scales``: the reference's bytes under "nan-scale"; ``ignoring`` / ``undefined``: under
    "ignore-nan" and where those are undefined (an all-NaN block)."""

    x: np.ndarray
    fmt: str
    scale_mode: str
    element_rounding: str
    data: str
    scale_inv: str
    scales: np.ndarray
    ignoring: np.ndarray
    undefined: np.ndarray

    def check_scales(self, outs, numerics) -> Metrics:
        got = host(outs[self.scale_inv])
        x, fmt, mode = self.x, self.fmt, self.scale_mode
        if mx_policy(numerics) == NAN_SCALE:
            return check_mx_scales(got, self.scales, x, fmt, mode)
        if got.shape != self.ignoring.shape:
            return check_mx_scales(got, self.ignoring, x, fmt, mode)
        want = np.where(self.undefined, got, self.ignoring)  # an all-NaN block's byte: undefined
        return _excuse(check_mx_scales(got, want, x, fmt, mode), int(self.undefined.sum()),
                       "scales of all-NaN blocks are undefined")

    def _codes(self, outs):
        return code_bits(outs, self.data, self.fmt, self.x.shape[1])

    def check_codes(self, outs, numerics) -> Metrics:
        codes = self._codes(outs)
        if isinstance(codes, str):
            return malformed(codes)
        return codes_under_policy(codes, host(outs[self.scale_inv]), self.x, self.fmt,
                                  self.element_rounding, mx_policy(numerics),
                                  fp4_ties.declared(numerics))

    def pair_scales(self, ox, oy, nx, ny) -> Metrics:
        sx, sy = host(ox[self.scale_inv]), host(oy[self.scale_inv])
        x, fmt, mode = self.x, self.fmt, self.scale_mode
        skip = 0
        if mx_policy(nx) != mx_policy(ny) and sx.shape == sy.shape == self.scales.shape:
            # Blocks with NaN / Inf follow each side's declared policy (each judged against
            # the reference under it); the pair compares the blocks where the policies agree.
            differ = nonfinite_blocks(x)
            skip = int(differ.sum())
            sx, sy = np.where(differ, 0, sx), np.where(differ, 0, sy)
        # Judged both ways: each side's byte must be one the other side's rule could reach.
        there = check_mx_scales(sx, sy, x, fmt, mode)
        back = check_mx_scales(sy, sx, x, fmt, mode)
        worse = there if not there.passed or back.passed is there.passed else back
        return _excuse(worse, skip, "blocks with NaN/Inf judged per side (nonfinite policies "
                                    "differ)")

    def pair_codes(self, ox, oy, nx, ny) -> Metrics:
        cx, cy = self._codes(ox), self._codes(oy)
        if isinstance(cx, str) or isinstance(cy, str):
            return malformed(cx if isinstance(cx, str) else cy)
        ties = fp4_ties.declared(nx) or fp4_ties.declared(ny)
        sx, sy = host(ox[self.scale_inv]), host(oy[self.scale_inv])
        x, fmt, er = self.x, self.fmt, self.element_rounding
        if mx_policy(nx) == mx_policy(ny) == NAN_SCALE:
            return check_mx_codes_pair(cx, sx, cy, sy, x, fmt, er, tie_tolerant=ties)
        # Each side must be the re-quantization of x under its own scales and policy (so
        # where the scales agree, the codes agree).
        mx = codes_under_policy(cx, sx, x, fmt, er, mx_policy(nx), ties)
        my = codes_under_policy(cy, sy, x, fmt, er, mx_policy(ny), ties)
        return combine_pair(mx, my, Tier.E8M0_ADJUSTED_PAIR)
