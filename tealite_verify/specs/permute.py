"""Specs for MoE token permutation (semantics: tealite/ops/permute.py, tealite/moe_types.py).

A case names the routing (``map_type``, tokens, experts, top-k, the fraction of tokens routed
to nobody, how many routed rows are dropped, a routing seed), the rows that move (``shape`` =
[tokens, hidden], dtype and value distribution, or ``quant``: FP8 / MX codes with their
scales), and for pad / unpad / sort-chunks the group ``splits`` (and ``align`` / ``order``).
Routing is drawn as top-k distinct experts per token from seeded random scores.

Data movement (permuted rows, codes and scales, permuted probs, the row-id map, the kept
tokens per expert, padded / unpadded / sorted rows) is judged by the ``exact`` tier; the
merging sum of unpermute and the backward's products and probs gradient by
tiers/permute_sum.py's derived bounds.  The unpermute specs build their row-id map from the
reference's definition, so they test unpermute apart from any backend's permute.
"""
from __future__ import annotations

import numpy as np
import torch

import tealite
import tealite.recipes as R
from tealite.moe_types import MapType, RowIdMap
from tealite.types import Op, QuantizedTensor
from tealite_verify import coverage as cov
from tealite_verify.graph_replay import GraphReplayPolicy
from tealite_verify.references import permute as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies import moe as strat
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import permute_sum
from tealite_verify.tiers.metrics import Tier

from hypothesis import strategies as st



def probs_dtype(case) -> torch.dtype:
    """The probs' dtype: float32 (TE's recommendation) unless the case names another."""
    return dtype_of(case.get("probs_dtype", "float32"))


# ---- inputs -------------------------------------------------------------------------------

def routing_of(case) -> torch.Tensor:
    """The case's routing: mask (tokens, experts) bool or indices (tokens, topk) int32."""
    n, e, k = case["shape"][0], case["experts"], case["topk"]
    g = torch.Generator().manual_seed(case["routing_seed"])
    idx = torch.rand((n, e), generator=g).argsort(dim=1)[:, :k]  # k distinct experts
    if case["map_type"] == "index":
        return idx.to(torch.int32)
    mask = torch.zeros((n, e), dtype=torch.bool).scatter_(1, idx, True)
    nobody = torch.randperm(n, generator=g)[:int(round(case.get("nobody", 0.0) * n))]
    mask[nobody] = False
    return mask


def routed(routing: torch.Tensor, map_type: str) -> int:
    return int(routing.sum()) if map_type == "mask" else routing.numel()


def num_out_tokens(case, routing) -> int:
    return max(0, routed(routing, case["map_type"]) - case["drop"])


# The quantized layouts: (recipe, codes dtype, code columns, scale shape, scale dtype).
def quant_layout(case):
    m, k = case["shape"]
    fmt, quant = case.get("fmt", "e4m3"), case["quant"]
    codes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    if quant in ("tensor", "row"):
        return (R.Float8CurrentScaling(fmt=fmt, granularity=quant), codes, k,
                (1,) if quant == "tensor" else (m,), torch.float32)
    if quant == "block":
        return R.Float8BlockScaling(fmt=fmt), codes, k, (m, -(-k // 128)), torch.float32
    if quant == "mx":
        return R.MXBlockScaling(fmt=fmt), codes, k, (m, -(-k // 32)), torch.uint8
    return R.MXBlockScaling(fmt="e2m1"), torch.uint8, -(-k // 2), (m, -(-k // 32)), torch.uint8


def _raw(shape, dtype, seed, device) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaN codes included)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(dtype) \
        .reshape(shape).to(device)


def _rows_inputs(case, device, rows: int | None = None) -> dict:
    """x (values), or codes and scales for a quantized case."""
    m = case["shape"][0] if rows is None else rows
    k = case["shape"][1]
    if case.get("quant") is None:
        return {"x": generate(case["dist"], [m, k], dtype_of(case["dtype"]), case["seed"],
                              device)}
    recipe, codes, cols, scale_shape, scale_dtype = quant_layout(dict(case, shape=[m, k]))
    if scale_dtype == torch.uint8:
        scales = _raw(scale_shape, torch.uint8, case["seed"] + 1, device)
    else:
        g = torch.Generator().manual_seed(case["seed"] + 1)
        scales = torch.exp2(torch.randint(-20, 20, scale_shape, generator=g).float()) \
            .to(device)
    return {"codes": _raw((m, cols), codes, case["seed"], device), "scales": scales}


def rows_arg(inputs, case):
    """What the front-end takes: x, or a QuantizedTensor of the codes and scales."""
    if case.get("quant") is None:
        return inputs["x"]
    recipe = quant_layout(case)[0]
    return QuantizedTensor(recipe, (inputs["codes"].shape[0], case["shape"][1]),
                           data=inputs["codes"], scale_inv=inputs["scales"])


def rows_outputs(out, prefix: str = "") -> dict:
    if isinstance(out, QuantizedTensor):
        return {f"{prefix}data": out.data, f"{prefix}scale_inv": out.scale_inv}
    return {f"{prefix}out": out}


def _probs(case, shape, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(case["seed"] + 7)
    return torch.rand(shape, generator=g, dtype=torch.float32).to(probs_dtype(case)) \
        .to(device)


# ---- expected values ------------------------------------------------------------------------

def _exact(value, dtype) -> Expected:
    t = torch.from_numpy(np.ascontiguousarray(value)).to(dtype)
    return Expected(t, dtype, Tier.EXACT)


def _rows_expected(x, case, move, fill_scale=None) -> dict:
    """``move(array, fill)`` applied to x, or to the codes and (row-indexed) scales."""
    if case.get("quant") is None:
        return {"out": _exact(move(x["x"], 0.0), dtype_of(case["dtype"]))}
    _, codes, _, _, scale_dtype = quant_layout(case)
    if case["quant"] == "tensor":
        scales = x["scales"]
    else:
        one = 127.0 if scale_dtype == torch.uint8 else 1.0
        s2 = x["scales"].reshape(-1, 1) if case["quant"] == "row" else x["scales"]
        scales = move(s2, one).reshape((-1,) if case["quant"] == "row" else (-1, s2.shape[1]))
    return {"data": _exact(move(x["codes"], 0.0), codes), "scale_inv": _exact(scales, scale_dtype)}


def _row_map(x, case) -> tuple[np.ndarray, int]:
    n_out = int(x["num_out"]) if "num_out" in x else None
    return ref.row_id_map(x["routing"], case["map_type"], case["experts"], n_out), n_out


# ---- moe_permute ------------------------------------------------------------------------------

@st.composite
def permute_cases(draw, dtype=None, size="ci"):
    case = draw(strat.permute_routing(size))
    rows = draw(strat.permute_rows(dtype, size))
    case.update(rows, shape=[case.pop("tokens"), rows.pop("hidden")])
    case.pop("hidden", None)
    case["with_probs"] = draw(st.booleans())
    return case


def permute_inputs(case, device) -> dict:
    routing = routing_of(case)
    inputs = dict(_rows_inputs(case, device), routing=routing.to(device))
    inputs["num_out"] = num_out_tokens(case, routing)
    if case["with_probs"]:
        inputs["probs"] = _probs(case, tuple(routing.shape), device)
    return inputs


def permute_call(inputs, case, backend):
    p = tealite.moe_permute(rows_arg(inputs, case), inputs["routing"], map_type=case["map_type"],
                            num_experts=case["experts"], num_out_tokens=inputs["num_out"],
                            probs=inputs.get("probs"), backend=backend)
    out = dict(rows_outputs(p.out), row_id_map=p.row_id_map.rows,
               tokens_per_expert=torch.tensor(p.row_id_map.tokens_per_expert,
                                              dtype=torch.int64))
    if p.probs is not None:
        out["probs"] = p.probs
    return out


def permute_reference(x, case):
    rows, n_out = _row_map(x, case)
    exp = _rows_expected(x, case, lambda a, fill: ref.permute(a, rows, n_out))
    exp["row_id_map"] = _exact(rows, torch.int32)
    exp["tokens_per_expert"] = _exact(
        ref.tokens_per_expert(x["routing"], case["map_type"], case["experts"], rows),
        torch.int64)
    if case["with_probs"]:
        exp["probs"] = _exact(ref.permute_probs(x["probs"], rows, n_out), probs_dtype(case))
    return exp


# ---- moe_unpermute and its backward -------------------------------------------------------------

@st.composite
def unpermute_bwd_cases(draw, dtype=None, size="ci"):
    case = draw(strat.permute_routing(size))
    rows = draw(strat.permute_rows(dtype, size, quantized=False))
    case.update(rows, shape=[case.pop("tokens"), rows.pop("hidden")])
    case.pop("hidden", None)
    case["with_probs"] = draw(st.booleans())
    return case


@st.composite
def unpermute_cases(draw, dtype=None, size="ci"):
    """As the backward's, and sometimes quantized rows (codes with their scales): unpermuted
    without probs and routed top-1, the case where that is a move (tealite/ops/permute.py)."""
    case = draw(unpermute_bwd_cases(dtype, size))
    if draw(st.integers(0, 3)) == 0:
        case.update(quant=draw(st.sampled_from(strat.PERMUTE_QUANT)),
                    fmt=draw(st.sampled_from(("e4m3", "e5m2"))), topk=1, with_probs=False)
    return case


def _map_inputs(case, device) -> dict:
    routing = routing_of(case)
    n_out = num_out_tokens(case, routing)
    rows = ref.row_id_map(routing.numpy(), case["map_type"], case["experts"], n_out)
    tpe = ref.tokens_per_expert(routing.numpy(), case["map_type"], case["experts"], rows)
    inputs = {"routing": routing.to(device), "num_out": n_out,
              "rows": torch.from_numpy(rows).to(torch.int32).to(device),
              "tokens_per_expert": tuple(int(v) for v in tpe)}
    if case["with_probs"]:
        inputs["probs"] = _probs(case, tuple(routing.shape), device)
    return inputs


def row_id_map_of(inputs, case) -> RowIdMap:
    return RowIdMap(inputs["rows"], MapType(case["map_type"]), case["experts"],
                    inputs["num_out"], inputs["tokens_per_expert"])


def unpermute_inputs(case, device) -> dict:
    inputs = _map_inputs(case, device)
    if case.get("quant") is not None:  # the permuted codes and scales
        return dict(inputs, **_rows_inputs(case, device, rows=inputs["num_out"]))
    inputs["permuted"] = generate(case["dist"], [inputs["num_out"], case["shape"][1]],
                                  dtype_of(case["dtype"]), case["seed"], device)
    return inputs


def unpermute_call(inputs, case, backend):
    permuted = rows_arg(inputs, case) if case.get("quant") is not None else inputs["permuted"]
    return rows_outputs(tealite.moe_unpermute(permuted, row_id_map_of(inputs, case),
                                              merging_probs=inputs.get("probs"),
                                              backend=backend))


def _prob_scale(probs):
    return 1.0 if probs is None else max(1.0, float(np.abs(probs).max(initial=0.0)))


def unpermute_reference(x, case):
    rows = x["rows"].astype(np.int64)
    if case.get("quant") is not None:
        return _rows_expected(x, case, lambda a, fill: ref.unpermute_moved(a, rows, fill))
    probs = x.get("probs")
    value, mag, terms = ref.unpermute(x["permuted"], rows, probs)
    out_dt = dtype_of(case["dtype"])
    return {"out": Expected(value, out_dt, Tier.ULP, lambda nm: permute_sum.dot_tolerance(
        value, mag, terms, out_dt, nm, prob_scale=_prob_scale(probs)))}


def unpermute_bwd_inputs(case, device) -> dict:
    inputs = _map_inputs(case, device)
    dt = dtype_of(case["dtype"])
    inputs["grad_out"] = generate(case["dist"], case["shape"], dt, case["seed"], device)
    inputs["permuted"] = generate(case["dist"], [inputs["num_out"], case["shape"][1]], dt,
                                  case["seed"] + 3, device)
    return inputs


def unpermute_bwd_call(inputs, case, backend):
    g = tealite.moe_unpermute_bwd(inputs["grad_out"], row_id_map_of(inputs, case),
                                  permuted=inputs["permuted"], merging_probs=inputs.get("probs"),
                                  backend=backend)
    out = {"grad_permuted": g.grad_permuted}
    if g.grad_probs is not None:
        out["grad_probs"] = g.grad_probs
    return out


def unpermute_bwd_reference(x, case):
    rows = x["rows"].astype(np.int64)
    probs = x.get("probs")
    gp, gprobs, mag = ref.unpermute_bwd(x["grad_out"], rows, int(x["num_out"]), x["permuted"],
                                        probs)
    out_dt = dtype_of(case["dtype"])
    if probs is None:
        return {"grad_permuted": _exact(gp, out_dt)}
    hidden = case["shape"][1]
    return {"grad_permuted": Expected(gp, out_dt, Tier.ULP,
                                      lambda nm: permute_sum.product_tolerance(gp, out_dt, nm)),
            "grad_probs": Expected(gprobs, probs_dtype(case), Tier.ULP,
                                   lambda nm: np.where(rows >= 0, permute_sum.dot_tolerance(
                                       gprobs, mag, hidden, probs_dtype(case), nm), 0.0))}


# ---- sort chunks, pad / unpad -------------------------------------------------------------------

def splits_of(case) -> list[int]:
    """The drawn splits made to sum to shape[0] (an edge cell may have moved it): trimmed
    from the last group, or the difference added to it."""
    splits, total = list(case["splits"]), case["shape"][0]
    for g in range(len(splits) - 1, -1, -1):
        over = sum(splits) - total
        if over <= 0:
            break
        splits[g] -= min(over, splits[g])
    splits[-1] += total - sum(splits)
    return splits


@st.composite
def split_cases(draw, dtype=None, size="ci"):
    rows = draw(strat.permute_rows(dtype, size))
    splits = draw(strat.permute_splits(size))
    case = dict(rows, shape=[sum(splits), rows["hidden"]], splits=splits,
                align=draw(strat.pad_aligns()))
    case.pop("hidden")
    case["order"] = draw(st.permutations(list(range(len(splits)))))
    case["with_probs"] = draw(st.booleans())
    case["probs_dtype"] = draw(strat.probs_dtypes())
    return case


def sort_inputs(case, device) -> dict:
    inputs = _rows_inputs(case, device)
    if case["with_probs"]:
        inputs["probs"] = _probs(case, (case["shape"][0],), device)
    return inputs


def sort_call(inputs, case, backend):
    s = tealite.moe_sort_chunks(rows_arg(inputs, case), splits_of(case), case["order"],
                                probs=inputs.get("probs"), backend=backend)
    out = rows_outputs(s.out)
    if s.probs is not None:
        out["probs"] = s.probs
    return out


def sort_reference(x, case):
    splits = splits_of(case)
    exp = _rows_expected(x, case, lambda a, fill: ref.sort_chunks(a, splits, case["order"]))
    if case["with_probs"]:
        exp["probs"] = _exact(ref.sort_chunks(x["probs"], splits, case["order"]),
                              probs_dtype(case))
    return exp


def pad_call(inputs, case, backend):
    p = tealite.moe_pad_rows(rows_arg(inputs, case), splits_of(case), case["align"],
                             backend=backend)
    return rows_outputs(p.out)


def pad_reference(x, case):
    splits, align = splits_of(case), case["align"]
    return _rows_expected(x, case, lambda a, fill: ref.pad_rows(a, splits, align, fill))


def unpad_inputs(case, device) -> dict:
    padded = sum(-(-s // case["align"]) * case["align"] for s in splits_of(case))
    return _rows_inputs(case, device, rows=padded)


def unpad_call(inputs, case, backend):
    p = tealite.moe_unpad_rows(rows_arg(inputs, case), splits_of(case), case["align"],
                               backend=backend)
    return rows_outputs(p.out)


def unpad_reference(x, case):
    splits, align = splits_of(case), case["align"]
    return _rows_expected(x, case, lambda a, fill: ref.unpad_rows(a, splits, align))


# ---- smoke cases, coverage, registration ----------------------------------------------------

_DIST = {"kind": "normal", "scale": 1.0}


def _route(map_type, tokens, experts, topk, hidden, dtype="bfloat16", **kw):
    case = {"map_type": map_type, "shape": [tokens, hidden], "experts": experts, "topk": topk,
            "nobody": 0.0, "drop": 0, "routing_seed": 5, "dtype": dtype, "dist": _DIST,
            "seed": 7, "with_probs": True}
    case.update(kw)
    return case


def _split(splits, hidden, align, order, dtype="bfloat16", **kw):
    case = {"shape": [sum(splits), hidden], "splits": splits, "align": align, "order": order,
            "dtype": dtype, "dist": _DIST, "seed": 7, "with_probs": True}
    case.update(kw)
    return case


_ROUTE_SMOKE = (
    _route("mask", 13, 4, 2, 64),
    _route("index", 11, 8, 3, 40, "float16", probs_dtype="bfloat16"),
    _route("mask", 17, 5, 2, 24, "float32", nobody=0.25, drop=6, probs_dtype="float16"),
    _route("index", 7, 3, 3, 19, "float32", drop=9, with_probs=False),
    _route("mask", 0, 4, 2, 16),
    _route("mask", 9, 1, 1, 33, "float16", nobody=1.0),
)
_QUANT_SMOKE = (
    _route("mask", 10, 4, 2, 160, "float32", quant="block", fmt="e4m3", drop=3),
    _route("index", 6, 3, 2, 64, "float32", quant="mx", fmt="e5m2"),
    _route("mask", 5, 3, 2, 70, "float32", quant="mx-fp4", fmt="e4m3"),
    _route("index", 8, 4, 1, 48, "float32", quant="row", fmt="e4m3"),
    _route("mask", 8, 4, 2, 16, "float32", quant="tensor", fmt="e5m2"),
)
# Quantized unpermute: top-1, no probs (a move); tokens routed to nobody and dropped rows
# get a zero row (code 0, scale 1).
_UNPERMUTE_QUANT_SMOKE = (
    _route("mask", 10, 4, 1, 160, "float32", quant="block", fmt="e4m3", drop=3,
           with_probs=False),
    _route("index", 6, 3, 1, 64, "float32", quant="mx", fmt="e5m2", with_probs=False),
    _route("mask", 5, 3, 1, 70, "float32", quant="mx-fp4", fmt="e4m3", nobody=0.4,
           with_probs=False),
    _route("index", 8, 4, 1, 48, "float32", quant="row", fmt="e4m3", drop=2,
           with_probs=False),
    _route("mask", 8, 4, 1, 16, "float32", quant="tensor", fmt="e5m2", with_probs=False),
)
_SPLIT_SMOKE = (
    _split([3, 0, 5, 17], 40, 16, [2, 0, 3, 1]),
    _split([0, 0], 16, 128, [1, 0], "float16"),
    _split([129, 2], 8, 128, [1, 0], "float32", with_probs=False),
    _split([4, 1, 0], 160, 16, [1, 2, 0], "float32", quant="block", fmt="e4m3"),
    _split([7, 2], 64, 32, [1, 0], "float32", quant="mx", fmt="e4m3"),
)

_COVERAGE = cov.layout_cells("map_type", strat.MAP_TYPES) + cov.edge_cells(
    (cov.EMPTY, cov.MISALIGNED, cov.ZERO_BLOCK))
_SPLIT_COVERAGE = cov.edge_cells((cov.EMPTY, cov.MISALIGNED))

for _spec in (
    OpSpec(Op.MOE_PERMUTE, "permute", permute_cases, permute_inputs, permute_call,
           permute_reference, smoke_cases=_ROUTE_SMOKE + _QUANT_SMOKE, coverage=_COVERAGE,
           # found by an H100 --graph-replay fuzz (2026-11-27): the capture failed on both
           # backends because this call reads the counts back; the op skips its own reads
           # while capturing.
           graph_replay=GraphReplayPolicy(
               capturable=False, reason="the spec's call reads tokens_per_expert (the "
                                        "per-expert counts) back to the host to judge it, a "
                                        "sync a CUDA graph cannot capture")),
    OpSpec(Op.MOE_UNPERMUTE, "permute", unpermute_cases, unpermute_inputs, unpermute_call,
           unpermute_reference, smoke_cases=_ROUTE_SMOKE + _UNPERMUTE_QUANT_SMOKE,
           coverage=_COVERAGE),
    OpSpec(Op.MOE_UNPERMUTE_BWD, "permute", unpermute_bwd_cases, unpermute_bwd_inputs,
           unpermute_bwd_call, unpermute_bwd_reference, smoke_cases=_ROUTE_SMOKE,
           coverage=_COVERAGE),
    OpSpec(Op.MOE_SORT_CHUNKS, "permute", split_cases, sort_inputs, sort_call, sort_reference,
           smoke_cases=_SPLIT_SMOKE, coverage=_SPLIT_COVERAGE),
    OpSpec(Op.MOE_PAD_ROWS, "permute", split_cases, _rows_inputs, pad_call, pad_reference,
           smoke_cases=_SPLIT_SMOKE, coverage=_SPLIT_COVERAGE),
    OpSpec(Op.MOE_UNPAD_ROWS, "permute", split_cases, unpad_inputs, unpad_call,
           unpad_reference, smoke_cases=_SPLIT_SMOKE, coverage=_SPLIT_COVERAGE),
):
    register(_spec)
