"""Dot-product attention forward and backward, float64, written from the contract's text
(tealite/attention_types.py's docstring), never from a backend.

For query row ``i`` and key ``j`` of one sequence (actual lengths ``lq``, ``lk``):

    s[i, j] = scale * <q_i, k_j> + bias[i, j]          (bias: given, ALiBi, or 0)
    P[i, :] = exp(s[i, :] - lse_i),  lse_i = log sum_j exp(s[i, j])   over visible keys
    out_i   = sum_j P[i, j] v_j
    dP = dout v^T,  D_i = <dout_i, out_i>,  dS = P * (dP - D)
    dq = scale dS k,  dk = scale dS^T q,  dv = P^T dout   (dk, dv summed over a K/V head's
                                                          query heads)

Visibility is built here as one interval of keys per query row: ``[lo_i, hi_i]`` with
``off = lk - lq`` for the bottom-right alignments (the ``*_bottom_right`` masks, and every
non-causal mask for its window) and 0 for the top-left ones; a causal mask caps ``hi`` at
``i + off``, a window ``(left, right)`` (-1: unbounded) clamps to ``[i + off - left,
i + off + right]``; a ``-inf`` bias entry hides its key.  A row with no visible key has
out 0 and lse -inf; its gradients are 0.

The work runs per sequence and per chunk of query rows (:func:`blocks`), so that a long
sequence on the GPU needs (heads x chunk x lk) float64 scores at a time, not (heads x lq x
lk); the tier (tiers/attention.py) walks the same blocks to build its bounds.  Written
against the arrays' namespace: numpy on the host, torch float64 on the reference device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from tealite_verify.references._device import namespace, on_reference_device

# Scores held per block at most (float64 elements: 128 MiB).
BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Structure:
    """What, besides the tensors, defines a case: plain values from the case description.

    ``lens_*``: actual sequence lengths (thd; bshd/sbhd under a padding mask), else None;
    ``offs_*``: thd only, the first row of each sequence (``cu_seqlens_*_padded`` when
    given, else ``cu_seqlens_*``)."""

    layout: str
    mask: str
    scale: float
    window: tuple[int, int] = (-1, -1)
    lens_q: tuple[int, ...] | None = None
    lens_kv: tuple[int, ...] | None = None
    offs_q: tuple[int, ...] | None = None
    offs_kv: tuple[int, ...] | None = None

    @property
    def causal(self) -> bool:
        return "causal" in self.mask

    @property
    def bottom_right(self) -> bool:
        return self.mask.endswith("bottom_right") or not self.causal


@dataclass(frozen=True)
class Span:
    """One sequence: its number, its batch row (bshd/sbhd; None for thd, whose rows are at
    the packed offsets), and its lengths."""

    seq: int
    batch: int | None
    q0: int
    lq: int
    k0: int
    lk: int

    def q_rows(self, r0: int, r1: int) -> tuple:
        """Index of its query rows [r0, r1) in a bshd-ordered (or thd) q-like array."""
        if self.batch is None:
            return (slice(self.q0 + r0, self.q0 + r1),)
        return (self.batch, slice(r0, r1))

    def kv_rows(self) -> tuple:
        if self.batch is None:
            return (slice(self.k0, self.k0 + self.lk),)
        return (self.batch, slice(0, self.lk))

    def lse_rows(self, r0: int, r1: int) -> tuple:
        if self.batch is None:
            return (slice(None), slice(self.q0 + r0, self.q0 + r1))
        return (self.batch, slice(None), slice(r0, r1))


def bshd_view(t, layout: str):
    """q/k/v-like array in bshd order (a view; thd stays (t, h, d))."""
    return t.swapaxes(0, 1) if layout == "sbhd" else t


def spans(st: Structure, q_shape, k_shape) -> list[Span]:
    if st.layout == "thd":
        return [Span(i, None, st.offs_q[i], st.lens_q[i], st.offs_kv[i], st.lens_kv[i])
                for i in range(len(st.lens_q))]
    b_axis, s_axis = (1, 0) if st.layout == "sbhd" else (0, 1)
    b, sq, sk = q_shape[b_axis], q_shape[s_axis], k_shape[s_axis]
    if st.lens_q is not None:
        return [Span(i, i, 0, st.lens_q[i], 0, st.lens_kv[i]) for i in range(b)]
    return [Span(i, i, 0, sq, 0, sk) for i in range(b)]


def key_interval(st: Structure, lq: int, lk: int, r0: int, r1: int):
    """(lo, hi) int arrays: the keys rows r0..r1-1 of a sequence may see (hi < lo: none)."""
    rows = np.arange(r0, r1)
    diag = rows + ((lk - lq) if st.bottom_right else 0)
    lo = np.zeros(rows.shape, np.int64)
    hi = np.full(rows.shape, lk - 1, np.int64)
    left, right = st.window
    if st.causal:
        hi = np.minimum(hi, diag)
    if left >= 0:
        lo = np.maximum(lo, diag - left)
    if right >= 0:
        hi = np.minimum(hi, diag + right)
    return lo, hi


class _Ops:
    """The few array functions beyond namespace() the blocks need, numpy or torch."""

    def __init__(self, like):
        self.xp = namespace(like)
        self.torch = None if self.xp.name == "numpy" else self.xp.torch
        self.device = None if self.torch is None else like.device

    def host(self, a):  # a numpy array on the arrays' device
        return a if self.torch is None else self.torch.as_tensor(a, device=self.device)

    def zeros(self, shape):
        if self.torch is None:
            return np.zeros(shape)
        return self.torch.zeros(shape, dtype=self.torch.float64, device=self.device)

    def full(self, shape, value):
        return self.zeros(shape) + value

    def amax(self, a, axis):
        return a.max(axis=axis) if self.torch is None else a.amax(dim=axis)

    def log(self, a):
        return np.log(a) if self.torch is None else self.torch.log(a)

    def heads_to(self, a, group: int):
        """(s, h, d) -> (h * group, s, d): each K/V head repeated over its query group."""
        a = a.swapaxes(0, 1)
        if group == 1:
            return a
        if self.torch is None:
            return np.repeat(a, group, axis=0)
        return self.torch.repeat_interleave(a, group, dim=0)

    def group_sum(self, a, group: int):
        """(h_q, s, d) -> (h_kv, s, d) summed over each K/V head's query group."""
        return a.reshape(a.shape[0] // group, group, *a.shape[1:]).sum(1)


@dataclass
class Block:
    """One sequence's chunk of query rows, everything in float64 and heads first."""

    span: Span
    r0: int
    r1: int
    group: int
    q: object          # (h_q, C, d_qk)
    k: object          # (h_q, lk, d_qk), K heads repeated over their query groups
    v: object          # (h_q, lk, d_v)
    bias: object       # (1|h_q, C, lk) or None
    vis: object        # bool (1|h_q, C, lk): visible and not hidden by a -inf bias
    s: object          # (h_q, C, lk) scores, -inf where hidden
    lse: object        # (h_q, C), -inf for a row that sees no key
    p: object          # (h_q, C, lk) probabilities, 0 where hidden
    out: object        # (h_q, C, d_v)
    ops: _Ops


def bias_block(ops, bias, alibi, span: Span, r0: int, r1: int):
    if bias is not None:
        b = bias[span.seq if bias.shape[0] > 1 else 0]
        return b[:, r0:r1, :span.lk]
    if alibi is not None:
        slopes = alibi[span.seq] if alibi.ndim == 2 else alibi
        dist = np.abs(np.arange(r0, r1)[:, None] + (span.lk - span.lq)
                      - np.arange(span.lk)[None, :]).astype(np.float64)
        return -slopes[:, None, None] * ops.host(dist)[None]
    return None


def blocks(q, k, v, st: Structure, *, bias=None, alibi=None,
           max_elements: int = BLOCK_ELEMENTS) -> Iterator[Block]:
    """Every (sequence, chunk of query rows) with its exact scores, softmax and output."""
    ops = _Ops(q)
    xp = ops.xp
    hq, hk = q.shape[-2], k.shape[-2]
    group = hq // hk if hk else 1
    qv, kv, vv = (bshd_view(t, st.layout) for t in (q, k, v))
    for span in spans(st, q.shape, k.shape):
        if span.lq == 0 or hq == 0:
            continue
        kh = ops.heads_to(kv[span.kv_rows()], group)
        vh = ops.heads_to(vv[span.kv_rows()], group)
        chunk = max(1, max_elements // max(1, hq * span.lk))
        for r0 in range(0, span.lq, chunk):
            r1 = min(span.lq, r0 + chunk)
            qh = ops.heads_to(qv[span.q_rows(r0, r1)], 1)
            lo, hi = key_interval(st, span.lq, span.lk, r0, r1)
            cols = np.arange(span.lk)[None, :]
            vis = ops.host((cols >= lo[:, None]) & (cols <= hi[:, None]))[None]
            b = bias_block(ops, bias, alibi, span, r0, r1)
            s = (qh @ kh.swapaxes(-1, -2)) * st.scale
            if b is not None:
                s = s + b
                vis = vis & (b > -np.inf)
            s = xp.where(vis, s, -np.inf)
            lse, p = softmax(ops, s, vis)
            yield Block(span, r0, r1, group, qh, kh, vh, b, vis, s, lse, p, p @ vh, ops)


def softmax(ops: _Ops, s, vis):
    """(lse, P) of masked scores (h, C, lk); a row with no visible key: lse -inf, P 0."""
    xp = ops.xp
    if s.shape[-1] == 0:
        return ops.full(s.shape[:-1], -np.inf), s
    m = ops.amax(s, -1)
    seen = m > -np.inf
    m0 = xp.where(seen, m, 0.0)
    e = xp.where(vis, xp.exp(s - m0[..., None]), 0.0)
    total = e.sum(-1)
    lse = xp.where(seen, m0 + ops.log(xp.where(seen, total, 1.0)), -np.inf)
    return lse, e / xp.where(seen, total, 1.0)[..., None]


def ops_of(like) -> "_Ops":
    return _Ops(like)


def lse_shape(q_shape, layout: str) -> tuple[int, ...]:
    """(b, h_q, s_q) for bshd / sbhd, (h_q, t_q) for thd."""
    if layout == "thd":
        return (q_shape[1], q_shape[0])
    b, s = (q_shape[1], q_shape[0]) if layout == "sbhd" else (q_shape[0], q_shape[1])
    return (b, q_shape[-2], s)


def empty_outputs(q, v, st: Structure):
    """(zeros shaped like out, -inf shaped like lse) in q's namespace."""
    ops = _Ops(q)
    out = ops.zeros(tuple(q.shape[:-1]) + (v.shape[-1],))
    return out, ops.full(lse_shape(q.shape, st.layout), -np.inf)


@on_reference_device
def attention_fwd(q, k, v, st: Structure, *, bias=None, alibi=None):
    """(out in q's layout with v's head dim, lse (b, h_q, s_q) or (h_q, t_q))."""
    out, lse = empty_outputs(q, v, st)
    ov = bshd_view(out, st.layout)
    for blk in blocks(q, k, v, st, bias=bias, alibi=alibi):
        ov[blk.span.q_rows(blk.r0, blk.r1)] = blk.out.swapaxes(0, 1)
        lse[blk.span.lse_rows(blk.r0, blk.r1)] = blk.lse
    return out, lse


def backward_block(blk: Block, dout_rows):
    """(dP, D, dS) of one block: dout_rows (C, h_q, d_v) -> heads first."""
    do = dout_rows.swapaxes(0, 1)
    dp = do @ blk.v.swapaxes(-1, -2)
    d = (do * blk.out).sum(-1)
    return do, dp, d, blk.p * (dp - d[..., None])


@on_reference_device
def attention_bwd(dout, q, k, v, st: Structure, *, bias=None, alibi=None):
    """(dq, dk, dv) at the exact forward (D from the exact out, P from the exact lse)."""
    ops = _Ops(q)
    dq, dk, dv = ops.zeros(q.shape), ops.zeros(k.shape), ops.zeros(v.shape)
    dqv, dkv, dvv = (bshd_view(t, st.layout) for t in (dq, dk, dv))
    dov = bshd_view(dout, st.layout)
    for blk in blocks(q, k, v, st, bias=bias, alibi=alibi):
        rows = blk.span.q_rows(blk.r0, blk.r1)
        do, _, _, ds = backward_block(blk, dov[rows])
        dqv[rows] = (ds @ blk.k).swapaxes(0, 1) * st.scale
        kv = blk.span.kv_rows()
        dkv[kv] += ops.group_sum(ds.swapaxes(-1, -2) @ blk.q, blk.group).swapaxes(0, 1) \
            * st.scale
        dvv[kv] += ops.group_sum(blk.p.swapaxes(-1, -2) @ do, blk.group).swapaxes(0, 1)
    return dq, dk, dv
