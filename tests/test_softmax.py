"""The softmax family (issue 15, part 1): the float64 reference against hand-computed values and
torch float64 autograd, the softmax tier catching deliberately wrong kernels (no max
subtraction in fp16, wrong fill, missing scale in backward, off-by-one causal diagonal) while
passing a correct one that sums in another order, and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tealite
from tealite.errors import TealiteArgumentError
from tealite.types import SOFTMAX_MASK_FILL, softmax_visible
from tealite_verify.references import softmax as ref

from _helpers_tolerance import assert_caught, assert_passes

F32 = torch.float32
NUM = {"compute_dtype": F32, "exp_ulps": 1}


# ---- the reference on hand cases ---------------------------------------------------------

def test_reference_hand_values():
    x = np.log(np.array([1.0, 2.0, 3.0]))[None, None, None, :]
    np.testing.assert_allclose(ref.softmax_fwd(x, "scaled", scale=1.0)[0, 0, 0],
                               [1 / 6, 2 / 6, 3 / 6], rtol=1e-15)
    # logits of 1e4: exp(1e4) overflows float64 too, the max subtraction keeps it exact
    big = np.array([1e4, 1e4 + math.log(3.0)])[None, None, None, :]
    np.testing.assert_allclose(ref.softmax_fwd(big, "scaled", scale=1.0)[0, 0, 0],
                               [0.25, 0.75], rtol=1e-12)


def test_reference_fill_rules():
    x = np.zeros((1, 1, 3, 4))
    mask = np.zeros((1, 1, 3, 4), dtype=bool)
    mask[..., 0, :] = True           # fully masked row: zeros (TE)
    mask[..., 1, :2] = True          # two kept keys of equal logit
    x[..., 2, :] = [-30000.0, -30000.0, 0.0, 0.0]
    mask[..., 2, 2:] = True          # kept logits below the fill: TE zeroes the row too
    y = ref.softmax_fwd(x, "scaled_masked", scale=1.0, mask=mask)[0, 0]
    np.testing.assert_array_equal(y[0], 0.0)
    np.testing.assert_allclose(y[1], [0, 0, 0.5, 0.5], atol=1e-300)
    np.testing.assert_array_equal(y[2], 0.0)
    # aligned causal, sq = 3 > sk = 2: row 0 keeps no key (zeros), row 1 keeps key 0 only
    y = ref.softmax_fwd(np.zeros((1, 1, 3, 2)), "scaled_aligned_causal", scale=1.0)[0, 0]
    np.testing.assert_array_equal(y, [[0, 0], [1, 0], [0.5, 0.5]])
    # upper triangular: -inf fill, so a kept logit of -20000 is still a normal softmax
    x = np.full((1, 2, 2), -20000.0)
    np.testing.assert_array_equal(ref.softmax_fwd(x, "scaled_upper_triang", scale=1.0)[0],
                                  [[1, 0], [0.5, 0.5]])
    # aligned causal: the -10000 fill enters the sum when the kept logits are below it
    # (row 0 keeps key 0 at -10000 - ln 3; the hidden key's -10000 is the max: 1/3 / (4/3))
    y = ref.softmax_fwd(np.full((1, 1, 2, 2), -10000.0 - math.log(3.0)),
                        "scaled_aligned_causal", scale=1.0)
    np.testing.assert_allclose(y[0, 0], [[0.25, 0.0], [0.5, 0.5]], rtol=1e-9)


@pytest.mark.parametrize("kind", ["scaled", "scaled_upper_triang", "scaled_aligned_causal"])
def test_reference_backward_is_torch_autograd(kind):
    g = torch.Generator().manual_seed(3)
    shape = (5, 5) if kind != "scaled_aligned_causal" else (4, 7)
    x = torch.randn(1, 2, *shape, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(1, 2, *shape, generator=g, dtype=torch.float64)
    scale = 0.3
    keep = softmax_visible(kind, *shape)
    s = x * scale if keep is None else (x * scale).masked_fill(~keep, -math.inf)
    y = torch.softmax(s, dim=-1)
    y.backward(dy)
    xs = x.detach().numpy()[0] if kind == "scaled_upper_triang" else x.detach().numpy()
    y_ref = ref.softmax_fwd(xs, kind, scale=scale)
    np.testing.assert_allclose(y_ref.reshape(y.shape), y.detach().numpy(), rtol=1e-13,
                               atol=1e-300)
    dys = dy.numpy()[0] if kind == "scaled_upper_triang" else dy.numpy()
    dx = ref.softmax_bwd(dys, y_ref, kind, scale=scale)
    want = x.grad.numpy() if keep is None else np.where(keep.numpy(), x.grad.numpy(), 0.0)
    np.testing.assert_allclose(dx.reshape(want.shape), want, rtol=1e-12, atol=1e-15)


# ---- seeded wrong kernels are caught; a legitimate variant is not ------------------------

def _case(kind, shape, dtype, *, dist=None, scale=0.125, **kw):
    case = {"kind": kind, "shape": shape, "dtype": dtype, "scale": scale,
            "dist": dist or {"kind": "normal", "scale": 4.0}, "seed": 11,
            "dist_dy": {"kind": "normal", "scale": 1.0}}
    if kind == "scaled_masked":
        case.update(mask_batch="b", mask_frac=0.3, masked_rows=0.25)
    case.update(kw)
    return case


_LARGE = {"kind": "uniform", "lo": 200.0, "hi": 900.0}


def _softmax32(s, *, order=None):
    """fp32 softmax of filled logits s; ``order``: sum the row sequentially in this order."""
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    if order is None:
        total = e.sum(-1, keepdim=True)
    else:
        total = torch.zeros_like(e[..., :1])
        for j in order(e.shape[-1]):
            total = total + e[..., j:j + 1]
    return e / total


def _fwd_backend(make_backend, name, *, fill=SOFTMAX_MASK_FILL, no_max=False, diag=0,
                 order=None):
    b = make_backend(name)

    @b.implements("softmax_fwd", numerics=NUM)
    def fwd(x, kind, *, scale, mask):
        if x.numel() == 0:
            return torch.empty_like(x)
        s = x.float() * scale
        if no_max:  # exp of the logits themselves, in the input dtype
            e = torch.exp(s.to(x.dtype)).float()
            return (e / e.sum(-1, keepdim=True)).to(x.dtype)
        keep = None
        if kind == "scaled_masked":
            s = s.masked_fill(mask, fill)
        elif kind != "scaled":
            sq, sk = s.shape[-2:]
            i = torch.arange(sq)[:, None]
            keep = torch.arange(sk)[None, :] <= i + (sk - sq) + diag
            s = s.masked_fill(~keep, -math.inf if kind == "scaled_upper_triang" else fill)
        y = _softmax32(s, order=order)
        if kind == "scaled_masked":
            y = torch.where(s.amax(-1, keepdim=True) == SOFTMAX_MASK_FILL, 0.0, y)
        if keep is not None:
            y = torch.where(keep, y, 0.0)
        return torch.nan_to_num(y, nan=0.0).to(x.dtype)

    return b.name


def test_no_max_subtraction_in_fp16_is_caught(make_backend):
    name = _fwd_backend(make_backend, "softmax_nomax", no_max=True)
    assert_caught("softmax_fwd", [_case("scaled", [1, 2, 3, 29], "float16", scale=1.0,
                                        dist={"kind": "normal", "scale": 8.0}),
                                  _case("scaled", [2, 1, 4, 17], "bfloat16", scale=1.0,
                                        dist=_LARGE)], name)


def test_wrong_fill_is_caught(make_backend):
    # -inf instead of TE's -10000: fully masked rows become NaN -> 0 (here) or stay NaN;
    # a row whose kept logits are below -10000 is a normal softmax instead of zeros
    name = _fwd_backend(make_backend, "softmax_fill_inf", fill=-30000.0)
    below = {"kind": "uniform", "lo": -40000.0, "hi": -20000.0}
    assert_caught("softmax_fwd", [_case("scaled_masked", [2, 1, 5, 13], "float32", scale=1.0,
                                        dist=below, mask_frac=0.5, masked_rows=0.0)], name)
    name = _fwd_backend(make_backend, "softmax_fill_zero", fill=0.0)
    assert_caught("softmax_fwd", [_case("scaled_masked", [2, 2, 7, 29], "bfloat16"),
                                  _case("scaled_aligned_causal", [1, 2, 5, 9], "float16")],
                  name)


def test_off_by_one_causal_diagonal_is_caught(make_backend):
    for diag in (1, -1):
        name = _fwd_backend(make_backend, f"softmax_diag{diag}", diag=diag)
        assert_caught("softmax_fwd", [_case("scaled_upper_triang", [3, 1, 11, 11], "bfloat16"),
                                      _case("scaled_aligned_causal", [1, 2, 6, 13], "float32")],
                      name)


def test_other_summation_order_passes(make_backend):
    for order in (lambda n: range(n), lambda n: reversed(range(n))):
        name = _fwd_backend(make_backend, "softmax_seqsum", order=order)
        assert_passes("softmax_fwd", [
            _case("scaled", [2, 2, 5, 97], "float32", dist=_LARGE, scale=1.0),
            _case("scaled_masked", [2, 3, 7, 67], "float16"),
            _case("scaled_upper_triang", [2, 1, 33, 33], "bfloat16"),
            _case("scaled_aligned_causal", [1, 2, 9, 61], "float32",
                  dist={"kind": "wide", "log2_lo": -12, "log2_hi": 10})], name)


def _bwd_backend(make_backend, name, *, scaled=True, order=None):
    b = make_backend(name)

    @b.implements("softmax_bwd", numerics=NUM)
    def bwd(dy, y, kind, *, scale):
        y32, dy32 = y.float(), dy.float()
        keep = softmax_visible(kind, *y.shape[-2:])
        if keep is not None:
            y32, dy32 = torch.where(keep, y32, 0.0), torch.where(keep, dy32, 0.0)
        p = dy32 * y32
        if order is None:
            c = p.sum(-1, keepdim=True)
        else:
            c = torch.zeros_like(p[..., :1])
            for j in order(p.shape[-1]):
                c = c + p[..., j:j + 1]
        dx = p - y32 * c
        return (scale * dx if scaled else dx).to(dy.dtype)

    return b.name


def test_missing_scale_in_backward_is_caught(make_backend):
    name = _bwd_backend(make_backend, "softmax_bwd_noscale", scaled=False)
    assert_caught("softmax_bwd", [_case("scaled", [1, 2, 5, 31], "bfloat16"),
                                  _case("scaled_aligned_causal", [2, 1, 4, 9], "float32",
                                        scale=2.0)], name)


def test_backward_other_summation_order_passes(make_backend):
    name = _bwd_backend(make_backend, "softmax_bwd_rev", order=lambda n: reversed(range(n)))
    assert_passes("softmax_bwd", [_case("scaled", [2, 2, 5, 97], "float32"),
                                  _case("scaled_masked", [1, 3, 7, 67], "float16"),
                                  _case("scaled_upper_triang", [2, 1, 29, 29], "bfloat16")], name)


# ---- bad input ---------------------------------------------------------------------------

def _x(*shape, dtype=F32):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("call, match", [
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "causal", scale=1.0), "kind must be one of"),
    (lambda: tealite.softmax_fwd(_x(3, 4, 5), "scaled", scale=1.0), "x must be 4-D"),
    (lambda: tealite.softmax_fwd(_x(2, 4, 5), "scaled_upper_triang", scale=1.0),
     r"sq == sk"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled", scale=float("nan")),
     "scale must be finite"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled", scale=float("inf")),
     "scale must be finite"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5, dtype=torch.float64), "scaled", scale=1.0),
     "x dtype must be one of"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled_masked", scale=1.0),
     "mask is required"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled_masked", scale=1.0,
                                 mask=torch.zeros(3, 1, 4, 5, dtype=torch.bool)),
     r"mask must have shape \(2 or 1, 1, 4, 5\)"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled_masked", scale=1.0,
                                 mask=torch.zeros(2, 1, 4, 5)), "mask dtype must be one of"),
    (lambda: tealite.softmax_fwd(_x(2, 3, 4, 5), "scaled", scale=1.0,
                                 mask=torch.zeros(2, 1, 4, 5, dtype=torch.bool)),
     "mask must be None"),
    (lambda: tealite.softmax_bwd(_x(2, 3, 4, 5), _x(2, 3, 4, 6), "scaled", scale=1.0),
     "dy must have shape"),
    (lambda: tealite.softmax_bwd(_x(2, 3, 4, 5, dtype=torch.float16), _x(2, 3, 4, 5),
                                 "scaled", scale=1.0), "dy dtype must be one of"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(TealiteArgumentError, match=match):
        call()
