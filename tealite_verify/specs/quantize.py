"""Specs for ``quantize`` (every recipe, rowwise / columnwise / both), ``dequantize`` and
``amax``.  Codes and scales are judged bit-exactly; MX scales under the e8m0-adjusted tier
(tolerance_quant), with codes re-quantized under the backend's own scales."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.formats import get_format
from tealite.ops.quantize import QuantizedTensor
from tealite_verify import tolerance, tolerance_quant
from tealite_verify.references import quantize as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import recipe_from_json, recipes
from tealite_verify.strategies.shapes import dim, row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate

_LIMITS = {"ci": 160, "local": 600, "large": 4096}
U8 = torch.uint8


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    dtype = dtype or draw(float_dtypes())
    recipe = draw(recipes())
    limit = _LIMITS[size]
    rowwise, columnwise = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    pad = False
    m, k = draw(dim(limit, allow_zero=True)), draw(dim(limit))
    if recipe["kind"] == "mx":
        pad = draw(st.booleans())
        if not pad:  # the blocked dims must be whole blocks (and even for e2m1)
            k = 32 * max(1, k // 32) if rowwise else k
            m = 32 * max(0 if not columnwise else 1, m // 32) if columnwise else m
    edges = st.just({"kind": "quant_edges", "fmt": recipe["fmt"], "block": 32})
    specials = st.builds(lambda f: {"kind": "specials", "frac": f}, st.sampled_from([0.01, 0.2]))
    dist = draw(st.one_of(edges, edges, specials, distributions(dtype)))
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


def _mx_expected(x, prefix, r) -> dict:
    """Expected entries for one direction (x is already transposed for columnwise)."""
    fmt, mode, er = r["fmt"], r["scale_rounding"], r["element_rounding"]
    bits, scales = ref.mx_quantize(x, fmt, mode, er)
    k = x.shape[1]
    dname, sname = f"{prefix}data", f"{prefix}scale_inv"
    packed = ref.pack_e2m1(bits) if fmt == "e2m1" else bits

    def check_scales(outs, numerics):
        return tolerance_quant.check_mx_scales(_np(outs[sname]), scales, x, fmt, mode)

    def check_codes(outs, numerics):
        codes = _codes(outs, dname, fmt, k)
        if isinstance(codes, str):
            return _malformed(codes)
        tie_ok = numerics.get("fp4_tie_rounding") == "hardware"
        return tolerance_quant.check_mx_codes(codes, _np(outs[sname]), x, fmt, er,
                                              tie_tolerant=tie_ok)

    def pair_scales(ox, oy, nx, ny):
        # Judged both ways: each side's byte must be one the other side's rule could reach.
        there = tolerance_quant.check_mx_scales(_np(ox[sname]), _np(oy[sname]), x, fmt, mode)
        back = tolerance_quant.check_mx_scales(_np(oy[sname]), _np(ox[sname]), x, fmt, mode)
        return there if not there.passed or back.passed is there.passed else back

    def pair_codes(ox, oy, nx, ny):
        cx, cy = _codes(ox, dname, fmt, k), _codes(oy, dname, fmt, k)
        if isinstance(cx, str) or isinstance(cy, str):
            return _malformed(cx if isinstance(cx, str) else cy)
        ties = "hardware" in (nx.get("fp4_tie_rounding"), ny.get("fp4_tie_rounding"))
        return tolerance_quant.check_mx_codes_pair(cx, _np(ox[sname]), cy, _np(oy[sname]), x,
                                                   fmt, er, tie_tolerant=ties)

    return {sname: Expected(scales, U8, "e8m0-adjusted", check=check_scales,
                            check_pair=pair_scales),
            dname: Expected(packed, U8, "e8m0-adjusted", check=check_codes,
                            check_pair=pair_codes)}


def _fp8_expected(x, prefix, r) -> dict:
    gran = {"current": None, "block": "block", "delayed": "given"}[r["kind"]]
    gran = gran or r["granularity"]
    bits, scale_inv, _ = ref.fp8_quantize(
        x, r["fmt"], gran, scale=r.get("scale"), force_pow2=r.get("force_pow2_scales", False),
        amax_epsilon=r.get("amax_epsilon", 0.0), block=tuple(r["block"]) if "block" in r else None,
        saturate=r.get("saturation", "saturate") == "saturate")
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
    if r["kind"] in ("delayed",) or (r["kind"] == "current" and r["granularity"] == "tensor"):
        expected["amax"] = Expected(ref.amax(x).reshape(1), torch.float32, "exact")
    elif r["kind"] == "current":
        expected["amax"] = Expected(ref.amax(x, axis=1), torch.float32, "exact")
    return expected


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

register(OpSpec(name="quantize", family="quantize", cases=cases, make_inputs=make_inputs,
                call=call, reference=reference, smoke_cases=SMOKE))
register(OpSpec(name="dequantize", family="quantize", cases=dq_cases,
                make_inputs=dq_make_inputs, call=dq_call, reference=dq_reference,
                smoke_cases=tuple(dict(c, rowwise=True, columnwise=False) for c in SMOKE)))
register(OpSpec(
    name="amax", family="quantize",
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
                  "dist": {"kind": "wide", "log2_lo": -12, "log2_hi": 12}})))
