"""Attention cases: the shapes, masks, windows and values that break attention kernels.

A case is JSON: ``layout``, ``mask``, ``window`` [left, right], ``batch``, padded lengths
``sq`` / ``sk`` (bshd / sbhd), per-sequence actual lengths ``lens_q`` / ``lens_kv`` (padding
masks and thd; 0 and 1 drawn often), ``pad_q`` / ``pad_kv`` (thd: the slack after each
sequence in its slot, TE's padded thd; None: unpadded), ``heads_q`` / ``heads_kv`` (MHA, GQA
ratios, MQA), ``d_qk`` / ``d_v`` (off the 16-grid; 192/128 from ``local`` up), ``scale``
(None: 1/sqrt(d_qk); large values make logits whose softmax overflows fp32 without the max
subtraction), ``bias`` ("none", "post_scale", "post_scale_inf": -inf entries and a fully
hidden row, "alibi"), value distributions and a seed.  Every field is independent of the
layout, so one case can be moved to any layout x mask cell (coverage.py) and the front-end
decides what is valid (thd takes padding masks and no bias tensor).
"""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds

LAYOUTS = ("bshd", "sbhd", "thd")
MASKS = ("none", "causal", "causal_bottom_right", "padding", "padding_causal",
         "padding_causal_bottom_right")
BIASES = ("none", "post_scale", "post_scale_inf", "alibi")
PADDING_MASKS = tuple(m for m in MASKS if m.startswith("padding"))
THD_BIASES = ("none", "alibi")

# (batch, seq, heads, head dims) per size.  ci: interpreted Triton flash kernels run these.
_LIMITS = {
    "ci": (3, 48, 4, (8, 12, 16, 20, 24, 32, 36, 40, 48, 60, 64)),
    "local": (4, 300, 8, (32, 40, 64, 72, 80, 96, 120, 128, 160, 192, 200, 256)),
    "large": (2, 4096, 16, (64, 72, 128, 192, 256)),
}
_MLA = {"ci": (), "local": ((192, 128),), "large": ((192, 128),)}
_GROUPS = (1, 1, 2, 3, 4)


@st.composite
def _heads(draw, max_heads: int):
    hk = draw(pick(*[h for h in (1, 1, 2, 4) if h <= max_heads]))
    group = draw(pick(*[g for g in _GROUPS if g * hk <= max_heads]))
    return hk * group, hk


# Strategies built once per argument (a composite's body runs per draw, and a strategy built
# there anew is validated by Hypothesis each time: strategies/choices.py).
@functools.lru_cache(maxsize=None)
def _length(max_len: int) -> st.SearchStrategy[int]:
    """0 and 1 often (empty and one-token sequences), the full length, else any."""
    return st.one_of(pick(0, 1), st.integers(0, max_len), st.just(max_len))


@functools.lru_cache(maxsize=None)
def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@st.composite
def _lens(draw, n: int, max_len: int):
    return [min(draw(_length(max_len)), max_len) for _ in range(n)]   # 1 > an empty max


@st.composite
def _window(draw, sk: int, causal: bool):
    """(-1, -1) half the time; else edges: 0, 1, a few keys, and >= s_kv."""
    if draw(st.booleans()):
        return [-1, -1]
    sides = pick(-1, 0, 1, 3, sk, sk + 5)
    left, right = draw(sides), draw(sides)
    return [left, min(right, 0) if causal else right]


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, bwd: bool = False):
    max_b, max_s, max_h, dims = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    # Only what the front-end accepts (a refused case would be a fuzz "error"): thd takes the
    # padding masks and no bias tensor (TE's rules); coverage.force may move a case anywhere,
    # and the suite checks the moved case with the front-end.
    layout = draw(pick(*LAYOUTS))
    mask = draw(pick(*(PADDING_MASKS if layout == "thd" else MASKS)))
    batch = draw(_int(1, max_b))
    sq = draw(dim(max_s, allow_zero=True))
    sk = sq if draw(st.booleans()) else draw(dim(max_s, allow_zero=True))  # sq == sk, or not
    hq, hk = draw(_heads(max_h))
    d_qk = draw(pick(*dims))
    d_v = d_qk if draw(st.booleans()) else draw(pick(*dims))
    if _MLA[size] and draw(_int(0, 7)) == 0:
        d_qk, d_v = _MLA[size][0]
    thd_padded = draw(st.booleans())
    cap = 8 if dtype == "float16" else None    # fp16 outputs: keep v inside fp16's range
    case = {
        "layout": layout, "mask": mask, "dtype": dtype,
        "window": draw(_window(sk, "causal" in mask)),
        "batch": batch, "sq": sq, "sk": sk,
        "lens_q": draw(_lens(batch, sq)), "lens_kv": draw(_lens(batch, sk)),
        "pad_q": draw(_lens(batch, 3)) if thd_padded else None,
        "pad_kv": draw(_lens(batch, 3)) if thd_padded else None,
        "heads_q": hq, "heads_kv": hk, "d_qk": d_qk, "d_v": d_v,
        "scale": draw(pick(None, None, 0.1, 1.0, 4.0, 16.0)),
        "bias": draw(pick(*(THD_BIASES if layout == "thd" else BIASES))),
        # A per-head bias at the large size would be (b, h, 4096, 4096) float64 on the host.
        "bias_batch": draw(st.booleans()),
        "bias_heads": size != "large" and draw(st.booleans()),
        "bias_dtype": draw(pick(dtype, "float32")),
        "dist_q": draw(distributions(dtype, wide=False, max_log2=cap)),
        "dist_k": draw(distributions(dtype, wide=False, max_log2=cap)),
        "dist_v": draw(distributions(dtype, wide=False, max_log2=cap)),
        "seed": draw(seeds()),
    }
    if bwd:
        case["dist_dout"] = draw(distributions(dtype, wide=False, max_log2=cap))
    return case
