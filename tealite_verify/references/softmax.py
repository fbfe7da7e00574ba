"""TransformerEngine's fused softmax kinds, float64 (numpy), from the math.

For one row of logits x (length sk) and a scale:

    s_j = scale * x_j, or the fill where the kind hides key j
    m = max_j s_j;  e_j = exp(s_j - m);  y_j = e_j / sum_k e_k

with TE's fill rule: ``scaled_masked`` writes -10000 over a masked logit (and a row whose
maximum is -10000 outputs zeros); ``scaled_aligned_causal`` writes -10000 over a hidden key
(it enters the max and the sum; its output is 0); ``scaled_upper_triang`` writes -inf (it takes
no part; its output is 0).  Key j is hidden from query i by a causal kind when
j > i + (sk - sq).  The max subtraction is exact algebra (softmax is shift invariant); it is
kept here so that large logits do not overflow float64's exp either.

Backward: dx_j = scale * y_j * (dy_j - sum_k dy_k y_k), over the kept keys of a causal kind
(0 at the hidden ones), over the whole row otherwise.

The helpers :func:`filled_logits` and :func:`kept` give the tier (tiers/softmax.py) the
quantities its bound is a function of.  Imports nothing of tealite.
"""
from __future__ import annotations

import numpy as np

MASK_FILL = -10000.0
KINDS = ("scaled", "scaled_masked", "scaled_upper_triang", "scaled_aligned_causal")
CAUSAL = ("scaled_upper_triang", "scaled_aligned_causal")


def kept(kind: str, sq: int, sk: int) -> np.ndarray | None:
    """(sq, sk) bool: key j kept for query i by a causal kind (None: every key)."""
    if kind not in CAUSAL:
        return None
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return j <= i + (sk - sq)


def filled_logits(x, kind: str, scale: float, mask=None) -> np.ndarray:
    """scale * x with the kind's fill at the positions it hides or masks (float64)."""
    if kind not in KINDS:
        raise ValueError(f"unknown softmax kind {kind!r}")
    s = np.asarray(x, dtype=np.float64) * float(scale)
    if kind == "scaled_masked":
        return np.where(np.asarray(mask, dtype=bool), MASK_FILL, s)
    keep = kept(kind, s.shape[-2], s.shape[-1])
    if keep is None:
        return s
    fill = -np.inf if kind == "scaled_upper_triang" else MASK_FILL
    return np.where(keep, s, fill)


def zeroed(kind: str, s: np.ndarray) -> np.ndarray:
    """Where the kind's output is 0 by definition: hidden keys, and rows TE zeroes."""
    out = np.zeros(s.shape, dtype=bool)
    if s.size == 0:
        return out
    if kind == "scaled_masked":
        out |= s.max(axis=-1, keepdims=True) == MASK_FILL
    keep = kept(kind, s.shape[-2], s.shape[-1])
    if keep is not None:
        out |= ~keep
    return out


def softmax_fwd(x, kind: str, *, scale: float, mask=None) -> np.ndarray:
    s = filled_logits(x, kind, scale, mask)
    if s.size == 0:
        return s.copy()
    m = s.max(axis=-1, keepdims=True)
    # A row with every key hidden by -inf (only a shape the front-end refuses: upper-triangular
    # with sq > sk) is zeroed below; 0 keeps its arithmetic quiet.
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    with np.errstate(invalid="ignore"):
        y = e / e.sum(axis=-1, keepdims=True)
    return np.where(zeroed(kind, s), 0.0, y)


def softmax_bwd(dy, y, kind: str, *, scale: float) -> np.ndarray:
    dy = np.asarray(dy, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return y.copy()
    keep = kept(kind, y.shape[-2], y.shape[-1])
    if keep is not None:
        dy, y = np.where(keep, dy, 0.0), np.where(keep, y, 0.0)
    c = (dy * y).sum(axis=-1, keepdims=True)
    return float(scale) * y * (dy - c)
