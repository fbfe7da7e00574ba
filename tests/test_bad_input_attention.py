"""Bad input to tealite.attention_fwd / attention_bwd gets a clear error naming the argument
and the constraint it broke, raised by the front-end before any backend is chosen: nothing is
computed (no dispatch is recorded)."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import registry

from _helpers_bad_input import BF16, esc, raises, t

I32 = torch.int32
B, SQ, SK, HQ, HK, D = 2, 5, 7, 4, 2, 8


def qkv(layout="bshd", hq=HQ, hk=HK, d=D, dv=D, dtype=torch.float32):
    if layout == "thd":
        return t(9, hq, d, dtype=dtype), t(11, hk, d, dtype=dtype), t(11, hk, dv, dtype=dtype)
    if layout == "sbhd":
        return (t(SQ, B, hq, d, dtype=dtype), t(SK, B, hk, d, dtype=dtype),
                t(SK, B, hk, dv, dtype=dtype))
    return (t(B, SQ, hq, d, dtype=dtype), t(B, SK, hk, d, dtype=dtype),
            t(B, SK, hk, dv, dtype=dtype))


def ints(*values):
    return torch.tensor(values, dtype=I32)


THD = dict(layout="thd", mask="padding", cu_seqlens_q=ints(0, 4, 9),
           cu_seqlens_kv=ints(0, 5, 11))


def fwd(q=None, k=None, v=None, **kw):
    layout = kw.get("layout", "bshd")
    dq, dk, dv = qkv(layout)
    with registry.trace() as records:
        try:
            return tealite.attention_fwd(dq if q is None else q, dk if k is None else k,
                                         dv if v is None else v, backend="torch", **kw)
        finally:
            fwd.records = list(records)


def bwd(dout=None, out=None, lse=None, **kw):
    q, k, v = qkv(kw.get("layout", "bshd"))
    o, l_ = tealite.attention_fwd(q, k, v, backend="torch", **kw)
    with registry.trace() as records:
        try:
            return tealite.attention_bwd(o if dout is None else dout, q, k, v,
                                         o if out is None else out, l_ if lse is None else lse,
                                         backend="torch", **kw)
        finally:
            bwd.records = list(records)


def test_valid_baselines_dispatch():
    fwd()
    assert [r.op for r in fwd.records] == ["attention_fwd"]
    fwd(**THD)
    bwd()
    bwd(**THD)
    assert [r.op for r in bwd.records] == ["attention_bwd"]


@pytest.mark.parametrize("kw,message", [
    # head counts, head dims, dtypes, batch and sequence agreement
    (dict(k=t(B, SK, 3, D), v=t(B, SK, 3, D)),
     esc("q's head count (4) must be a positive multiple of k/v's (3) (MHA, GQA, MQA)")),
    (dict(v=t(B, SK, 1, D)), "k and v must have one head count, got 2 and 1"),
    (dict(k=t(B, SK, HK, 6)), esc("k's head dim (6) must equal q's (8)")),
    (dict(q=t(B, SQ, HQ, 0), k=t(B, SK, HK, 0)), "head dims must be > 0, got d_qk=0"),
    (dict(v=t(B, SK, HK, 0)), "head dims must be > 0, got d_qk=8, d_v=0"),
    (dict(k=t(B, SK, HK, D, dtype=BF16)), "q, k and v must share one dtype"),
    (dict(k=t(3, SK, HK, D), v=t(3, SK, HK, D)), "q, k and v must have one batch size"),
    (dict(v=t(B, SK + 1, HK, D)), "k and v must have one sequence length"),
    (dict(q=t(B, SQ, HQ)), esc("q must be 4-D, got shape (2, 5, 4)")),
    # layout, mask, window, scale
    (dict(layout="bhsd"), "layout"), (dict(mask="causal_top_left"), "mask"),
    (dict(window=(-2, 0)), "window sizes must be >= -1"),
    (dict(window=(3, -5)), "window sizes must be >= -1"),
    (dict(window=(1, 2, 3)), "window must be a pair of ints"),
    (dict(mask="causal", window=(2, 1)),
     esc("a causal mask ('causal') needs window right in (-1, 0), got 1")),
    (dict(softmax_scale=0.0), "softmax_scale"), (dict(softmax_scale=float("nan")), "softmax_scale"),
    # bias and ALiBi
    (dict(bias=t(1, HQ, SQ, SK + 1)), esc("bias must have shape (1|2, 1|4, 5, 7)")),
    (dict(bias=t(B, 3, SQ, SK)), esc("bias must have shape (1|2, 1|4, 5, 7)")),
    (dict(bias=t(HQ, SQ, SK)), esc("bias must be 4-D, got shape (4, 5, 7)")),
    (dict(bias=t(1, 1, SQ, SK), alibi_slopes=t(HQ)), "give bias or alibi_slopes, not both"),
    (dict(alibi_slopes=t(HQ + 1)), esc("alibi_slopes must have shape (4,) or (2, 4)")),
    (dict(alibi_slopes=t(HQ, dtype=BF16)), "alibi_slopes dtype"),
    # padding masks with bshd / sbhd
    (dict(mask="padding"), "padding masks with layout bshd/sbhd need seqlens_q and seqlens_kv"),
    (dict(mask="padding", seqlens_q=ints(5, 6), seqlens_kv=ints(7, 7)),
     esc("seqlens_q entries must lie in [0, 5]")),
    (dict(mask="padding", seqlens_q=ints(5, -1), seqlens_kv=ints(7, 7)),
     esc("seqlens_q entries must lie in [0, 5]")),
    (dict(mask="padding", seqlens_q=ints(5), seqlens_kv=ints(7, 7)), "seqlens_q must have shape"),
    (dict(mask="padding", seqlens_q=torch.tensor([5, 5]), seqlens_kv=ints(7, 7)),
     "seqlens_q dtype"),
    (dict(seqlens_q=ints(5, 5), seqlens_kv=ints(7, 7)), "seqlens_\\* need a padding mask"),
    (dict(cu_seqlens_q=ints(0, 5), cu_seqlens_kv=ints(0, 7)), "cu_seqlens_\\* are for layout 'thd'"),
])
def test_forward_front_end_errors(kw, message):
    with raises(message):
        fwd(**kw)
    assert fwd.records == []


@pytest.mark.parametrize("kw,message", [
    (dict(cu_seqlens_q=ints(0, 5, 4)), "cu_seqlens_q must be non-decreasing"),
    (dict(cu_seqlens_q=ints(1, 4, 9)), "cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_q=ints(0, 4, 8)), "cu_seqlens_q must end at the token count 9, got 8"),
    (dict(cu_seqlens_kv=ints(0, 5, 12)), "cu_seqlens_kv must end at the token count 11"),
    (dict(cu_seqlens_kv=ints(0, 11)), "cu_seqlens_kv must have shape"),
    (dict(cu_seqlens_q=ints(0)), "cu_seqlens_q must have at least 2 entries"),
    (dict(cu_seqlens_q=None), "layout 'thd' needs cu_seqlens_q and cu_seqlens_kv"),
    (dict(mask="causal"), "layout 'thd' needs a padding mask"),
    (dict(cu_seqlens_q_padded=ints(0, 3, 9)),
     esc("sequence 0 has 4 tokens (cu_seqlens_q) but its slot in cu_seqlens_q_padded holds 3")),
    (dict(cu_seqlens_q_padded=ints(0, 4, 10)), "cu_seqlens_q_padded must end at most at the "
                                               "token count 9"),
    (dict(seqlens_q=ints(4, 5), seqlens_kv=ints(5, 6)), "layout 'thd' takes cu_seqlens_\\*"),
    (dict(bias=t(1, 1, 9, 11)), "bias is not supported with layout 'thd'"),
])
def test_thd_front_end_errors(kw, message):
    with raises(message):
        fwd(**{**THD, **kw})
    assert fwd.records == []


@pytest.mark.parametrize("kw,message", [
    (dict(lse=t(B, HQ, SQ + 1)), esc("lse must have shape (2, 4, 5)")),
    (dict(lse=t(B, HQ, SQ, dtype=BF16)), "lse dtype"),
    (dict(out=t(B, SQ, HQ, D + 1)), "out must have shape"),
    (dict(dout=t(B, SQ, HQ, D, dtype=BF16)), "dout dtype"),
    (dict(dout=t(B, SQ, HQ)), "dout must have shape"),
])
def test_backward_front_end_errors(kw, message):
    with raises(message):
        bwd(**kw)
    assert bwd.records == []


def test_bias_dtype_is_checked_forward_and_backward():
    """A bias in neither q's dtype nor float32 is refused by both front-ends (the backward
    did not check it before issue 15's part 2)."""
    bias = t(1, 1, SQ, SK, dtype=torch.float16)
    with raises("bias dtype must be one of"):
        fwd(bias=bias)
    assert fwd.records == []
    q, k, v = qkv()
    out, lse = tealite.attention_fwd(q, k, v, backend="torch")
    with registry.trace() as records, raises("bias dtype must be one of"):
        tealite.attention_bwd(out, q, k, v, out, lse, bias=bias, backend="torch")
    assert list(records) == []


def test_backward_thd_lse_shape():
    with raises(esc("lse must have shape (4, 9)")):
        bwd(lse=t(B, HQ, 9), **THD)
    assert bwd.records == []
