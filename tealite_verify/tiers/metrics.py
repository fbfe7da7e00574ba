"""What every tier returns: a :class:`Metrics` record labelled with a :class:`Tier`, built by one
function (:func:`from_mask`) from the tier's per-element verdict.

Also the three verdicts that belong to no one tier: :func:`malformed` (an output whose dtype,
shape or presence breaks the op's contract, so no tier can judge it), :func:`absent` (an
output that must be, or may be, missing and is), and :func:`combine_pair`, the pair rule of
every tier that judges each backend against the reference under its own numerics.
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


class Tier(str, enum.Enum):
    """Tier labels.  The values are what findings, reports and the committed baselines store:
    never rename one.  A ``-pair`` label is the tier's backend-vs-backend rule."""

    EXACT = "exact"                    # bitwise (tiers/exact.py)
    EXACT_PAIR = "exact-pair"          # exact scale_inv of two fused backends (code_interval)
    BOUNDED = "bounded"                # |got - want| <= tol with no op's bound named
    ULP = "ulp"                        # elementwise ops, norms (tiers/ulp.py)
    ULP_PAIR = "ulp-pair"
    GEMM = "gemm"                      # K-aware Higham bound (tiers/gemm.py)
    GEMM_PAIR = "gemm-pair"
    ATTENTION = "attention"            # dot-product attention (tiers/attention.py)
    ATTENTION_PAIR = "attention-pair"
    SOFTMAX = "softmax"                # softmax fwd / bwd (tiers/softmax.py)
    SOFTMAX_PAIR = "softmax-pair"
    ROUTER = "router"                  # MoE router: selection, weights, aux loss (router.py)
    ROUTER_PAIR = "router-pair"
    E8M0_ADJUSTED = "e8m0-adjusted"    # MX scales and codes (tiers/e8m0_adjusted.py)
    E8M0_ADJUSTED_PAIR = "e8m0-adjusted-pair"
    FP4_TIES = "fp4-ties"              # MX codes with hardware FP4 ties (tiers/fp4_ties.py)
    FP32_DIV_PAIR = "fp32-div-pair"    # AITER's rule, approximate division (tiers/fp32_div.py)
    SHUFFLE = "shuffle"                # AITER layouts (tiers/shuffle.py)
    DEQUANTIZED = "dequantized"        # values of a round trip (tiers/dequantized.py)
    DEQUANTIZED_PAIR = "dequantized-pair"
    DEQUANTIZED_CROSS_RECIPE = "dequantized-cross-recipe"
    CODE_INTERVAL = "code-interval"    # fused quantizers' codes (tiers/code_interval.py)
    CODE_INTERVAL_PAIR = "code-interval-pair"
    E8M0_INTERVAL = "e8m0-interval"    # fused MX scales
    E8M0_INTERVAL_PAIR = "e8m0-interval-pair"
    SCALE_INTERVAL = "scale-interval"  # fused FP8 scale_inv under AITER's rule
    SCALE_INTERVAL_PAIR = "scale-interval-pair"
    AMAX_INTERVAL = "amax-interval"    # fused quantizers' reported amax
    AMAX_INTERVAL_PAIR = "amax-interval-pair"
    PARITY = "parity"                  # grouped vs split path of one backend (tiers/parity.py)
    ABSENT = "absent"                  # an output that must (or may) be missing
    ABSENT_PAIR = "absent-pair"
    MALFORMED = "malformed"            # dtype / shape / presence broken: nothing to judge
    MOE_LAYER = "moe-layer"            # composed MoE layer, bound propagated (tiers/moe_layer.py)
    MOE_LAYER_PAIR = "moe-layer-pair"
    MODULE_CHAIN = "module-chain"      # LayerNormLinear / MLP, bound propagated (tiers/modules.py)
    MODULE_CHAIN_PAIR = "module-chain-pair"
    STATISTICAL = "statistical"        # dropout masks, binomial tests (tiers/statistical.py)
    STATISTICAL_PAIR = "statistical-pair"

    # Two labels carry the declared ``fp32_div_ulps`` (tiers/fp32_div.py): "div-<n>ulp" for
    # scale_inv and "recip-<n>ulp" for codes.  They are members made on first use, so that a
    # stored label reads back and any other string is still an error.
    @classmethod
    def _missing_(cls, value):
        match = re.fullmatch(r"(div|recip)-([1-9][0-9]*)ulp", value) \
            if isinstance(value, str) else None
        if match is None:
            return None
        member = str.__new__(cls, value)
        member._name_ = f"{match[1].upper()}_{match[2]}ULP"
        member._value_ = value
        return cls._value2member_map_.setdefault(value, member)

    @classmethod
    def div_ulps(cls, kind: str, ulps: int) -> "Tier":
        """The label of an fp32-division tier: ``kind`` "div" (scale_inv) or "recip" (codes)."""
        return cls(f"{kind}-{int(ulps)}ulp")

    @property
    def pair(self) -> "Tier":
        """This tier's backend-vs-backend label."""
        try:
            return Tier(f"{self.value}-pair")
        except ValueError:
            raise ValueError(f"tier {self.value!r} has no pair rule") from None

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


@dataclass(frozen=True)
class Metrics:
    tier: Tier
    numel: int
    mismatches: int
    max_abs_err: float
    max_ratio: float
    worst_index: tuple | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None
    worst_tol: float | None = None
    nonfinite_mismatches: int = 0
    shape_error: str | None = None
    excused: int = 0  # elements a tier's documented exception accepted (reported, not hidden)
    note: str | None = None  # what the tier saw but does not judge (e.g. padding contents)
    # exact tier: the largest distance between mismatched bit patterns (as integers); there
    # max_abs_err is the value error |got - want| of the mismatched elements.
    max_bit_distance: int | None = None
    # Opt-in probabilistic check (tiers/probabilistic.py): max err / the Higham-Mary bound, and
    # the FlashAttention-style cross-check max|err| / max|same-precision torch - ref|; None when
    # not computed.  Informational: ``passed`` stays the deterministic verdict.
    prob_ratio: float | None = None
    fa_ratio: float | None = None

    def __post_init__(self):
        # A label string (a stored report, a test) is checked: a misspelled tier is an error.
        object.__setattr__(self, "tier", Tier(self.tier))

    @property
    def suspicious(self) -> bool:
        """Within the deterministic bound but beyond the probabilistic one."""
        return self.passed and self.prob_ratio is not None and self.prob_ratio > 1.0

    @property
    def passed(self) -> bool:
        return self.shape_error is None and self.mismatches == 0

    def summary(self) -> str:
        if self.shape_error:
            return f"[{self.tier}] {self.shape_error}"
        s = (f"[{self.tier}] {self.mismatches}/{self.numel} mismatched, max|err|="
             f"{self.max_abs_err:.4g}, max err/tol={self.max_ratio:.4g}")
        if self.max_bit_distance is not None:
            s += f", max bit distance={self.max_bit_distance}"
        if self.worst_index is not None:
            s += (f", worst at {self.worst_index}: got {self.worst_actual!r}, "
                  f"want {self.worst_expected!r} +- {self.worst_tol:.4g}")
        if self.nonfinite_mismatches:
            s += f", {self.nonfinite_mismatches} NaN/Inf mismatches"
        if self.excused:
            s += f", {self.excused} excused by the tier's rule"
        if self.note:
            s += f" ({self.note})"
        if self.prob_ratio is not None:
            s += f", prob err/bound={self.prob_ratio:.4g}" + (" SUSPICIOUS" if self.suspicious
                                                               else "")
        if self.fa_ratio is not None:
            s += f", err/err(torch same precision)={self.fa_ratio:.4g}"
        return s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tier"] = self.tier.value
        d["passed"] = self.passed
        d["suspicious"] = self.suspicious
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


def from_mask(tier: Tier, ok, actual, expected, *, err=None, tol=None, numel: int | None = None,
              live=None, excused: int = 0, nonfinite: int = 0, allowed=None) -> Metrics:
    """The one builder of a tier's Metrics from its per-element verdict ``ok``.

    ``actual`` / ``expected``: arrays of ``ok``'s shape (values or code bits) for the worst
    element's report.  Two kinds of tier:

    * bounded (``tol`` given: |err| <= tol per element, ``err`` required): the worst element
      is the largest err / tol, a rejected element whose ratio is <= 1 (a NaN, a missing
      overflow) counting as inf, and it is reported even when every element passes;
      ``max_abs_err`` is the largest finite err over all elements.
    * in or out (no ``tol``): an element is accepted or not.  Nothing but the counts is
      reported when all are accepted.  Otherwise ``max_abs_err`` is the largest ``err`` of a
      rejected element (NaN counts inf; inf without ``err``), ``max_ratio`` is inf and the
      worst element is the first rejected one, or with ``allowed`` = (lo, hi) (an interval
      tier, ``expected`` its centre) the one farthest from its centre, reported with the
      interval's larger half-width as its tolerance.  ``live``: the elements the tier judges
      (the rest are neither counted nor rejected).

    ``numel`` overrides the element count (default: ``ok``'s size, or the live elements).
    """
    ok = np.asarray(ok, bool)
    if tol is not None:
        return _bounded(tier, ok, err, tol, actual, expected, nonfinite)
    live = np.ones(ok.shape, bool) if live is None else np.asarray(live, bool)
    bad = ~ok & live
    numel = int(live.sum()) if numel is None else int(numel)
    if not bad.any():
        return Metrics(tier, numel, 0, 0.0, 0.0, excused=int(excused))
    off = None
    if err is not None:
        with np.errstate(invalid="ignore"):
            off = np.abs(np.asarray(err, np.float64))
        off = np.where(bad, np.where(np.isnan(off), np.inf, off), -1.0)
    if allowed is not None and off is not None:
        flat = int(np.argmax(off))
    else:
        flat = int(np.argmax(bad))
    idx = tuple(int(i) for i in np.unravel_index(flat, ok.shape))
    worst_tol, note = 0.0, None
    if allowed is not None:
        lo, hi = (float(np.asarray(b)[idx]) for b in allowed)
        centre = float(np.asarray(expected)[idx])
        half = max(abs(hi - centre), abs(centre - lo))
        worst_tol = half if math.isfinite(half) else math.inf
        note = f"allowed [{lo!r}, {hi!r}]"
    return Metrics(tier, numel, int(bad.sum()), math.inf if off is None else float(off.max()),
                   math.inf, worst_index=idx, worst_actual=float(np.asarray(actual)[idx]),
                   worst_expected=float(np.asarray(expected)[idx]), worst_tol=worst_tol,
                   excused=int(excused), note=note)


def _bounded(tier, ok, err, tol, a, e, nonfinite) -> Metrics:
    numel = int(ok.size)
    if numel == 0:
        return Metrics(tier, 0, 0, 0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))
    # A rejected element whose plain ratio is <= 1 (a NaN, a missing overflow) counts as inf.
    ratio = np.where(ok, np.minimum(ratio, 1.0), np.where(ratio > 1, ratio, np.inf))
    flat = int(np.argmax(ratio))
    idx = tuple(int(i) for i in np.unravel_index(flat, ok.shape))
    finite_err = err[np.isfinite(err)]
    return Metrics(
        tier=tier, numel=numel, mismatches=int((~ok).sum()),
        max_abs_err=float(finite_err.max()) if finite_err.size else (math.inf if err.size else 0.0),
        max_ratio=float(ratio.reshape(-1)[flat]),
        worst_index=idx, worst_actual=float(a[idx]), worst_expected=float(e[idx]),
        worst_tol=float(tol[idx]) if np.ndim(tol) else float(tol),
        nonfinite_mismatches=int(nonfinite),
    )


def malformed(reason: str) -> Metrics:
    """An output no tier can judge: its dtype, shape or presence breaks the op's contract."""
    return Metrics(Tier.MALFORMED, 0, 0, math.inf, math.inf, shape_error=reason)


def shape_mismatch(tier: Tier, actual_shape, expected_shape) -> Metrics | None:
    """A failed ``tier`` verdict when the shapes differ, else None."""
    if tuple(actual_shape) == tuple(expected_shape):
        return None
    return Metrics(tier, 0, 0, math.inf, math.inf,
                   shape_error=f"shape {tuple(actual_shape)} != expected {tuple(expected_shape)}")


def absent(note: str | None = None) -> Metrics:
    """The ``absent`` verdict: an output that must (or may) be missing, and is."""
    return Metrics(Tier.ABSENT, 0, 0, 0.0, 0.0, note=note)


def combine_pair(mx: Metrics, my: Metrics, tier: Tier | None = None) -> Metrics:
    """Backend vs backend where each side is judged against the reference under its own
    numerics (two correct kernels may round differently): both must pass.  A malformed side
    is reported as it is; otherwise the counts add up and the side with more mismatches gives
    the worst element.  ``tier``: the pair's label (default ``mx``'s tier's pair)."""
    if mx.shape_error or my.shape_error:
        return mx if mx.shape_error else my
    worse = mx if mx.mismatches >= my.mismatches else my
    return Metrics(mx.tier.pair if tier is None else tier, mx.numel,
                   mx.mismatches + my.mismatches, worse.max_abs_err, worse.max_ratio,
                   worse.worst_index, worse.worst_actual, worse.worst_expected, worse.worst_tol,
                   excused=mx.excused + my.excused, note=worse.note)
