"""Specs for TE's fused softmax kinds, forward and backward (tealite/ops/softmax.py).

Cases: ``shape`` is (b, h, sq, sk) for every kind (:func:`x_shape`); every kind
(``scaled``, ``scaled_masked`` with a (b or 1, 1, sq, sk) mask, ``scaled_upper_triang`` on
(b * h, sk, sk), ``scaled_aligned_causal`` with sq != sk drawn on
purpose, sq > sk giving fully hidden rows), prime and misaligned sq / sk, masks from none to
all-masked plus fully masked rows, and logits of three sizes: ordinary, ``large`` (|scale x|
in the hundreds to thousands: a softmax without the max subtraction overflows exp in every
dtype, at 88.7 in fp32 / bf16 and 11.1 in fp16) and the hostile distributions of
strategies/values.py.  Backward inputs: y is the float64 reference forward rounded to the
dtype (as a kernel's forward would give it), dy is drawn.

Tier: ``softmax`` (tiers/softmax.py, the derivation is there).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.types import SOFTMAX_KINDS, Op
from tealite_verify import coverage as cov
from tealite_verify.references import softmax as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import softmax as tier
from tealite_verify.tiers.metrics import Tier

# (max batch, max heads, max sq, max sk) per size: the ci size keeps interpreted Triton
# cases tiny (one program per row: at most 2 * 2 * 16 rows, or 4 * 16 for the square
# upper-triangular kind, whose sk is drawn like sq).
_LIMITS = {"ci": (2, 2, 16, 48), "local": (4, 8, 128, 1024), "large": (4, 8, 256, 4096)}
# Softmax scales: TE's usual 1/sqrt(head dim) (first: not a power of two, so scale * x
# rounds; Hypothesis favours early choices), 1, 1/sqrt(64), 2.
_SCALES = (1.0 / math.sqrt(96.0), 1.0, 0.125, 2.0)
# Logits whose scaled size overflows exp without the max subtraction, in every dtype.
_LARGE = ({"kind": "normal", "scale": 256.0, "sample_dtype": "float32"},
          {"kind": "uniform", "lo": 200.0, "hi": 900.0, "sample_dtype": "float32"})


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, bwd: bool,
          kinds=SOFTMAX_KINDS):
    max_b, max_h, max_sq, max_sk = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    kind = draw(pick(*kinds))
    # The square upper-triangular kind draws its sk like sq (its rows are b * h * sk).
    sk = draw(dim(max_sq if kind == "scaled_upper_triang" else max_sk, allow_zero=True))
    shape = [draw(dim(max_b)), draw(dim(max_h)), draw(dim(max_sq)), sk]
    case = {"kind": kind, "shape": shape, "dtype": dtype, "scale": draw(pick(*_SCALES)),
            "dist": draw(st.one_of(distributions(dtype, max_log2=12), pick(*_LARGE))),
            "seed": draw(seeds())}
    if kind == "scaled_masked":
        case["mask_batch"] = draw(pick("b", "1"))
        case["mask_frac"] = draw(pick(0.0, 0.3, 0.9, 1.0))
        case["masked_rows"] = draw(pick(0.0, 0.0, 0.25))
    if bwd:
        case["dist_dy"] = draw(distributions(dtype, wide=False))
    return case


def x_shape(case) -> list[int]:
    """The case's (b, h, sq, sk) as the kind takes x: the upper-triangular kind takes
    (b * h, sk, sk) (square; its sq is sk's), every other kind (b, h, sq, sk).  One shape
    description for every kind, so a coverage cell can move a case to any kind."""
    b, h, sq, sk = case["shape"]
    return [b * h, sk, sk] if case["kind"] == "scaled_upper_triang" else [b, h, sq, sk]


def _mask(case, device):
    if case["kind"] != "scaled_masked":
        return None
    b, _, sq, sk = case["shape"]
    mb = b if case["mask_batch"] == "b" else 1
    g = torch.Generator().manual_seed(case["seed"] + 11)
    mask = torch.rand((mb, 1, sq, sk), generator=g) < case["mask_frac"]
    rows = torch.rand((mb, 1, sq, 1), generator=g) < case["masked_rows"]
    return (mask | rows).to(device)


def make_fwd_inputs(case, device):
    x = generate(case["dist"], x_shape(case), dtype_of(case["dtype"]), case["seed"], device)
    inputs = {"x": x}
    mask = _mask(case, device)
    if mask is not None:
        inputs["mask"] = mask
    return inputs


def make_bwd_inputs(case, device):
    fwd = make_fwd_inputs(case, "cpu")
    mask = fwd.get("mask")
    y = ref.softmax_fwd(fwd["x"].double().numpy(), case["kind"], scale=case["scale"],
                        mask=None if mask is None else mask.numpy())
    dt = dtype_of(case["dtype"])
    # dy first: the coverage's edge classes read the first of the largest inputs, and dy's
    # values are drawn (y's are a softmax, never subnormal-only or zero rows by themselves).
    return {"dy": generate(case["dist_dy"], x_shape(case), dt, case["seed"] + 3, device),
            "y": torch.from_numpy(y).to(dt).to(device)}


def fwd_reference(x, case):
    mask = x.get("mask")
    s = ref.filled_logits(x["x"], case["kind"], case["scale"], mask)
    y = ref.softmax_fwd(x["x"], case["kind"], scale=case["scale"], mask=mask)
    zeroed = ref.zeroed(case["kind"], s)
    out_dt = dtype_of(case["dtype"])
    return {"y": Expected(y, out_dt, Tier.SOFTMAX,
                          lambda n: tier.forward_bound(y, s, zeroed, out_dt, n))}


def bwd_reference(x, case):
    kind, scale = case["kind"], case["scale"]
    dx = ref.softmax_bwd(x["dy"], x["y"], kind, scale=scale)
    keep = ref.kept(kind, *np.shape(x["y"])[-2:])
    out_dt = dtype_of(case["dtype"])
    return {"dx": Expected(dx, out_dt, Tier.SOFTMAX, lambda n: tier.backward_bound(
        x["dy"], x["y"], dx, scale, keep, out_dt, n))}


def fwd_call(inputs, case, backend):
    y = tealite.softmax_fwd(inputs["x"], case["kind"], scale=case["scale"],
                            mask=inputs.get("mask"), backend=backend)
    return {"y": y}


def bwd_call(inputs, case, backend):
    dx = tealite.softmax_bwd(inputs["dy"], inputs["y"], case["kind"], scale=case["scale"],
                             backend=backend)
    return {"dx": dx}


def _smoke(kind, shape, dtype, **kw):
    case = {"kind": kind, "shape": shape, "dtype": dtype, "scale": _SCALES[0],
            "dist": {"kind": "normal", "scale": 4.0}, "seed": 5,
            "dist_dy": {"kind": "normal", "scale": 1.0}}
    if kind == "scaled_masked":
        case.update(mask_batch="1", mask_frac=0.3, masked_rows=0.25)
    case.update(kw)
    return case


_SMOKE = (
    _smoke("scaled", [2, 2, 5, 37], "bfloat16", scale=1.0, dist=_LARGE[1]),
    _smoke("scaled_masked", [2, 3, 7, 29], "float16"),
    _smoke("scaled_upper_triang", [3, 1, 17, 17], "float32"),
    _smoke("scaled_aligned_causal", [1, 2, 11, 5], "bfloat16"),  # sq > sk: hidden rows
    _smoke("scaled_aligned_causal", [2, 1, 5, 13], "float16", dist=_LARGE[0]),
    _smoke("scaled", [1, 1, 3, 0], "float32"),
)

_COVERAGE = cov.layout_cells("kind", SOFTMAX_KINDS) + cov.edge_cells(cov.FLOAT_EDGES)

for _name, _bwd, _make, _ref, _call in (
        (Op.SOFTMAX_FWD, False, make_fwd_inputs, fwd_reference, fwd_call),
        (Op.SOFTMAX_BWD, True, make_bwd_inputs, bwd_reference, bwd_call)):
    def _cases(dtype=None, size="ci", _bwd=_bwd):
        return cases(dtype, size, bwd=_bwd)

    register(OpSpec(name=_name, family="softmax", cases=_cases, make_inputs=_make,
                    call=_call, reference=_ref, smoke_cases=_SMOKE, coverage=_COVERAGE))
