"""Specs for activations (forward, backward, fused dbias + dact), every kind.

Each kind has a condition magnitude: the derivative-free running-error bound of evaluating its
formula in the compute dtype, i.e. the formula on absolute values plus the error that a rounded
argument causes through exp/erf/tanh.  Cancellation (1 + erf(x/sqrt2) for x << 0, the
1 - sigmoid(x) term in silu') therefore widens the bound exactly where fp32 loses bits.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

import tealite
from tealite.ops.activations import GATED, KINDS, POINTWISE, output_shape
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import activations as ref
from tealite_verify.references._device import namespace
from tealite_verify.references._special import SQRT_2_OVER_PI, normal_pdf, sigmoid
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import ulp
from tealite_verify.tiers.metrics import Tier

_LIMITS = {"ci": (24, 256), "local": (128, 2048), "large": (1024, 4096)}
OPS = 8  # rounded operations per element in any kind's formula (generous)


# The bounds below are written against the array namespace of x (numpy, or torch float64 on
# the reference device: see OpSpec.device_reference), like the references they accompany.

def fwd_magnitude(kind, x):
    xp = namespace(x)
    ax = xp.abs(x)
    if kind == "gelu":
        return ax
    if kind == "gelu_tanh":
        inner = SQRT_2_OVER_PI * (x + ref.GELU_TANH_C * x**3)
        return ax * (1.0 + xp.abs(inner) * (1.0 - xp.tanh(inner) ** 2))
    if kind in ("silu", "qgelu"):
        a = 1.0 if kind == "silu" else ref.QGELU_ALPHA
        s = sigmoid(a * x)
        return ax * s * (1.0 + a * ax * (1.0 - s))
    if kind == "srelu":
        return xp.where(x > 0, x * x, 0.0)
    if kind == "relu":
        return xp.zeros_like(x)
    raise KeyError(kind)


def bwd_magnitude(kind, x):
    """Magnitude of the derivative's evaluation (multiply by |dy| for dx)."""
    xp = namespace(x)
    ax = xp.abs(x)
    if kind == "gelu":
        return 1.0 + ax * normal_pdf(x) * (1.0 + x * x)
    if kind == "gelu_tanh":
        poly = 1.0 + 3.0 * ref.GELU_TANH_C * x * x
        inner = SQRT_2_OVER_PI * (x + ref.GELU_TANH_C * x**3)
        t = xp.tanh(inner)
        return 1.0 + ax * SQRT_2_OVER_PI * poly * (1.0 + xp.abs(inner) * (1.0 - t * t)) + \
            xp.abs(inner) * (1.0 - t * t)
    if kind in ("silu", "qgelu"):
        a = 1.0 if kind == "silu" else ref.QGELU_ALPHA
        s = sigmoid(a * x)
        return s + a * ax * s * (1.0 + (1.0 - s) * (1.0 + a * ax))
    if kind == "srelu":
        return xp.where(x > 0, 2.0 * ax, 0.0)
    if kind == "relu":
        return xp.zeros_like(x)
    raise KeyError(kind)


def _split(x):
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


def act_fwd_magnitude(kind, x):
    if kind in GATED:
        a, b = _split(x)
        return fwd_magnitude(GATED[kind], a) * namespace(x).abs(b)
    return fwd_magnitude(kind, x)


def act_bwd_magnitude(kind, dy, x):
    xp = namespace(x)
    if kind in GATED:
        base = GATED[kind]
        a, b = _split(x)
        f_abs = xp.abs(ref.POINTWISE[base][0](a))
        mag_a = xp.abs(dy) * (bwd_magnitude(base, a) * xp.abs(b))
        mag_b = xp.abs(dy) * (fwd_magnitude(base, a) + f_abs)
        return xp.concatenate([mag_a, mag_b], axis=-1)
    return xp.abs(dy) * bwd_magnitude(kind, x)


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, bwd: bool, kinds=KINDS):
    max_rows, max_hidden = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    kind = draw(pick(*kinds))
    shape = list(draw(row_shapes(max_rows=max_rows, max_hidden=max_hidden)))
    if kind in GATED:
        shape[-1] = 2 * max(1, shape[-1] // 2)
    case = {"kind": kind, "shape": shape, "dtype": dtype, "dist": draw(distributions(dtype)),
            "seed": draw(seeds())}
    if bwd:
        case["dist_dy"] = draw(distributions(dtype, wide=False))
    return case


def make_inputs(case, device):
    dt = dtype_of(case["dtype"])
    inputs = {"x": generate(case["dist"], case["shape"], dt, case["seed"], device)}
    if "dist_dy" in case:
        inputs["dy"] = generate(case["dist_dy"], output_shape(case["shape"], case["kind"]), dt,
                                case["seed"] + 1, device)
    return inputs


def underflow_scale(kind, x):
    """What an underflowed intermediate (sigmoid(x) ~ e^x, Phi(x)) is multiplied by later."""
    xp = namespace(x)
    if kind in GATED:
        a, b = _split(x)
        amp = 1.0 + xp.abs(a)
        return xp.concatenate([amp * (1.0 + xp.abs(b)), amp], axis=-1)
    return 1.0 + xp.abs(x)


def _expected(value, mag, dt, reduction=0, amp=1.0):
    return Expected(value, dt, Tier.ULP, lambda n: ulp.elementwise_tolerance(
        value, mag + namespace(value).abs(value), dt, n, ops=OPS, reduction=reduction,
        underflow_scale=amp))


def fwd_reference(x, case):
    y = ref.act_fwd(x["x"], case["kind"])
    amp = underflow_scale(case["kind"], x["x"])
    if case["kind"] in GATED:
        amp = amp[..., : y.shape[-1]]
    return {"y": _expected(y, act_fwd_magnitude(case["kind"], x["x"]), dtype_of(case["dtype"]),
                           amp=amp)}


def bwd_reference(x, case):
    dx = ref.act_bwd(x["dy"], x["x"], case["kind"])
    mag = act_bwd_magnitude(case["kind"], x["dy"], x["x"])
    amp = _dx_underflow_scale(case["kind"], x)
    return {"dx": _expected(dx, mag, dtype_of(case["dtype"]), amp=amp)}


def _dx_underflow_scale(kind, x):
    xp = namespace(x["dy"])
    dy_abs = xp.abs(x["dy"])
    if kind in GATED:
        dy_abs = xp.concatenate([dy_abs, dy_abs], axis=-1)
    return underflow_scale(kind, x["x"]) * (1.0 + dy_abs)


def dbias_reference(x, case):
    dx, dbias = ref.dbias_dact(x["dy"], x["x"], case["kind"])
    dt = dtype_of(case["dtype"])
    mag = act_bwd_magnitude(case["kind"], x["dy"], x["x"])
    xp = namespace(dx)
    rows = math.prod(dx.shape) // dx.shape[-1] if dx.shape[-1] else 0
    mag_bias = xp.sum((mag + xp.abs(dx)).reshape(-1, dx.shape[-1]), axis=0)
    amp = _dx_underflow_scale(case["kind"], x)
    amp_bias = xp.sum(amp.reshape(-1, dx.shape[-1]), axis=0) if rows else 1.0
    return {"dx": _expected(dx, mag, dt, amp=amp),
            "dbias": _expected(dbias, mag_bias, dt, rows, amp=amp_bias)}


def _smoke(kind, shape, dtype):
    return {"kind": kind, "shape": shape, "dtype": dtype,
            "dist": {"kind": "normal", "scale": 2.0}, "seed": 11,
            "dist_dy": {"kind": "normal", "scale": 1.0}}


_SMOKE = tuple(_smoke(k, [7, 64], dt) for k, dt in zip(
    KINDS, ["bfloat16", "float16", "float32"] * 4))

register(OpSpec(
    name=Op.ACT_FWD, family="activations", cases=lambda dtype=None, size="ci": cases(
        dtype, size, bwd=False), make_inputs=make_inputs,
    call=lambda i, c, b: {"y": tealite.act_fwd(i["x"], c["kind"], backend=b)},
    reference=fwd_reference, smoke_cases=_SMOKE, device_reference=True,
    coverage=cov.layout_cells("kind", KINDS) + cov.edge_cells(cov.FLOAT_EDGES)))

register(OpSpec(
    name=Op.ACT_BWD, family="activations", cases=lambda dtype=None, size="ci": cases(
        dtype, size, bwd=True), make_inputs=make_inputs,
    call=lambda i, c, b: {"dx": tealite.act_bwd(i["dy"], i["x"], c["kind"], backend=b)},
    reference=bwd_reference, smoke_cases=_SMOKE, device_reference=True,
    coverage=cov.layout_cells("kind", KINDS) + cov.edge_cells(cov.FLOAT_EDGES)))

register(OpSpec(
    name=Op.DBIAS_DACT, family="activations", cases=lambda dtype=None, size="ci": cases(
        dtype, size, bwd=True, kinds=POINTWISE), make_inputs=make_inputs,
    call=lambda i, c, b: tealite.dbias_dact(i["dy"], i["x"], c["kind"], backend=b)._asdict(),
    reference=dbias_reference, smoke_cases=tuple(s for s in _SMOKE if s["kind"] in POINTWISE),
    device_reference=True,
    coverage=cov.layout_cells("kind", POINTWISE) + cov.edge_cells(cov.FLOAT_EDGES)))
