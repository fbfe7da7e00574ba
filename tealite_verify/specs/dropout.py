"""Specs for ``dropout_fwd`` and ``dropout_bwd`` (tealite/ops/dropout.py).

Every output is judged under the backend's *own* mask, since masks are each generator's own
(never compared bit for bit across backends):

* ``y`` (exact): ``y == fl_dtype(fl32(x) * fl32(1/(1-p)))`` where the returned mask keeps,
  +0 elsewhere (references/dropout.py), bit for bit;
* ``mask`` (statistical): bool, x's shape, and a sample of Bernoulli(1 - p) draws;
* ``mask_again`` (exact): the same (seed, offset) called again gives the same mask;
* ``stats`` (statistical): a larger mask (``stats_shape``, the offset and offset + 1) through
  every test of tiers/statistical.py: kept fraction, periodic classes, lags, and the next
  offset's stream;
* ``dx`` (dropout_bwd, exact): ``dropout_bwd(dy, mask)`` with the forward's mask is the same
  rule applied to dy: the backward uses the forward's mask (nothing regenerated).

Backend vs backend: each side's verdicts under its own mask (``exact-pair`` /
``statistical-pair``), never a bitwise comparison of the two.
"""
from __future__ import annotations

import torch

import tealite
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import dropout as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.training import dropout_cases
from tealite_verify.tensors import dtype_of, from_bits, generate
from tealite_verify.tiers import statistical
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, Tier, combine_pair, malformed


def make_inputs(case, device):
    dt = dtype_of(case["dtype"])
    return {"x": generate(case["dist"], case["shape"], dt, case["seed"], device),
            "dy": generate(case["dist"], case["shape"], dt, case["seed"] + 1, device)}


def _fwd(x, case, backend, offset=None):
    return tealite.dropout_fwd(x, case["p"], seed=case["drop_seed"],
                               offset=case["offset"] if offset is None else offset,
                               backend=backend)


def call_fwd(inputs, case, backend):
    x = inputs["x"]
    y, mask = _fwd(x, case, backend)
    zeros = torch.zeros(case["stats_shape"], dtype=x.dtype, device=x.device)
    return {"y": y, "mask": mask, "mask_again": _fwd(x, case, backend).mask,
            "stats": _fwd(zeros, case, backend).mask,
            "stats_next": _fwd(zeros, case, backend, case["offset"] + 1).mask}


def call_bwd(inputs, case, backend):
    y, mask = _fwd(inputs["x"], case, backend)
    return {"mask": mask,
            "dx": tealite.dropout_bwd(inputs["dy"], mask, case["p"], backend=backend)}


def _mask_malformed(mask, shape) -> Metrics | None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return malformed(f"mask must be a bool tensor, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if tuple(mask.shape) != tuple(shape):
        return malformed(f"mask shape {tuple(mask.shape)} != {tuple(shape)}")
    return None


def _scaled_check(name: str, value64, case):
    """The exact verdict of output ``name`` against the rule under the outputs' own mask."""
    def check(outs, numerics=None):
        bad = _mask_malformed(outs.get("mask"), case["shape"])
        if bad is not None:
            return bad
        want = ref.apply_mask(value64, outs["mask"].cpu().numpy(), case["p"], case["dtype"])
        return compare_exact(outs[name], from_bits(want, dtype_of(case["dtype"])))

    def pair(ox, oy, nx=None, ny=None):
        return combine_pair(check(ox), check(oy), Tier.EXACT_PAIR)
    return Expected(None, dtype_of(case["dtype"]), Tier.EXACT, check=check, check_pair=pair)


def _mask_check(case):
    def check(outs, numerics=None):
        mask = outs.get("mask")
        return _mask_malformed(mask, case["shape"]) or statistical.judge_mask(
            mask, case["p"], row=case["shape"][-1] if case["shape"] else None)

    def pair(ox, oy, nx=None, ny=None):
        return combine_pair(check(ox), check(oy), Tier.STATISTICAL_PAIR)
    return Expected(None, torch.bool, Tier.STATISTICAL, check=check, check_pair=pair)


def _again_check(case):
    def check(outs, numerics=None):
        bad = _mask_malformed(outs.get("mask_again"), case["shape"])
        return bad or compare_exact(outs["mask_again"], outs["mask"])

    def pair(ox, oy, nx=None, ny=None):
        return combine_pair(check(ox), check(oy), Tier.EXACT_PAIR)
    return Expected(None, torch.bool, Tier.EXACT, check=check, check_pair=pair)


def _stats_check(case):
    rows, cols = case["stats_shape"]

    def check(outs, numerics=None):
        for name in ("stats", "stats_next"):
            bad = _mask_malformed(outs.get(name), (rows, cols))
            if bad is not None:
                return bad
        return statistical.judge_mask(outs["stats"], case["p"], row=cols,
                                      next_mask=outs["stats_next"])

    def pair(ox, oy, nx=None, ny=None):
        return combine_pair(check(ox), check(oy), Tier.STATISTICAL_PAIR)
    return Expected(None, torch.bool, Tier.STATISTICAL, check=check, check_pair=pair)


def reference_fwd(inputs, case):
    return {"y": _scaled_check("y", inputs["x"], case), "mask": _mask_check(case),
            "mask_again": _again_check(case), "stats": _stats_check(case)}


def reference_bwd(inputs, case):
    return {"dx": _scaled_check("dx", inputs["dy"], case)}


def _smoke(**kw):
    base = {"shape": [7, 33], "p": 0.1, "drop_seed": 1234, "offset": 0,
            "stats_shape": [64, 64], "dist": {"kind": "normal", "scale": 1.0}, "seed": 5}
    return {**base, **kw}


_SMOKE = (_smoke(dtype="float32"), _smoke(dtype="bfloat16", p=0.0),
          _smoke(dtype="float16", p=1.0, shape=[130]),
          _smoke(dtype="float32", p=0.5, shape=[0, 8], drop_seed=2**32 + 1, offset=2**32),
          _smoke(dtype="bfloat16", p=1.0 / 3.0, shape=[3, 2, 16],
                 dist={"kind": "specials", "frac": 0.3}))
_COVERAGE = cov.layout_cells("p", (0.0, 0.1, 0.5, 1.0)) + cov.edge_cells((cov.EMPTY,))

register(OpSpec(
    name=Op.DROPOUT_FWD, family="dropout", cases=dropout_cases, make_inputs=make_inputs,
    call=call_fwd, reference=reference_fwd, coverage=_COVERAGE,
    smoke_cases=_SMOKE))

register(OpSpec(
    name=Op.DROPOUT_BWD, family="dropout", cases=dropout_cases, make_inputs=make_inputs,
    call=call_bwd, reference=reference_bwd, coverage=_COVERAGE,
    drives=(Op.DROPOUT_FWD, Op.DROPOUT_BWD), smoke_cases=_SMOKE))
