"""Bad input gets a clear error naming the argument and the constraint it broke; nothing is
silently broadcast, truncated or reinterpreted.

Every check here runs in the op front-ends before any backend is chosen, so these tests run
on the CPU only.  A tensor on the ``meta`` device stands in for "a second device".
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tealite
from tealite import registry
from tealite.errors import BackendUnavailable, TealiteArgumentError, UnsupportedCase
from tealite.ops.activations import GATED, KINDS, POINTWISE
from tealite.ops.gemm import LAYOUTS

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
M, N, K = 5, 6, 8


def t(*shape, dtype=F32, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def raises(match: str):
    return pytest.raises(TealiteArgumentError, match=match)


def esc(text: str) -> str:
    return re.escape(text)


def test_argument_error_is_a_value_error():
    assert issubclass(TealiteArgumentError, ValueError)
    assert tealite.TealiteArgumentError is TealiteArgumentError


# ---- GEMM ----------------------------------------------------------------------------------

def stored(layout: str, m=M, n=N, k_a=K, k_b=K, dtype=F32):
    """a, b stored for ``layout`` (a gives K=k_a, b gives K=k_b)."""
    a = t(n, k_a, dtype=dtype) if layout[0] == "T" else t(k_a, n, dtype=dtype)
    b = t(m, k_b, dtype=dtype) if layout[1] == "N" else t(k_b, m, dtype=dtype)
    return a, b


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_valid_shapes_pass(layout):
    # The sanity baseline every bad case below perturbs.
    a, b = stored(layout)
    r = tealite.gemm(a, b, layout=layout)
    assert r.out.shape == (M, N) and r.pre_gelu is None


def test_gemm_wrong_rank():
    a, b = stored("TN")
    with raises(r"a must be 2-D, got shape \(8,\)"):
        tealite.gemm(t(K), b)
    with raises(r"b must be 2-D, got shape \(2, 5, 8\)"):
        tealite.gemm(a, t(2, M, K))
    with raises(r"a must be 2-D, got shape \(\)"):
        tealite.gemm(torch.tensor(1.0), b)


def test_gemm_non_tensor():
    a, b = stored("TN")
    with raises(r"a must be a torch.Tensor, got ndarray"):
        tealite.gemm(np.ones((N, K), np.float32), b)
    with raises(r"b must be a torch.Tensor, got list"):
        tealite.gemm(a, [[1.0] * K] * M)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_k_mismatch_names_k_and_both_shapes(layout):
    a, b = stored(layout, k_a=K, k_b=K + 1)
    pattern = (rf"contraction dims differ under layout {layout}: "
               rf"a gives K={K} \(a shape {esc(str(tuple(a.shape)))}\), "
               rf"b gives K={K + 1} \(b shape {esc(str(tuple(b.shape)))}\)")
    with raises(pattern):
        tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_wrong_layout_for_shapes_is_not_silently_transposed(layout):
    # Operands stored for another layout must fail under this one (M, N, K all differ, so
    # no two layouts accept the same stored shapes).
    for other in LAYOUTS:
        if other == layout:
            continue
        a, b = stored(other)
        with raises("contraction dims differ"):
            tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("bad", [torch.int32, torch.float64, torch.int8, torch.complex64])
@pytest.mark.parametrize("which", ["a", "b"])
def test_gemm_unsupported_dtype(which, bad):
    a, b = stored("TN")
    if which == "a":
        a = a.to(bad)
    else:
        b = b.to(bad)
    name = str(bad).removeprefix("torch.")
    with raises(rf"{which} dtype must be one of \(float32, bfloat16, float16\), got {name}"):
        tealite.gemm(a, b)


def test_gemm_ab_dtype_mismatch():
    a, b = stored("TN")
    with raises(r"a and b must share a dtype, got a torch.float32 and b torch.bfloat16"):
        tealite.gemm(a, b.to(BF16))


@pytest.mark.parametrize("layout", ["tn", "XN", "T", "TNN", "", None, ("T", "N")])
def test_gemm_bad_layout(layout):
    a, b = stored("TN")
    with raises(r"layout must be one of \('TN', 'NN', 'NT', 'TT'\), got " + esc(repr(layout))):
        tealite.gemm(a, b, layout=layout)


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.int32, torch.float8_e4m3fn,
                                       "float32", F32.itemsize])
def test_gemm_bad_out_dtype(out_dtype):
    a, b = stored("TN")
    with raises(r"out_dtype must be one of \(float32, bfloat16, float16\), got "):
        tealite.gemm(a, b, out_dtype=out_dtype)


def test_gemm_string_out_dtype_message_is_unambiguous():
    a, b = stored("TN")
    with raises(r"out_dtype must be one of \(float32, bfloat16, float16\), got 'float32'"):
        tealite.gemm(a, b, out_dtype="float32")


@pytest.mark.parametrize("shape", [(N + 1,), (1,), (N - 1,), (1, N), (M, N), (K,)], ids=str)
def test_gemm_bias_wrong_shape(shape):
    a, b = stored("TN", dtype=BF16)
    bias = t(*shape, dtype=BF16)
    if len(shape) != 1:
        match = rf"bias must be 1-D, got shape {esc(str(shape))}"
    else:
        match = (rf"bias must have shape \({N},\) \(one value per output column N\), "
                 rf"got {esc(str(shape))}")
    with raises(match):
        tealite.gemm(a, b, bias=bias)


@pytest.mark.parametrize("bias_dtype", [F32, F16, torch.float64, torch.int32])
def test_gemm_bias_wrong_dtype(bias_dtype):
    a, b = stored("TN", dtype=BF16)
    name = str(bias_dtype).removeprefix("torch.")
    with raises(rf"bias dtype must be one of \(bfloat16\), got {name}"):
        tealite.gemm(a, b, bias=t(N, dtype=bias_dtype))


@pytest.mark.parametrize("shape", [(M, N + 1), (N, M), (1, N), (M, 1), (M * N,), (1, M, N)],
                         ids=str)
@pytest.mark.parametrize("layout", ["TN", "NT"])
def test_gemm_out_wrong_shape(layout, shape):
    a, b = stored(layout)
    out = t(*shape)
    if len(shape) != 2:
        match = rf"out must be 2-D, got shape {esc(str(shape))}"
    else:
        match = (rf"out must have shape \({M}, {N}\) \(\(M, N\) for layout {layout}\), "
                 rf"got {esc(str(shape))}")
    with raises(match):
        tealite.gemm(a, b, layout=layout, out=out, beta=1.0)


def test_gemm_out_wrong_dtype():
    a, b = stored("TN", dtype=BF16)
    with raises(r"out dtype must be one of \(bfloat16\), got float32"):
        tealite.gemm(a, b, out=t(M, N))  # out_dtype defaults to a's dtype
    with raises(r"out dtype must be one of \(float32\), got bfloat16"):
        tealite.gemm(a, b, out=t(M, N, dtype=BF16), out_dtype=F32)


@pytest.mark.parametrize("beta", [1.0, -0.5, 1e-30, 1])
def test_gemm_beta_without_out(beta):
    a, b = stored("TN")
    with raises(r"beta != 0 needs out= holding the prior output"):
        tealite.gemm(a, b, beta=beta)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_gemm_non_finite_scalars(name, value):
    a, b = stored("TN")
    with raises(rf"{name} must be finite, got {value}"):
        tealite.gemm(a, b, out=t(M, N), **{name: value})


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", ["1.0", True, None, torch.tensor(1.0), 1 + 0j],
                         ids=["str", "bool", "None", "tensor", "complex"])
def test_gemm_non_number_scalars(name, value):
    a, b = stored("TN")
    with raises(rf"{name} must be a Python float, got {type(value).__name__}"):
        tealite.gemm(a, b, out=t(M, N), **{name: value})


def test_gemm_huge_int_alpha_is_an_argument_error():
    a, b = stored("TN")
    with raises(r"alpha must be finite"):
        tealite.gemm(a, b, alpha=10**400)


@pytest.mark.parametrize("gelu", [1, 0, None, "yes", np.bool_(True)], ids=repr)
def test_gemm_gelu_must_be_bool(gelu):
    a, b = stored("TN")
    with raises(r"gelu must be a bool, got "):
        tealite.gemm(a, b, gelu=gelu)


@pytest.mark.parametrize("which", ["a", "b", "bias", "out"])
def test_gemm_mixed_devices(which):
    a, b = stored("TN")
    kw = {"a": a, "b": b, "bias": t(N), "out": t(M, N)}
    kw[which] = kw[which].to("meta")
    with raises(rf"all tensors must be on one device; got .*{which} on meta"):
        tealite.gemm(kw.pop("a"), kw.pop("b"), beta=1.0, **kw)
    # The message lists every tensor's device, the CPU ones too.
    with raises(r"all tensors must be on one device; got a on cpu, b on meta"):
        tealite.gemm(a, b.to("meta"))


# ---- norms ----------------------------------------------------------------------------------

H = 16
X_SHAPE = (3, 4, H)
ROWS = X_SHAPE[:-1]


def ln_fwd(x=None, gamma=None, beta=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    gamma = t(H) if gamma is None else gamma
    beta = t(*gamma.shape, dtype=gamma.dtype) if beta is None else beta
    return tealite.layernorm_fwd(x, gamma, beta, **kw)


def rms_fwd(x=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    gamma = t(H) if gamma is None else gamma
    return tealite.rmsnorm_fwd(x, gamma, **kw)


def ln_bwd(dy=None, x=None, mean=None, rsigma=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    return tealite.layernorm_bwd(t(*x.shape, dtype=x.dtype) if dy is None else dy, x,
                                 t(*x.shape[:-1]) if mean is None else mean,
                                 t(*x.shape[:-1]) if rsigma is None else rsigma,
                                 t(*x.shape[-1:]) if gamma is None else gamma, **kw)


def rms_bwd(dy=None, x=None, rsigma=None, gamma=None, **kw):
    x = t(*X_SHAPE) if x is None else x
    return tealite.rmsnorm_bwd(t(*x.shape, dtype=x.dtype) if dy is None else dy, x,
                               t(*x.shape[:-1]) if rsigma is None else rsigma,
                               t(*x.shape[-1:]) if gamma is None else gamma, **kw)


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


# ---- validation precedes dispatch -----------------------------------------------------------

def test_argument_errors_win_over_backend_errors():
    # A bad argument is reported as such even when the backend name is bogus too.
    with raises("layout must be one of"):
        tealite.gemm(t(N, K), t(M, K), layout="XX", backend="no-such-backend")
    with raises("eps must be > 0"):
        rms_fwd(eps=0.0, backend="no-such-backend")
    with raises("kind must be one of"):
        tealite.act_fwd(t(3, 8), "nope", backend="no-such-backend")


# ---- backend registry -----------------------------------------------------------------------

def _all_op_calls(dtype=F32, layout="TN"):
    """One valid call per front-end, as (op name, callable taking backend=)."""
    a, b = stored(layout, dtype=dtype)
    x = t(*X_SHAPE, dtype=dtype)
    return {
        "gemm": lambda be: tealite.gemm(a, b, layout=layout, backend=be),
        "layernorm_fwd": lambda be: ln_fwd(x=x, gamma=t(H, dtype=dtype),
                                           beta=t(H, dtype=dtype), backend=be),
        "layernorm_bwd": lambda be: ln_bwd(x=x, backend=be),
        "rmsnorm_fwd": lambda be: rms_fwd(x=x, backend=be),
        "rmsnorm_bwd": lambda be: rms_bwd(x=x, backend=be),
        "act_fwd": lambda be: tealite.act_fwd(t(3, 8, dtype=dtype), "gelu", backend=be),
        "act_bwd": lambda be: tealite.act_bwd(t(3, 8, dtype=dtype), t(3, 8, dtype=dtype),
                                              "gelu", backend=be),
        "dbias_dact": lambda be: tealite.dbias_dact(t(3, 8, dtype=dtype),
                                                    t(3, 8, dtype=dtype), "gelu", backend=be),
    }


OPS = list(_all_op_calls())


@pytest.fixture
def temp_backend():
    """Register temporary backends; always unregister them afterwards."""
    registry.load_plugins()
    names: list[str] = []

    def make(name, **kw) -> registry.Backend:
        backend = registry.Backend(name=name, **kw)
        registry.register_backend(backend)
        names.append(name)
        return backend

    try:
        yield make
    finally:
        for name in names:
            registry.unregister_backend(name)
        assert not set(names) & set(registry.backends())


def _delegate(op):
    """An implementation that forwards to the torch backend (so it returns real outputs)."""
    torch_impl = registry.get_backend("torch").impls[op]
    calls = []

    def fn(*args, **kwargs):
        calls.append(op)
        return torch_impl.fn(*args, **kwargs)

    return fn, calls


@pytest.mark.parametrize("op", OPS)
def test_unknown_backend_name(op):
    with pytest.raises(KeyError, match=r"no backend named 'no-such-backend'; registered: "
                                       r"\[.*'torch'.*\]"):
        _all_op_calls()[op]("no-such-backend")


@pytest.mark.parametrize("op", OPS)
def test_unavailable_backend_carries_probe_reason(temp_backend, op):
    backend = temp_backend("_t_unavailable", probe=lambda: "needs a frobnicator (none found)")
    fn, calls = _delegate(op)
    backend.implements(op)(fn)
    with pytest.raises(BackendUnavailable, match=r"backend '_t_unavailable' is unavailable: "
                                                 r"needs a frobnicator \(none found\)"):
        _all_op_calls()[op]("_t_unavailable")
    assert not calls
    # With backend=None the unavailable backend is skipped, not fatal.
    _all_op_calls()[op](None)
    assert not calls


def test_crashing_probe_is_a_reason(temp_backend):
    def probe():
        raise RuntimeError("driver exploded")

    backend = temp_backend("_t_crashing", probe=probe)
    backend.implements("gemm")(_delegate("gemm")[0])
    with pytest.raises(BackendUnavailable,
                       match=r"availability probe raised RuntimeError: driver exploded"):
        _all_op_calls()["gemm"]("_t_crashing")


@pytest.mark.parametrize("op", OPS)
def test_unsupported_dtype_carries_reason(temp_backend, op):
    backend = temp_backend("_t_fp32_only")
    fn, calls = _delegate(op)
    backend.implements(op, dtypes=[F32])(fn)
    with pytest.raises(UnsupportedCase, match=r"backend '_t_fp32_only' does not support "
                                              rf"{op} here: dtype bfloat16 not in \['float32'\]"):
        _all_op_calls(dtype=BF16)[op]("_t_fp32_only")
    assert not calls
    # The supported dtype really dispatches to it.
    with registry.trace() as records:
        _all_op_calls(dtype=F32)[op]("_t_fp32_only")
    assert calls == [op]
    assert [(r.backend, r.op) for r in records] == [("_t_fp32_only", op)]


def test_unsupported_layout_device_check_and_missing_op(temp_backend):
    backend = temp_backend("_t_picky")
    fn, _ = _delegate("gemm")
    backend.implements("gemm", layouts=["TN"],
                       check=lambda p: "K must be a multiple of 16" if p["k"] % 16 else None)(fn)
    calls = _all_op_calls(layout="NN")
    with pytest.raises(UnsupportedCase, match=r"layout NN not in \['TN'\]"):
        calls["gemm"]("_t_picky")
    with pytest.raises(UnsupportedCase, match=r"K must be a multiple of 16"):
        _all_op_calls(layout="TN")["gemm"]("_t_picky")  # K = 8
    with pytest.raises(UnsupportedCase, match=r"op act_fwd not implemented"):
        calls["act_fwd"]("_t_picky")

    gpu_only = temp_backend("_t_gpu_only")
    gpu_only.implements("act_fwd", devices=("cuda",))(_delegate("act_fwd")[0])
    with pytest.raises(UnsupportedCase, match=r"device cpu not in \['cuda'\]"):
        calls["act_fwd"]("_t_gpu_only")


def test_default_dispatch_reports_every_reason(temp_backend, monkeypatch):
    # Hide every real backend: with nothing capable, the error lists each candidate's reason.
    fn, _ = _delegate("gemm")
    monkeypatch.setattr(registry, "_BACKENDS", {})
    temp_backend("_t_a", probe=lambda: "no device")
    temp_backend("_t_b").implements("gemm", dtypes=[F16])(fn)
    with pytest.raises(UnsupportedCase, match=r"no backend supports gemm for this case: "
                                              r"_t_a: backend unavailable: no device; "
                                              r"_t_b: dtype float32 not in \['float16'\]"):
        _all_op_calls()["gemm"](None)


def test_register_backend_rejects_duplicates_and_non_backends(temp_backend):
    temp_backend("_t_dup")
    with pytest.raises(ValueError, match=r"a backend named '_t_dup' is already registered"):
        registry.register_backend(registry.Backend(name="_t_dup"))
    with pytest.raises(TypeError, match=r"backend must be a tealite.registry.Backend, got dict"):
        registry.register_backend({"name": "x"})
