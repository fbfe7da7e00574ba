"""Specs for AITER's weight shuffle and E8M0 scale shuffle (and their inverses), judged by the
``shuffle`` tier (tiers/shuffle.py) and their round trips by the ``exact`` tier.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.ops.layouts import weight_tile
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import layouts as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import seeds
from tealite_verify.tiers import shuffle
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Tier

WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                 "e4m3": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz,
                 "int8": torch.int8, "fp4x2": torch.uint8}
_LIMIT = {"ci": 4, "local": 16, "large": 64}


def _raw(shape, dtype, seed, device):
    """Random bit patterns of ``dtype`` (every byte value, NaN codes included)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(dtype) \
        .reshape(shape).to(device)


@st.composite
def weight_cases(draw, dtype=None, size="ci"):
    wdt = draw(pick(*sorted(WEIGHT_DTYPES)))
    bn, bk, _ = weight_tile(WEIGHT_DTYPES[wdt])
    return {"wdtype": wdt, "n": bn * draw(dim(_LIMIT[size])), "k": bk * draw(dim(_LIMIT[size])),
            "seed": draw(seeds())}


def weight_inputs(case, device):
    return {"w": _raw((case["n"], case["k"]), WEIGHT_DTYPES[case["wdtype"]], case["seed"],
                      device)}


def weight_call(inputs, case, backend):
    shuffled = tealite.shuffle_weight(inputs["w"], backend=backend)
    return {"shuffled": shuffled,
            "roundtrip": tealite.unshuffle_weight(shuffled, backend=backend)}


def weight_reference(inputs, case):
    wdt = WEIGHT_DTYPES[case["wdtype"]]
    w = inputs["_w_bits"]
    bn, bk, kv = weight_tile(wdt)

    def check(outs, numerics):
        return shuffle.check_weight(outs["shuffled"], w, bn, bk, kv)

    def check_roundtrip(outs, numerics):
        return compare_exact(shuffle.bits(outs["roundtrip"]), w)

    return {"shuffled": Expected(ref.shuffle_weight(w, bn, bk, kv), None, Tier.SHUFFLE,
                                 check=check),
            "roundtrip": Expected(w, None, Tier.EXACT, check=check_roundtrip)}


@st.composite
def scale_cases(draw, dtype=None, size="ci"):
    return {"m": draw(dim(64 * _LIMIT[size], allow_zero=True)),
            "s": draw(dim(8 * _LIMIT[size], allow_zero=True)), "seed": draw(seeds())}


def scale_inputs(case, device):
    return {"scales": _raw((case["m"], case["s"]), torch.uint8, case["seed"], device)}


def scale_call(inputs, case, backend):
    shuffled = tealite.shuffle_e8m0_scales(inputs["scales"], backend=backend)
    return {"shuffled": shuffled, "roundtrip": tealite.unshuffle_e8m0_scales(
        shuffled, case["m"], case["s"], backend=backend)}


def scale_reference(inputs, case):
    m, s = case["m"], case["s"]
    plain = np.asarray(inputs["scales"]).astype(np.uint8)

    def check(outs, numerics):
        return shuffle.check_scales(outs["shuffled"], plain, m, s)

    def check_roundtrip(outs, numerics):
        return compare_exact(shuffle.bits(outs["roundtrip"]), plain)

    def pair(ox, oy, nx, ny):
        return shuffle.pair_scales(ox["shuffled"], oy["shuffled"], m, s)

    return {"shuffled": Expected(ref.shuffle_e8m0(plain), None, Tier.SHUFFLE, check=check,
                                 check_pair=pair),
            "roundtrip": Expected(plain, None, Tier.EXACT, check=check_roundtrip)}


def _with_bits(make):
    """make_inputs wrapper: keep the exact bit patterns for the reference (the runner's
    float64 view of fp8/bf16 inputs would not preserve NaN payloads)."""
    def wrapped(case, device):
        inputs = make(case, device)
        if "w" in inputs:
            inputs["_w_bits"] = shuffle.bits(inputs["w"])
        return inputs
    return wrapped


register(OpSpec(
    name=Op.SHUFFLE_WEIGHT, family="layouts", cases=weight_cases,
    make_inputs=_with_bits(weight_inputs), call=weight_call, reference=weight_reference,
    dtypes=("float32",), coverage=cov.layout_cells("wdtype", sorted(WEIGHT_DTYPES)),
    smoke_cases=tuple({"wdtype": d, "n": 32, "k": 128, "seed": 3} for d in WEIGHT_DTYPES)))
register(OpSpec(
    name=Op.SHUFFLE_E8M0, family="layouts", cases=scale_cases, make_inputs=scale_inputs,
    call=scale_call, reference=scale_reference, dtypes=("float32",),
    coverage=cov.edge_cells((cov.ONE_ELEMENT, cov.EMPTY, cov.MISALIGNED)),
    smoke_cases=({"m": 70, "s": 5, "seed": 1}, {"m": 256, "s": 8, "seed": 2},
                 {"m": 0, "s": 3, "seed": 3}, {"m": 513, "s": 17, "seed": 4})))
