"""The dequantized (value) tier, the shuffle tier and the scaled_mm backend's padding report:
each catches a seeded wrong implementation and passes the correct one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.ops.layouts import weight_tile
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

TORCH = tealite.get_backend("torch")


def _failures(report, backend):
    """Failures of ``backend`` against the reference."""
    return [c for c in report.failures if c.lhs == backend and c.rhs == "reference"]


def _wrap_quantize_dequantize(b, dequantize_fn):
    b.implements("quantize")(TORCH.impls["quantize"].fn)
    b.implements("dequantize")(dequantize_fn)


def test_dequantized_tier_catches_wrong_e8m0_bias(make_backend):
    """Dequantizing MX with bias 126 (every value doubled) is caught on values."""
    b = make_backend("dq_bias126")

    def dequantize(q, *, out_dtype, columnwise):
        y = TORCH.impls["dequantize"].fn(q, out_dtype=out_dtype, columnwise=columnwise)
        return y * 2 if isinstance(q.recipe, R.MXBlockScaling) else y

    _wrap_quantize_dequantize(b, dequantize)
    spec = get_spec("quant_roundtrip")
    for case in spec.smoke_cases:
        report = run_case(spec, case, backends=["torch", b.name])
        assert not _failures(report, "torch") and _failures(report, b.name)
        assert any(b.name in (c.lhs, c.rhs) and "reference" not in (c.lhs, c.rhs)
                   for c in report.failures)  # and pairwise


def test_dequantized_tier_catches_truncating_quantizer(make_backend):
    """A quantizer that truncates (RTZ) leaves errors up to a whole code step."""
    b = make_backend("q_rtz")

    def quantize(x, recipe, *, rowwise, columnwise, scale):
        q = TORCH.impls["quantize"].fn(x, recipe, rowwise=rowwise, columnwise=columnwise,
                                       scale=scale)
        if q.data is not None and not isinstance(recipe, R.MXBlockScaling):
            s = 1.0 / q.scale_inv
            v = x.float() * (s.unsqueeze(1) if s.numel() > 1 else s)
            bits = q.data.view(torch.uint8)
            rounded_up = (q.data.float().abs() > v.abs()) & ((bits & 0x7F) > 0)
            q.data = torch.where(rounded_up, bits - 1, bits).view(q.data.dtype)
        return q

    b.implements("quantize")(quantize)
    b.implements("dequantize")(TORCH.impls["dequantize"].fn)
    spec = get_spec("quant_roundtrip")
    case = dict(spec.smoke_cases[1], recipe_a=dict(spec.smoke_cases[1]["recipe_b"]))
    report = run_case(spec, case, backends=["torch", b.name])
    assert not _failures(report, "torch") and _failures(report, b.name)


def test_shuffle_tier_catches_wrong_vector_width(make_backend):
    """Shuffling FP8 with bf16's Kv (8 instead of 16) is a wrong stride: caught after
    un-shuffling; BF16 (where it is right) still passes."""
    b = make_backend("shuffle_kv8")

    def shuffle(w, layout, *, inverse):
        if inverse:
            return TORCH.impls["shuffle_weight"].fn(w, layout, inverse=True)
        bn, bk, _ = weight_tile(w.dtype, layout)
        kv = 8
        n, k = w.shape
        return w.reshape(n // bn, bn, k // bk, bk // kv, kv).permute(0, 2, 3, 1, 4) \
            .contiguous().reshape(n, k)

    b.implements("shuffle_weight")(shuffle)
    spec = get_spec("shuffle_weight")
    fp8 = {"wdtype": "e4m3", "n": 32, "k": 64, "seed": 1}
    report = run_case(spec, fp8, backends=["torch", b.name])
    assert any(c.lhs == b.name and c.output == "shuffled" for c in report.failures)
    bf16 = {"wdtype": "bfloat16", "n": 32, "k": 64, "seed": 1}
    assert run_case(spec, bf16, backends=["torch", b.name]).verdict == "pass"


def test_shuffle_padding_is_reported_not_compared(make_backend):
    """A scale shuffle that leaves garbage in the padding passes, and the report says so."""
    b = make_backend("shuffle_garbage_pad")

    def shuffle(scales, unshuffle_to):
        out = TORCH.impls["shuffle_e8m0"].fn(scales, unshuffle_to)
        if unshuffle_to is None:
            m, s = scales.shape
            plain = TORCH.impls["shuffle_e8m0"].fn(out, (out.shape[0], out.shape[1]))
            plain[m:, :] = 0xAB
            plain[:, s:] = 0xAB
            out = TORCH.impls["shuffle_e8m0"].fn(plain, None)
        return out

    b.implements("shuffle_e8m0")(shuffle)
    report = run_case(get_spec("shuffle_e8m0"), {"m": 70, "s": 5, "seed": 1},
                      backends=["torch", b.name])
    assert report.verdict == "pass", report.describe()
    note = next(c.metrics.note for c in report.comparisons
                if c.lhs == b.name and c.rhs == "reference" and c.output == "shuffled")
    assert "1698 bytes, 1698 non-zero, not compared" in note


def test_scaled_mm_pads_k_and_n_and_says_so():
    a = tealite.quantize(torch.randn(17, 257), R.Float8CurrentScaling())  # (N, K) TN weight
    b = tealite.quantize(torch.randn(5, 257), R.Float8CurrentScaling(granularity="row"))
    out = tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="scaled_mm")
    assert out.meta == {"padded": {"k": [257, 272], "n": [17, 32]}}
    assert out.out.shape == (5, 17)
    ref = tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="torch")
    assert ref.meta == {}
    torch.testing.assert_close(out.out.float(), ref.out.float(), rtol=2**-7, atol=1e-2)


def test_scaled_mm_refuses_what_it_cannot_do_with_reason():
    a = tealite.quantize(torch.randn(16, 64), R.MXFP8BlockScaling())
    with pytest.raises(tealite.UnsupportedCase, match="no block or MX scales"):
        tealite.qgemm(a, a, layout="TN", backend="scaled_mm")
    f = tealite.quantize(torch.randn(16, 64), R.Float8CurrentScaling("e4m3fnuz"))
    if torch.version.hip is None:
        with pytest.raises(tealite.UnsupportedCase, match="FNUZ FP8 needs ROCm"):
            tealite.qgemm(f, f, layout="TN", backend="scaled_mm")
    assert np.isfinite(tealite.qgemm(f, f, layout="TN", backend="torch").out.float().numpy()).all()
