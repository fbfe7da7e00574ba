"""Spec for ``tealite.gemm``: every layout, dtype, out dtype, bias / GELU / alpha / beta."""
from __future__ import annotations

from hypothesis import strategies as st

import tealite
from tealite.ops.gemm import LAYOUTS
from tealite_verify import tolerance
from tealite_verify.references import gemm as ref
from tealite_verify.references._device import namespace
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import gemm_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate

_LIMITS = {"ci": (48, 256), "local": (160, 2048), "large": (1024, 8192)}


def stored_shapes(case) -> tuple[tuple[int, int], tuple[int, int]]:
    m, n, k, layout = case["m"], case["n"], case["k"], case["layout"]
    a = (n, k) if layout[0] == "T" else (k, n)
    b = (m, k) if layout[1] == "N" else (k, m)
    return a, b


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    max_mn, max_k = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    m, n, k = draw(gemm_shapes(max_mn=max_mn, max_k=max_k))
    # fp16 sums of K products overflow quickly; keep inputs small there (overflow itself is
    # still reachable through the wide distributions and is judged overflow-aware).
    cap = 4 if dtype == "float16" else None
    beta = draw(pick(0.0, 0.0, 1.0, -0.5))
    return {
        "m": m, "n": n, "k": k, "layout": draw(pick(*LAYOUTS)),
        "dtype": dtype, "out_dtype": draw(pick(dtype, dtype, "float32")),
        "bias": draw(st.booleans()), "gelu": draw(st.booleans()),
        "alpha": draw(pick(1.0, 1.0, 0.5, -2.0, 0.1)), "beta": beta,
        "dist_a": draw(distributions(dtype, max_log2=cap)),
        "dist_b": draw(distributions(dtype, max_log2=cap)),
        "seed": draw(seeds()),
    }


def make_inputs(case, device):
    dt, out_dt = dtype_of(case["dtype"]), dtype_of(case["out_dtype"])
    a_shape, b_shape = stored_shapes(case)
    s = case["seed"]
    inputs = {"a": generate(case["dist_a"], a_shape, dt, s, device),
              "b": generate(case["dist_b"], b_shape, dt, s + 1, device)}
    if case["bias"]:
        inputs["bias"] = generate({"kind": "normal", "scale": 1.0}, (case["n"],), dt, s + 2, device)
    if case["beta"] != 0.0:
        inputs["out"] = generate({"kind": "normal", "scale": 1.0}, (case["m"], case["n"]),
                                 out_dt, s + 3, device)
    return inputs


def call(inputs, case, backend):
    out = inputs.get("out")
    out = out.clone() if out is not None else None
    result = tealite.gemm(inputs["a"], inputs["b"], layout=case["layout"],
                          out_dtype=dtype_of(case["out_dtype"]), bias=inputs.get("bias"),
                          gelu=case["gelu"], out=out, alpha=case["alpha"], beta=case["beta"],
                          backend=backend)
    outputs = {"out": result.out}
    if case["gelu"]:
        outputs["pre_gelu"] = result.pre_gelu
    return outputs


def reference(x, case):
    a, b, layout = x["a"], x["b"], case["layout"]
    alpha, beta = case["alpha"], case["beta"]
    c, bias = x.get("out"), x.get("bias")
    out, pre = ref.gemm(a, b, layout=layout, alpha=alpha, beta=beta, c=c, bias=bias,
                        gelu_epilogue=case["gelu"])
    xp = namespace(a)  # numpy, or torch float64 on the device (device_reference)
    p = ref.product(a, b, layout)
    p_abs = ref.product(xp.abs(a), xp.abs(b), layout)
    epilogue_abs = xp.zeros_like(p)
    if c is not None:
        epilogue_abs = epilogue_abs + abs(beta) * xp.abs(c)
    if bias is not None:
        epilogue_abs = epilogue_abs + xp.abs(bias)[None, :]
    out_dt = dtype_of(case["out_dtype"])

    in_dt = dtype_of(case["dtype"])

    def bounds(numerics):
        floor = numerics.get("alignment_floor")
        mag = p_abs if floor is None else ref.product(
            tolerance.aligned_magnitude(a, floor), tolerance.aligned_magnitude(b, floor), layout)
        flushed = None
        if numerics.get("subnormal_inputs") == "may_flush":
            flushed = p_abs - ref.product(tolerance.normal_magnitude(a, in_dt),
                                          tolerance.normal_magnitude(b, in_dt), layout)
        return tolerance.gemm_tolerances(mag, p, pre, case["k"], out_dt, numerics,
                                         alpha=alpha, epilogue_abs=epilogue_abs,
                                         gelu_out=out if case["gelu"] else None,
                                         flushed_abs=flushed)

    expected = {"out": Expected(out, out_dt, "gemm", lambda num: bounds(num)["out"])}
    if case["gelu"]:
        expected["pre_gelu"] = Expected(pre, out_dt, "gemm", lambda num: bounds(num)["pre"])
    return expected


def make_case(layout, dtype, m, n, k, **kw):
    """A gemm case dict with normal inputs; keyword arguments override any field."""
    case = {"m": m, "n": n, "k": k, "layout": layout, "dtype": dtype, "out_dtype": dtype,
            "bias": False, "gelu": False, "alpha": 1.0, "beta": 0.0,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 1234}
    case.update(kw)
    return case


SPEC = register(OpSpec(
    name="gemm", family="gemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, device_reference=True,
    smoke_cases=(
        make_case("TN", "bfloat16", 29, 29, 541),
        make_case("NN", "float16", 71, 33, 71, bias=True, gelu=True),
        make_case("NT", "float32", 0, 16, 64),
        make_case("TT", "bfloat16", 17, 31, 257, out_dtype="float32", alpha=0.5, beta=1.0,
               bias=True),
    ),
))
