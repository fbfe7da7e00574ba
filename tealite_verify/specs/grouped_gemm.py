"""Spec for ``tealite.grouped_gemm``: every grouped layout, dtype and out dtype, bias, accumulate,
shared and per-group weights, and splits with zeros, primes, one group holding everything and
many small groups (strategies/moe.py).

Two verdicts per case: ``out`` against the float64 reference under the per-group GEMM bound
(tiers/grouped_gemm.py), and ``parity``: the grouped path against the same backend's split
path, a loop of single ``tealite.gemm`` calls (tiers/parity.py).  ``call`` runs both paths;
the split path's output rides along as ``split:out`` and what its single calls declared as
``split:numerics`` (one Numerics per group, None where no call ran), for the bounded parity
rule.  No reference verdict of its own: the gemm spec judges the single op.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite import registry
from tealite.errors import UnsupportedCase
from tealite.moe_types import GROUPED_LAYOUTS, split_offsets, splits_k
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import grouped_gemm as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.moe import grouped_gemm_dims
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import gemm as gemm_tier
from tealite_verify.tiers import grouped_gemm as grouped_tier
from tealite_verify.tiers import parity
from tealite_verify.tiers.metrics import Tier

SPLIT_OUTPUT = "split:out"
SPLIT_NUMERICS = "split:numerics"


def declared_by(op: Op, call):
    """(``call()``'s result, the numerics its dispatch of ``op`` declared)."""
    with registry.trace() as records:
        result = call()
    ran = [r for r in records if r.op == op]
    return result, (ran[-1].numerics if ran else None)


def with_split(outputs: dict, split) -> dict:
    """``outputs`` plus the split path's output and per-group numerics (when it ran)."""
    if split is not None:
        outputs[SPLIT_OUTPUT], outputs[SPLIT_NUMERICS] = split
    return outputs


def stored_shapes(case) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(A's, B's) stored shapes.  NT: A (K_total, N), B (K_total, M); split-M: A (G, N, K) /
    (G, K, N), or 2-D when one weight is shared; B (M_total, K)."""
    splits, layout, n, k = case["m_splits"], case["layout"], case["n"], case["k"]
    total = sum(splits)
    if splits_k(layout):
        return (total, n), (total, case["m"])
    weight = (n, k) if layout[0] == "T" else (k, n)
    return (weight if case["shared_weight"] else (len(splits),) + weight), (total, k)


def out_shape(case) -> tuple[int, ...]:
    if splits_k(case["layout"]):
        return len(case["m_splits"]), case["m"], case["n"]
    return sum(case["m_splits"]), case["n"]


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    """``m`` is NT's output rows (split-M layouts: unused, the rows are the splits' sum) and
    ``k`` the split-M contraction (NT: unused, the splits cut it), so any layout fits."""
    dtype = dtype or draw(float_dtypes())
    splits, m, n, k = draw(grouped_gemm_dims(size))
    layout = draw(pick(*GROUPED_LAYOUTS))
    split_m = not splits_k(layout)
    cap = 4 if dtype == "float16" else None  # as specs/gemm.py: fp16 sums overflow early
    return {"layout": layout, "m_splits": splits, "m": m, "n": n, "k": k, "dtype": dtype,
            "out_dtype": draw(pick(dtype, dtype, "float32")),
            "bias": split_m and draw(st.booleans()),
            "accumulate": draw(pick(False, False, True)),
            "shared_weight": split_m and draw(pick(False, False, True)),
            "dist_a": draw(distributions(dtype, max_log2=cap)),
            "dist_b": draw(distributions(dtype, max_log2=cap)), "seed": draw(seeds())}


def make_inputs(case, device):
    dt, out_dt = dtype_of(case["dtype"]), dtype_of(case["out_dtype"])
    a_shape, b_shape = stored_shapes(case)
    s = case["seed"]
    inputs = {"a": generate(case["dist_a"], a_shape, dt, s, device),
              "b": generate(case["dist_b"], b_shape, dt, s + 1, device)}
    if case["bias"]:
        inputs["bias"] = generate({"kind": "normal", "scale": 1.0},
                                  (len(case["m_splits"]), case["n"]), dt, s + 2, device)
    if case["accumulate"]:
        inputs["out"] = generate({"kind": "normal", "scale": 1.0}, out_shape(case), out_dt,
                                 s + 3, device)
    return inputs


def call(inputs, case, backend):
    prior = inputs.get("out")
    out = tealite.grouped_gemm(
        inputs["a"], inputs["b"], case["m_splits"], layout=case["layout"],
        out_dtype=dtype_of(case["out_dtype"]), bias=inputs.get("bias"),
        out=None if prior is None else prior.clone(), accumulate=case["accumulate"],
        backend=backend)
    return with_split({"out": out}, split_path(inputs, case, backend))


def split_path(inputs, case, backend) -> tuple[torch.Tensor, tuple] | None:
    """The split per-group path: the same backend's single ``gemm`` on each non-empty group
    (bias[g]; accumulate as its ``beta = 1`` into the group's prior output), the empty groups
    as the contract fixes them; (output, per-group numerics).  None when the backend's gemm
    refuses a group."""
    a, b, bias = inputs["a"], inputs["b"], inputs.get("bias")
    splits, layout = case["m_splits"], case["layout"]
    out_dt = dtype_of(case["out_dtype"])
    prior = inputs.get("out")
    result = prior.clone() if prior is not None else \
        torch.zeros(out_shape(case), dtype=out_dt, device=b.device)
    off = split_offsets(splits)
    declared = [None] * len(splits)
    for g, rows in enumerate(splits):
        if rows == 0:
            continue
        lo, hi = off[g], off[g + 1]
        if splits_k(layout):
            a_g, b_g, target = a[lo:hi], b[lo:hi], result[g]
        else:
            a_g, b_g, target = (a[g] if a.dim() == 3 else a), b[lo:hi], result[lo:hi]
        try:
            r, declared[g] = declared_by(Op.GEMM, lambda: tealite.gemm(
                a_g, b_g, layout=layout, out_dtype=out_dt,
                bias=None if bias is None else bias[g],
                out=target.clone() if case["accumulate"] else None,
                beta=1.0 if case["accumulate"] else 0.0, backend=backend))
        except UnsupportedCase:
            return None
        target.copy_(r.out)
    return result, tuple(declared)


def _rows_of(bias, splits) -> np.ndarray:
    """(G, N) bias as one row per output row (split-M)."""
    return np.repeat(bias, splits, axis=0)


def reference(x, case):
    a, b, splits, layout = x["a"], x["b"], case["m_splits"], case["layout"]
    bias, prior = x.get("bias"), x.get("out")
    out_dt, in_dt = dtype_of(case["out_dtype"]), dtype_of(case["dtype"])
    value = ref.grouped_gemm(a, b, splits, layout=layout, bias=bias, prior=prior)
    p = ref.grouped_gemm(a, b, splits, layout=layout)
    p_abs = ref.grouped_gemm(a, b, splits, layout=layout, mag=True)
    epilogue_abs = np.zeros_like(p)
    if prior is not None:
        epilogue_abs = epilogue_abs + np.abs(prior)
    if bias is not None:
        epilogue_abs = epilogue_abs + _rows_of(np.abs(bias), splits)

    @functools.cache  # one set of magnitudes per declaration
    def magnitudes(floor, may_flush):
        mag = p_abs if floor is None else ref.grouped_gemm(
            gemm_tier.aligned_magnitude(a, floor), gemm_tier.aligned_magnitude(b, floor),
            splits, layout=layout, mag=True)
        flushed = None
        if may_flush:
            flushed = p_abs - ref.grouped_gemm(gemm_tier.normal_magnitude(a, in_dt),
                                               gemm_tier.normal_magnitude(b, in_dt), splits,
                                               layout=layout, mag=True)
        return mag, flushed

    def bound(numerics):  # one declaration, or one per group (the split path's)
        return grouped_tier.grouped_bound(
            lambda num: magnitudes(num.alignment_floor, num.subnormal_inputs == "may_flush"),
            p, value, splits, case["k"], layout, out_dt, numerics, epilogue_abs)

    return verdicts(value, out_dt, bound, splits, layout, prior)


def verdicts(value, out_dt, bound, splits, layout, prior) -> dict[str, Expected]:
    """``out`` (the per-group GEMM bound, empty groups exact) and ``parity`` (tiers/parity.py)
    of a grouped GEMM case; ``bound(numerics or per-group numerics)``."""
    prior_t = None if prior is None else torch.from_numpy(np.asarray(prior)).to(out_dt)

    def parity_check(outs, num):
        return parity.judge(outs["out"], outs.get(SPLIT_OUTPUT), value, lambda: bound(num),
                            lambda: bound(outs[SPLIT_NUMERICS]), out_dt,
                            matches_split=num.grouped_matches_split)

    return {
        "out": Expected(value, out_dt, Tier.GEMM, bound, check=lambda outs, num:
                        grouped_tier.judge(outs["out"], value, bound(num), out_dt, splits,
                                           layout, prior_t)),
        "parity": Expected(value, out_dt, Tier.PARITY, check=parity_check),
    }


def make_case(layout, dtype, splits, n, k, m=8, **kw):
    """A grouped_gemm case with normal inputs; keyword arguments override any field."""
    case = {"layout": layout, "m_splits": list(splits), "m": m, "n": n, "k": k,
            "dtype": dtype, "out_dtype": dtype, "bias": False, "accumulate": False,
            "shared_weight": False, "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 1616}
    case.update(kw)
    return case


SPEC = register(OpSpec(
    name=Op.GROUPED_GEMM, family="gemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    coverage=cov.layout_cells("layout", GROUPED_LAYOUTS) + cov.layout_cells("bias", (True, False)),
    smoke_cases=(
        make_case("TN", "bfloat16", [3, 0, 5, 1], 24, 40, bias=True),
        make_case("NN", "float16", [0, 7], 17, 33, shared_weight=True, out_dtype="float32"),
        make_case("NT", "float32", [5, 0, 11], 17, 1, m=9, accumulate=True),
        make_case("NT", "bfloat16", [0, 0], 8, 1, m=4),
        make_case("TN", "bfloat16", [2, 3, 5, 7, 11], 31, 29, accumulate=True, bias=True),
    ),
))
