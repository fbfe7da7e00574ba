"""Dot-product attention forward and backward in fp32 math (semantics:
tealite/attention_types.py).

Every case is brought to one form, per sequence: q (h_q, s_q, d_qk), k (h_q, s_kv, d_qk),
v (h_q, s_kv, d_v) in float32 (K/V heads repeated over their query group), the sequence's
actual lengths, and its additive bias.  Scores, softmax, both products and the backward's
dP, D and dS are fp32; every output is rounded once, at the end.  bshd/sbhd loop over the
batch (a padded batch's rows past its length are outside attention), thd over the packed
sequences (rows in no sequence stay 0).  The backward recomputes P from the given lse, as
flash kernels do, so the out / lse it is handed are the ones its gradients are consistent
with.
"""
from __future__ import annotations

import dataclasses

import torch

from tealite.attention_types import AttentionConfig, diagonal_offset
from tealite.backends.torch import BACKEND
from tealite.backends.torch.quantize import _fp8_rowwise
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NUMERICS = {"compute_dtype": torch.float32}
_F32 = torch.float32


def _as_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(0, 1) if layout == "sbhd" else t


def _seq_spans(config: AttentionConfig, b: int, sq: int, sk: int):
    """[(q start, q length, kv start, kv length)] of every sequence, in its batch row
    (bshd/sbhd: start 0) or its packed offset (thd)."""
    if config.layout == "thd":
        cq, ck = config.cu_seqlens_q.tolist(), config.cu_seqlens_kv.tolist()
        oq = (config.cu_seqlens_q_padded if config.cu_seqlens_q_padded is not None
              else config.cu_seqlens_q).tolist()
        ok = (config.cu_seqlens_kv_padded if config.cu_seqlens_kv_padded is not None
              else config.cu_seqlens_kv).tolist()
        return [(oq[i], cq[i + 1] - cq[i], ok[i], ck[i + 1] - ck[i]) for i in range(len(cq) - 1)]
    if config.padded:
        lq, lk = config.seqlens_q.tolist(), config.seqlens_kv.tolist()
        return [(0, lq[i], 0, lk[i]) for i in range(b)]
    return [(0, sq, 0, sk)] * b


def _bias_f32(config: AttentionConfig, i: int, hq: int, len_q: int, len_kv: int,
              device) -> torch.Tensor | None:
    """Additive fp32 bias of sequence ``i`` over its (len_q, len_kv) block: (1|h_q, .., ..)."""
    if config.bias is not None:
        bias = config.bias[i if config.bias.shape[0] > 1 else 0]
        return bias[:, :len_q, :len_kv].to(_F32)
    if config.alibi_slopes is not None:
        slopes = config.alibi_slopes
        slopes = slopes[i] if slopes.ndim == 2 else slopes
        rows = torch.arange(len_q, device=device, dtype=_F32)[:, None]
        cols = torch.arange(len_kv, device=device, dtype=_F32)[None, :]
        dist = (rows + (len_kv - len_q) - cols).abs()
        return -slopes.to(_F32)[:, None, None] * dist
    return None


def _visible(config: AttentionConfig, len_q: int, len_kv: int, device) -> torch.Tensor:
    """bool (len_q, len_kv): which keys each query row of one sequence sees."""
    rows = torch.arange(len_q, device=device)[:, None]
    cols = torch.arange(len_kv, device=device)[None, :]
    diag = rows + diagonal_offset(config, len_q, len_kv)
    vis = torch.ones(len_q, len_kv, dtype=torch.bool, device=device)
    left, right = config.window
    if config.causal:
        vis &= cols <= diag
    if left >= 0:
        vis &= cols >= diag - left
    if right >= 0:
        vis &= cols <= diag + right
    return vis


def _scores(q, k, config, i, len_q, len_kv):
    """fp32 masked scores (h, len_q, len_kv); -inf where a key is hidden."""
    s = torch.matmul(q, k.transpose(-1, -2)) * config.softmax_scale
    bias = _bias_f32(config, i, q.shape[0], len_q, len_kv, q.device)
    if bias is not None:
        s = s + bias
    return s.masked_fill(~_visible(config, len_q, len_kv, q.device), float("-inf"))


def _heads_first(t: torch.Tensor, group: int = 1) -> torch.Tensor:
    """(s, h, d) -> fp32 (h * group, s, d), each K/V head repeated over its query group."""
    t = t.to(_F32).transpose(0, 1)
    return t.repeat_interleave(group, dim=0) if group > 1 else t


def _sequences(q, k, v, config):
    """Yield (index, q slot, kv slot, q, k, v, len_q, len_kv) per sequence: the slots index
    the bshd-ordered q / k / v (thd: rows of the packed dim; else batch row and rows)."""
    layout = config.layout
    qb, kb, vb = (_as_bshd(t, layout) for t in (q, k, v))
    if layout == "thd":
        b, sq, sk = config.cu_seqlens_q.shape[0] - 1, q.shape[0], k.shape[0]
    else:
        b, sq, sk = qb.shape[0], qb.shape[1], kb.shape[1]
    for i, (q0, lq, k0, lk) in enumerate(_seq_spans(config, b, sq, sk)):
        if layout == "thd":
            yield i, (slice(q0, q0 + lq),), (slice(k0, k0 + lk),), qb, kb, vb, lq, lk
        else:
            yield i, (i, slice(0, lq)), (i, slice(0, lk)), qb, kb, vb, lq, lk


def _lse_index(config, i, rows):
    return (slice(None), rows[0]) if config.layout == "thd" else (i, slice(None), rows[1])


def fp8_dequantized(t: torch.Tensor, recipe) -> torch.Tensor:
    """fp32 codes * scale_inv of ``t`` quantized as a whole with ``recipe`` (per-tensor FP8,
    the quantize op's own rule): FP8 attention's inputs as the recipe defines them."""
    codes, scale_inv = _fp8_rowwise(t.reshape(-1, t.shape[-1]) if t.ndim else t, recipe, None)
    return (codes.float() * scale_inv).reshape(t.shape)


@BACKEND.implements(Op.ATTENTION_FWD_FP8, dtypes=_FLOATS, numerics=_NUMERICS)
@BACKEND.implements(Op.ATTENTION_FWD, dtypes=_FLOATS, numerics=_NUMERICS)
def attention_fwd(q, k, v, config: AttentionConfig):
    if config.recipe is not None:  # FP8: the fp32 path on the dequantized inputs, out in q's
        plain = dataclasses.replace(config, recipe=None)             # dtype, rounded once
        out, lse = attention_fwd(*(fp8_dequantized(t, config.recipe) for t in (q, k, v)), plain)
        return out.to(q.dtype), lse
    hq, hk = q.shape[-2], k.shape[-2]
    group = hq // hk
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    out = torch.zeros(out_shape, dtype=q.dtype, device=q.device)
    outb = _as_bshd(out, config.layout)
    if config.layout == "thd":
        lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=_F32, device=q.device)
    else:
        b, s = _as_bshd(q, config.layout).shape[:2]
        lse = torch.full((b, hq, s), float("-inf"), dtype=_F32, device=q.device)
    for i, qi, ki, qb, kb, vb, lq, lk in _sequences(q, k, v, config):
        if lq == 0 or hq == 0:
            continue
        s = _scores(_heads_first(qb[qi]), _heads_first(kb[ki], group), config, i, lq, lk)
        o, l_ = _softmax_pv(s, _heads_first(vb[ki], group))
        outb[qi] = o.transpose(0, 1).to(q.dtype)
        lse[_lse_index(config, i, qi)] = l_
    return out, lse


def _softmax_pv(s, v):
    """(P v / rowsum, lse) of fp32 scores with max subtraction; empty rows: 0 and -inf."""
    if s.shape[-1] == 0:
        m = torch.full(s.shape[:-1], float("-inf"), dtype=_F32, device=s.device)
    else:
        m = s.amax(dim=-1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe[..., None])
    row_sum = p.sum(dim=-1)
    o = torch.matmul(p, v) / row_sum[..., None]
    o = torch.where(row_sum[..., None] > 0, o, torch.zeros_like(o))
    return o, m_safe + torch.log(row_sum)


@BACKEND.implements(Op.ATTENTION_BWD_FP8, dtypes=_FLOATS, numerics=_NUMERICS)
@BACKEND.implements(Op.ATTENTION_BWD, dtypes=_FLOATS, numerics=_NUMERICS)
def attention_bwd(dout, q, k, v, out, lse, config: AttentionConfig):
    if config.recipe is not None:  # FP8: the fp32 path on the dequantized dout, q, k, v (out
        plain = dataclasses.replace(config, recipe=None)     # as given), each grad rounded once
        deq = (fp8_dequantized(t, config.recipe) for t in (dout, q, k, v))
        grads = attention_bwd(*deq, out.to(_F32), lse, plain)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
    hq, hk = q.shape[-2], k.shape[-2]
    group = hq // hk
    dq32 = torch.zeros(q.shape, dtype=_F32, device=q.device)
    dk32 = torch.zeros(k.shape, dtype=_F32, device=q.device)
    dv32 = torch.zeros(v.shape, dtype=_F32, device=q.device)
    layout = config.layout
    dqb, dkb, dvb = (_as_bshd(t, layout) for t in (dq32, dk32, dv32))
    doutb, outb = _as_bshd(dout, layout), _as_bshd(out, layout)
    for i, qi, ki, qb, kb, vb, lq, lk in _sequences(q, k, v, config):
        if lq == 0 or lk == 0 or hq == 0:
            continue
        qh, kh, vh = _heads_first(qb[qi]), _heads_first(kb[ki], group), _heads_first(vb[ki], group)
        s = _scores(qh, kh, config, i, lq, lk)
        row_lse = lse[_lse_index(config, i, qi)].to(_F32)
        # P from the given lse; a row with lse -inf saw no key: P = 0 there (not NaN).
        lse_safe = torch.where(torch.isfinite(row_lse), row_lse, torch.zeros_like(row_lse))
        p = torch.exp(s - lse_safe[..., None])
        p = torch.where(torch.isfinite(row_lse)[..., None], p, torch.zeros_like(p))
        do, o = _heads_first(doutb[qi]), _heads_first(outb[qi])
        dp = torch.matmul(do, vh.transpose(-1, -2))
        d_row = (do * o).sum(dim=-1)
        ds = p * (dp - d_row[..., None])
        scale = config.softmax_scale
        dqb[qi] = (torch.matmul(ds, kh) * scale).transpose(0, 1)
        dk_h = torch.matmul(ds.transpose(-1, -2), qh) * scale
        dv_h = torch.matmul(p.transpose(-1, -2), do)
        dkb[ki] = _group_sum(dk_h, group).transpose(0, 1)
        dvb[ki] = _group_sum(dv_h, group).transpose(0, 1)
    return dq32.to(q.dtype), dk32.to(k.dtype), dv32.to(v.dtype)


def _group_sum(t: torch.Tensor, group: int) -> torch.Tensor:
    """(h_q, s, d) -> (h_kv, s, d): dK / dV of a K/V head sum over its query group (fp32)."""
    return t.reshape(t.shape[0] // group, group, *t.shape[1:]).sum(dim=1)
