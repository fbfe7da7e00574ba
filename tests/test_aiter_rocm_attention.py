"""The ``aiter`` backend's attention (AITER's CK fmha: ``mha_fwd``, ``mha_bwd``,
``mha_varlen_fwd``, ``mha_varlen_bwd``) on a CPU, against a FAKE ``aiter``.

The fake implements the four entry points with float64 torch math under CK's conventions
(bottom-right masks "b:left,right", one (s_q, s_kv) bias, (b, h, s) / (h, t) LSE, padded
group mode through ``cu_seqlens_*_padded``, ``zero_tensors``) and *asserts the arguments the
real C++ checks* (last dim contiguous, head dims multiples of 8, bias shape, lse layout).  So
these tests prove the adapter and the refusals, not CK's numerics (an MI300 / MI350 run).
"""
from __future__ import annotations

import math
import sys
import types

import pytest
import torch

import tealite
from tealite.backends import aiter as A

_FAKE_ENTRIES = ("mha_fwd", "mha_bwd", "mha_varlen_fwd", "mha_varlen_bwd")


def _attend(q, k, v, scale, causal, left, right, bias=None, slopes=None):
    """float64 (out, lse) of one sequence, q (s, h, d)."""
    g = q.shape[1] // k.shape[1]
    s = _scores(q, k, scale, causal, left, right, bias, slopes)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, v.double().repeat_interleave(g, 1)), lse


def _contiguous_last(*ts):
    for t in ts:
        assert t.stride(-1) == 1, "CK: tensors must have a contiguous last dimension"
        assert t.shape[-1] % 8 == 0, "CK: head dims must be multiples of 8"


def _scores(q, k, scale, causal, left, right, bias=None, slopes=None):
    """float64 masked scores (h, s_q, s_kv) of one sequence; CK's bottom-right "b:" masks."""
    sq, h, _ = q.shape
    sk, g = k.shape[0], h // k.shape[1]
    s = torch.einsum("ihd,jhd->hij", q.double(), k.double().repeat_interleave(g, 1)) * scale
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    diag = i + sk - sq
    if bias is not None:
        s = s + bias.double()
    if slopes is not None:
        s = s - slopes.double()[:, None, None] * (diag - j).abs()
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    right = 0 if causal else right
    if right >= 0:
        hidden |= j > diag + right
    if left >= 0:
        hidden |= j < diag - left
    return s.masked_fill(hidden, -math.inf)


def _attend_bwd(dout, q, k, v, out, lse, scale, mask_args, bias=None, slopes=None):
    """float64 dq, dk, dv of one sequence from the given out and lse (as flash kernels do)."""
    h, g = q.shape[1], q.shape[1] // k.shape[1]
    s = _scores(q, k, scale, *mask_args, bias, slopes)
    p = torch.exp(s - lse.double()[..., None]).nan_to_num(0.0)
    do, o = dout.double(), out.double()
    vv = v.double().repeat_interleave(g, 1)
    dp = torch.einsum("ihd,jhd->hij", do, vv)
    ds = p * (dp - (do * o).sum(-1).t()[..., None])
    dq = torch.einsum("hij,jhd->ihd", ds, k.double().repeat_interleave(g, 1)) * scale
    dk = torch.einsum("hij,ihd->jhd", ds, q.double()) * scale
    dv = torch.einsum("hij,ihd->jhd", p, do)
    fold = (lambda t: t.reshape(t.shape[0], h // g, g, t.shape[-1]).sum(2))
    return dq, fold(dk), fold(dv)


def make_fake(calls: list) -> types.ModuleType:
    fake = types.ModuleType("aiter")
    fake.__version__ = "0.0-fake"
    fake.__tealite_fake_arch__ = "gfx950"
    fake.__tealite_fake_devices__ = ("cpu",)

    def mha_fwd(q, k, v, dropout_p, softmax_scale, is_causal, window_size_left,
                window_size_right, return_softmax_lse, return_dropout_randval, bias=None,
                alibi_slopes=None, **kw):
        calls.append("mha_fwd")
        _contiguous_last(q, k, v)
        assert bias is None or tuple(bias.shape) == (q.shape[1], k.shape[1])
        assert dropout_p == 0.0 and return_softmax_lse
        outs, lses = [], []
        for b in range(q.shape[0]):
            sl = None if alibi_slopes is None else (
                alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes)
            o, l_ = _attend(q[b], k[b], v[b], softmax_scale, is_causal, window_size_left,
                            window_size_right, bias, sl)
            outs.append(o)
            lses.append(l_)
        return torch.stack(outs).to(q.dtype), torch.stack(lses).float(), None, None

    def _groups(cu_q, cu_k, pad_q, pad_k):
        oq = (pad_q if pad_q is not None else cu_q).tolist()
        ok = (pad_k if pad_k is not None else cu_k).tolist()
        cq, ck = cu_q.tolist(), cu_k.tolist()
        return [(oq[i], cq[i + 1] - cq[i], ok[i], ck[i + 1] - ck[i]) for i in range(len(cq) - 1)]

    def mha_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap, zero_tensors,
                       is_causal, window_size_left, window_size_right, return_softmax_lse,
                       return_dropout_randval, alibi_slopes=None, cu_seqlens_q_padded=None,
                       cu_seqlens_k_padded=None, **kw):
        calls.append("mha_varlen_fwd")
        _contiguous_last(q, k, v)
        assert zero_tensors and logits_soft_cap == 0.0
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
        lse = torch.full((q.shape[1], q.shape[0]), -math.inf)
        for i, (q0, lq, k0, lk) in enumerate(_groups(cu_seqlens_q, cu_seqlens_k,
                                                     cu_seqlens_q_padded, cu_seqlens_k_padded)):
            assert lq <= max_seqlen_q and lk <= max_seqlen_k
            sl = None if alibi_slopes is None else (
                alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes)
            o, l_ = _attend(q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk], softmax_scale,
                            is_causal, window_size_left, window_size_right, None, sl)
            out[q0:q0 + lq], lse[:, q0:q0 + lq] = o.to(q.dtype), l_.float()
        return out, lse, None, None

    def mha_bwd(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, is_causal,
                window_size_left, window_size_right, deterministic, bias=None,
                alibi_slopes=None, **kw):
        calls.append("mha_bwd")
        assert tuple(softmax_lse.shape) == (q.shape[0], q.shape[2], q.shape[1])
        mask_args = (is_causal, window_size_left, window_size_right)
        grads = [_attend_bwd(dout[b], q[b], k[b], v[b], out[b], softmax_lse[b], softmax_scale,
                             mask_args, bias, None if alibi_slopes is None else (
                                 alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes))
                 for b in range(q.shape[0])]
        return (*(torch.stack([g[i] for g in grads]).to(q.dtype) for i in range(3)), None)

    def mha_varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                       max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, zero_tensors,
                       is_causal, window_size_left, window_size_right, deterministic,
                       alibi_slopes=None, cu_seqlens_q_padded=None, cu_seqlens_k_padded=None,
                       **kw):
        calls.append("mha_varlen_bwd")
        assert tuple(softmax_lse.shape) == (q.shape[1], q.shape[0])
        dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
        for i, (q0, lq, k0, lk) in enumerate(_groups(cu_seqlens_q, cu_seqlens_k,
                                                     cu_seqlens_q_padded, cu_seqlens_k_padded)):
            sl = None if alibi_slopes is None else (
                alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes)
            g = _attend_bwd(dout[q0:q0 + lq], q[q0:q0 + lq], k[k0:k0 + lk], v[k0:k0 + lk],
                            out[q0:q0 + lq], softmax_lse[:, q0:q0 + lq], softmax_scale,
                            (is_causal, window_size_left, window_size_right), None, sl)
            dq[q0:q0 + lq], dk[k0:k0 + lk], dv[k0:k0 + lk] = (x.to(q.dtype) for x in g)
        return dq, dk, dv, None

    for fn in (mha_fwd, mha_bwd, mha_varlen_fwd, mha_varlen_bwd):
        setattr(fake, fn.__name__, fn)
    return fake


@pytest.fixture
def calls(monkeypatch):
    record: list = []
    monkeypatch.setitem(sys.modules, "aiter", make_fake(record))
    A.reset()
    with A.PLATFORM.override(rocm=True, gpu_visible=True):
        yield record
    A.reset()


def _within_one_fp16_rounding(got, want):
    """Both sides round a float64 (fake) / fp32 (torch backend) value to fp16 once: they
    agree within one fp16 ulp of the larger magnitude, plus the torch side's fp32 error.

    That fp32 error is relative to the magnitude of the summed terms, not of the result: a
    gradient entry that cancels to ~1e-4 out of O(1) terms carries ~1e-7 of fp32 noise,
    more than its own fp16 ulp (a CI run hit 1.8e-7 at -8.4e-5).  The slack is 16 fp32
    unit roundoffs of the tensor's largest entry, standing in for the terms' size (the
    sums here have at most 16 terms)."""
    mag = torch.maximum(got.double().abs(), want.double().abs())
    ulp = torch.where(mag > 0, 2.0 ** (torch.floor(torch.log2(mag.clamp_min(2 ** -14))) - 10),
                      torch.zeros_like(mag))
    fp32_noise = 16 * 2.0 ** -24 * float(mag.max()) if mag.numel() else 0.0
    assert ((got.double() - want.double()).abs() <= ulp * 1.001 + fp32_noise).all()


def _inputs(layout, sq, sk, hq=4, hk=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "thd":
        shapes = [(sq, hq, d), (sk, hk, d), (sk, hk, d)]
    elif layout == "bshd":
        shapes = [(2, sq, hq, d), (2, sk, hk, d), (2, sk, hk, d)]
    else:
        shapes = [(sq, 2, hq, d), (sk, 2, hk, d), (sk, 2, hk, d)]
    return [torch.randn(*s, generator=g).half() for s in shapes]


@pytest.mark.parametrize("layout, mask, kw", [
    ("bshd", "causal_bottom_right", {"window": (3, 0)}),
    ("sbhd", "none", {"window": (2, 1)}),
    ("bshd", "none", {"bias": "one"}),
    ("bshd", "causal", {"alibi": True}),
])
def test_batch_mode_matches_torch(calls, layout, mask, kw):
    q, k, v = _inputs(layout, 9, 9 if mask == "causal" else 12)
    extra = {"window": kw.get("window", (-1, -1))}
    sq, sk = (q.shape[1], k.shape[1]) if layout == "bshd" else (q.shape[0], k.shape[0])
    if kw.get("bias"):
        extra["bias"] = torch.randn(1, 1, sq, sk, generator=torch.Generator().manual_seed(2)).half()
    if kw.get("alibi"):
        extra["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    args = dict(layout=layout, mask=mask, **extra)
    got = tealite.attention_fwd(q, k, v, backend="aiter", **args)
    want = tealite.attention_fwd(q, k, v, backend="torch", **args)
    assert calls == ["mha_fwd"]
    _within_one_fp16_rounding(got.out, want.out)
    torch.testing.assert_close(got.lse, want.lse, atol=1e-5, rtol=1e-6)
    dout = torch.randn(got.out.shape, generator=torch.Generator().manual_seed(3)).half()
    gb = tealite.attention_bwd(dout, q, k, v, want.out, want.lse, backend="aiter", **args)
    wb = tealite.attention_bwd(dout, q, k, v, want.out, want.lse, backend="torch", **args)
    for a, b in zip(gb, wb):
        _within_one_fp16_rounding(a, b)


def test_padded_thd_goes_to_group_mode(calls):
    cu_q = torch.tensor([0, 5, 5, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 9, 16], dtype=torch.int32)
    pad_q = torch.tensor([0, 6, 7, 11], dtype=torch.int32)   # gaps between sequences
    pad_k = torch.tensor([0, 7, 10, 18], dtype=torch.int32)
    q, k, v = _inputs("thd", 11, 18)
    args = dict(layout="thd", mask="padding_causal_bottom_right", cu_seqlens_q=cu_q,
                cu_seqlens_kv=cu_k, cu_seqlens_q_padded=pad_q, cu_seqlens_kv_padded=pad_k)
    got = tealite.attention_fwd(q, k, v, backend="aiter", **args)
    want = tealite.attention_fwd(q, k, v, backend="torch", **args)
    _within_one_fp16_rounding(got.out, want.out)
    assert torch.equal(got.lse.isinf(), want.lse.isinf())
    dout = torch.randn(got.out.shape, generator=torch.Generator().manual_seed(4)).half()
    gb = tealite.attention_bwd(dout, q, k, v, want.out, want.lse, backend="aiter", **args)
    wb = tealite.attention_bwd(dout, q, k, v, want.out, want.lse, backend="torch", **args)
    for a, b in zip(gb, wb):
        _within_one_fp16_rounding(a, b)
    assert calls == ["mha_varlen_fwd", "mha_varlen_bwd"]


@pytest.mark.parametrize("dtype, args, words", [
    (torch.bfloat16, {}, "truncation"),
    (torch.float32, {}, "fp16 / bf16"),
    (torch.float16, {"mask": "causal"}, "bottom-right"),                # s_q != s_kv
    (torch.float16, {"bias": torch.zeros(2, 1, 9, 12).half()}, "(s_q, s_kv) bias"),
])
def test_refusals_name_the_reason(calls, dtype, args, words):
    q, k, v = (t.to(dtype) for t in _inputs("bshd", 9, 12))
    with pytest.raises(tealite.UnsupportedCase, match=words.replace("(", r"\(").replace(")", r"\)")):
        tealite.attention_fwd(q, k, v, backend="aiter", **args)
    assert calls == []


def test_head_dims_off_the_8_grid_are_refused(calls):
    q, k, v = _inputs("bshd", 5, 5, d=12)
    with pytest.raises(tealite.UnsupportedCase, match="multiples of 8"):
        tealite.attention_fwd(q, k, v, backend="aiter")


def test_every_entry_point_declares_its_contract():
    from tealite.backends.aiter_common import contracts
    declared = {c.entry_point for c in contracts.contracts("aiter")}
    assert set(_FAKE_ENTRIES) <= declared <= set(A.ENTRY_POINTS) | declared
