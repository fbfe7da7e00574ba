"""Specs for LayerNorm / RMSNorm forward and backward, and the fused add + RMSNorm + pad.

Tolerances follow a first-order running-error analysis of the textbook fp32 algorithm
(mean, centered variance, rsqrt, scale): every bound is ``coefficient * magnitude`` where the
magnitude is the formula evaluated on absolute values, then the output rounding.  A safety
factor of 2 covers the dropped second-order terms.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.ops.norms import padded_hidden
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import norms as ref
from tealite_verify.references._device import namespace
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, from_bits, generate
from tealite_verify.tiers import primitives as fp
from tealite_verify.tiers import ulp
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Tier, combine_pair

_LIMITS = {"ci": (24, 320), "local": (128, 2048), "large": (4096, 8192)}
SAFETY = 2.0
F32 = torch.float32


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, rms: bool, bwd: bool):
    max_rows, max_hidden = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    case = {
        "shape": list(draw(row_shapes(max_rows=max_rows, max_hidden=max_hidden))),
        "dtype": dtype,
        "weight_dtype": draw(pick(dtype, "float32")),
        "zero_centered_gamma": draw(st.booleans()),
        "eps": draw(pick(1e-5, 1e-6, 1e-3)),
        "dist": draw(distributions(dtype)),
        "seed": draw(seeds()),
    }
    if not rms:
        # A large common offset makes fp32 centering lose bits: the hard case for LayerNorm.
        case["offset"] = draw(pick(0.0, 0.0, 3.0, 100.0))
    if bwd:
        case["dist_dy"] = draw(distributions(dtype, wide=False))
    return case


def _base_inputs(case, device, *, rms):
    dt, wdt = dtype_of(case["dtype"]), dtype_of(case["weight_dtype"])
    shape, s, hidden = case["shape"], case["seed"], case["shape"][-1]
    # Draw in x's dtype (so "tiny" means its subnormals), then add the offset and round again.
    x = generate(case["dist"], shape, dt, s).double() + case.get("offset", 0.0)
    inputs = {"x": x.to(dt).to(device)}
    wscale = 0.1 if case["zero_centered_gamma"] else 1.0
    inputs["gamma"] = generate({"kind": "normal", "scale": wscale}, (hidden,), wdt, s + 1, device)
    if not rms:
        inputs["beta"] = generate({"kind": "normal", "scale": 1.0}, (hidden,), wdt, s + 2, device)
    return inputs


def _with_stats(inputs, case, device, *, rms):
    """Backward inputs: dy plus the fp32 statistics of x (reference forward, rounded)."""
    x = inputs["x"].double().cpu().numpy()
    g = inputs["gamma"].double().cpu().numpy()
    zc = case["zero_centered_gamma"]
    if rms:
        _, rs = ref.rmsnorm_fwd(x, g, eps=case["eps"], zero_centered_gamma=zc)
    else:
        _, mean, rs = ref.layernorm_fwd(x, g, 0 * g, eps=case["eps"], zero_centered_gamma=zc)
        inputs["mean"] = torch.from_numpy(mean).to(F32).to(device)
    inputs["rsigma"] = torch.from_numpy(rs).to(F32).to(device)
    inputs["dy"] = generate(case["dist_dy"], case["shape"], dtype_of(case["dtype"]),
                            case["seed"] + 3, device)
    inputs.pop("beta", None)
    return inputs


def _reduction_gamma(n, numerics):
    return fp.gamma(n, fp.unit_roundoff(fp.compute_dtype(numerics))) if n > 0 else 0.0


def _u(numerics):
    return fp.unit_roundoff(fp.compute_dtype(numerics))


# The references' bounds below are written against the array namespace of their inputs
# (numpy, or torch float64 on the reference device: OpSpec.device_reference).

def _rows(a):
    return namespace(a).sum(a.reshape(-1, a.shape[-1]), axis=0)


def _numel(a) -> int:
    return math.prod(a.shape)


# ---- LayerNorm -------------------------------------------------------------------------

def ln_fwd_reference(x, case):
    g_eff = ref.effective_weight(x["gamma"], case["zero_centered_gamma"])
    y, mean, rs = ref.layernorm_fwd(x["x"], x["gamma"], x["beta"], eps=case["eps"],
                                    zero_centered_gamma=case["zero_centered_gamma"])
    xp = namespace(x["x"])
    hidden = x["x"].shape[-1]
    mean_abs = xp.mean(xp.abs(x["x"]), axis=-1)
    var = xp.mean((x["x"] - mean[..., None]) ** 2, axis=-1)
    xhat = (x["x"] - mean[..., None]) * rs[..., None]
    out_dt = dtype_of(case["dtype"])

    memo: dict = {}

    def parts(num):
        # Three outputs share one bound computation; it depends on the numerics only
        # through the compute dtype.
        key = str(fp.compute_dtype(num))
        if key not in memo:
            memo[key] = _ln_fwd_parts(num)
        return memo[key]

    def _ln_fwd_parts(num):
        u, gh = _u(num), _reduction_gamma(hidden, num)
        e_mean = SAFETY * ((gh + u) * mean_abs)
        rel_rs = SAFETY * (0.5 * (e_mean**2 / (var + case["eps"]) + gh + 3 * u) + 2 * u)
        e_xhat = e_mean[..., None] * rs[..., None] + xp.abs(xhat) * (rel_rs[..., None] + 2 * u)
        e_y = xp.abs(g_eff) * e_xhat + SAFETY * 2 * u * (xp.abs(xhat * g_eff) + xp.abs(x["beta"]))
        e_y = e_y + 8 * fp.underflow_error(fp.compute_dtype(num)) * rs[..., None] * (
            1.0 + xp.abs(g_eff))
        return e_mean, rel_rs, e_y

    return {
        "y": Expected(y, out_dt, Tier.ULP,
                      lambda n: ulp.with_output_rounding(y, parts(n)[2], out_dt)),
        "mean": Expected(mean, F32, Tier.ULP,
                         lambda n: ulp.with_output_rounding(mean, parts(n)[0], F32)),
        "rsigma": Expected(rs, F32, Tier.ULP,
                           lambda n: ulp.with_output_rounding(rs, parts(n)[1] * rs, F32)),
    }


def _ln_bwd_parts(x, case, *, rms):
    """Reference grads and their condition magnitudes, shared by LayerNorm/RMSNorm backward."""
    xp = namespace(x["x"])
    zc = case["zero_centered_gamma"]
    g_eff = ref.effective_weight(x["gamma"], zc)
    rs = x["rsigma"][..., None]
    xhat = (x["x"] - (0.0 if rms else x["mean"][..., None])) * rs
    gdy = xp.abs(x["dy"] * g_eff)
    mag_dx = rs * (gdy + xp.abs(xhat) * xp.mean(gdy * xp.abs(xhat), axis=-1, keepdims=True))
    if not rms:
        mag_dx = mag_dx + rs * xp.mean(gdy, axis=-1, keepdims=True)
    return mag_dx, _rows(xp.abs(x["dy"] * xhat)), _rows(xp.abs(x["dy"]))


def _bwd_underflow_scales(x, case, *, rms):
    """Multipliers applied after an underflowed product (g*dy, dy*xhat) in each gradient."""
    xp = namespace(x["x"])
    g = xp.abs(ref.effective_weight(x["gamma"], case["zero_centered_gamma"]))
    rs = x["rsigma"][..., None]
    xhat = xp.abs((x["x"] - (0.0 if rms else x["mean"][..., None])) * rs)
    amp_dx = rs * (1.0 + g) * (1.0 + xhat)
    amp_dg = _rows(1.0 + xhat) if _numel(xhat) else 1.0
    amp_db = float(_numel(xhat) // max(xhat.shape[-1], 1)) + 1.0
    return amp_dx, amp_dg, amp_db


def _bwd_expected(grads, mags, amps, names, out_dtypes, reductions):
    expected = {}
    for name, value, mag, amp, dt, red in zip(names, grads, mags, amps, out_dtypes, reductions):
        expected[name] = Expected(value, dt, Tier.ULP, (
            lambda n, v=value, m=mag, a=amp, d=dt, r=red: ulp.elementwise_tolerance(
                v, SAFETY * m, d, n, ops=8, reduction=r, underflow_scale=a)))
    return expected


def ln_bwd_reference(x, case):
    dx, dgamma, dbeta = ref.layernorm_bwd(x["dy"], x["x"], x["mean"], x["rsigma"], x["gamma"],
                                          zero_centered_gamma=case["zero_centered_gamma"])
    mags = _ln_bwd_parts(x, case, rms=False)
    hidden, rows = x["x"].shape[-1], _numel(x["x"]) // x["x"].shape[-1]
    dt, wdt = dtype_of(case["dtype"]), dtype_of(case["weight_dtype"])
    amps = _bwd_underflow_scales(x, case, rms=False)
    return _bwd_expected((dx, dgamma, dbeta), mags, amps, ("dx", "dgamma", "dbeta"),
                         (dt, wdt, wdt), (hidden, rows, rows))


def ln_fwd_call(inputs, case, backend):
    r = tealite.layernorm_fwd(inputs["x"], inputs["gamma"], inputs["beta"], eps=case["eps"],
                              zero_centered_gamma=case["zero_centered_gamma"], backend=backend)
    return r._asdict()


def ln_bwd_call(inputs, case, backend):
    r = tealite.layernorm_bwd(inputs["dy"], inputs["x"], inputs["mean"], inputs["rsigma"],
                              inputs["gamma"], zero_centered_gamma=case["zero_centered_gamma"],
                              backend=backend)
    return r._asdict()


# ---- RMSNorm ---------------------------------------------------------------------------

def rms_fwd_reference(x, case):
    y, rs = ref.rmsnorm_fwd(x["x"], x["gamma"], eps=case["eps"],
                            zero_centered_gamma=case["zero_centered_gamma"])
    xp = namespace(x["x"])
    hidden = x["x"].shape[-1]
    ms = xp.mean(x["x"] ** 2, axis=-1)
    out_dt = dtype_of(case["dtype"])

    def rel_rs(num):
        u, gh = _u(num), _reduction_gamma(hidden, num)
        return SAFETY * (0.5 * (gh + u) * ms / (ms + case["eps"]) + 2 * u)

    def y_bound(num):
        e_y = xp.abs(y) * (rel_rs(num)[..., None] + SAFETY * 3 * _u(num))
        e_y = e_y + 8 * fp.underflow_error(fp.compute_dtype(num)) * rs[..., None] * (
            1.0 + xp.abs(ref.effective_weight(x["gamma"], case["zero_centered_gamma"])))
        return ulp.with_output_rounding(y, e_y, out_dt)

    return {
        "y": Expected(y, out_dt, Tier.ULP, y_bound),
        "rsigma": Expected(rs, F32, Tier.ULP,
                           lambda n: ulp.with_output_rounding(rs, rel_rs(n) * rs, F32)),
    }


def rms_bwd_reference(x, case):
    dx, dgamma = ref.rmsnorm_bwd(x["dy"], x["x"], x["rsigma"], x["gamma"],
                                 zero_centered_gamma=case["zero_centered_gamma"])
    mag_dx, mag_dg, _ = _ln_bwd_parts(x, case, rms=True)
    hidden, rows = x["x"].shape[-1], _numel(x["x"]) // x["x"].shape[-1]
    dt, wdt = dtype_of(case["dtype"]), dtype_of(case["weight_dtype"])
    amps = _bwd_underflow_scales(x, case, rms=True)[:2]
    return _bwd_expected((dx, dgamma), (mag_dx, mag_dg), amps, ("dx", "dgamma"), (dt, wdt),
                         (hidden, rows))


def rms_fwd_call(inputs, case, backend):
    r = tealite.rmsnorm_fwd(inputs["x"], inputs["gamma"], eps=case["eps"],
                            zero_centered_gamma=case["zero_centered_gamma"], backend=backend)
    return r._asdict()


def rms_bwd_call(inputs, case, backend):
    r = tealite.rmsnorm_bwd(inputs["dy"], inputs["x"], inputs["rsigma"], inputs["gamma"],
                            zero_centered_gamma=case["zero_centered_gamma"], backend=backend)
    return r._asdict()


def _smoke(shape, dtype, **kw):
    case = {"shape": shape, "dtype": dtype, "weight_dtype": dtype, "zero_centered_gamma": False,
            "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0}, "seed": 7,
            "dist_dy": {"kind": "normal", "scale": 1.0}}
    case.update(kw)
    return case


_SMOKE = (_smoke([5, 4, 160], "bfloat16"), _smoke([217, 256], "float16",
                                                  zero_centered_gamma=True),
          _smoke([0, 128], "float32"), _smoke([3, 1481], "float32", weight_dtype="float32"))

_COVERAGE = (cov.layout_cells("zero_centered_gamma", (True, False))
             + cov.layout_cells("weight_dtype", ("float32",)) + cov.edge_cells(cov.FLOAT_EDGES))

for _name, _rms, _bwd, _ref, _call in (
        (Op.LAYERNORM_FWD, False, False, ln_fwd_reference, ln_fwd_call),
        (Op.LAYERNORM_BWD, False, True, ln_bwd_reference, ln_bwd_call),
        (Op.RMSNORM_FWD, True, False, rms_fwd_reference, rms_fwd_call),
        (Op.RMSNORM_BWD, True, True, rms_bwd_reference, rms_bwd_call)):
    def _make(case, device, _rms=_rms, _bwd=_bwd):
        inputs = _base_inputs(case, device, rms=_rms)
        return _with_stats(inputs, case, device, rms=_rms) if _bwd else inputs

    def _cases(dtype=None, size="ci", _rms=_rms, _bwd=_bwd):
        return cases(dtype, size, rms=_rms, bwd=_bwd)

    register(OpSpec(name=_name, family="norms", cases=_cases, make_inputs=_make, call=_call,
                    reference=_ref, device_reference=True,
                    smoke_cases=tuple(dict(c, offset=0.0) if not _rms else c for c in _SMOKE),
                    coverage=_COVERAGE))



# ---- fused add + RMSNorm + pad -----------------------------------------------------------
#
# y: the RMSNorm bound above applied to r = x + residual, plus the fp32 add's rounding of
# each r_i (relative u: u on y directly, 2u on mean(r^2), so u on rsigma).  The padded
# columns are judged exactly: 0, or NaN in a row holding a NaN where the backend declares
# ``pad_nan_rows`` (it computes them as 0 * rsigma * 0).
#
# residual_out = round_R(fl32(x + residual)), R the residual's dtype: exact against the
# correctly rounded sum (references.norms.round_once).  With R = float32 there is one
# rounding.  With R = bf16 / fp16 the residual, and so x (the front end allows a residual in
# x's dtype or float32), are bf16 / fp16: a sum of two p-bit numbers (p = 8 / 11) rounded
# to float32 (24 bits >= 2p + 2) and then to p bits is correctly rounded (double rounding is
# innocuous for +: Figueroa, "When is double rounding innocuous?", 1995; bf16 shares fp32's
# exponent range, and fp16's subnormal and overflow thresholds lie on float32's grid).

PAD_MULTIPLES = (0, 1, 16, 128, 3, 24, 100)  # none, trivial, aligned, and ones that do not divide


@st.composite
def add_pad_cases(draw, dtype: str | None = None, size: str = "ci"):
    max_rows, max_hidden = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    residual = draw(pick("same", "float32", None))
    return {
        "shape": list(draw(row_shapes(max_rows=max_rows, max_hidden=max_hidden))),
        "dtype": dtype,
        "weight_dtype": draw(pick(dtype, "float32")),
        "residual_dtype": dtype if residual == "same" else residual,
        "pad_to_multiple": draw(pick(*PAD_MULTIPLES)),
        "eps": draw(pick(1e-5, 1e-6, 1e-3)),
        "dist": draw(distributions(dtype)),
        "dist_res": draw(distributions(dtype)),
        "seed": draw(seeds()),
    }


def add_pad_inputs(case, device):
    shape, s, hidden = case["shape"], case["seed"], case["shape"][-1]
    inputs = {"x": generate(case["dist"], shape, dtype_of(case["dtype"]), s, device),
              "weight": generate({"kind": "normal", "scale": 1.0}, (hidden,),
                                 dtype_of(case["weight_dtype"]), s + 1, device)}
    if case["residual_dtype"] is not None:
        inputs["residual"] = generate(case["dist_res"], shape,
                                      dtype_of(case["residual_dtype"]), s + 2, device)
    return inputs


def _hidden_out(case) -> int:
    return padded_hidden(case["shape"][-1], case["pad_to_multiple"])


def _pad_expected(r, hidden_out: int, out_dt: torch.dtype) -> Expected:
    nan_rows = np.isnan(r).any(axis=-1, keepdims=True) if r.size else \
        np.zeros((*r.shape[:-1], 1), dtype=bool)
    pad_shape = (*r.shape[:-1], hidden_out - r.shape[-1])

    def want(numerics) -> torch.Tensor:
        nan = bool(getattr(numerics, "pad_nan_rows", False))
        values = np.where(nan & nan_rows, np.nan, 0.0) * np.ones(pad_shape)
        return torch.from_numpy(values).to(out_dt)  # 0 and NaN: exact in every dtype

    def check(outs, numerics=None):
        return compare_exact(outs["y_pad"], want(numerics))

    def pair(ox, oy, nx=None, ny=None):
        return combine_pair(check(ox, nx), check(oy, ny), Tier.EXACT_PAIR)
    return Expected(None, out_dt, Tier.EXACT, check=check, check_pair=pair)


def add_pad_reference(x, case):
    res_dt = case["residual_dtype"]
    with np.errstate(invalid="ignore"):  # NaN / Inf rows (the gate's non-finite edge class)
        y, r, res_out = ref.add_rmsnorm_pad(x["x"], x["weight"], eps=case["eps"],
                                            residual=x.get("residual"),
                                            hidden_out=_hidden_out(case),
                                            residual_dtype=res_dt)
        ms = np.mean(r * r, axis=-1)
        rs = 1.0 / np.sqrt(ms + case["eps"])
    hidden = x["x"].shape[-1]
    y = y[..., :hidden]
    out_dt = dtype_of(case["dtype"])

    def y_bound(num):
        u, gh = _u(num), _reduction_gamma(hidden, num)
        u_add = u if res_dt is not None else 0.0
        with np.errstate(invalid="ignore"):
            rel_rs = SAFETY * (0.5 * (gh + u + 2 * u_add) * ms / (ms + case["eps"]) + 2 * u)
        e_y = np.abs(y) * (rel_rs[..., None] + SAFETY * (3 * u + u_add))
        e_y = e_y + 8 * fp.underflow_error(fp.compute_dtype(num)) * rs[..., None] * (
            1.0 + np.abs(x["weight"]))
        with np.errstate(invalid="ignore"):
            bound = ulp.with_output_rounding(y, e_y, out_dt)
        # A row holding an Inf has mean(r^2) = Inf and rsigma = 0: its finite elements are
        # exactly (signed) 0 and their bound (Inf / Inf terms) is NaN; demand the 0.
        return np.where(np.isnan(bound), 0.0, bound)

    expected = {"y": Expected(y, out_dt, Tier.ULP, y_bound),
                "y_pad": _pad_expected(r, _hidden_out(case), out_dt)}
    if res_dt is not None:
        expected["residual_out"] = Expected(from_bits(res_out, dtype_of(res_dt)),
                                            dtype_of(res_dt), Tier.EXACT)
    return expected


def add_pad_call(inputs, case, backend):
    r = tealite.add_rmsnorm_pad(inputs["x"], inputs["weight"], eps=case["eps"],
                                residual=inputs.get("residual"),
                                pad_to_multiple=case["pad_to_multiple"], backend=backend)
    hidden = inputs["x"].shape[-1]
    # The real columns and the padding are judged by different tiers; a wrong width shows
    # as a shape error of one of the two.
    out = {"y": r.y[..., :hidden], "y_pad": r.y[..., hidden:]}
    if case["residual_dtype"] is not None:
        out["residual_out"] = r.residual_out
    return out


def _add_smoke(shape, dtype, pad, residual_dtype, **kw):
    case = {"shape": shape, "dtype": dtype, "weight_dtype": dtype, "residual_dtype": residual_dtype,
            "pad_to_multiple": pad, "eps": 1e-5, "dist": {"kind": "normal", "scale": 1.0},
            "dist_res": {"kind": "normal", "scale": 1.0}, "seed": 11}
    case.update(kw)
    return case


register(OpSpec(
    name=Op.ADD_RMSNORM_PAD, family="norms", cases=add_pad_cases, make_inputs=add_pad_inputs,
    call=add_pad_call, reference=add_pad_reference,
    smoke_cases=(_add_smoke([5, 4, 160], "bfloat16", 128, "bfloat16"),
                 _add_smoke([7, 131], "float16", 16, "float32", weight_dtype="float32"),
                 _add_smoke([3, 37], "float32", 0, None),
                 _add_smoke([0, 100], "float32", 3, "float32"),
                 _add_smoke([2, 13], "float16", 1, None)),
    coverage=(cov.layout_cells("residual_dtype", (None, "float32"))
              + cov.layout_cells("pad_to_multiple", (0, 1, 16, 128, 24))
              + cov.edge_cells(cov.FLOAT_EDGES))))
