"""Spec for ``grouped_quantize`` (issue 16): every quantize recipe, per-group scales, dbias.

Outputs: ``g<i>.<field>`` for group i's QuantizedTensor fields (``data``, ``scale_inv``,
``columnwise_data``, ``columnwise_scale_inv``, ``amax``), and ``dbias`` (G, K) when asked.

* **Codes, scales, amax per group**: the quantize spec's reference (tealite_verify/specs/
  quantize.py) applied to the group's rows alone, with its tiers (bit-exact FP8 codes and
  scales; the e8m0-adjusted tier for MX; the fp32-division tiers under AITER's rule).  The
  group's own amax, its own blocks and its own given scale are what makes a scale taken over
  the whole tensor, or a block crossing a group boundary, fail here.
* **dbias** (``ulp`` tier): the float64 column sum of each group.  The backend sums n_g
  values exactly representable in fp32 (x is fp32 / bf16 / fp16), in fp32 in any order, then
  rounds once to x's dtype: by Higham's bound for recursive (or any tree) summation the fp32
  error is at most gamma_{n_g}(u32) * sum_i |x_i| with gamma_n = n u / (1 - n u), and the
  final rounding adds half an ulp of the output at |ref| + that error.  That is
  ``ulp.elementwise_tolerance`` with ops=0, reduction=n_g and magnitude sum |x| (per group,
  so a group of few rows gets a tight bound).  An empty group's bound is half the smallest
  subnormal: only an exact zero passes.
* **parity** (tiers/parity.py): the backend's own per-group ``quantize`` calls, made in
  ``call`` as ``split.<name>``, equal its grouped outputs bit for bit.  This is the contract
  of the op (tealite/ops/grouped_quantize.py), so it is judged for every backend, with no
  declaration to opt out.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.moe_types import split_offsets
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import recipe_rules as rules
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs import quantize as quantize_spec
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.moe import GQ_LIMITS, gq_directions, gq_splits
from tealite_verify.strategies.recipes import (FP8_SCALE_RULES, given_scale, recipe_from_json,
                                               recipes)
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import ulp
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.parity import judge_outputs

FIELDS = ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax")
SPLIT = "split."  # prefix of the split path's outputs in call()'s dict


@functools.lru_cache(maxsize=None)
def _values(fmt: str, dtype: str) -> st.SearchStrategy[dict]:
    """Exact codes, ties and scale boundaries; NaN / Inf; rows of zeros; plain draws."""
    edges = st.just({"kind": "quant_edges", "fmt": fmt, "block": 32})
    specials = st.builds(lambda f: {"kind": "specials", "frac": f, "sample_dtype": "float32"},
                         pick(0.01, 0.2))
    zero_rows = st.just({"kind": "zero_rows", "scale": 3.0, "frac": 0.3})
    return st.one_of(edges, specials, zero_rows, distributions(dtype))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    dtype = dtype or draw(float_dtypes())
    entry = draw(recipes(scale_rules=FP8_SCALE_RULES))
    recipe = recipe_from_json(entry)
    max_rows, max_k, max_groups = GQ_LIMITS[size]
    rowwise, columnwise = draw(gq_directions())
    k = draw(dim(max_k))
    blk = rules.row_block(recipe)  # MX: whole blocks per group unless pad
    pad = bool(blk) and draw(st.booleans())
    if blk and not pad and rowwise:
        k = blk * max(1, k // blk)
    unit = blk if blk and not pad and columnwise else 1
    splits = draw(gq_splits(max_rows, max_groups, unit))
    zero_group = draw(st.none() | st.integers(0, len(splits) - 1))
    return {"recipe": entry, "dtype": dtype, "m_splits": splits, "shape": [sum(splits), k],
            "rowwise": rowwise, "columnwise": columnwise, "pad": pad,
            "dbias": draw(st.booleans()), "zero_group": zero_group,
            "dist": draw(_values(recipe.fmt, dtype)), "seed": draw(seeds())}


def group_scales(case) -> list[float] | None:
    """Each group's given scale (DelayedScaling): the drawn one times 1, 1/2, 1/4 in turn,
    so that a kernel reading another group's scale gives other codes."""
    base = given_scale(case["recipe"])
    if base is None:
        return None
    return [base * 2.0 ** -(g % 3) for g in range(len(case["m_splits"]))]


def make_inputs(case, device):
    x = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    g = case.get("zero_group")
    if g is not None and g < len(case["m_splits"]):  # a group whose amax is 0
        offsets = split_offsets(case["m_splits"])
        x[offsets[g]:offsets[g + 1]] = 0
    inputs = {"x": x}
    scales = group_scales(case)
    if scales is not None:
        inputs["scale"] = torch.tensor(scales, dtype=torch.float32, device=device)
    return inputs


def _fields(prefix: str, q) -> dict:
    return {f"{prefix}{f}": getattr(q, f) for f in FIELDS if getattr(q, f) is not None}


def call(inputs, case, backend):
    x, scale, recipe = inputs["x"], inputs.get("scale"), recipe_from_json(case["recipe"])
    flags = dict(rowwise=case["rowwise"], columnwise=case["columnwise"], pad=case["pad"],
                 backend=backend)
    out = tealite.grouped_quantize(x, case["m_splits"], recipe, dbias=case["dbias"],
                                   scale=scale, **flags)
    outputs = {}
    for g, q in enumerate(out.tensors):
        outputs.update(_fields(f"g{g}.", q))
    if out.dbias is not None:
        outputs["dbias"] = out.dbias
    # The split path: the same backend's quantize, one call per group (the parity oracle).
    offsets = split_offsets(case["m_splits"])
    for g in range(len(case["m_splits"])):
        q = tealite.quantize(x[offsets[g]:offsets[g + 1]], recipe,
                             scale=None if scale is None else scale[g:g + 1], **flags)
        outputs.update(_fields(f"{SPLIT}g{g}.", q))
    return outputs


def _strip(outs: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in outs.items() if k.startswith(prefix)}


def _group_expected(exp: Expected, prefix: str) -> Expected:
    """The quantize spec's verdict on one output, reading group ``prefix``'s outputs."""
    check = exp.check and (lambda outs, n, c=exp.check: c(_strip(outs, prefix), n))
    pair = exp.check_pair and (lambda ox, oy, nx, ny, c=exp.check_pair: c(
        _strip(ox, prefix), _strip(oy, prefix), nx, ny))
    return Expected(exp.value, exp.out_dtype, exp.tier, exp.bound, check=check,
                    check_pair=pair)


def _dbias_expected(x: np.ndarray, offsets, out_dtype) -> Expected:
    rows = [x[offsets[g]:offsets[g + 1]] for g in range(len(offsets) - 1)]
    value = np.stack([r.sum(axis=0) for r in rows]) if rows else np.zeros((0, x.shape[1]))
    magnitude = np.stack([np.abs(r).sum(axis=0) for r in rows])

    def bound(numerics):
        return np.stack([ulp.elementwise_tolerance(
            value[g], magnitude[g], out_dtype, numerics, ops=0, reduction=len(rows[g]))
            for g in range(len(rows))])

    return Expected(value, out_dtype, Tier.ULP, bound)


def _parity_expected() -> Expected:
    def check(outs, numerics):
        split = _strip(outs, SPLIT)
        fused = {k: v for k, v in outs.items() if k.startswith("g")}
        return judge_outputs(fused, split)

    return Expected(None, None, Tier.PARITY, check=check)


def reference(inputs, case):
    x = inputs["x"]
    offsets = split_offsets(case["m_splits"])
    scales = group_scales(case)
    expected = {}
    for g in range(len(case["m_splits"])):
        entry = dict(case["recipe"], scale=scales[g]) if scales else case["recipe"]
        one = {"recipe": entry, "rowwise": case["rowwise"], "columnwise": case["columnwise"]}
        for name, exp in quantize_spec.reference({"x": x[offsets[g]:offsets[g + 1]]},
                                                 one).items():
            expected[f"g{g}.{name}"] = _group_expected(exp, f"g{g}.")
    if case["dbias"]:
        expected["dbias"] = _dbias_expected(x, offsets, dtype_of(case["dtype"]))
    expected["parity"] = _parity_expected()
    return expected


def _smoke(recipe, dtype, splits, k, *, rowwise=True, columnwise=False, dbias=True,
           zero_group=None, dist=None, seed=1):
    return {"recipe": recipe, "dtype": dtype, "m_splits": splits, "shape": [sum(splits), k],
            "rowwise": rowwise, "columnwise": columnwise, "pad": False, "dbias": dbias,
            "zero_group": zero_group, "dist": dist or {"kind": "normal", "scale": 2.0},
            "seed": seed}


_CURRENT = {"kind": "current", "fmt": "e4m3", "granularity": "tensor",
            "force_pow2_scales": False, "amax_epsilon": 0.0}
_BLOCK_1x128_POW2 = {"kind": "block", "fmt": "e4m3", "block": [1, 128],
                     "force_pow2_scales": True, "amax_epsilon": 0.0}
SMOKE = (
    _smoke(_CURRENT, "bfloat16", [5, 0, 11, 1], 33, columnwise=True, zero_group=3),
    _smoke(_BLOCK_1x128_POW2, "float32", [3, 7, 0], 130, columnwise=True,
           dist={"kind": "outliers", "scale": 1.0, "frac": 0.05, "factor": 512.0}, seed=2),
    _smoke({"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"},
           "float16", [32, 0, 32], 64, columnwise=True, dbias=False, seed=3),
    _smoke({"kind": "delayed", "fmt": "e5m2", "scale": 0.75}, "float32", [4, 2, 0], 17,
           seed=4),
    _smoke(_CURRENT, "float16", [0, 0], 24, columnwise=True, seed=5),  # every group empty
)

register(OpSpec(
    name=Op.GROUPED_QUANTIZE, family="moe", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, smoke_cases=SMOKE, drives=(Op.GROUPED_QUANTIZE, Op.QUANTIZE),
    # Value edges that set "dist" only: a shape edge would break sum(m_splits) == M.
    coverage=cov.family_cells("recipe") + cov.direction_cells() + cov.edge_cells(
        (cov.NONFINITE, cov.TIES, cov.ZERO_BLOCK, cov.SUBNORMAL_BLOCK))))
