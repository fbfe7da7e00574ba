"""Specs for ``quantize`` (every recipe, rowwise / columnwise / both), ``dequantize`` and
``amax``.  Codes and scales are judged bit-exactly; MX scales under the e8m0-adjusted tier
(tolerance_quant), with codes re-quantized under the backend's own scales.

Declared numerics this spec reads (quantize):

``fp32_div_ulps`` (int, default 0)
    For current scaling under AITER's rule (``scale_rule`` "amax/fmax"): the error bound, in
    ulps, of the backend's fp32 divisions amax / max and 1 / scale_inv (0: IEEE-rounded; 2:
    CUDA's ``div.full.f32``, what Triton's ``/`` compiles to).  With a bound, scale_inv must
    lie within it of amax / max, and every code must be the cast of x * r for an fp32 r
    within the bound of 1 / (the backend's own scale_inv): the codes are re-quantized under
    the kernel's scale, as for MX, with the reciprocal's documented error as the only slack.
``mx_nonfinite`` ("nan-scale" default | "ignore-nan")
    How MX blocks holding NaN / Inf are encoded: "nan-scale" (OCP, TE: scale byte 0xFF,
    codes unspecified) or "ignore-nan" (AITER's Triton MXFP4: NaN left out of the block amax,
    an Inf amax takes byte 0xFE, NaN and Inf elements encode as +-max; see
    references.quantize.mx_scales_nan_ignoring).  The reference follows the declared policy
    (no slack): a backend declaring another policy than its kernel follows fails.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.formats import get_format
from tealite.ops.quantize import QuantizedTensor
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import tolerance, tolerance_quant
from tealite_verify.references import quantize as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import (AITER_RULE, FP8_SCALE_RULES, aiter_recipes,
                                               recipe_from_json, recipes)
from tealite_verify.strategies.shapes import dim, row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate

_LIMITS = {"ci": 160, "local": 600, "large": 4096}
U8 = torch.uint8


@functools.lru_cache(maxsize=None)
def _distributions(fmt: str, dtype: str) -> st.SearchStrategy[dict]:
    """Values for quantizing to ``fmt``: exact codes, ties and scale boundaries half the time."""
    edges = st.just({"kind": "quant_edges", "fmt": fmt, "block": 32})
    specials = st.builds(lambda f: {"kind": "specials", "frac": f,
                                         "sample_dtype": "float32"}, pick(0.01, 0.2))
    return st.one_of(edges, edges, specials, distributions(dtype))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    dtype = dtype or draw(float_dtypes())
    # A third of the cases use exactly the conventions AITER's quant entry points follow,
    # rowwise and in whole MX blocks (what they accept); the rest every recipe, both scale
    # rules, every direction.
    aiter_shaped = draw(pick(False, False, True))
    recipe = draw(aiter_recipes() if aiter_shaped else recipes(scale_rules=FP8_SCALE_RULES))
    limit = _LIMITS[size]
    rowwise, columnwise = (True, False) if aiter_shaped else \
        draw(pick((True, False), (False, True), (True, True)))
    pad = False
    m, k = draw(dim(limit, allow_zero=True)), draw(dim(limit))
    if recipe["kind"] == "mx":
        pad = False if aiter_shaped else draw(st.booleans())
        if not pad:  # the blocked dims must be whole blocks (and even for e2m1)
            k = 32 * max(1, k // 32) if rowwise else k
            m = 32 * max(0 if not columnwise else 1, m // 32) if columnwise else m
    dist = draw(_distributions(recipe["fmt"], dtype))
    return {"recipe": recipe, "dtype": dtype, "shape": [m, k], "rowwise": rowwise,
            "columnwise": columnwise, "pad": pad, "dist": dist, "seed": draw(seeds())}


def make_inputs(case, device):
    x = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    inputs = {"x": x}
    if case["recipe"]["kind"] == "delayed":
        inputs["scale"] = torch.tensor([case["recipe"]["scale"]], dtype=torch.float32,
                                       device=device)
    return inputs


def call(inputs, case, backend):
    q = tealite.quantize(inputs["x"], recipe_from_json(case["recipe"]), rowwise=case["rowwise"],
                         columnwise=case["columnwise"], scale=inputs.get("scale"),
                         pad=case["pad"], backend=backend)
    out = {"data": q.data, "scale_inv": q.scale_inv, "columnwise_data": q.columnwise_data,
           "columnwise_scale_inv": q.columnwise_scale_inv, "amax": q.amax}
    return {k: v for k, v in out.items() if v is not None}


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def _codes(outputs, name, fmt, n):
    """Unpacked code bits (rows, n) of a backend's data, or the reason it is malformed: the
    storage dtype must be the format's (dequantize reads it so) and e2m1 exactly ceil(n/2)
    bytes per row."""
    data = outputs[name]
    want = get_format(fmt).torch_dtype or U8
    if data.dtype != want:
        return f"{name} dtype {data.dtype} != {want} for {fmt}"
    if fmt == "e2m1":
        if data.shape[-1] != -(-n // 2):
            return f"{name} has {data.shape[-1]} bytes per row, want ceil({n}/2)"
        return ref.unpack_e2m1(_np(data), n)
    return _np(data.view(U8))


def _malformed(reason: str) -> tolerance.Metrics:
    return tolerance.Metrics("malformed", 0, 0, np.inf, np.inf, shape_error=reason)


_NAN_SCALE, _IGNORE_NAN = "nan-scale", "ignore-nan"


def _mx_policy(numerics) -> str:
    policy = numerics.mx_nonfinite or _NAN_SCALE
    if policy not in (_NAN_SCALE, _IGNORE_NAN):
        raise ValueError(f"unknown mx_nonfinite policy {policy!r}")
    return policy


def _excuse(m: tolerance.Metrics, n: int, why: str) -> tolerance.Metrics:
    return dataclasses.replace(m, excused=m.excused + n, note=why) if n else m


def _mx_codes_under(codes, scales, x, fmt, er, policy, tie_ok) -> tolerance.Metrics:
    """check_mx_codes under a nonfinite policy: with "ignore-nan" a NaN element must encode
    as max (its sign bit is not a value: NaN has no sign to keep), i.e. as +Inf would."""
    if policy == _IGNORE_NAN:
        nan = np.isnan(x)
        sign = 0x08 if fmt == "e2m1" else 0x80
        codes = np.where(nan, codes & ~np.uint8(sign), codes).astype(np.uint8)
        x = np.where(nan, np.float32(np.inf), x).astype(np.float32)
    return tolerance_quant.check_mx_codes(codes, scales, x, fmt, er, tie_tolerant=tie_ok)


def _nonfinite_blocks(x, block: int = 32) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(tolerance_quant.block_amax(np.where(np.isinf(x), np.nan, x), block))


def _mx_expected(x, prefix, r) -> dict:
    """Expected entries for one direction (x is already transposed for columnwise)."""
    fmt, mode, er = r["fmt"], r["scale_rounding"], r["element_rounding"]
    bits, scales = ref.mx_quantize(x, fmt, mode, er)
    k = x.shape[1]
    dname, sname = f"{prefix}data", f"{prefix}scale_inv"
    packed = ref.pack_e2m1(bits) if fmt == "e2m1" else bits
    ignoring, undefined = ref.mx_scales_nan_ignoring(x, fmt, mode)

    def check_scales(outs, numerics):
        got = _np(outs[sname])
        if _mx_policy(numerics) == _NAN_SCALE:
            return tolerance_quant.check_mx_scales(got, scales, x, fmt, mode)
        if got.shape != ignoring.shape:
            return tolerance_quant.check_mx_scales(got, ignoring, x, fmt, mode)
        want = np.where(undefined, got, ignoring)  # an all-NaN block's byte is undefined
        return _excuse(tolerance_quant.check_mx_scales(got, want, x, fmt, mode),
                       int(undefined.sum()), "scales of all-NaN blocks are undefined")

    def check_codes(outs, numerics):
        codes = _codes(outs, dname, fmt, k)
        if isinstance(codes, str):
            return _malformed(codes)
        tie_ok = numerics.fp4_tie_rounding == "hardware"
        return _mx_codes_under(codes, _np(outs[sname]), x, fmt, er, _mx_policy(numerics),
                               tie_ok)

    def pair_scales(ox, oy, nx, ny):
        sx, sy = _np(ox[sname]), _np(oy[sname])
        skip = 0
        if _mx_policy(nx) != _mx_policy(ny) and sx.shape == sy.shape == scales.shape:
            # Blocks with NaN / Inf follow each side's declared policy (each judged against
            # the reference under it); the pair compares the blocks where the policies agree.
            differ = _nonfinite_blocks(x)
            skip = int(differ.sum())
            sx, sy = np.where(differ, 0, sx), np.where(differ, 0, sy)
        # Judged both ways: each side's byte must be one the other side's rule could reach.
        there = tolerance_quant.check_mx_scales(sx, sy, x, fmt, mode)
        back = tolerance_quant.check_mx_scales(sy, sx, x, fmt, mode)
        worse = there if not there.passed or back.passed is there.passed else back
        return _excuse(worse, skip, "blocks with NaN/Inf judged per side (nonfinite policies "
                                    "differ)")

    def pair_codes(ox, oy, nx, ny):
        cx, cy = _codes(ox, dname, fmt, k), _codes(oy, dname, fmt, k)
        if isinstance(cx, str) or isinstance(cy, str):
            return _malformed(cx if isinstance(cx, str) else cy)
        ties = "hardware" in (nx.fp4_tie_rounding, ny.fp4_tie_rounding)
        if _mx_policy(nx) == _mx_policy(ny) == _NAN_SCALE:
            return tolerance_quant.check_mx_codes_pair(cx, _np(ox[sname]), cy, _np(oy[sname]),
                                                       x, fmt, er, tie_tolerant=ties)
        # Each side must be the re-quantization of x under its own scales and policy (so
        # where the scales agree, the codes agree).
        mx = _mx_codes_under(cx, _np(ox[sname]), x, fmt, er, _mx_policy(nx), ties)
        my = _mx_codes_under(cy, _np(oy[sname]), x, fmt, er, _mx_policy(ny), ties)
        return _combine(mx, my, "e8m0-adjusted-pair")

    return {sname: Expected(scales, U8, "e8m0-adjusted", check=check_scales,
                            check_pair=pair_scales),
            dname: Expected(packed, U8, "e8m0-adjusted", check=check_codes,
                            check_pair=pair_codes)}


def _combine(mx: tolerance.Metrics, my: tolerance.Metrics, tier: str) -> tolerance.Metrics:
    """One pair metric from the two sides' own checks."""
    if mx.shape_error or my.shape_error:
        return mx if mx.shape_error else my
    worse = mx if mx.mismatches >= my.mismatches else my
    return tolerance.Metrics(tier, mx.numel, mx.mismatches + my.mismatches, worse.max_abs_err,
                             worse.max_ratio, worse.worst_index, worse.worst_actual,
                             worse.worst_expected, worse.worst_tol,
                             excused=mx.excused + my.excused, note=worse.note)


def _first_bad(tier, ok, actual, expected, numel) -> tolerance.Metrics:
    ok = np.asarray(ok, bool)
    if ok.all():
        return tolerance.Metrics(tier, numel, 0, 0.0, 0.0)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(~ok)), ok.shape))
    return tolerance.Metrics(tier, numel, int((~ok).sum()), np.inf, np.inf, worst_index=idx,
                             worst_actual=float(np.asarray(actual)[idx]),
                             worst_expected=float(np.asarray(expected)[idx]), worst_tol=0.0)


def _scale_inv_within_ulps(got, amax, fmt, ulps) -> tolerance.Metrics:
    """AITER-rule scale_inv from an approximate fp32 division: within ``ulps`` of amax / max
    (special values exact: 0, Inf, NaN)."""
    tier = f"div-{ulps}ulp"
    g = np.asarray(got)
    if g.dtype != np.float32 or g.shape != np.shape(amax):
        return _malformed(f"scale_inv {g.dtype}{g.shape} != float32{np.shape(amax)}")
    exact = np.asarray(amax, np.float64) / ref.fmt_max(fmt)
    g64 = g.astype(np.float64)
    finite = np.isfinite(exact) & (exact != 0)
    safe = np.where(finite, np.abs(exact), 1.0)
    ulp = np.ldexp(1.0, np.maximum(np.frexp(safe)[1] - 1, -126) - 23)
    with np.errstate(invalid="ignore"):
        ok = np.where(finite, np.abs(g64 - exact) <= ulps * ulp,
                      (g64 == exact) | (np.isnan(g64) & np.isnan(exact)))
    return _first_bad(tier, ok, g64, exact, int(g.size))


def _codes_under_recip_bound(codes, x, scale_inv, fmt, per_row, ulps) -> tolerance.Metrics:
    """AITER-rule codes re-quantized under the backend's own scale_inv: each must be the
    cast of fl32(x * r) for an fp32 r within ``ulps`` of 1 / scale_inv.  x * r is monotone in
    r and the cast is monotone, so the allowed codes are those between the casts at the two
    extreme r (both NaN: NaN; equal: that code, bit for bit)."""
    tier = f"recip-{ulps}ulp"
    s = np.asarray(scale_inv)
    want_shape = (x.shape[0],) if per_row else (1,)
    if s.dtype != np.float32 or s.shape != want_shape:
        return _malformed(f"scale_inv {s.dtype}{s.shape} != float32{want_shape}")
    lo, hi = ref.recip_ulp_bounds(s, ulps)
    if per_row:
        lo, hi = lo[:, None], hi[:, None]
    bounds = [ref.codes_to_bits(ref.round_elements(ref.aiter_scaled(x, None, recip=r), fmt))
              for r in (lo, hi)]
    vals = [ref.decode(b, fmt) for b in bounds]
    got = ref.decode(codes, fmt)
    with np.errstate(invalid="ignore"):
        low, high = np.fmin(vals[0], vals[1]), np.fmax(vals[0], vals[1])
        nan = np.isnan(vals[0])
        same = bounds[0] == bounds[1]
        ok = np.where(nan, np.isnan(got),
                      np.where(same, codes == bounds[0], (got >= low) & (got <= high)))
    return _first_bad(tier, ok, got, ref.decode(bounds[0], fmt), int(codes.size))


def _aiter_rule_expected(x, prefix, r, bits, scale_inv) -> dict:
    """FP8 current scaling under AITER's rule: bit-exact for a backend whose divisions are
    IEEE, the fp32_div_ulps tiers otherwise (see the module docstring)."""
    fmt, n = r["fmt"], x.shape[1]
    per_row = r["granularity"] == "row"
    amax = ref.aiter_amax(x, per_row=per_row)
    dname, sname = f"{prefix}data", f"{prefix}scale_inv"
    ml = ref.ML_DTYPES[fmt]

    def check_codes(outs, numerics):
        codes = _codes(outs, dname, fmt, n)
        if isinstance(codes, str):
            return _malformed(codes)
        ulps = int(numerics.fp32_div_ulps or 0)
        if not ulps:
            return tolerance.compare_exact(codes.view(ml), bits.view(ml))
        return _codes_under_recip_bound(codes, x, _np(outs[sname]), fmt, per_row, ulps)

    def check_scales(outs, numerics):
        ulps = int(numerics.fp32_div_ulps or 0)
        if not ulps:
            return tolerance.compare_exact(outs[sname], scale_inv)
        return _scale_inv_within_ulps(_np(outs[sname]), amax, fmt, ulps)

    def pair(check, exact_pair):
        def judge(ox, oy, nx, ny):
            if not nx.fp32_div_ulps and not ny.fp32_div_ulps:
                return exact_pair(ox, oy)
            # An approximate division on either side: each side against the reference
            # under its own bound (so where both are exact they agree bit for bit).
            return _combine(check(ox, nx), check(oy, ny), "fp32-div-pair")
        return judge

    def exact_codes(ox, oy):
        cx, cy = _codes(ox, dname, fmt, n), _codes(oy, dname, fmt, n)
        if isinstance(cx, str) or isinstance(cy, str):
            return _malformed(cx if isinstance(cx, str) else cy)
        return tolerance.compare_exact(cx.view(ml), cy.view(ml))

    return {dname: Expected(bits, U8, "exact", check=check_codes,
                            check_pair=pair(check_codes, exact_codes)),
            sname: Expected(scale_inv, torch.float32, "exact", check=check_scales,
                            check_pair=pair(check_scales, lambda ox, oy: tolerance.compare_exact(
                                ox[sname], oy[sname])))}


def _fp8_expected(x, prefix, r) -> dict:
    gran = {"current": None, "block": "block", "delayed": "given"}[r["kind"]]
    gran = gran or r["granularity"]
    rule = r.get("scale_rule", FP8_SCALE_RULES[0])
    bits, scale_inv, _ = ref.fp8_quantize(
        x, r["fmt"], gran, scale=r.get("scale"), force_pow2=r.get("force_pow2_scales", False),
        amax_epsilon=r.get("amax_epsilon", 0.0), block=tuple(r["block"]) if "block" in r else None,
        saturate=r.get("saturation", "saturate") == "saturate", scale_rule=rule)
    if rule == AITER_RULE:
        return _aiter_rule_expected(x, prefix, r, bits, scale_inv)
    dname = f"{prefix}data"
    n = x.shape[1]

    ml = ref.ML_DTYPES[r["fmt"]]

    # Codes compared as FP8 values bit-exactly, except that any NaN code matches any NaN
    # (torch writes 0x7F for an e5m2 NaN, ml_dtypes 0x7E: both are NaN, no payload contract).
    def check_codes(outs, numerics):
        codes = _codes(outs, dname, r["fmt"], n)
        return _malformed(codes) if isinstance(codes, str) else \
            tolerance.compare_exact(codes.view(ml), bits.view(ml))

    def pair_codes(ox, oy, nx, ny):
        cx, cy = _codes(ox, dname, r["fmt"], n), _codes(oy, dname, r["fmt"], n)
        if isinstance(cx, str) or isinstance(cy, str):
            return _malformed(cx if isinstance(cx, str) else cy)
        return tolerance.compare_exact(cx.view(ml), cy.view(ml))

    return {dname: Expected(bits, U8, "exact", check=check_codes, check_pair=pair_codes),
            f"{prefix}scale_inv": Expected(scale_inv, torch.float32, "exact")}


def reference(inputs, case):
    x = inputs["x"].astype(np.float32)
    r = case["recipe"]
    expected = {}
    for flag, prefix, t in ((case["rowwise"], "", x), (case["columnwise"], "columnwise_", x.T)):
        if flag:
            t = np.ascontiguousarray(t)
            expected.update(_mx_expected(t, prefix, r) if r["kind"] == "mx"
                            else _fp8_expected(t, prefix, r))
    if r.get("scale_rule") == AITER_RULE:
        expected["amax"] = Expected(None, torch.float32, "absent", check=_no_amax,
                                    check_pair=lambda ox, oy, nx, ny: _no_amax(ox, nx))
    elif r["kind"] in ("delayed",) or (r["kind"] == "current" and r["granularity"] == "tensor"):
        expected["amax"] = Expected(ref.amax(x).reshape(1), torch.float32, "exact")
    elif r["kind"] == "current":
        expected["amax"] = Expected(ref.amax(x, axis=1), torch.float32, "exact")
    return expected


def _no_amax(outs, numerics) -> tolerance.Metrics:
    """AITER's rule reports no amax (tealite.recipes): an amax output breaks the contract."""
    if "amax" in outs:
        return _malformed("amax must be None under scale_rule amax/fmax (AITER's kernels "
                          "report none)")
    return tolerance.Metrics("absent", 0, 0, 0.0, 0.0)


# ---- dequantize and amax -------------------------------------------------------------------

def dq_cases(dtype: str | None = None, size: str = "ci"):
    return cases(dtype, size).map(lambda c: dict(c, rowwise=True, columnwise=False))


def dq_make_inputs(case, device):
    """Codes and scales from the *reference* quantizer, so every backend decodes the same."""
    x = make_inputs(case, "cpu")["x"].float().numpy()
    r = case["recipe"]
    recipe = recipe_from_json(r)
    if r["kind"] == "mx":
        bits, scales = ref.mx_quantize(x, r["fmt"], r["scale_rounding"], r["element_rounding"])
        data = torch.from_numpy(ref.pack_e2m1(bits) if r["fmt"] == "e2m1" else bits)
        scale_inv = torch.from_numpy(scales)
    else:
        exp = _fp8_expected(x, "", r)
        data = torch.from_numpy(exp["data"].value)
        scale_inv = torch.from_numpy(np.asarray(exp["scale_inv"].value))
    fmt = get_format(r["fmt"])
    if not fmt.packed:
        data = data.view(fmt.torch_dtype)
    return {"data": data.to(device), "scale_inv": scale_inv.to(device),
            "_recipe": recipe, "_shape": tuple(x.shape)}


def dq_call(inputs, case, backend):
    q = QuantizedTensor(recipe=inputs["_recipe"], shape=inputs["_shape"], data=inputs["data"],
                        scale_inv=inputs["scale_inv"])
    return {"y": tealite.dequantize(q, out_dtype=dtype_of(case["dtype"]), backend=backend)}


def dq_reference(inputs, case):
    r = case["recipe"]
    m, k = case["shape"]
    data = np.asarray(inputs["data"])
    if r["kind"] == "mx":
        # The runner hands references float64 views of the inputs: FP8 codes arrive decoded,
        # packed e2m1 bytes and E8M0 bytes arrive as their integer values.
        vals = ref.decode(ref.unpack_e2m1(data.astype(np.uint8), k), "e2m1") \
            if r["fmt"] == "e2m1" else data
        scales = np.asarray(inputs["scale_inv"]).astype(np.uint8)
        y = vals * np.repeat(ref.e8m0_value(scales), 32, axis=-1)[:, :k]
    else:
        vals = np.asarray(inputs["data"], dtype=np.float64)
        s = np.asarray(inputs["scale_inv"], dtype=np.float64)
        if r["kind"] == "block":
            bm, bn = r["block"]
            s = np.repeat(np.repeat(s, bm, axis=0), bn, axis=1)[:m, :k]
        elif r["kind"] == "current" and r["granularity"] == "row":
            s = s[:, None]
        y = vals * s
    out_dt = dtype_of(case["dtype"])
    # codes x scale rounded once in fp32, then once to the output dtype.
    return {"y": Expected(y, out_dt, "ulp", lambda n: tolerance.elementwise_tolerance(
        y, np.abs(y), out_dt, n, ops=1))}


SMOKE = (
    {"recipe": {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil",
                "element_rounding": "rne"}, "dtype": "bfloat16", "shape": [65, 96],
     "rowwise": True, "columnwise": False, "pad": False,
     "dist": {"kind": "quant_edges", "fmt": "e4m3", "block": 32}, "seed": 5},
    {"recipe": {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
                "element_rounding": "ties_away"}, "dtype": "float32", "shape": [64, 96],
     "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "quant_edges", "fmt": "e2m1", "block": 32}, "seed": 6},
    {"recipe": {"kind": "current", "fmt": "e4m3fnuz", "granularity": "row",
                "force_pow2_scales": False, "amax_epsilon": 0.0}, "dtype": "float16",
     "shape": [33, 17], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "normal", "scale": 4.0}, "seed": 7},
    {"recipe": {"kind": "block", "fmt": "e4m3", "block": [128, 128],
                "force_pow2_scales": True, "amax_epsilon": 0.0}, "dtype": "bfloat16",
     "shape": [257, 129], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "outliers", "scale": 1.0, "frac": 0.01, "factor": 1024.0}, "seed": 8},
    {"recipe": {"kind": "delayed", "fmt": "e5m2", "scale": 0.75}, "dtype": "float32",
     "shape": [0, 31], "rowwise": True, "columnwise": True, "pad": False,
     "dist": {"kind": "normal", "scale": 1.0}, "seed": 9},
)

_RECIPE_CELLS = cov.recipe_cells("recipe", ("delayed", "current", "block", "mx"),
                                  aiter_rule=True)
register(OpSpec(name=Op.QUANTIZE, family="quantize", cases=cases, make_inputs=make_inputs,
                call=call, reference=reference, smoke_cases=SMOKE,
                coverage=_RECIPE_CELLS + cov.direction_cells() + cov.edge_cells(cov.QUANT_EDGES)
                + cov.product_cells(cov.family_cells("recipe", cov.FAMILIES),
                                    cov.direction_cells())))
register(OpSpec(name=Op.DEQUANTIZE, family="quantize", cases=dq_cases,
                make_inputs=dq_make_inputs, call=dq_call, reference=dq_reference,
                smoke_cases=tuple(dict(c, rowwise=True, columnwise=False) for c in SMOKE),
                coverage=_RECIPE_CELLS + cov.edge_cells(cov.SHAPE_EDGES + (
                    cov.TIES, cov.NONFINITE, cov.ZERO_BLOCK, cov.OVERFLOW))))
register(OpSpec(
    name=Op.AMAX, family="quantize",
    cases=lambda dtype=None, size="ci": st.fixed_dictionaries({
        # (*leading, H) with the leading product capped: the interpreter runs amax too.
        "shape": row_shapes(max_rows=_LIMITS[size], max_hidden=_LIMITS[size]).map(list),
        "dtype": st.just(dtype) if dtype else float_dtypes(), "seed": seeds(),
        "dist": distributions(dtype or "float32")}),
    make_inputs=lambda c, d: {"x": generate(c["dist"], c["shape"], dtype_of(c["dtype"]),
                                            c["seed"], d)},
    call=lambda i, c, b: {"amax": tealite.amax(i["x"], backend=b)},
    reference=lambda i, c: {"amax": Expected(ref.amax(i["x"]).reshape(1), torch.float32,
                                             "exact")},
    smoke_cases=({"shape": [3, 0], "dtype": "float32", "seed": 1,
                  "dist": {"kind": "normal", "scale": 1.0}},
                 {"shape": [7, 33], "dtype": "bfloat16", "seed": 2,
                  "dist": {"kind": "wide", "log2_lo": -12, "log2_hi": 12}}),
    coverage=cov.edge_cells(cov.FLOAT_EDGES + (cov.NONFINITE,))))
