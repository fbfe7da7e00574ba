"""Spec for ``tealite.gemm``: every layout, dtype, out dtype, bias / GELU / alpha / beta."""
from __future__ import annotations

import functools

import torch
from hypothesis import strategies as st

import tealite
from tealite.ops.gemm import LAYOUTS
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import gemm as ref
from tealite_verify.references import _device as reference_device
from tealite_verify.references._device import namespace
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import gemm_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import gemm as gemm_tier
from tealite_verify.tiers import probabilistic
from tealite_verify.tiers.metrics import Tier

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

    @functools.cache  # one set of products per declaration, whichever outputs and bounds ask
    def magnitudes(floor, may_flush):
        mag = p_abs if floor is None else ref.product(
            gemm_tier.aligned_magnitude(a, floor), gemm_tier.aligned_magnitude(b, floor), layout)
        flushed = None
        if may_flush:
            flushed = p_abs - ref.product(gemm_tier.normal_magnitude(a, in_dt),
                                          gemm_tier.normal_magnitude(b, in_dt), layout)
        return mag, flushed

    def bounds(numerics, tolerances=gemm_tier.gemm_tolerances):
        mag, flushed = magnitudes(numerics.alignment_floor,
                                  numerics.subnormal_inputs == "may_flush")
        return tolerances(mag, p, pre, case["k"], out_dt, numerics,
                          alpha=alpha, epilogue_abs=epilogue_abs,
                          gelu_out=out if case["gelu"] else None, flushed_abs=flushed)

    def prob_bounds(numerics, p_case):  # opt-in: gamma_K -> Higham-Mary's gamma~_K
        return bounds(numerics, functools.partial(probabilistic.gemm_prob_tolerances,
                                                  p_case=p_case))

    baseline = functools.cache(lambda: same_precision(x, case))
    expected = {"out": Expected(out, out_dt, Tier.GEMM, lambda num: bounds(num)["out"],
                                prob_bound=lambda num, pc: prob_bounds(num, pc)["out"],
                                same_precision=lambda: baseline()[0])}
    if case["gelu"]:
        expected["pre_gelu"] = Expected(pre, out_dt, Tier.GEMM, lambda num: bounds(num)["pre"],
                                        prob_bound=lambda num, pc: prob_bounds(num, pc)["pre"],
                                        same_precision=lambda: baseline()[1])
    return expected


def same_precision(x, case):
    """(out, pre_gelu) of the plain torch computation in the inputs' precision, as float64:
    torch.matmul in the input dtype, the epilogue in fp32, rounded to the out dtype (what the
    torch backend does, so its FlashAttention-style ratio is 1 by construction).  ``x``: the
    reference's float64 view of the inputs, whose values are exact in the input dtype.  Runs
    on the case's device (the reference device; the CPU off the GPU), as the backend did."""
    dt, out_dt = dtype_of(case["dtype"]), dtype_of(case["out_dtype"])
    device = reference_device.current() or "cpu"

    def t(v, d):
        return (v if isinstance(v, torch.Tensor) else torch.from_numpy(v)).to(device, d)

    op_b, op_a = ref.operands(t(x["a"], dt), t(x["b"], dt), case["layout"])
    acc = torch.matmul(op_b, op_a)
    pre = acc.float() * case["alpha"]
    if case["beta"] != 0.0:
        pre = pre + case["beta"] * t(x["out"], out_dt).float()
    if case["bias"]:
        pre = pre + t(x["bias"], dt).float()
    y = torch.nn.functional.gelu(pre) if case["gelu"] else pre
    return y.to(out_dt).double().cpu(), pre.to(out_dt).double().cpu()


def make_case(layout, dtype, m, n, k, **kw):
    """A gemm case dict with normal inputs; keyword arguments override any field."""
    case = {"m": m, "n": n, "k": k, "layout": layout, "dtype": dtype, "out_dtype": dtype,
            "bias": False, "gelu": False, "alpha": 1.0, "beta": 0.0,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 1234}
    case.update(kw)
    return case


SPEC = register(OpSpec(
    name=Op.GEMM, family="gemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, device_reference=True,
    coverage=(cov.layout_cells("layout", LAYOUTS) + cov.layout_cells("bias", (True, False))
              + cov.layout_cells("gelu", (True, False))
              + cov.edge_cells(cov.FLOAT_EDGES + (cov.SQUARE,))),
    smoke_cases=(
        make_case("TN", "bfloat16", 29, 29, 541),
        make_case("NN", "float16", 71, 33, 71, bias=True, gelu=True),
        make_case("NT", "float32", 0, 16, 64),
        make_case("TT", "bfloat16", 17, 31, 257, out_dtype="float32", alpha=0.5, beta=1.0,
               bias=True),
    ),
))
