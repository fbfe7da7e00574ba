"""Spec for ``tealite.grouped_qgemm``: every qgemm recipe pair (FP8 per-tensor current /
delayed and per-row, FP8 block scaling 1x128 tokens x 128x128 weights with and without
power-of-two scales, MXFP8 / MXFP4) in every grouped layout, per-group or shared weights,
bias and accumulate.

Each group's operands are quantized on their own by the *reference* quantizer (per-group
scales, as grouped quantize makes them), so every backend multiplies the same codes; the
reference dequantizes them exactly and multiplies in float64 group by group.  Verdicts as
specs/grouped_gemm.py: ``out`` under the per-group GEMM bound, ``parity`` against the
backend's own split path (a loop of single ``tealite.qgemm`` calls, tiers/parity.py).
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.errors import UnsupportedCase
from tealite.moe_types import GROUPED_LAYOUTS, split_offsets, splits_k
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import recipe_rules as rules
from tealite_verify.references import grouped_gemm as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs.grouped_gemm import (declared_by, out_shape, stored_shapes, verdicts,
                                               with_split)
from tealite_verify.specs.qgemm import (_AlignedMagnitude, _k_last, _operand, _recipe_pair,
                                        dequantize_k_last, quantize_k_last)
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.moe import grouped_gemm_dims
from tealite_verify.strategies.recipes import recipe_from_json
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import grouped_gemm as grouped_tier
from tealite_verify.tiers import parity
from tealite_verify.tiers.metrics import Tier


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    dtype = dtype or draw(float_dtypes())
    ra, rb = draw(_recipe_pair())
    splits, m, n, k = draw(grouped_gemm_dims(size))
    layout = draw(pick(*GROUPED_LAYOUTS))
    blk = rules.row_block(recipe_from_json(ra))
    if blk:  # MX: every K-last row holds whole 32-blocks: K, and NT's group sizes, in blocks
        k = blk * max(1, k // blk)
        if splits_k(layout):
            splits = [blk * min(s, 2) for s in splits]
    split_m = not splits_k(layout)
    return {"recipe_a": ra, "recipe_b": rb, "layout": layout, "m_splits": splits, "m": m,
            "n": n, "k": k, "dtype": dtype,
            "out_dtype": draw(pick("bfloat16", "float32", "float16")),
            "bias": split_m and draw(st.booleans()),
            "accumulate": draw(pick(False, False, True)),
            "shared_weight": split_m and draw(pick(False, False, True)),
            "dist_a": draw(distributions(dtype, wide=False)),
            "dist_b": draw(distributions(dtype, wide=False)), "seed": draw(seeds())}


def _groups(x: torch.Tensor, case, side: str) -> list[torch.Tensor]:
    """The stored per-group matrices of operand ``side`` ("a" or "b")."""
    splits, layout = case["m_splits"], case["layout"]
    off = split_offsets(splits)
    if side == "a" and not splits_k(layout):
        return [x] if x.dim() == 2 else [x[g] for g in range(len(splits))]
    return [x[off[g]:off[g + 1]] for g in range(len(splits))]


def make_inputs(case, device):
    dt = dtype_of(case["dtype"])
    a_shape, b_shape = stored_shapes(case)
    s = case["seed"]
    a = generate(case["dist_a"], a_shape, dt, s)
    b = generate(case["dist_b"], b_shape, dt, s + 1)
    k_first_a, k_first_b = case["layout"][0] == "N", case["layout"][1] == "T"
    inputs = {"a_x": a.to(device), "b_x": b.to(device),
              "_qa": [_operand(x, case["recipe_a"], k_first_a, device)
                      for x in _groups(a, case, "a")],
              "_qb": [_operand(x, case["recipe_b"], k_first_b, device)
                      for x in _groups(b, case, "b")]}
    out_dt = dtype_of(case["out_dtype"])
    if case["bias"]:
        inputs["bias"] = generate({"kind": "normal", "scale": 1.0},
                                  (len(case["m_splits"]), case["n"]), out_dt, s + 2, device)
    if case["accumulate"]:
        inputs["out"] = generate({"kind": "normal", "scale": 1.0}, out_shape(case), out_dt,
                                 s + 3, device)
    return inputs


def call(inputs, case, backend):
    prior = inputs.get("out")
    qa = inputs["_qa"][0] if case["shared_weight"] and not splits_k(case["layout"]) \
        else inputs["_qa"]
    out = tealite.grouped_qgemm(
        qa, inputs["_qb"], case["m_splits"], layout=case["layout"],
        out_dtype=dtype_of(case["out_dtype"]), bias=inputs.get("bias"),
        out=None if prior is None else prior.clone(), accumulate=case["accumulate"],
        backend=backend)
    return with_split({"out": out}, split_path(inputs, case, backend))


def split_path(inputs, case, backend) -> tuple[torch.Tensor, tuple] | None:
    """The split per-group path: the same backend's single ``qgemm`` per non-empty group;
    with accumulate (qgemm has no beta) its fp32 product added to the prior in fp32 and
    rounded once, as tealite/ops/grouped_gemm.py specifies; (output, per-group numerics).
    None when qgemm refuses a group."""
    qa, qb, bias = inputs["_qa"], inputs["_qb"], inputs.get("bias")
    splits, layout = case["m_splits"], case["layout"]
    out_dt = dtype_of(case["out_dtype"])
    prior = inputs.get("out")
    result = prior.clone() if prior is not None else \
        torch.zeros(out_shape(case), dtype=out_dt, device=inputs["b_x"].device)
    off = split_offsets(splits)
    declared = [None] * len(splits)
    for g, rows in enumerate(splits):
        if rows == 0:
            continue
        target = result[g] if splits_k(layout) else result[off[g]:off[g + 1]]
        try:
            r, declared[g] = declared_by(Op.QGEMM, lambda: tealite.qgemm(
                qa[g if len(qa) > 1 else 0], qb[g], layout=layout,
                out_dtype=torch.float32 if case["accumulate"] else out_dt,
                bias=None if bias is None else bias[g], backend=backend).out)
        except UnsupportedCase:
            return None
        target.copy_((target.float() + r).to(out_dt) if case["accumulate"] else r)
    return result, tuple(declared)


def reference(x, case):
    splits, layout, n = case["m_splits"], case["layout"], case["n"]
    ra, rb = case["recipe_a"], case["recipe_b"]
    a_groups = _groups(torch.from_numpy(x["a_x"]), case, "a")
    b_groups = _groups(torch.from_numpy(x["b_x"]), case, "b")
    a_k = [_k_last(t.numpy().astype(np.float32), layout[0] == "N") for t in a_groups]
    b_k = [_k_last(t.numpy().astype(np.float32), layout[1] == "T") for t in b_groups]
    a_deq = [dequantize_k_last(*quantize_k_last(t, ra), ra) for t in a_k]
    b_deq = [dequantize_k_last(*quantize_k_last(t, rb), rb) for t in b_k]
    bias, prior = x.get("bias"), x.get("out")
    m = case["m"] if splits_k(layout) else None
    value = ref.grouped_qgemm(a_deq, b_deq, splits, layout=layout, n=n, m=m, bias=bias,
                              prior=prior)
    p = ref.grouped_qgemm(a_deq, b_deq, splits, layout=layout, n=n, m=m)
    p_abs = ref.grouped_qgemm(a_deq, b_deq, splits, layout=layout, n=n, m=m, mag=True)
    epilogue_abs = np.zeros_like(p)
    if prior is not None:
        epilogue_abs = epilogue_abs + np.abs(prior)
    if bias is not None:
        epilogue_abs = epilogue_abs + np.repeat(np.abs(bias), splits, axis=0)
    out_dt = dtype_of(case["out_dtype"])
    aligned = _Aligned(a_k, b_k, ra, rb, p_abs, splits, layout)

    def bound(numerics):  # one declaration, or one per group (the split path's)
        return grouped_tier.grouped_bound(
            lambda num: (aligned(num.mma_restart_k)
                         if num.alignment_floor == FP8_CODE_ALIGNMENT else p_abs, None),
            p, value, splits, case["k"], layout, out_dt, numerics, epilogue_abs)

    return verdicts(value, out_dt, bound, splits, layout, prior)


class _Aligned:
    """specs/qgemm.py's aligned magnitude (Hopper FP8 MMA; per restart block where the
    backend declares ``mma_restart_k``), group by group, stitched as the output is; computed
    on first use."""

    def __init__(self, a_k, b_k, ra, rb, p_abs, splits, layout):
        self._args, self._values = (a_k, b_k, ra, rb, p_abs, splits, layout), {}

    def __call__(self, restart_k: int | None = None):
        if restart_k not in self._values:
            a_k, b_k, ra, rb, p_abs, splits, layout = self._args
            off = split_offsets(splits)
            parts = []
            for g in range(len(splits)):
                own = p_abs[g] if splits_k(layout) else p_abs[off[g]:off[g + 1]]
                parts.append(_AlignedMagnitude(a_k[g if len(a_k) > 1 else 0], b_k[g], ra, rb,
                                               own)(restart_k))
            self._values[restart_k] = np.stack(parts) if splits_k(layout) \
                else np.concatenate(parts)
        return self._values[restart_k]


_CUR = {"kind": "current", "fmt": "e4m3", "granularity": "tensor", "force_pow2_scales": False,
        "amax_epsilon": 0.0}
_DEL = {"kind": "delayed", "fmt": "e4m3", "scale": 0.75}
_BLK = {"kind": "block", "fmt": "e4m3", "block": [128, 128], "force_pow2_scales": True,
        "amax_epsilon": 0.0}
_MX8 = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}


def _smoke(ra, rb, layout, splits, n, k, m=8, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "layout": layout, "m_splits": list(splits),
            "m": m, "n": n, "k": k, "dtype": "bfloat16", "out_dtype": "bfloat16",
            "bias": False, "accumulate": False, "shared_weight": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 316}
    case.update(kw)
    return case


register(OpSpec(
    name=Op.GROUPED_QGEMM, family="qgemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    # recipe_b follows recipe_a (specs/qgemm.py's operand pairs), so recipe_a's cells reach
    # every pair kind; recipe_b's own cells would double the interpreted cases for little.
    coverage=(cov.recipe_cells("recipe_a") + cov.layout_cells("layout", GROUPED_LAYOUTS)),
    smoke_cases=(
        _smoke(_CUR, _CUR, "TN", [3, 0, 5, 1], 24, 40, bias=True),
        _smoke(_BLK, dict(_BLK, block=[1, 128]), "TN", [0, 7, 2], 17, 200),
        _smoke(dict(_BLK, force_pow2_scales=False),
               dict(_BLK, block=[1, 128], force_pow2_scales=False), "NN", [5, 3], 9, 130,
               shared_weight=True, out_dtype="float32"),
        _smoke(_MX8, _MX8, "NT", [32, 0, 64], 12, 1, m=5, accumulate=True),
        _smoke(_CUR, _CUR, "NT", [0, 0], 8, 1, m=4),
        _smoke(_DEL, _CUR, "NN", [4, 4], 16, 32, accumulate=True, bias=True),
    )))
