"""The ``sdpa`` backend (torch SDPA's CUDA kernels with the LSE) on a CPU.

Nothing here runs a CUDA kernel: the CPU part is that the backend is unavailable with the
reason, which kernel each case goes to or why none can take it, and the argument plumbing,
with the aten ops replaced by fakes carrying the real ops' schemas (``ATEN.override``) that
compute attention in float64 with FlashAttention-2's / the memory-efficient kernel's own
conventions (bottom-right causal; (b, h, s) LSE, padded to 32 rows by the efficient kernel).
The kernels' numerics need the integrator's GPU run.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tealite import registry
from tealite.backends import sdpa
from tealite.backends.sdpa import attention as sa
from tealite.errors import UnsupportedCase
from tealite.ops.attention import make_config

_NO_EXTRAS = dict(window=(-1, -1), softmax_scale=None, bias=None, alibi_slopes=None,
                  seqlens_q=None, seqlens_kv=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                  cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None)


def _config(q, k, v, **kw):
    args = {**_NO_EXTRAS, "layout": "bshd", "mask": "none", **kw}
    return make_config(q, k, v, **args)


def _math(q, k, v, scale, causal_offset, bias=None):
    """float64 attention of bshd q/k/v (GQA repeated); causal_offset None: no mask."""
    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    k64 = k.double().repeat_interleave(g, 2)
    v64 = v.double().repeat_interleave(g, 2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k64) * scale
    if bias is not None:
        s = s + bias.double()
    if causal_offset is not None:
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + causal_offset, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", p, v64), lse


class FakeOp:
    """A stand-in aten op: the real op's schema, ``fn`` for the result, the calls recorded."""

    def __init__(self, real, fn, drop: tuple[str, ...] = ()):
        args = [a for a in real._schema.arguments if a.name not in drop]
        self._schema = SimpleNamespace(name=real._schema.name, arguments=args)
        self.fn, self.calls = fn, []

    def __call__(self, **kw):
        self.calls.append(kw)
        return self.fn(**kw)


def _flash_fwd(query, key, value, is_causal, scale, **kw):
    sq, sk = query.shape[1], key.shape[1]
    out, lse = _math(query, key, value, scale, sk - sq if is_causal else None)
    return out.to(query.dtype), lse.float(), None, None, None


def _efficient_fwd(query, key, value, bias, custom_mask_type, scale, **kw):
    sq, sk = query.shape[1], key.shape[1]
    offset = {0: None, 1: 0, 2: sk - sq}[custom_mask_type]
    out, lse = _math(query, key, value, scale, offset, bias)
    padded = torch.zeros(*lse.shape[:-1], -(-sq // 32) * 32)
    padded[..., :sq] = lse
    return out.to(query.dtype), padded, None, None, sq, sk


def _fakes(drop=()):
    aten = torch.ops.aten
    return dict(
        flash_fwd=FakeOp(aten._flash_attention_forward.default, _flash_fwd, drop),
        flash_bwd=FakeOp(aten._flash_attention_backward.default,
                         lambda query, key, value, **kw: (query * 1, key * 1, value * 1), drop),
        efficient_fwd=FakeOp(aten._efficient_attention_forward.default, _efficient_fwd, drop),
        efficient_bwd=FakeOp(aten._efficient_attention_backward.default,
                             lambda query, key, value, **kw: (query * 1, key * 1, value * 1,
                                                              None), drop))


def test_unavailable_on_the_cpu_with_the_reason():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    why = registry.get_backend("sdpa").unavailable_reason()
    assert why is not None and "CUDA only" in why
    with sdpa.PLATFORM.override(cuda=True):
        assert registry.get_backend("sdpa").unavailable_reason() is None


def _params(**kw):
    p = dict(dtype=torch.float16, layout="bshd", mask="none", window=(-1, -1), bias=False,
             alibi=False, heads_q=4, heads_kv=4, head_dim_qk=64, head_dim_v=64,
             thd_padded=False, seqlen_q=16, seqlen_kv=16)
    p.update(kw)
    return p


@pytest.mark.parametrize("params, kernel", [
    (_params(), "flash"),
    (_params(dtype=torch.float32), "efficient"),
    (_params(bias=True), "efficient"),
    (_params(heads_kv=1, window=(3, 2)), "flash"),
    (_params(mask="causal", seqlen_q=8), "efficient"),       # top-left, s_q != s_kv
    (_params(mask="causal_bottom_right", seqlen_q=8), "flash"),
    (_params(head_dim_qk=192, head_dim_v=128), "efficient"),  # MLA: flash needs one head dim
    (_params(layout="thd", mask="padding"), "flash"),
])
def test_each_case_goes_to_the_first_kernel_that_can_run_it(params, kernel):
    assert sa.choose_kernel(params)[0] == kernel


@pytest.mark.parametrize("params, words", [
    (_params(dtype=torch.float32, heads_kv=2), ["fp16 / bf16", "equal head counts"]),
    (_params(dtype=torch.float32, alibi=True), ["fp16 / bf16", "ALiBi"]),
    (_params(mask="padding"), ["per-sequence lengths"]),
    (_params(layout="thd", mask="padding", thd_padded=True), ["gaps"]),
    (_params(layout="thd", mask="padding_causal", heads_kv=2), ["bottom-right", "thd"]),
    (_params(seqlen_kv=0), ["empty sequence"]),
])
def test_refusals_name_the_reason_of_every_kernel(params, words):
    kernel, why = sa.choose_kernel(params)
    assert kernel is None and all(w in why for w in words), why


def test_options_force_one_kernel():
    with sdpa.OPTIONS.override(kernels=("efficient",)):
        assert sa.choose_kernel(_params())[0] == "efficient"
        assert "equal head counts" in sa.choose_kernel(_params(heads_kv=1))[1]


def test_flash_plumbing_sbhd_padding_window_and_lse():
    torch.manual_seed(0)
    q, k, v = torch.randn(9, 2, 4, 12), torch.randn(11, 2, 2, 12), torch.randn(11, 2, 2, 12)
    q, k, v = (t.half() for t in (q, k, v))
    config, _ = _config(q, k, v, layout="sbhd", mask="causal_bottom_right", window=(4, -1))
    fakes = _fakes()
    with sa.ATEN.override(**fakes):
        out, lse = sa.attention_fwd(q, k, v, config)
        grads = sa.attention_bwd(out, q, k, v, out, lse, config)
    call = fakes["flash_fwd"].calls[0]
    assert call["query"].shape == (2, 9, 4, 16)            # bshd view, head dim padded to 8
    assert call["is_causal"] and call["window_size_left"] == 4
    assert call["window_size_right"] is None               # causal: right = 0 via is_causal
    assert call["scale"] == pytest.approx(1 / math.sqrt(12))
    want, want_lse = _math(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                           1 / math.sqrt(12), 2)
    assert out.shape == (9, 2, 4, 12) and out.is_contiguous()
    torch.testing.assert_close(out.transpose(0, 1).double(), want, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)
    bwd = fakes["flash_bwd"].calls[0]
    assert bwd["logsumexp"] is not None and bwd["dropout_p"] == 0.0
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    torch.testing.assert_close(grads[0], q)                # the fake echoes the padded q


def test_efficient_plumbing_mask_type_bias_alignment_and_lse_tail():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 7, 2, 8), torch.randn(1, 7, 2, 8)
    bias = torch.randn(1, 1, 5, 7)
    config, _ = _config(q, k, v, mask="causal", bias=bias)
    fakes = _fakes()
    with sa.ATEN.override(**fakes):
        out, lse = sa.attention_fwd(q, k, v, config)
        sa.attention_bwd(out, q, k, v, out, lse, config)
    call = fakes["efficient_fwd"].calls[0]
    assert call["custom_mask_type"] == 1                    # top-left
    assert call["bias"].shape == (1, 2, 5, 7) and call["bias"].stride(-2) % 16 == 0
    assert lse.shape == (1, 2, 5)
    want, want_lse = _math(q, k, v, 1 / math.sqrt(8), 0, bias)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)
    assert fakes["efficient_bwd"].calls[0]["logsumexp"].shape == (1, 2, 32)


def test_an_argument_this_torch_lacks_is_refused_not_dropped():
    q = k = v = torch.randn(1, 4, 1, 8).half()
    config, _ = _config(q, k, v, window=(2, 2))
    with sa.ATEN.override(**_fakes(drop=("window_size_left", "window_size_right"))):
        with pytest.raises(UnsupportedCase, match="adapter: .*window_size_left"):
            sa.attention_fwd(q, k, v, config)
        config, _ = _config(q, k, v)                        # unwindowed: runs without them
        assert sa.attention_fwd(q, k, v, config)[0].shape == q.shape


def test_a_bias_in_another_dtype_is_refused_at_the_call():
    q = k = v = torch.randn(1, 4, 1, 8).half()
    config, _ = _config(q, k, v, bias=torch.zeros(1, 1, 4, 4))
    with sa.ATEN.override(**_fakes()), pytest.raises(UnsupportedCase, match="q's dtype"):
        sa.attention_fwd(q, k, v, config)


def _with_empty_rows(fn, value):
    """A fake forward writing ``value`` as the lse of rows that see no key (the efficient
    kernel's 0 and FlashAttention-2's +inf, seen / documented on an H100)."""
    def fwd(**kw):
        out, lse, *rest = fn(**kw)
        return (out, torch.where(torch.isneginf(lse), value, lse), *rest)
    return fwd


def test_rows_that_see_no_key_get_the_contracts_lse_both_ways():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    bias = torch.randn(1, 2, 4, 4)
    bias[0, 1, 2] = -math.inf                               # head 1, row 2: no key
    config, _ = _config(q, k, v, bias=bias)
    fakes = _fakes()
    fakes["efficient_fwd"].fn = _with_empty_rows(_efficient_fwd, 0.0)
    with sa.ATEN.override(**fakes):
        out, lse = sa.attention_fwd(q, k, v, config)
        sa.attention_bwd(out, q, k, v, out, lse, config)
    assert torch.isneginf(lse[0, 1, 2]) and torch.isfinite(lse[0, 0]).all()
    assert torch.isposinf(fakes["efficient_bwd"].calls[0]["logsumexp"][0, 1, 2])

    qh = torch.randn(1, 4, 2, 8).half()                     # s_q 4 > s_kv 2: rows 0, 1 empty
    kh, vh = torch.randn(1, 2, 2, 8).half(), torch.randn(1, 2, 2, 8).half()
    config, _ = _config(qh, kh, vh, mask="causal_bottom_right")
    fakes = _fakes()
    fakes["flash_fwd"].fn = _with_empty_rows(_flash_fwd, math.inf)
    with sa.ATEN.override(**fakes):
        out, lse = sa.attention_fwd(qh, kh, vh, config)
        sa.attention_bwd(out, qh, kh, vh, out, lse, config)
    assert torch.isneginf(lse[..., :2]).all() and torch.isfinite(lse[..., 2:]).all()
    assert torch.isposinf(fakes["flash_bwd"].calls[0]["logsumexp"][..., :2]).all()


def test_alibi_is_not_sent_to_torchs_flash_build():
    kernel, why = sa.choose_kernel(_params(alibi=True))
    assert kernel is None and "does not support alibi" in why


def test_gqa_backward_declares_per_head_partials():
    numerics = sa._numerics(True)
    assert numerics(_params(heads_kv=1))["partial_sums_rounded_to"] == torch.float16
    assert "partial_sums_rounded_to" not in numerics(_params())
