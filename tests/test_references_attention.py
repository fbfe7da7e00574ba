"""The float64 attention reference against hand-computed cases and a brute-force loop over
every (sequence, head, query row, key) written straight from the contract's sentences, for
every mask, window, layout (thd with gaps and empty sequences), GQA, ALiBi and -inf bias;
its empty-row rule; the chunking; and numpy vs torch float64 (the GPU path's namespace)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tealite_verify.references import attention as ref

RNG = np.random.default_rng(7)


def test_two_keys_by_hand():
    q = np.array([[[[1.0, 0.0]]]])                    # (b, s, h, d) = (1, 1, 1, 2)
    k = np.array([[[[1.0, 0.0]]], [[[0.0, 1.0]]]]).reshape(1, 2, 1, 2)
    v = np.array([[[[2.0]]], [[[4.0]]]]).reshape(1, 2, 1, 1)
    out, lse = ref.attention_fwd(q, k, v, ref.Structure("bshd", "none", 2.0))
    # scores 2 and 0: P = (e^2, 1) / (e^2 + 1)
    p0 = math.exp(2) / (math.exp(2) + 1)
    assert out[0, 0, 0, 0] == pytest.approx(2 * p0 + 4 * (1 - p0), rel=1e-15)
    assert lse[0, 0, 0] == pytest.approx(math.log(math.exp(2) + 1), rel=1e-15)
    dq, dk, dv = ref.attention_bwd(np.ones_like(out), q, k, v,
                                   ref.Structure("bshd", "none", 2.0))
    # dv_j = P_j; dS_j = P_j (v_j - out); dq = 2 sum_j dS_j k_j
    o = out[0, 0, 0, 0]
    assert dv[0, :, 0, 0] == pytest.approx([p0, 1 - p0], rel=1e-14)
    assert dq[0, 0, 0] == pytest.approx([2 * p0 * (2 - o), 2 * (1 - p0) * (4 - o)], rel=1e-13)
    # dk_j = 2 dS_j q: q = (1, 0), so the second component is 0.
    assert dk[0, :, 0, 0] == pytest.approx([2 * p0 * (2 - o), 2 * (1 - p0) * (4 - o)], rel=1e-13)
    assert np.all(dk[0, :, 0, 1] == 0)


def _visible(mask, window, i, j, lq, lk):
    """The contract's visibility rule, sentence by sentence."""
    if not (i < lq and j < lk):
        return False
    off = lk - lq if (mask.endswith("bottom_right") or "causal" not in mask) else 0
    left, right = window
    if "causal" in mask:
        right = 0
        if j > i + off:
            return False
    if left >= 0 and j < i + off - left:
        return False
    if right >= 0 and j > i + off + right:
        return False
    return True


def _brute(q, k, v, dout, st, spans, bias=None, alibi=None):
    """out, lse, dq, dk, dv by loops over (sequence, head, row, key), all in float64."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.full(ref.lse_shape(q.shape, st.layout), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    hq, hk = q.shape[-2], k.shape[-2]
    view = (lambda t: t.swapaxes(0, 1)) if st.layout == "sbhd" else (lambda t: t)
    qv, kv, vv, ov, dov = map(view, (q, k, v, out, dout))
    dqv, dkv, dvv = map(view, (dq, dk, dv))

    def at(arr, sp, row, key):
        return arr[sp.q0 + row if sp.batch is None else (sp.batch, row)] if not key else \
            arr[sp.k0 + row if sp.batch is None else (sp.batch, row)]

    for sp in spans:
        for h in range(hq):
            g = h // (hq // hk)
            for i in range(sp.lq):
                s = {}
                for j in range(sp.lk):
                    if not _visible(st.mask, st.window, i, j, sp.lq, sp.lk):
                        continue
                    b = 0.0
                    if bias is not None:
                        b = bias[sp.seq if bias.shape[0] > 1 else 0,
                                 h if bias.shape[1] > 1 else 0, i, j]
                    if alibi is not None:
                        slope = alibi[sp.seq, h] if alibi.ndim == 2 else alibi[h]
                        b = -slope * abs(i + sp.lk - sp.lq - j)
                    if b == -np.inf:
                        continue
                    s[j] = st.scale * float(at(qv, sp, i, False)[h] @ at(kv, sp, j, True)[g]) + b
                if not s:
                    continue
                top = max(s.values())
                total = sum(math.exp(x - top) for x in s.values())
                lse_i = top + math.log(total)
                p = {j: math.exp(x - lse_i) for j, x in s.items()}
                o = sum(p[j] * at(vv, sp, j, True)[g] for j in p)
                at(ov, sp, i, False)[h] = o
                lse[(h, sp.q0 + i) if sp.batch is None else (sp.batch, h, i)] = lse_i
                do = at(dov, sp, i, False)[h]
                d = float(do @ o)
                for j, pj in p.items():
                    ds = pj * (float(do @ at(vv, sp, j, True)[g]) - d)
                    at(dqv, sp, i, False)[h] += st.scale * ds * at(kv, sp, j, True)[g]
                    at(dkv, sp, j, True)[g] += st.scale * ds * at(qv, sp, i, False)[h]
                    at(dvv, sp, j, True)[g] += pj * do
    return out, lse, dq, dk, dv


def _case(layout, mask, window=(-1, -1), *, hq=4, hk=2, bias=False, alibi=False):
    dqk, dv = 5, 3
    if layout == "thd":
        lens_q, lens_k, pad_q, pad_k = (3, 0, 1, 4), (2, 3, 0, 5), (1, 0, 2, 0), (0, 2, 0, 1)
        offs_q = tuple(np.cumsum((0,) + tuple(a + b for a, b in zip(lens_q, pad_q)))[:-1])
        offs_k = tuple(np.cumsum((0,) + tuple(a + b for a, b in zip(lens_k, pad_k)))[:-1])
        tq, tk = sum(lens_q) + sum(pad_q), sum(lens_k) + sum(pad_k)
        q, k, v = (RNG.standard_normal(s) for s in ((tq, hq, dqk), (tk, hk, dqk), (tk, hk, dv)))
        st = ref.Structure("thd", mask, 0.7, window, lens_q, lens_k, tuple(map(int, offs_q)),
                           tuple(map(int, offs_k)))
    else:
        b, sq, sk = 2, 5, 7
        shape = (lambda s, h, d: (b, s, h, d)) if layout == "bshd" else \
            (lambda s, h, d: (s, b, h, d))
        q, k, v = (RNG.standard_normal(shape(*a)) for a in ((sq, hq, dqk), (sk, hk, dqk),
                                                             (sk, hk, dv)))
        lens = ((5, 2), (0, 7)) if mask.startswith("padding") else (None, None)
        st = ref.Structure(layout, mask, 0.7, window, *lens)
    bias_t = None
    if bias:
        bias_t = RNG.standard_normal((1, hq, 5, 7))
        bias_t[0, 1, 2, :] = -np.inf
        bias_t[0, 0, :, 3] = -np.inf
    slopes = RNG.uniform(0.1, 1.0, (2, hq) if layout != "thd" else (4, hq)) if alibi else None
    return q, k, v, st, bias_t, slopes


@pytest.mark.parametrize("layout,mask,window,extra", [
    ("bshd", "none", (-1, -1), {}), ("bshd", "causal", (-1, -1), {}),
    ("sbhd", "causal_bottom_right", (2, -1), {}), ("bshd", "none", (1, 2), {"hk": 1}),
    ("bshd", "none", (0, 0), {"hk": 4}), ("sbhd", "none", (-1, -1), {"bias": True}),
    ("bshd", "causal", (-1, -1), {"alibi": True}),
    ("bshd", "padding", (1, 1), {}), ("sbhd", "padding_causal", (-1, -1), {"alibi": True}),
    ("bshd", "padding_causal_bottom_right", (2, 0), {}),
    ("thd", "padding", (-1, -1), {}), ("thd", "padding_causal", (1, 0), {"alibi": True}),
    ("thd", "padding_causal_bottom_right", (-1, -1), {"hk": 1}),
])
def test_reference_matches_brute_force(layout, mask, window, extra):
    q, k, v, st, bias, slopes = _case(layout, mask, window, **extra)
    window = (window[0], 0) if "causal" in mask else window
    st = ref.Structure(st.layout, st.mask, st.scale, window, st.lens_q, st.lens_kv, st.offs_q,
                       st.offs_kv)
    out, lse = ref.attention_fwd(q, k, v, st, bias=bias, alibi=slopes)
    dout = RNG.standard_normal(out.shape)
    grads = ref.attention_bwd(dout, q, k, v, st, bias=bias, alibi=slopes)
    spans = ref.spans(st, q.shape, k.shape)
    want = _brute(q, k, v, dout, st, spans, bias, slopes)
    for got, exp in zip((out, lse) + grads, want):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


def test_empty_rows_gaps_and_unseen_keys():
    q, k, v, st, _, _ = _case("thd", "padding_causal")
    out, lse = ref.attention_fwd(q, k, v, st)
    dq, dk, dv = ref.attention_bwd(np.ones_like(out), q, k, v, st)
    # sequence 1 has no query rows, sequence 2 one row and no keys; gaps after 0 and 2.
    assert np.all(out[3] == 0) and np.all(np.isneginf(lse[:, 3]))       # the gap
    assert np.all(out[4:7] == 0) and np.all(np.isneginf(lse[:, 4:7]))   # no keys, gap
    assert np.all(dk[2:5] == 0) and np.all(dv[2:5] == 0)                # keys no row sees
    assert np.isfinite(dq).all() and np.abs(dq[0:3]).sum() > 0


def test_chunking_does_not_change_values():
    """Blocks of one query row give the rows the whole-sequence block gives (up to the
    summation order of the BLAS products)."""
    q, k, v, st, bias, _ = _case("bshd", "none", bias=True)

    def rows(max_elements):
        got = {}
        for blk in ref.blocks(q, k, v, st, bias=bias, max_elements=max_elements):
            for r in range(blk.r0, blk.r1):
                got[(blk.span.seq, r)] = (blk.out[:, r - blk.r0], blk.lse[:, r - blk.r0])
        return got

    whole, small = rows(ref.BLOCK_ELEMENTS), rows(1)
    assert whole.keys() == small.keys() and len(whole) == 10
    for key, (o, l_) in whole.items():
        np.testing.assert_allclose(small[key][0], o, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(small[key][1], l_, rtol=1e-14)


def test_large_logits_do_not_overflow():
    q, k, v, st, _, _ = _case("bshd", "causal")
    st = ref.Structure("bshd", "causal", 400.0)      # exp(scores) overflows float64 unshifted
    out, lse = ref.attention_fwd(q, k, v, st)
    assert np.isfinite(out).all() and np.isfinite(lse).all() and lse.max() > 710


def test_numpy_and_torch_float64_agree():
    q, k, v, st, bias, _ = _case("sbhd", "padding_causal_bottom_right", (2, 0))
    out, lse = ref.attention_fwd(q, k, v, st)
    t = [torch.from_numpy(a) for a in (q, k, v)]
    tout, tlse = ref.attention_fwd(*t, st)
    np.testing.assert_allclose(tout.numpy(), out, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(tlse.numpy()), np.isneginf(lse))
    grads = ref.attention_bwd(out, q, k, v, st)
    tgrads = ref.attention_bwd(torch.from_numpy(out), *t, st)
    for a, b in zip(tgrads, grads):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-13)
