"""tealite's Triton flash attention (forward and backward) on fixed hard cases: every layout x
mask, sliding windows, GQA / MQA, thd with padded offsets and zero-length / length-1
sequences, d_qk != d_v, head dims off the 16-grid, bias with -inf entries, ALiBi, rows that
see no key; and, under the interpreter, seeded kernel bugs that the oracle must catch.

Oracle (FlashAttention's, NUMERICS.md): for each output tensor, the kernel's max error against
float64 attention of the same (rounded) inputs must be at most twice the max error of the
same computation done in the input precision through plain torch (scores, softmax, products
in fp16 / bf16; fp32 for fp32 inputs).  Why this can fail and why a correct kernel passes:
the low-precision baseline's error measures how sensitive these inputs make each output to
roundings of the input dtype (its unit roundoff u times the magnitudes |P||V|, |dS||K|, ...
that the softmax and the products reach); a flash kernel rounds only P and dS to the input
dtype once and keeps scores, softmax and accumulators in fp32, so its error is at most about
that of the baseline, while a wrong mask, a dropped key block, a wrong LSE base or a P
rounded more coarsely than the input dtype gives errors of order |out| (mask bugs) or >> u.
One floor is added for dq / dk: the kernel forms dS = P * (dP - D) from dP = dout . v and
D = dout . out summed in fp32 in different orders, so where the true dS is 0 (a row with one
visible key: out = v, dP = D) the baseline can be exactly 0 while the kernel's dS is within
gamma_{d_v} |dout| |v| of it; summed over n keys (dq) or queries (dk) and scaled, that is at
most scale * n * gamma_{d_v} * max|dout| max|v| * max|k| (or max|q|) (``_ds_floor``); it is
also what lets fp32 inputs, whose baseline is the same precision, pass with a factor 2.
The contract's corner rules are checked exactly: rows that see no key have out 0, lse -inf
and dq 0; keys no query sees have dk = dv = 0; thd gap rows stay 0.

The harness judges the kernels against the float64 reference with the attention tier on
drawn cases (tests/test_differential.py -k attention); this file pins the corner cases.
On a GPU (no TRITON_INTERPRET) the same cases run compiled, plus realistic shapes with
TEALITE_ATTN_LARGE=1.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pytest
import torch

import tealite
from tealite import registry
from tealite.backends.triton import INTERPRET

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
interpreter_only = pytest.mark.skipif(not INTERPRET, reason="seeded bugs patch module globals, "
                                      "which only the interpreter reads at run time")
DEVICE = "cpu" if INTERPRET else "cuda"
F64 = torch.float64
NEG_INF = float("-inf")


@dataclass
class Case:
    layout: str = "bshd"
    mask: str = "none"
    window: tuple = (-1, -1)
    dtype: torch.dtype = torch.float16
    b: int = 1
    sq: int = 33
    sk: int = 29
    h: int = 2
    hk: int = 1
    d: int = 40
    dv: int = 24
    lens_q: tuple | None = None      # padded bshd/sbhd: seqlens; thd: sequence lengths
    lens_kv: tuple | None = None
    gap_q: int = 0                   # thd: rows of padding after each sequence
    gap_kv: int = 0
    bias: str | None = None          # "tensor" (with -inf entries) or "alibi"
    scale: float | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)


# ---- building a case ----------------------------------------------------------------------

def _cu(lens, gap=0):
    return torch.tensor([0] + [sum(x + gap for x in lens[:i + 1]) for i in range(len(lens))],
                        dtype=torch.int32)


def _make(c: Case):
    """(q, k, v, dout, kwargs of the op, spans) on DEVICE; spans lists per sequence
    (batch index or None, q row offset, lq, kv row offset, lk) in the bshd / thd view."""
    g = torch.Generator().manual_seed(c.seed)
    kw = dict(layout=c.layout, mask=c.mask, window=c.window, softmax_scale=c.scale)
    if c.layout == "thd":
        tq = sum(c.lens_q) + c.gap_q * len(c.lens_q)
        tk = sum(c.lens_kv) + c.gap_kv * len(c.lens_kv)
        shapes = ((tq, c.h, c.d), (tk, c.hk, c.d), (tk, c.hk, c.dv), (tq, c.h, c.dv))
        kw.update(cu_seqlens_q=_cu(c.lens_q), cu_seqlens_kv=_cu(c.lens_kv))
        if c.gap_q or c.gap_kv:
            kw.update(cu_seqlens_q_padded=_cu(c.lens_q, c.gap_q),
                      cu_seqlens_kv_padded=_cu(c.lens_kv, c.gap_kv))
        oq, ok = _cu(c.lens_q, c.gap_q).tolist(), _cu(c.lens_kv, c.gap_kv).tolist()
        spans = [(None, oq[i], c.lens_q[i], ok[i], c.lens_kv[i]) for i in range(len(c.lens_q))]
    else:
        shapes = ((c.b, c.sq, c.h, c.d), (c.b, c.sk, c.hk, c.d), (c.b, c.sk, c.hk, c.dv),
                  (c.b, c.sq, c.h, c.dv))
        lq = c.lens_q or (c.sq,) * c.b
        lk = c.lens_kv or (c.sk,) * c.b
        if c.lens_q is not None:
            kw.update(seqlens_q=torch.tensor(lq, dtype=torch.int32),
                      seqlens_kv=torch.tensor(lk, dtype=torch.int32))
        spans = [(i, 0, lq[i], 0, lk[i]) for i in range(c.b)]
    q, k, v, dout = (torch.randn(s, generator=g).to(c.dtype) for s in shapes)
    if c.bias == "tensor":
        bias = torch.randn(1, c.h, c.sq, c.sk, generator=g).to(c.dtype)
        bias[0, 0, 3, 1::2] = NEG_INF   # some keys hidden
        bias[0, 1, 2, :] = NEG_INF      # a row that sees no key
        kw["bias"] = bias
    elif c.bias == "alibi":
        kw["alibi_slopes"] = torch.rand(c.b, c.h, generator=g).float()
    if c.layout == "sbhd":  # the same data, stored sequence-major
        q, k, v, dout = (t.transpose(0, 1).contiguous() for t in (q, k, v, dout))
    kw = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    return (*(t.to(DEVICE) for t in (q, k, v, dout)), kw, spans)


def _bshd(t, layout):
    return t.transpose(0, 1) if layout == "sbhd" else t


# ---- dense attention of one sequence, in float64 or in the input precision --------------

def _visible(c: Case, lq, lk):
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    causal = "causal" in c.mask
    off = lk - lq if (c.mask.endswith("bottom_right") or not causal) else 0
    left, right = c.window
    right = 0 if causal else right
    vis = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def _dense(c, q, k, v, vis, bias, scale):
    """out (lq, h, dv), lse (h, lq) of one sequence in q's dtype (autograd-able).  Rows that
    see no key give out 0, lse -inf, and no NaN in any gradient."""
    grp = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(grp, 1), v.repeat_interleave(grp, 1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if bias is not None:
        s = s + bias.to(s.dtype)
    vis = vis[None] & (s > NEG_INF)
    row = vis.any(-1, keepdim=True)
    s = torch.where(row, torch.where(vis, s, torch.finfo(s.dtype).min), 0)
    p = torch.softmax(s, -1) * row
    if s.shape[-1]:
        lse = torch.where(row[..., 0], torch.logsumexp(s.float(), -1), NEG_INF)
    else:
        lse = torch.full(s.shape[:-1], NEG_INF)
    return torch.einsum("hij,jhd->ihd", p, v), lse


def _seq_bias(c, kw, b, lq, lk, h):
    if c.bias == "tensor":
        return kw["bias"].cpu()[0, :, :lq, :lk].expand(h, lq, lk)
    if c.bias == "alibi":
        slopes = kw["alibi_slopes"].cpu()[b]
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        return -slopes.double()[:, None, None] * (i + lk - lq - j).abs().double()[None]
    return None


def _attention_by_seq(c, q, k, v, dout, kw, spans, dtype):
    """out, lse, dq, dk, dv of the whole case computed sequence by sequence in ``dtype``
    (CPU; bshd view for bshd / sbhd), zeros outside every sequence."""
    q, k, v, dout = (_bshd(t, c.layout).cpu() for t in (q, k, v, dout))
    scale = c.scale or 1 / math.sqrt(c.d)
    res = {n: torch.zeros(t.shape, dtype=F64) for n, t in
           (("out", dout), ("dq", q), ("dk", k), ("dv", v))}
    lse_shape = (c.h, q.shape[0]) if c.layout == "thd" else (c.b, c.h, c.sq)
    res["lse"] = torch.full(lse_shape, NEG_INF, dtype=F64)
    seen_k = torch.zeros(k.shape[:-1], dtype=torch.bool)  # keys some query sees, per head
    for b, q0, lq, k0, lk in spans:
        sel_q = (slice(q0, q0 + lq),) if b is None else (b, slice(0, lq))
        sel_k = (slice(k0, k0 + lk),) if b is None else (b, slice(0, lk))
        qs, ks, vs = (t[s].to(dtype).requires_grad_() for t, s in
                      ((q, sel_q), (k, sel_k), (v, sel_k)))
        vis = _visible(c, lq, lk)
        bias = _seq_bias(c, kw, b if b is not None else 0, lq, lk, c.h)
        out, lse = _dense(c, qs, ks, vs, vis, bias, scale)
        by_head = vis[None] & (bias > NEG_INF) if bias is not None else vis[None].expand(c.h, -1, -1)
        seen_k[sel_k] = by_head.any(1).T.reshape(lk, c.hk, c.h // c.hk).any(-1)
        grads = torch.autograd.grad(out, (qs, ks, vs), dout[sel_q].to(dtype),
                                    allow_unused=True) if lq and lk else (None,) * 3
        res["out"][sel_q] = out.detach().double()
        for n, gr, sel in (("dq", grads[0], sel_q), ("dk", grads[1], sel_k),
                           ("dv", grads[2], sel_k)):
            if gr is not None:
                res[n][sel] = gr.double()
        if b is None:
            res["lse"][:, q0:q0 + lq] = lse.detach().double()
        else:
            res["lse"][b, :, :lq] = lse.detach().double()
    res["seen_k"] = seen_k
    return res


def _triton(c, q, k, v, dout, kw):
    out, lse = tealite.attention_fwd(q, k, v, backend="triton", **kw)
    dq, dk, dv = tealite.attention_bwd(dout, q, k, v, out, lse, backend="triton", **kw)
    return {"out": _bshd(out, c.layout), "lse": lse, "dq": _bshd(dq, c.layout),
            "dk": _bshd(dk, c.layout), "dv": _bshd(dv, c.layout)}


def _errors(c: Case) -> dict[str, tuple[float, float]]:
    """Per output: (kernel's max error, the input-precision baseline's) vs float64, after the
    exact corner rules (-inf LSE exactly where float64 has it, zeros where it is zero)."""
    q, k, v, dout, kw, spans = _make(c)
    got = {n: t.cpu().double() for n, t in _triton(c, q, k, v, dout, kw).items()}
    want = _attention_by_seq(c, q, k, v, dout, kw, spans, F64)
    low = _attention_by_seq(c, q, k, v, dout, kw, spans,
                            torch.float32 if c.dtype == torch.float32 else c.dtype)
    errs = {}
    for n in ("out", "lse", "dq", "dk", "dv"):
        g, w, lo = got[n], want[n], low[n]
        assert torch.equal(torch.isneginf(g), torch.isneginf(w)), f"{n}: -inf pattern"
        assert torch.isfinite(g[~torch.isneginf(g)]).all(), f"{n}: NaN / inf"
        # the contract's exact zeros: rows that see no key (and thd gaps), unseen keys
        if n != "lse":
            unseen = (~want["seen_k"] if n in ("dk", "dv")
                      else torch.isneginf(_rows_like(want["lse"], w, c.layout)))
            assert torch.all(g[unseen] == 0), f"{n}: not 0 where no key is seen"
        fin = torch.isfinite(w)
        errs[n] = ((g - w)[fin].abs().max().item() if fin.any() else 0.0,
                   (lo - w)[fin].abs().max().item() if fin.any() else 0.0)
    return errs


def _rows_like(lse, t, layout):
    """lse (b, h, s) or (h, t) broadcast to t's bshd / thd shape (..., h, d)."""
    rows = lse.transpose(-1, -2) if layout == "thd" else lse.permute(0, 2, 1)
    return rows[..., None].expand(t.shape) if t.dim() == rows.dim() + 1 else rows


def _ds_floor(c: Case, q, k, v, dout) -> dict[str, float]:
    """The fp32 floor of dq / dk (module doc): scale * n * gamma_{d_v} * max|dout| max|v| *
    max|k| (dq) or max|q| (dk), n the keys (dq) or the queries of a K/V head (dk) summed."""
    u32 = 2.0 ** -24
    gamma = c.dv * u32 / (1 - c.dv * u32)
    scale = c.scale or 1 / math.sqrt(c.d)
    dp = gamma * dout.abs().max().item() * v.abs().max().item() * scale
    return {"dq": dp * k.shape[-3 if c.layout == "thd" else 1] * k.abs().max().item(),
            "dk": dp * q.shape[-3 if c.layout == "thd" else 1] * (c.h // c.hk)
            * q.abs().max().item()}


def _assert_fa_oracle(c: Case):
    q, k, v, dout, _, _ = _make(c)
    floor = _ds_floor(c, _bshd(q, c.layout), _bshd(k, c.layout), v, dout)
    for n, (err, base) in _errors(c).items():
        limit = 2 * base + floor.get(n, 0.0)
        assert err <= limit, (f"{n}: error {err:.3g} > 2 x input-precision baseline "
                              f"{base:.3g} + fp32 floor {floor.get(n, 0.0):.3g}")


# ---- the cases ----------------------------------------------------------------------------

MASKS = ("none", "causal", "causal_bottom_right", "padding", "padding_causal",
         "padding_causal_bottom_right")
PAD = dict(b=2, lens_q=(33, 5), lens_kv=(26, 0))   # one short sequence, one without keys
SBHD_MASKS = ("none", "causal_bottom_right", "padding_causal")


def _layout_mask_cases():
    for layout, dtype in (("bshd", torch.float16), ("sbhd", torch.bfloat16)):
        for mask in MASKS if layout == "bshd" else SBHD_MASKS:
            extra = PAD if mask.startswith("padding") else {}
            yield pytest.param(Case(layout=layout, mask=mask, dtype=dtype, **extra),
                               id=f"{layout}-{mask}")
    thd = dict(layout="thd", lens_q=(5, 0, 17, 1), lens_kv=(9, 4, 0, 20))
    yield pytest.param(Case(mask="padding", **thd), id="thd-padding")
    yield pytest.param(Case(mask="padding_causal", gap_q=2, gap_kv=1, dtype=torch.bfloat16,
                            **thd), id="thd-padded-offsets-causal")
    yield pytest.param(Case(mask="padding_causal_bottom_right", gap_q=3, **thd),
                       id="thd-padded-offsets-causal-bottom-right")


OTHER = [
    pytest.param(Case(window=(5, 3)), id="window-both"),
    pytest.param(Case(window=(0, 0), sq=20, sk=20), id="window-diagonal-only"),
    pytest.param(Case(mask="causal", window=(4, 0), sq=40, sk=40), id="causal-window"),
    pytest.param(Case(mask="padding_causal_bottom_right", window=(3, -1), **PAD),
                 id="padded-bottom-right-window"),
    pytest.param(Case(mask="causal_bottom_right", sq=37, sk=11), id="br-rows-without-keys"),
    pytest.param(Case(mask="causal", dtype=torch.float32, h=4, hk=1, d=17, dv=17, sq=20),
                 id="mqa-fp32-d17"),
    pytest.param(Case(h=4, hk=2, sq=1, sk=1, dtype=torch.bfloat16), id="gqa-one-token"),
    pytest.param(Case(bias="tensor", dtype=torch.bfloat16), id="bias-with-neg-inf"),
    pytest.param(Case(mask="causal", bias="alibi", sq=20, sk=33), id="alibi"),
    pytest.param(Case(h=1, d=192, dv=128, sq=17, sk=20, scale=0.3), id="mla-192-128"),
]


@pytest.mark.parametrize("case", list(_layout_mask_cases()) + OTHER)
def test_matches_float64_within_the_input_precision_baseline(case):
    _assert_fa_oracle(case)


def test_strided_inputs_are_read_in_place():
    """sbhd given as a transposed bshd view (non-contiguous): same result as contiguous."""
    c = Case(layout="bshd", mask="causal", sq=20, sk=20, h=1)
    q, k, v, dout, kw, _ = _make(c)
    kw = dict(kw, layout="sbhd")
    views = [t.transpose(0, 1) for t in (q, k, v, dout)]
    dense = [t.contiguous() for t in views]
    a = _triton(Case(layout="sbhd"), *views, kw)
    b = _triton(Case(layout="sbhd"), *dense, kw)
    for n in a:
        assert torch.equal(a[n], b[n]), n


def test_empty_inputs():
    q = torch.zeros(2, 0, 2, 16, dtype=torch.float16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, dtype=torch.float16, device=DEVICE)
    out, lse = tealite.attention_fwd(q, k, k, backend="triton")
    assert out.shape == (2, 0, 2, 16) and lse.shape == (2, 2, 0)
    out, lse = tealite.attention_fwd(k, k[:, :0], k[:, :0], backend="triton")
    assert torch.all(out == 0) and torch.isneginf(lse).all()


def test_refuses_head_dims_above_256():
    q = torch.zeros(1, 4, 1, 288, dtype=torch.float16, device=DEVICE)
    with pytest.raises(tealite.errors.UnsupportedCase, match="head dims up to 256"):
        tealite.attention_fwd(q, q, q, backend="triton")


# ---- seeded bugs: the oracle catches them (interpreter) ----------------------------------

from tealite.backends.triton import _attention_bwd as BWD  # noqa: E402
from tealite.backends.triton import _attention_fwd as FWD  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# The real helpers, bound before any test patches the modules (a seeded helper calls these).
_VISIBLE = FWD.visible
_KEY_RANGE = FWD.key_range
_FULL_KEYS = FWD.full_key_range
_FULL_QUERIES = FWD.full_query_range


@triton.jit
def _visible_no_left(rows, cols, len_q, len_kv, off, left, right,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    return _VISIBLE(rows, cols, len_q, len_kv, off, left, right, False, HAS_RIGHT)


@triton.jit
def _key_range_one_short(m0, len_q, len_kv, off, left, right, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    lo, hi = _KEY_RANGE(m0, len_q, len_kv, off, left, right, BLOCK_M, BLOCK_N,
                           HAS_LEFT, HAS_RIGHT)
    return lo, hi - BLOCK_N   # the last key block is never visited


@triton.jit
def _full_keys_one_block_wider(start, end, m0, len_kv, off, left, right, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
                               HAS_RIGHT: tl.constexpr):
    lo, hi = _FULL_KEYS(start, end, m0, len_kv, off, left, right, BLOCK_M, BLOCK_N,
                        HAS_LEFT, HAS_RIGHT)
    return lo, tl.minimum(hi + BLOCK_N, end)   # the diagonal / last block read unmasked


@triton.jit
def _full_queries_ignore_len_q(start, end, n0, len_q, len_kv, off, left, right,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    lo, hi = _FULL_QUERIES(start, end, n0, len_q + BLOCK_M, len_kv, off, left, right,
                           BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    return lo, hi   # a block holding padding rows runs unmasked


@triton.jit
def _p_rounded_to_4_bits(x, like, BITS: tl.constexpr):
    bits = x.to(tl.int32, bitcast=True)   # P / dS keep 4 significand bits, not the dtype's
    bits = ((bits + 0x40000) >> 19) << 19
    return bits.to(tl.float32, bitcast=True).to(like.dtype)


@triton.jit
def _lse2_natural(lse_ptr, lse_offs, row_in):
    lse = tl.load(lse_ptr + lse_offs, mask=row_in, other=0.0)   # log2(e) factor forgotten
    return tl.where(lse == float("-inf"), 0.0, lse)


SEEDED = [
    pytest.param([(FWD, "visible", _visible_no_left), (BWD, "visible", _visible_no_left)],
                 Case(window=(5, 3)), id="window-left-dropped"),
    pytest.param([(FWD, "key_range", _key_range_one_short)], Case(mask="causal"),
                 id="last-key-block-skipped"),
    # The unmasked interior (full_key_range / full_query_range): one block too many is caught.
    # Interpreter tiles are 16 x 16, so these sequences have interior and edge blocks.
    pytest.param([(FWD, "full_key_range", _full_keys_one_block_wider)],
                 Case(mask="causal", sq=70, sk=70, d=32, dv=32), id="fwd-diagonal-unmasked"),
    pytest.param([(BWD, "full_key_range", _full_keys_one_block_wider)],
                 Case(mask="causal", sq=70, sk=70, d=32, dv=32), id="dq-diagonal-unmasked"),
    pytest.param([(BWD, "full_query_range", _full_queries_ignore_len_q)],
                 Case(mask="padding", b=2, sq=64, sk=64, d=32, dv=32, lens_q=(40, 64),
                      lens_kv=(64, 64)), id="dkdv-padding-rows-unmasked"),
    pytest.param([(FWD, "to_input", _p_rounded_to_4_bits)], Case(), id="P-too-coarse"),
    pytest.param([(BWD, "to_input", _p_rounded_to_4_bits)], Case(), id="dS-too-coarse"),
    pytest.param([(BWD, "_lse2", _lse2_natural)], Case(mask="causal"), id="bwd-lse-base"),
]


@interpreter_only
@pytest.mark.parametrize("patches,case", SEEDED)
def test_seeded_kernel_bugs_are_caught(monkeypatch, patches, case):
    for module, name, fn in patches:
        monkeypatch.setattr(module, name, fn)
    with pytest.raises(AssertionError):
        _assert_fa_oracle(case)


# ---- realistic shapes, compiled (GPU only, opt-in) ----------------------------------------

LARGE = [
    Case(b=2, sq=1024, sk=1024, h=8, hk=8, d=64, dv=64, dtype=torch.bfloat16),
    Case(b=2, sq=777, sk=1024, h=8, hk=2, d=128, dv=128, mask="causal_bottom_right",
         dtype=torch.bfloat16),
    Case(b=1, sq=512, sk=512, h=4, hk=4, d=256, dv=256, mask="causal"),
    Case(b=1, sq=600, sk=600, h=4, hk=1, d=192, dv=128, window=(128, 16),
         dtype=torch.bfloat16),
    Case(layout="sbhd", b=2, sq=640, sk=640, h=8, hk=4, d=96, dv=96, mask="padding_causal",
         lens_q=(640, 300), lens_kv=(640, 511)),
    Case(layout="thd", h=8, hk=4, d=128, dv=128, mask="padding_causal", dtype=torch.bfloat16,
         lens_q=(700, 0, 1, 333), lens_kv=(700, 5, 0, 512), gap_q=7, gap_kv=3),
]


@pytest.mark.skipif(INTERPRET or os.environ.get("TEALITE_ATTN_LARGE") != "1",
                    reason="compiled kernels on realistic shapes: GPU with TEALITE_ATTN_LARGE=1")
@pytest.mark.parametrize("case", LARGE)
def test_large_compiled(case):
    _assert_fa_oracle(case)
