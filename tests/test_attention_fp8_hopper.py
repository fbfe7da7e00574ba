"""The FP8 attention forward tier against AITER's kernel as a Hopper GPU computes it.

``hopper_fp8_fwd`` replays AITER's Triton FP8 forward (``_attn_fwd`` with IS_FP8: per-tensor
codes from the adapter's host quantizer, Q K^T and P V as FP8 MMAs, P re-quantized per key
block with FP8_MAX / max(P), descales after each product, online softmax in fp32) with the
FP8 MMA as measured on an H200 (tests/test_fp8_mma_accumulator.py ``hopper_fp8_acc``).  Under
aiter_triton's NVIDIA declaration it settles two H100 fuzz findings of attention_fwd_fp8:

* the adapter's host quantizer computed ``448.0 / amax`` as torch does for a Python float over
  a tensor (a reciprocal, then a product), one ulp off TE's quotient: codes at ties moved (the
  CPU replay of the finding class gave 9.06x the bound on lse, the GPU 9.1x);
* a subnormal code is aligned at the smallest normal exponent, which the scores' bound must
  take from lifted magnitudes (``alignment_floor``, as the qgemm tier does).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from tealite.backends import aiter_triton
from tealite.backends.aiter_triton import attention as AA
from tealite.types import Op
from tealite_verify.runner import run_case
from tealite_verify.specs import attention_fp8 as fp8spec
from tealite_verify.specs import get_spec

from test_fp8_mma_accumulator import hopper_fp8_acc

F32 = np.float32
E4 = torch.float8_e4m3fn
BLOCK_M, BLOCK_N = 128, 64  # AITER's forward tile (its config on NVIDIA)


def _nvidia_numerics(monkeypatch, params, lift=True) -> dict:
    """aiter_triton's declaration for attention_fwd_fp8 on an NVIDIA GPU."""
    monkeypatch.setattr(AA, "INTERPRET", False)
    with aiter_triton.PLATFORM.override(nvidia=True):
        num = dict(AA._numerics(False)(params))
    num["attention_kv_block"] = BLOCK_N
    if not lift:
        num.pop("alignment_floor")
    return num


def _codes(t):
    return torch.from_numpy(np.ascontiguousarray(t, F32)).to(E4).double().numpy()


def _head(q8, k8, v8, coef: F32, descale_v: F32, off: int, causal: bool):
    """(out, lse) of one head: codes in, AITER's loop (mha.py ``_attn_fwd_inner``, IS_FP8)."""
    sq, sk = q8.shape[0], k8.shape[0]
    out, lse = np.zeros((sq, v8.shape[1]), F32), np.zeros(sq, F32)
    for m0 in range(0, sq, BLOCK_M):
        q = q8[m0:m0 + BLOCK_M]
        rows = np.arange(m0, m0 + q.shape[0])
        m_i = np.full(q.shape[0], -np.inf, F32)
        l_i = np.zeros(q.shape[0], F32)
        acc = np.zeros((q.shape[0], v8.shape[1]), F32)
        for n0 in range(0, sk, BLOCK_N):
            k, v = k8[n0:n0 + BLOCK_N], v8[n0:n0 + BLOCK_N]
            s = hopper_fp8_acc(q, k, -6, -6) * coef
            if causal:
                cols = np.arange(n0, n0 + k.shape[0])
                s = np.where(cols[None, :] <= rows[:, None] + off, s, -np.inf).astype(F32)
            m_ij = np.maximum(m_i, s.max(1))
            p = np.exp2(s - m_ij[:, None]).astype(F32)
            alpha = np.exp2(m_i - m_ij).astype(F32)
            l_i = (l_i * alpha + p.sum(1, dtype=F32)).astype(F32)
            amax = max(F32(np.abs(p).max()), F32(1e-9))
            p8 = _codes(p * (F32(448.0) / amax))
            pv = hopper_fp8_acc(p8, np.ascontiguousarray(v.T), -6, -6)
            acc = (acc * alpha[:, None] + pv * (amax / F32(448.0)) * descale_v).astype(F32)
            m_i = m_ij
        out[m0:m0 + BLOCK_M] = acc * (F32(1.0) / l_i)[:, None]
        lse[m0:m0 + BLOCK_M] = (m_i + np.log2(l_i)) * F32(0.6931471824645996)
    return out, lse


def hopper_fp8_fwd(q, k, v, config):
    """attention_fwd_fp8 (bshd / sbhd, no mask or bottom-right causal) as AITER computes it
    on Hopper."""
    bshd = (lambda t: t.transpose(0, 1)) if config.layout == "sbhd" else (lambda t: t)
    (q8, dq), (k8, dk), (v8, dv) = (AA._quantize_per_tensor(t, E4) for t in (q, k, v))
    q8, k8, v8 = (bshd(t).double().numpy() for t in (q8, k8, v8))
    b, sq, hq, _ = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    coef = F32(F32(F32(config.softmax_scale) * F32(1.4426950408889634)) * F32(dq)) * F32(dk)
    out = np.zeros((b, sq, hq, v8.shape[-1]), F32)
    lse = np.zeros((b, hq, sq), F32)
    for i in range(b):
        for h in range(hq):
            g = h // (hq // hk)
            out[i, :, h], lse[i, h] = _head(q8[i, :, h], k8[i, :, g], v8[i, :, g], coef,
                                            F32(dv), sk - sq, config.causal)
    return bshd(torch.from_numpy(out).to(q.dtype)).contiguous(), torch.from_numpy(lse)


def _runnable(p) -> str | None:
    if p["layout"] == "thd" or p["bias"] or p["alibi"]:
        return "emulated: bshd / sbhd without bias"
    if p["mask"] not in ("none", "causal_bottom_right") or p["window"] != (-1, -1) and \
            p["mask"] == "none":
        return "emulated: no mask or bottom-right causal"
    if p["seqlen_q"] > 0 and (p["seqlen_kv"] == 0 or (p["mask"] != "none"
                                                       and p["seqlen_q"] > p["seqlen_kv"])):
        return "emulated: every query row sees a key"
    return None


def _register(make_backend, monkeypatch, lift=True) -> str:
    b = make_backend("hopper_fp8_attention")
    b.implements(Op.ATTENTION_FWD_FP8, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                 devices=("cpu",), check=_runnable,
                 numerics=lambda p: _nvidia_numerics(monkeypatch, p, lift))(hopper_fp8_fwd)
    return b.name


def _crafted_case():
    """Row 0 of q: one subnormal code (2^-9) and 31 codes 1.5 * 2^-6; the only key: 448 there
    and 31 codes 1.25 * 2^-6 (row 1 of q holds 448, so both tensors quantize with scale 1).
    The MMA aligns 2^-9 * 448 at exponent -6 + 8 and cuts the 31 small products to 0: the
    score loses 31 * 1.875 * 2^-12, 4x gamma_32(2^-13) of its unlifted magnitude
    (tests/test_fp8_mma_accumulator.py's GEMM probe, as a score)."""
    q = torch.zeros(1, 2, 1, 32)
    q[0, 0, 0] = torch.tensor([2.0 ** -9] + [0.0234375] * 31)
    q[0, 1, 0, 0] = 448.0
    k = torch.tensor([448.0] + [0.01953125] * 31).reshape(1, 1, 1, 32)
    v = torch.ones(1, 1, 1, 32)
    case = fp8spec.make_case("bshd", "none", "float32", batch=1, sq=2, sk=1, lens_q=[2],
                             lens_kv=[1], heads_q=1, heads_kv=1, d_qk=32, d_v=32, scale=1.0)

    def make_inputs(c, device):
        return {"q": q.to(device), "k": k.to(device), "v": v.to(device)}
    return dataclasses.replace(get_spec(fp8spec.NAME), make_inputs=make_inputs), case


def test_the_emulated_mma_loses_the_small_products():
    spec, case = _crafted_case()
    x = spec.make_inputs(case, "cpu")
    q8 = x["q"][0, :, 0].double().numpy()
    k8 = x["k"][0, :, 0].double().numpy()
    assert float(hopper_fp8_acc(q8[:1], k8, -6, -6)[0, 0]) == 0.875
    assert float(q8[0] @ k8[0]) == pytest.approx(0.875 + 31 * 1.875 * 2.0 ** -12)


@pytest.mark.parametrize("lift", [True, False])
def test_subnormal_code_alignment_needs_the_lifted_scores(make_backend, monkeypatch, lift):
    """With aiter_triton's declaration (alignment_floor) the crafted scores pass; the same
    declaration without it fails on lse: the lift is what admits the hardware, not slack."""
    spec, case = _crafted_case()
    name = _register(make_backend, monkeypatch, lift)
    report = run_case(spec, case, backends=[name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert report.verdict == ("pass" if lift else "fail"), report.describe()


def test_the_te_tie_finding_passes_once_the_quantizer_divides(make_backend, monkeypatch):
    """The class of the H100 finding (bf16, outlier q, one key; CPU replay 31.75x the bound on
    lse before the quantizer fix)."""
    case = fp8spec.make_case(
        "bshd", "none", "bfloat16", batch=3, sq=3, sk=1, lens_q=[0, 0, 0], lens_kv=[1, 0, 0],
        heads_q=4, heads_kv=1, d_qk=8, d_v=8, seed=1,
        dist_q={"kind": "outliers", "factor": 64.0, "frac": 0.01, "scale": 1.0,
                "sample_dtype": "float32"},
        dist_k={"kind": "integers", "hi": 1},
        dist_v={"kind": "zero_rows", "frac": 0.25, "scale": 1.0, "sample_dtype": "float32"})
    name = _register(make_backend, monkeypatch)
    report = run_case(get_spec(fp8spec.NAME), case, backends=[name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=fp8spec.cases("bfloat16"))
def test_the_emulated_kernel_raises_no_false_alarm(make_backend, monkeypatch, case):
    """A correct kernel (AITER's algorithm on the measured MMA) passes the tier on the
    strategy's cases (the CPU campaign behind this: 3 minutes, ~16 600 runnable cases, 0
    findings after the quantizer fix)."""
    name = _register(make_backend, monkeypatch)
    report = run_case(get_spec(fp8spec.NAME), case, backends=[name])
    if report.outcomes[name].status == "ok":
        assert report.verdict == "pass", report.describe()
