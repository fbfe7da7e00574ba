"""Seeded wrong backends, end to end through the registry: each deliberately wrong implementation
is reported failing against the reference and pairwise against torch, while the torch backend
passes (and a correct variant is not flagged: a false alarm is a bug too).

The ``make_backend`` fixture is in conftest.py; case builders and the ``assert_caught`` /
``assert_passes`` helpers are in _helpers_tolerance.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tealite.ops.activations import GATED
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_tolerance import (BF16, NUM32, ULP_REL, _act_case, _gemm_case, _grad64, _norm_case,
                                _round_once, _rows, assert_caught, assert_passes)

def _epilogue(acc, *, out_dtype, bias, gelu, out, alpha, beta):
    pre = acc.float() * alpha
    if beta != 0.0:
        pre = pre + beta * out.float()
    if bias is not None:
        pre = pre + bias.float()
    result = (F.gelu(pre) if gelu else pre).to(out_dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return result, (pre.to(out_dtype) if gelu else None)


def test_wrong_gemm_transpose_inferred_from_shape(make_backend):
    """(a) Layout TN: the kernel 'infers' whether to transpose A from the shapes, so it only
    transposes when A is non-square -- wrong exactly when N == K."""
    b = make_backend("wrong_transpose")

    @b.implements("gemm", numerics=NUM32)
    def gemm(a, bm, *, layout, **kw):
        op_b = bm.t() if layout[1] == "T" else bm
        if layout[0] == "T":
            op_a = a if a.shape[0] == op_b.shape[1] else a.t()  # the bug
        else:
            op_a = a
        return _epilogue(op_b.float() @ op_a.float(), **kw)

    square = [_gemm_case("TN", "bfloat16", 17, 64, 64),
              _gemm_case("TN", "float32", 5, 31, 31, bias=True),
              _gemm_case("TN", "float16", 9, 29, 29, out_dtype="float32", gelu=True, alpha=0.5)]
    assert_caught("gemm", square, b.name)
    # Non-square A: the wrong kernel happens to be right and must not be flagged.
    assert_passes("gemm", [_gemm_case("TN", "bfloat16", 29, 29, 541),
                           _gemm_case("NN", "float16", 17, 64, 64)], b.name)


def test_wrong_gemm_scale_one_output_ulp(make_backend):
    """(b) alpha off by one output ULP (1 + 2^-7 in bf16, 1 + 2^-10 in fp16)."""
    b = make_backend("wrong_scale")

    @b.implements("gemm", numerics=NUM32)
    def gemm(a, bm, *, layout, out_dtype, **kw):
        op_a = a.t() if layout[0] == "T" else a
        op_b = bm.t() if layout[1] == "T" else bm
        acc = op_b.float() @ op_a.float()
        return _epilogue(acc * (1 + ULP_REL[out_dtype]), out_dtype=out_dtype, **kw)

    pos = {"kind": "uniform", "lo": 0.0, "hi": 1.0}
    cases = [_gemm_case("TN", "bfloat16", 29, 31, 541),  # zero-mean, K=541
             _gemm_case("TN", "bfloat16", 16, 24, 1),
             _gemm_case("NT", "bfloat16", 16, 24, 4096, dist_a=pos, dist_b=pos),
             _gemm_case("NN", "float16", 33, 17, 71),
             _gemm_case("TT", "float16", 16, 24, 4096, dist_a=pos, dist_b=pos),
             _gemm_case("TN", "bfloat16", 19, 23, 61, bias=True, gelu=True, alpha=-2.0)]
    assert_caught("gemm", cases, b.name)


def test_low_precision_compute_declaration_with_long_reduction_does_not_crash(make_backend):
    b = make_backend("bf16_compute_dbias")

    @b.implements("dbias_dact", numerics={"compute_dtype": BF16})
    def dbias_dact(dy, x, *, kind):
        dx = _grad64(dy, x, kind)
        return _round_once(dx, x.dtype), _round_once(_rows(dx), x.dtype)

    case = _act_case("gelu", [300, 8], "bfloat16")
    report = run_case(get_spec("dbias_dact"), case, backends=["torch", b.name])
    assert report.outcomes[b.name].status == "ok"
    assert report.verdict == "pass", report.describe()


def _ln_fwd(x, gamma, beta, *, eps, zero_centered_gamma, unbiased=False):
    x32 = x.float()
    h = x.shape[-1]
    mean = x32.mean(dim=-1)
    c = x32 - mean.unsqueeze(-1)
    var = (c * c).sum(dim=-1) / ((h - 1) if unbiased else h)
    rs = torch.rsqrt(var + eps)
    g = gamma.float() + 1.0 if zero_centered_gamma else gamma.float()
    y = c * rs.unsqueeze(-1) * g + beta.float()
    return y.to(x.dtype), mean, rs


def test_wrong_layernorm_unbiased_variance(make_backend):
    """(c) var divided by H-1: rsigma off by ~1/(2H) relative.  In bf16 y that is below an
    output ULP for large H, but the fp32 rsigma output exposes it at every H."""
    b = make_backend("wrong_ln_unbiased")
    b.implements("layernorm_fwd", numerics=NUM32)(
        lambda x, g, bt, **kw: _ln_fwd(x, g, bt, unbiased=True, **kw))
    cases = [_norm_case([5, 4, 160], "bfloat16", rms=False),
             _norm_case([7, 16], "float16", rms=False, zero_centered_gamma=True),
             _norm_case([3, 1481], "float32", rms=False, weight_dtype="float32"),
             _norm_case([6, 97], "bfloat16", rms=False, offset=100.0)]
    assert_caught("layernorm_fwd", cases, b.name, outputs={"rsigma"})
    # Small H: the output y itself is also caught.
    assert_caught("layernorm_fwd", [_norm_case([9, 8], "bfloat16", rms=False)], b.name,
                  outputs={"y"})


def _rms_fwd(x, gamma, *, eps, zero_centered_gamma, eps_mode="ok"):
    x32 = x.float()
    ms = (x32 * x32).mean(dim=-1)
    if eps_mode == "missing":
        rs = torch.rsqrt(ms)
    elif eps_mode == "fixed_1e-6":
        rs = torch.rsqrt(ms + 1e-6)
    elif eps_mode == "outside_sqrt":
        rs = 1.0 / (torch.sqrt(ms) + eps)
    else:
        rs = torch.rsqrt(ms + eps)
    g = gamma.float() + 1.0 if zero_centered_gamma else gamma.float()
    return (x32 * rs.unsqueeze(-1) * g).to(x.dtype), rs


@pytest.mark.parametrize("eps_mode", ["missing", "fixed_1e-6", "outside_sqrt"])
def test_wrong_rmsnorm_eps(make_backend, eps_mode):
    """(d) eps dropped, hard-coded, or added outside the sqrt.  eps only matters where mean(x^2)
    is not >> eps, so the cases use eps = 1e-3 or small inputs (scale 2^-6: mean(x^2) ~ 2.4e-4)."""
    b = make_backend("wrong_rms_eps")
    b.implements("rmsnorm_fwd", numerics=NUM32)(
        lambda x, g, **kw: _rms_fwd(x, g, eps_mode=eps_mode, **kw))
    small = {"kind": "normal", "scale": 2.0**-6}
    cases = [_norm_case([5, 4, 160], "bfloat16", rms=True, eps=1e-3),
             _norm_case([8, 256], "float16", rms=True, dist=small),
             _norm_case([3, 331], "float32", rms=True, eps=1e-3, weight_dtype="float32"),
             _norm_case([4, 64], "bfloat16", rms=True, dist=small, zero_centered_gamma=True)]
    assert_caught("rmsnorm_fwd", cases, b.name, outputs={"rsigma", "y"})
    # With a correct eps the same formula is not flagged (sanity of the test backend).
    ok = make_backend("ok_rms")
    ok.implements("rmsnorm_fwd", numerics=NUM32)(lambda x, g, **kw: _rms_fwd(x, g, **kw))
    assert_passes("rmsnorm_fwd", cases, ok.name)


def test_wrong_gated_halves_swapped(make_backend):
    """(e) gated forward activates the gate half and multiplies by the activation half."""
    b = make_backend("wrong_gated_swap")
    pw = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
          "qgelu": lambda v: v * torch.sigmoid(1.702 * v), "srelu": lambda v: F.relu(v) ** 2}

    @b.implements("act_fwd", numerics=NUM32)
    def act_fwd(x, *, kind):
        a, g = x.float().chunk(2, dim=-1)
        return (pw[GATED[kind]](g) * a).to(x.dtype)  # halves swapped

    cases = [_act_case(k, [7, 64], dt) for k, dt in zip(
        GATED, ["bfloat16", "float16", "float32", "bfloat16", "float16"])]
    assert_caught("act_fwd", cases, b.name)


def test_wrong_gelu_is_tanh_approximation(make_backend):
    """(f) gelu_tanh used for gelu.  |gelu - gelu_tanh| <= ~5e-4: always caught in fp32 and fp16;
    in bf16 only where the output is small (x ~ -2..-4), where an output ULP is tiny, so the bf16
    case draws a wider input range."""
    b = make_backend("wrong_gelu_tanh")

    @b.implements("act_fwd", numerics=NUM32)
    def act_fwd(x, *, kind):
        base = "gelu_tanh" if kind == "gelu" else kind
        return F.gelu(x.float(), approximate="tanh" if base == "gelu_tanh" else "none").to(
            x.dtype)

    cases = [_act_case("gelu", [7, 64], "float32"), _act_case("gelu", [7, 64], "float16"),
             _act_case("gelu", [16, 128], "bfloat16", scale=3.0)]
    assert_caught("act_fwd", cases, b.name)
    # gelu_tanh itself is the same function: not flagged.
    assert_passes("act_fwd", [_act_case("gelu_tanh", [7, 64], dt)
                              for dt in ("float32", "float16", "bfloat16")], b.name)


def _dgelu_bf16(dy, x, *, formula):
    """dgelu evaluated in bf16 arithmetic.

    ``exact``: Phi(x) + x phi(x); ``quick``: the quick-GELU derivative (sigmoid(1.702 x) for
    Phi(x)); ``no_pdf``: Phi(x) alone (the x phi(x) term forgotten)."""
    xb = x.to(BF16)
    if formula == "quick":
        s = torch.sigmoid(1.702 * xb)
        d = s + 1.702 * xb * s * (1 - s)
    else:
        d = 0.5 * (1 + torch.erf(xb * 0.70710678))
        if formula == "exact":
            d = d + xb * torch.exp(-0.5 * xb * xb) * 0.3989422804
    return (dy.to(BF16) * d).to(x.dtype)


def test_wrong_act_bwd_bf16_arithmetic(make_backend):
    """(g) GELU backward computed in bf16 arithmetic.

    * quick-GELU derivative in bf16, declaring the default (fp32) numerics: caught;
    * the exact formula in bf16 while declaring fp32: caught as well (bf16 rounding errors);
    * the exact formula in bf16, honestly declaring ``compute_dtype=bfloat16``: the bound widens
      to 8 bf16 roundings of the condition magnitude and it is NOT flagged (no false alarm);
    * declaring bf16 but forgetting the x phi(x) term (error up to 0.24 |dy|): still caught.
    """
    def backend(prefix, formula, numerics=None):
        b = make_backend(prefix)
        b.implements("act_bwd", numerics=numerics)(
            lambda dy, x, *, kind: _dgelu_bf16(dy, x, formula=formula))
        return b.name

    cases = [_act_case("gelu", [7, 64], dt) for dt in ("float32", "float16", "bfloat16")]
    assert_caught("act_bwd", cases, backend("wrong_bwd_quick_bf16", "quick"))
    assert_caught("act_bwd", cases, backend("wrong_bwd_bf16_as_fp32", "exact"))
    bf16_num = {"compute_dtype": BF16}
    assert_passes("act_bwd", cases, backend("honest_bwd_bf16", "exact", bf16_num))
    assert_caught("act_bwd", cases, backend("wrong_bwd_no_pdf", "no_pdf", bf16_num))
