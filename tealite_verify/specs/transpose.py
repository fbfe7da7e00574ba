"""Spec for ``transpose`` (issue 17 part 4): a plain tensor's transpose and a quantized tensor's
columnwise layout from its rowwise codes (``fp8_transpose``), judged ``exact``.

A transpose moves elements without arithmetic, so the only correct answer is the definition:
the reference (references/transpose.py) is x.T in x's element type and every output must equal
it bit for bit.  Cases: plain float32 / bf16 / fp16 tensors, contiguous or column-major (the
kernel reads x's strides), and FP8 codes of every format quantized by the torch backend (the
verified quantizer) with per-tensor or 128x128-block scales, compared as bytes; shapes with 0
and 1 rows, primes and one-off-alignment sizes around the kernels' 32-element tiles and the
128-element scale blocks.
"""
from __future__ import annotations

import numpy as np
import torch

import tealite
from tealite import recipes as R
from tealite.formats import get_format
from tealite.types import Op, QuantizedTensor
from tealite_verify import coverage as cov
from tealite_verify.references import transpose as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.training import (TRANSPOSE_KINDS, TRANSPOSE_LAYOUTS,
                                                transpose_cases)
from tealite_verify.tensors import dtype_of, from_bits, generate
from tealite_verify.tiers.metrics import Tier


def cases(dtype=None, size="ci"):
    return transpose_cases(dtype, size)


def recipe_of(case):
    if case["kind"] == "fp8_tensor":
        return R.Float8CurrentScaling(case["fmt"])
    return R.Float8BlockScaling(case["fmt"], block=(128, 128))


def make_inputs(case, device):
    x = generate(case["dist"], case["shape"], dtype_of(case["dtype"]), case["seed"], device)
    if case["kind"] == "plain":
        return {"x": x}
    q = tealite.quantize(x, recipe_of(case), backend="torch")
    # Codes as bytes: their float64 copy (the reference's input) is then exact.
    return {"codes": q.data.view(torch.uint8), "scale_inv": q.scale_inv}


def _strided(x, case):
    """x itself, or the same values held column-major (the kernel must follow the strides)."""
    return x.t().contiguous().t() if case["layout"] == "column_major" else x


def call(inputs, case, backend):
    if case["kind"] == "plain":
        return {"y": tealite.transpose(_strided(inputs["x"], case), backend=backend)}
    recipe = recipe_of(case)
    codes = _strided(inputs["codes"], case).view(get_format(case["fmt"]).torch_dtype)
    q = QuantizedTensor(recipe=recipe, shape=tuple(codes.shape), data=codes,
                        scale_inv=inputs["scale_inv"])
    t = tealite.fp8_transpose(q, backend=backend)
    return {"columnwise_data": t.columnwise_data.view(torch.uint8),
            "columnwise_scale_inv": t.columnwise_scale_inv}


def _exact(a: np.ndarray, dtype: torch.dtype) -> Expected:
    """The exact tier's expected tensor, as a torch tensor of ``dtype``: the tier reads torch
    bits as signed and numpy bits as unsigned integers, so a negative float held in numpy
    would differ from the same torch value."""
    return Expected(from_bits(a, dtype), dtype, Tier.EXACT)


def reference(inputs, case):
    if case["kind"] == "plain":
        return {"y": _exact(ref.transpose(inputs["x"], case["dtype"]),
                            dtype_of(case["dtype"]))}
    s = inputs["scale_inv"]
    scales = s.astype(np.float32) if case["kind"] == "fp8_tensor" else \
        ref.transpose(s, "float32")
    return {"columnwise_data": _exact(ref.transpose(inputs["codes"], "uint8"), torch.uint8),
            "columnwise_scale_inv": _exact(scales, torch.float32)}


def _smoke(dtype, shape, kind, fmt="e4m3", layout="contiguous", seed=1):
    return {"dtype": dtype, "shape": shape, "kind": kind, "fmt": fmt,
            "layout": layout, "dist": {"kind": "specials", "frac": 0.1, "sample_dtype":
                                       "float32"}, "seed": seed}


SMOKE = (
    _smoke("bfloat16", [37, 67], "plain", layout="column_major"),
    _smoke("float32", [1, 33], "plain"),
    _smoke("float16", [0, 5], "plain"),
    _smoke("float32", [131, 129], "fp8_block128", "e5m2fnuz", seed=2),
    _smoke("bfloat16", [33, 1], "fp8_tensor", "e4m3", layout="column_major", seed=3),
)

register(OpSpec(
    name=Op.TRANSPOSE, family="training", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference, smoke_cases=SMOKE,
    coverage=(cov.layout_cells("kind", TRANSPOSE_KINDS)
              + cov.layout_cells("layout", TRANSPOSE_LAYOUTS)
              + cov.edge_cells((cov.ONE_ELEMENT, cov.EMPTY, cov.MISALIGNED)))))
