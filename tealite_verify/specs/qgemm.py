"""Spec for ``tealite.qgemm``: FP8 per-tensor / per-row, FP8 block-scaled, MXFP8 / MXFP4, every
layout.  Operands are quantized by the *reference* quantizer, so every backend multiplies the
same codes and scales; the reference dequantizes them exactly and multiplies in float64."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.formats import get_format
from tealite.ops.gemm import LAYOUTS
from tealite.ops.quantize import QuantizedTensor
from tealite_verify import tolerance
from tealite_verify.references import qgemm as ref
from tealite_verify.references import quantize as qref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs.gemm import stored_shapes
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import recipe_from_json, recipes
from tealite_verify.strategies.shapes import gemm_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate

_LIMITS = {"ci": (48, 256), "local": (160, 1024), "large": (1024, 4096)}


@st.composite
def _recipe_pair(draw):
    family = draw(pick("fp8", "block", "mx"))
    if family == "fp8":
        fp8 = recipes(["current", "delayed"])
        return draw(fp8), draw(fp8)
    if family == "block":
        a = draw(recipes(["block"]))
        b = dict(draw(recipes(["block"])), block=[1, 128], fmt=a["fmt"])
        return a, b
    return draw(recipes(["mx"])), draw(recipes(["mx"]))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    max_mn, max_k = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    ra, rb = draw(_recipe_pair())
    m, n, k = draw(gemm_shapes(max_mn=max_mn, max_k=max_k))
    if ra["kind"] == "mx":
        k = 32 * max(1, k // 32)
    return {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k,
            "layout": draw(pick(*LAYOUTS)), "dtype": dtype,
            "out_dtype": draw(pick("bfloat16", "float32", "float16")),
            "bias": draw(st.booleans()),
            "dist_a": draw(distributions(dtype, wide=False)),
            "dist_b": draw(distributions(dtype, wide=False)), "seed": draw(seeds())}


def quantize_k_last(x_k: np.ndarray, r: dict):
    """Reference (code bits, scales) of a K-last float32 operand under recipe dict ``r``."""
    if r["kind"] == "mx":
        return qref.mx_quantize(x_k, r["fmt"], r["scale_rounding"], r["element_rounding"])
    gran = {"delayed": "given", "block": "block"}.get(r["kind"]) or r["granularity"]
    bits, scale_inv, _ = qref.fp8_quantize(
        x_k, r["fmt"], gran, scale=r.get("scale"), force_pow2=r.get("force_pow2_scales", False),
        amax_epsilon=r.get("amax_epsilon", 0.0), block=tuple(r["block"]) if "block" in r else None,
        saturate=r.get("saturation", "saturate") == "saturate")
    return bits, scale_inv


def dequantize_k_last(bits, scales, r: dict) -> np.ndarray:
    if r["kind"] == "mx":
        return qref.mx_dequantize(bits, scales, r["fmt"])
    gran = {"delayed": "tensor", "block": "block"}.get(r["kind"]) or r["granularity"]
    return ref.dequantize_fp8(bits, scales, r["fmt"], gran,
                              tuple(r["block"]) if "block" in r else None)


def _k_last(x: np.ndarray, k_first: bool) -> np.ndarray:
    return np.ascontiguousarray(x.T if k_first else x)


def _operand(x_stored: torch.Tensor, r: dict, k_first: bool, device) -> QuantizedTensor:
    bits, scales = quantize_k_last(_k_last(x_stored.float().numpy(), k_first), r)
    fmt = get_format(r["fmt"])
    data = torch.from_numpy(qref.pack_e2m1(bits) if fmt.packed else bits)
    data = data if fmt.packed else data.view(fmt.torch_dtype)
    q = QuantizedTensor(recipe=recipe_from_json(r), shape=tuple(x_stored.shape))
    payload = (data.to(device), torch.from_numpy(np.asarray(scales)).to(device))
    if k_first:
        q.columnwise_data, q.columnwise_scale_inv = payload
    else:
        q.data, q.scale_inv = payload
    return q


def make_inputs(case, device):
    dt = dtype_of(case["dtype"])
    a_shape, b_shape = stored_shapes(case)
    s = case["seed"]
    a = generate(case["dist_a"], a_shape, dt, s)
    b = generate(case["dist_b"], b_shape, dt, s + 1)
    inputs = {"a_x": a.to(device), "b_x": b.to(device),
              "_qa": _operand(a, case["recipe_a"], case["layout"][0] == "N", device),
              "_qb": _operand(b, case["recipe_b"], case["layout"][1] == "T", device)}
    if case["bias"]:
        inputs["bias"] = generate({"kind": "normal", "scale": 1.0}, (case["n"],),
                                  dtype_of(case["out_dtype"]), s + 2, device)
    return inputs


def call(inputs, case, backend):
    r = tealite.qgemm(inputs["_qa"], inputs["_qb"], layout=case["layout"],
                      out_dtype=dtype_of(case["out_dtype"]), bias=inputs.get("bias"),
                      backend=backend)
    return {"out": r.out}


def reference(inputs, case):
    a_k = _k_last(inputs["a_x"].astype(np.float32), case["layout"][0] == "N")
    b_k = _k_last(inputs["b_x"].astype(np.float32), case["layout"][1] == "T")
    a_deq = dequantize_k_last(*quantize_k_last(a_k, case["recipe_a"]), case["recipe_a"])
    b_deq = dequantize_k_last(*quantize_k_last(b_k, case["recipe_b"]), case["recipe_b"])
    bias = inputs.get("bias")
    out = ref.qgemm(a_deq, b_deq, bias)
    p = ref.qgemm(a_deq, b_deq)
    p_abs = ref.qgemm(np.abs(a_deq), np.abs(b_deq))
    epi = np.abs(bias)[None, :] * np.ones_like(p) if bias is not None else np.zeros_like(p)
    out_dt = dtype_of(case["out_dtype"])

    def bound(numerics):
        return tolerance.gemm_tolerances(p_abs, p, out, case["k"], out_dt, numerics,
                                         alpha=1.0, epilogue_abs=epi)["out"]

    return {"out": Expected(out, out_dt, "gemm", bound)}


def _smoke(ra, rb, layout, m, n, k, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k, "layout": layout,
            "dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 21}
    case.update(kw)
    return case


_CUR = {"kind": "current", "fmt": "e4m3", "granularity": "tensor", "force_pow2_scales": False,
        "amax_epsilon": 0.0}
_ROW = dict(_CUR, granularity="row")
_MX4 = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
_MX8 = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_BLK = {"kind": "block", "fmt": "e4m3", "block": [128, 128], "force_pow2_scales": True,
        "amax_epsilon": 0.0}

register(OpSpec(
    name="qgemm", family="qgemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    smoke_cases=(
        _smoke(_CUR, _CUR, "TN", 29, 48, 257),
        _smoke(_ROW, _CUR, "NN", 33, 17, 96, bias=True),
        _smoke(_BLK, dict(_BLK, block=[1, 128]), "NT", 20, 130, 300, out_dtype="float32"),
        _smoke(_MX4, _MX4, "TN", 16, 24, 128),
        _smoke(_MX8, dict(_MX8, fmt="e5m2"), "TT", 0, 8, 64),
        # Shapes AITER's Triton GEMMs route to their other entry points (per-token scales;
        # MXFP4 with pre-shuffled scales, and with pre-shuffled weights and scales), so the
        # gate's case set reaches them: random draws rarely do.
        _smoke(_ROW, _ROW, "TN", 40, 64, 128, out_dtype="float16"),
        _smoke(_MX4, _MX4, "TN", 40, 48, 256, out_dtype="float16"),
        _smoke(_MX4, _MX4, "TN", 40, 64, 256, out_dtype="float16"),
    )))
