"""Bad input to the norm and activation front-ends gets a clear error naming the argument and the
constraint it broke; nothing is silently broadcast, truncated or reinterpreted.

Every check here runs in the op front-ends before any backend is chosen, so these tests run
on the CPU only.  A tensor on the ``meta`` device stands in for "a second device".
"""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite.ops.activations import GATED, KINDS, POINTWISE

from _helpers_bad_input import (BF16, F16, H, ROWS, X_SHAPE, esc, ln_bwd, ln_fwd, raises, rms_bwd,
                                rms_fwd, t)

# ---- norms ----------------------------------------------------------------------------------

NORM_OPS = {"layernorm_fwd": ln_fwd, "rmsnorm_fwd": rms_fwd, "layernorm_bwd": ln_bwd,
            "rmsnorm_bwd": rms_bwd}
FWD_OPS = ["layernorm_fwd", "rmsnorm_fwd"]
BWD_OPS = ["layernorm_bwd", "rmsnorm_bwd"]


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_valid_baseline(op):
    NORM_OPS[op]()
    NORM_OPS[op](x=t(0, H))          # no rows is fine
    NORM_OPS[op](x=t(H))             # a single row with no leading dims is fine


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_x_rank_and_dtype(op):
    f = NORM_OPS[op]
    with raises(r"x must have at least 1 dims, got shape \(\)"):
        f(x=torch.tensor(1.0))
    for bad in (torch.int32, torch.float64):
        name = str(bad).removeprefix("torch.")
        with raises(rf"x dtype must be one of \(float32, bfloat16, float16\), got {name}"):
            f(x=t(*X_SHAPE, dtype=bad))


@pytest.mark.parametrize("shape", [(H + 1,), (1,), (H - 1,), (1, H), (H, 1), ()], ids=str)
@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_gamma_wrong_shape(op, shape):
    gamma = t(*shape)
    if len(shape) != 1:
        match = rf"gamma must be 1-D, got shape {esc(str(shape))}"
    else:
        match = (rf"gamma must have shape \({H},\) \(the normalized \(last\) dim of x\), "
                 rf"got {esc(str(shape))}")
    with raises(match):
        NORM_OPS[op](gamma=gamma)


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_gamma_wrong_dtype(op):
    x = t(*X_SHAPE, dtype=BF16)
    for bad in (F16, torch.float64, torch.int32):
        name = str(bad).removeprefix("torch.")
        with raises(rf"gamma dtype must be one of \(bfloat16, float32\), got {name}"):
            NORM_OPS[op](x=x, gamma=t(H, dtype=bad))


def test_layernorm_beta_shape_and_dtype():
    with raises(rf"beta must have shape \({H},\) \(the normalized \(last\) dim of x\), got \(1,\)"):
        ln_fwd(beta=t(1))
    with raises(r"beta must be 1-D"):
        ln_fwd(beta=t(1, H))
    x = t(*X_SHAPE, dtype=BF16)
    with raises(r"beta dtype torch.bfloat16 must equal gamma's torch.float32"):
        ln_fwd(x=x, gamma=t(H), beta=t(H, dtype=BF16))


@pytest.mark.parametrize("eps", [0.0, -1e-5, 0, -1])
@pytest.mark.parametrize("op", FWD_OPS)
def test_norm_eps_must_be_positive(op, eps):
    with raises(rf"eps must be > 0, got {float(eps)}"):
        NORM_OPS[op](eps=eps)


@pytest.mark.parametrize("eps", [float("nan"), float("inf")])
@pytest.mark.parametrize("op", FWD_OPS)
def test_norm_eps_must_be_finite(op, eps):
    with raises(rf"eps must be finite, got {eps}"):
        NORM_OPS[op](eps=eps)


@pytest.mark.parametrize("op", FWD_OPS)
def test_norm_eps_must_be_a_number(op):
    for eps in ("1e-5", None, True, torch.tensor(1e-5)):
        with raises(r"eps must be a Python float"):
            NORM_OPS[op](eps=eps)


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_zero_size_normalized_dim(op):
    with raises(r"x's last \(normalized\) dim must be > 0, got shape \(3, 0\)"):
        NORM_OPS[op](x=t(3, 0), gamma=t(0))


@pytest.mark.parametrize("op", NORM_OPS)
def test_norm_zero_centered_gamma_must_be_bool(op):
    with raises(r"zero_centered_gamma must be a bool"):
        NORM_OPS[op](zero_centered_gamma=1)


@pytest.mark.parametrize("stat", ["mean", "rsigma"])
def test_layernorm_bwd_stats_wrong_dtype(stat):
    for bad in (BF16, torch.float64, F16):
        name = str(bad).removeprefix("torch.")
        with raises(rf"{stat} dtype must be one of \(float32\), got {name}"):
            ln_bwd(**{stat: t(*ROWS, dtype=bad)})


def test_rmsnorm_bwd_stats_wrong_dtype():
    with raises(r"rsigma dtype must be one of \(float32\), got bfloat16"):
        rms_bwd(rsigma=t(*ROWS, dtype=BF16))


# keepdim-style (rows, 1), flattened rows, one row too many, x's full shape, a scalar.
STAT_SHAPES = [(*ROWS, 1), (ROWS[0] * ROWS[1],), (ROWS[0], ROWS[1] + 1), X_SHAPE, ()]


@pytest.mark.parametrize("shape", STAT_SHAPES, ids=str)
@pytest.mark.parametrize("op,stat", [("layernorm_bwd", "mean"), ("layernorm_bwd", "rsigma"),
                                     ("rmsnorm_bwd", "rsigma")])
def test_norm_bwd_stats_wrong_shape(op, stat, shape):
    with raises(rf"{stat} must have shape {esc(str(ROWS))} \(x.shape\[:-1\], one statistic "
                rf"per row\), got {esc(str(shape))}"):
        NORM_OPS[op](**{stat: t(*shape)})


@pytest.mark.parametrize("shape", [(1, 4, H), (3, 4, 1), (12, H), (3, 4, H + 1), (4, 3, H)],
                         ids=str)
@pytest.mark.parametrize("op", BWD_OPS)
def test_norm_bwd_dy_wrong_shape(op, shape):
    with raises(rf"dy must have shape {esc(str(X_SHAPE))} \(same as x\), "
                rf"got {esc(str(shape))}"):
        NORM_OPS[op](dy=t(*shape))


@pytest.mark.parametrize("op", BWD_OPS)
def test_norm_bwd_dy_wrong_dtype(op):
    with raises(r"dy dtype must be one of \(bfloat16\), got float32"):
        NORM_OPS[op](x=t(*X_SHAPE, dtype=BF16), dy=t(*X_SHAPE))


NORM_ARGS = {"layernorm_fwd": ("x", "gamma", "beta"), "rmsnorm_fwd": ("x", "gamma"),
             "layernorm_bwd": ("dy", "x", "mean", "rsigma", "gamma"),
             "rmsnorm_bwd": ("dy", "x", "rsigma", "gamma")}
NORM_SHAPES = {"x": X_SHAPE, "dy": X_SHAPE, "gamma": (H,), "beta": (H,), "mean": ROWS,
               "rsigma": ROWS}


@pytest.mark.parametrize("op,which", [(op, w) for op, ws in NORM_ARGS.items() for w in ws])
def test_norm_mixed_devices(op, which):
    kw = {name: t(*NORM_SHAPES[name], device="meta" if name == which else "cpu")
          for name in NORM_ARGS[op]}
    with raises(rf"all tensors must be on one device; got .*{which} on meta"):
        NORM_OPS[op](**kw)


# ---- activations ----------------------------------------------------------------------------

def test_act_valid_baseline():
    for kind in KINDS:
        x = t(3, 8)
        y = tealite.act_fwd(x, kind)
        assert y.shape == ((3, 4) if kind in GATED else (3, 8))
        assert tealite.act_bwd(t(*y.shape), x, kind).shape == x.shape
    for kind in POINTWISE:
        r = tealite.dbias_dact(t(3, 8), t(3, 8), kind)
        assert r.dx.shape == (3, 8) and r.dbias.shape == (8,)


def _act_call(op, x, kind, dy=None):
    if op == "act_fwd":
        return tealite.act_fwd(x, kind)
    dy = t(*x.shape, dtype=x.dtype) if dy is None else dy
    return getattr(tealite, op)(dy, x, kind)


ACT_OPS = ["act_fwd", "act_bwd", "dbias_dact"]


@pytest.mark.parametrize("kind", ["gelu2", "GELU", "swish", "", None, "glu"])
@pytest.mark.parametrize("op", ACT_OPS)
def test_act_unknown_kind(op, kind):
    with raises(r"kind must be one of \('gelu', .*'sreglu'\), got " + esc(repr(kind))):
        _act_call(op, t(3, 8), kind)


@pytest.mark.parametrize("op", ACT_OPS)
def test_act_x_rank_and_dtype(op):
    with raises(r"x must have at least 1 dims, got shape \(\)"):
        _act_call(op, torch.tensor(1.0), "gelu", dy=torch.tensor(1.0))
    for bad in (torch.int32, torch.float64):
        name = str(bad).removeprefix("torch.")
        with raises(rf"x dtype must be one of \(float32, bfloat16, float16\), got {name}"):
            _act_call(op, t(3, 8, dtype=bad), "gelu", dy=t(3, 8))


@pytest.mark.parametrize("kind", sorted(GATED))
@pytest.mark.parametrize("op", ["act_fwd", "act_bwd"])
def test_act_gated_odd_last_dim(op, kind):
    x = t(3, 7)
    with raises(rf"x's last dim must be even for gated kind {kind} \(it holds \[act \| gate\]\), "
                r"got shape \(3, 7\)"):
        _act_call(op, x, kind, dy=t(3, 3))


@pytest.mark.parametrize("kind", KINDS)
def test_act_bwd_dy_wrong_shape(kind):
    x = t(3, 8)
    want = (3, 4) if kind in GATED else (3, 8)
    # x's own shape for a gated kind, broadcastable shapes, a transposed one, truncated rows.
    bad_shapes = [(1, want[1]), (3, 1), (want[1], 3), (2, want[1]), (3 * want[1],)]
    if kind in GATED:
        bad_shapes.append((3, 8))
    for shape in bad_shapes:
        with raises(rf"dy must have shape {esc(str(want))} \(the forward output shape of "
                    rf"{kind}\), got {esc(str(shape))}"):
            tealite.act_bwd(t(*shape), x, kind)


@pytest.mark.parametrize("op", ["act_bwd", "dbias_dact"])
def test_act_dy_wrong_dtype(op):
    with raises(r"dy dtype must be one of \(float16\), got bfloat16"):
        _act_call(op, t(3, 8, dtype=F16), "gelu", dy=t(3, 8, dtype=BF16))


def test_dbias_dact_dy_wrong_shape():
    for shape in [(1, 8), (3, 1), (3, 4), (8, 3)]:
        with raises(rf"dy must have shape \(3, 8\) \(same as x\), got {esc(str(shape))}"):
            tealite.dbias_dact(t(*shape), t(3, 8), "gelu")


@pytest.mark.parametrize("kind", sorted(GATED))
def test_dbias_dact_rejects_gated_kinds(kind):
    with raises(rf"kind must be a pointwise kind \('gelu'.*\) for dbias_dact, got '{kind}'"):
        tealite.dbias_dact(t(3, 4), t(3, 8), kind)
    with raises(rf"kind must be a pointwise kind .*for dbias_dact, got '{kind}'"):
        tealite.dbias_dact(t(3, 8), t(3, 8), kind)


@pytest.mark.parametrize("op", ["act_bwd", "dbias_dact"])
@pytest.mark.parametrize("which", ["x", "dy"])
def test_act_mixed_devices(op, which):
    x = t(3, 8, device="meta" if which == "x" else "cpu")
    dy = t(3, 8, device="meta" if which == "dy" else "cpu")
    with raises(rf"all tensors must be on one device; got .*{which} on meta"):
        getattr(tealite, op)(dy, x, "gelu")
