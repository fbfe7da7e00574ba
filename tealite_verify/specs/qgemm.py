"""Spec for ``tealite.qgemm``: FP8 per-tensor / per-row, FP8 block-scaled, MXFP8 / MXFP4, every
layout.  Operands are quantized by the *reference* quantizer, so every backend multiplies the
same codes and scales; the reference dequantizes them exactly and multiplies in float64."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite import recipes as R
from tealite.formats import get_format
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.ops.gemm import LAYOUTS
from tealite.ops.quantize import QuantizedTensor
from tealite.recipes import Granularity
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify import recipe_rules as rules
from tealite_verify import recipe_space as space
from tealite_verify.references import qgemm as ref
from tealite_verify.references import quantize as qref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.specs.gemm import stored_shapes
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.recipes import given_scale, recipe_from_json, recipes
from tealite_verify.strategies.shapes import gemm_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import gemm as gemm_tier
from tealite_verify.tiers import probabilistic
from tealite_verify.tiers.metrics import Tier

_LIMITS = {"ci": (48, 256), "local": (160, 1024), "large": (1024, 4096)}


# The operand pairs qgemm multiplies (its contract, as TE's), by how their scales tile:
# float32 scales per tensor or per row on either side (any mix), 2-D blocks, or MX blocks.
_OPERAND_SCALES = ((Granularity.TENSOR, Granularity.ROW), (Granularity.BLOCK,),
                   (Granularity.MX_BLOCK,))
_ACTIVATION_BLOCK = (1, 128)


def _operand_recipes(scales) -> tuple[type, ...]:
    """The recipe classes whose every scale granularity is one of ``scales``."""
    return tuple(c for c in R.RECIPES if space.granularities(c) <= set(scales))


@st.composite
def _recipe_pair(draw):
    scales = draw(pick(*_OPERAND_SCALES))
    classes = _operand_recipes(scales)
    a = draw(recipes(classes))
    if scales == (Granularity.BLOCK,):  # b holds the activations: 1x128 blocks of a's format
        return a, draw(recipes(classes, block=[_ACTIVATION_BLOCK],
                               fmt=[recipe_from_json(a).fmt]))
    return a, draw(recipes(classes))


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci"):
    max_mn, max_k = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    ra, rb = draw(_recipe_pair())
    m, n, k = draw(gemm_shapes(max_mn=max_mn, max_k=max_k))
    blk = rules.row_block(recipe_from_json(ra))
    if blk:
        k = blk * max(1, k // blk)
    return {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k,
            "layout": draw(pick(*LAYOUTS)), "dtype": dtype,
            "out_dtype": draw(pick("bfloat16", "float32", "float16")),
            "bias": draw(st.booleans()),
            "dist_a": draw(distributions(dtype, wide=False)),
            "dist_b": draw(distributions(dtype, wide=False)), "seed": draw(seeds())}


def quantize_k_last(x_k: np.ndarray, entry: dict):
    """Reference (code bits, scales) of a K-last float32 operand under a case's recipe
    entry."""
    q = rules.quantize(x_k, recipe_from_json(entry), given_scale(entry))
    return q.bits, q.scale_inv


def dequantize_k_last(bits, scales, entry: dict) -> np.ndarray:
    return rules.dequantize(bits, scales, recipe_from_json(entry))


def _k_last(x: np.ndarray, k_first: bool) -> np.ndarray:
    return np.ascontiguousarray(x.T if k_first else x)


def _operand(x_stored: torch.Tensor, r: dict, k_first: bool, device) -> QuantizedTensor:
    bits, scales = quantize_k_last(_k_last(x_stored.float().numpy(), k_first), r)
    recipe = recipe_from_json(r)
    fmt = get_format(recipe.fmt)
    data = torch.from_numpy(qref.pack_e2m1(bits) if fmt.packed else bits)
    data = data if fmt.packed else data.view(fmt.torch_dtype)
    q = QuantizedTensor(recipe=recipe, shape=tuple(x_stored.shape))
    payload = (data.to(device), torch.from_numpy(np.asarray(scales)).to(device))
    if k_first:
        q.columnwise_data, q.columnwise_scale_inv = payload
    else:
        q.data, q.scale_inv = payload
    return q


def make_inputs(case, device):
    dt = dtype_of(case["dtype"])
    a_shape, b_shape = stored_shapes(case)
    s = case["seed"]
    a = generate(case["dist_a"], a_shape, dt, s)
    b = generate(case["dist_b"], b_shape, dt, s + 1)
    inputs = {"a_x": a.to(device), "b_x": b.to(device),
              "_qa": _operand(a, case["recipe_a"], case["layout"][0] == "N", device),
              "_qb": _operand(b, case["recipe_b"], case["layout"][1] == "T", device)}
    if case["bias"]:
        inputs["bias"] = generate({"kind": "normal", "scale": 1.0}, (case["n"],),
                                  dtype_of(case["out_dtype"]), s + 2, device)
    return inputs


def call(inputs, case, backend):
    r = tealite.qgemm(inputs["_qa"], inputs["_qb"], layout=case["layout"],
                      out_dtype=dtype_of(case["out_dtype"]), bias=inputs.get("bias"),
                      backend=backend)
    return {"out": r.out}


def reference(inputs, case):
    a_k = _k_last(inputs["a_x"].astype(np.float32), case["layout"][0] == "N")
    b_k = _k_last(inputs["b_x"].astype(np.float32), case["layout"][1] == "T")
    a_deq = dequantize_k_last(*quantize_k_last(a_k, case["recipe_a"]), case["recipe_a"])
    b_deq = dequantize_k_last(*quantize_k_last(b_k, case["recipe_b"]), case["recipe_b"])
    bias = inputs.get("bias")
    out = ref.qgemm(a_deq, b_deq, bias)
    p = ref.qgemm(a_deq, b_deq)
    p_abs = ref.qgemm(np.abs(a_deq), np.abs(b_deq))
    aligned = _AlignedMagnitude(a_k, b_k, case["recipe_a"], case["recipe_b"], p_abs)
    epi = np.abs(bias)[None, :] * np.ones_like(p) if bias is not None else np.zeros_like(p)
    out_dt = dtype_of(case["out_dtype"])

    def bound(numerics):
        mag = aligned(numerics.mma_restart_k) \
            if numerics.alignment_floor == FP8_CODE_ALIGNMENT else p_abs
        return gemm_tier.gemm_tolerances(mag, p, out, case["k"], out_dt, numerics,
                                         alpha=1.0, epilogue_abs=epi)["out"]

    def prob_bound(numerics, p_case):  # opt-in: gamma_K -> Higham-Mary's gamma~_K
        return probabilistic.gemm_prob_tolerances(p_abs, p, out, case["k"], out_dt, numerics,
                                                  p_case, alpha=1.0, epilogue_abs=epi)["out"]

    return {"out": Expected(out, out_dt, Tier.GEMM, bound, prob_bound=prob_bound,
                            same_precision=lambda: same_precision(a_deq, b_deq, bias, out_dt))}


class _AlignedMagnitude:
    """The magnitude a Hopper FP8 MMA's error scales with, for backends declaring
    ``alignment_floor`` = FP8_CODE_ALIGNMENT (computed on first use, per restart period).

    Measured on an H200 (tests/test_fp8_mma_accumulator.py): every product is cut toward zero
    at 2^(E - 13), E the largest *nominal* exponent in the sum, and a subnormal code counts at
    its format's smallest normal exponent.  So the error of a K-term sum is at most K 2^-13
    max(sum |p_k|, max_k |p_k|') where |p_k|' lifts a subnormal code to twice the smallest
    normal (tiers.gemm.aligned_magnitude): the usual gamma_K bound applied to max(|B||A|^T,
    L), L[m, n] = max_k |b_k|' |a_k|'.  Only products with a subnormal code can make L exceed
    |B||A|^T, so L is taken over those (a max over K per element, computed in K chunks).

    A kernel whose MMA restarts every ``restart_k`` (declared ``mma_restart_k``: a fresh dot
    per scale block) has one such sum per block, and the blocks' errors add: the magnitude is
    sum_b max(S_b, L_b) over the K blocks (S_b, L_b: the block's |B||A|^T and L), which is at
    least max(|B||A|^T, L) and is what its per-block unit roundoff multiplies
    (tests/test_fp8_mma_block_restart.py: a correct block kernel failed the single max)."""

    def __init__(self, a_k, b_k, ra: dict, rb: dict, p_abs: np.ndarray):
        self._args, self._values = (a_k, b_k, ra, rb, p_abs), {}

    def __call__(self, restart_k: int | None = None) -> np.ndarray:
        if restart_k not in self._values:
            self._values[restart_k] = self._compute(restart_k)
        return self._values[restart_k]

    def _compute(self, restart_k: int | None) -> np.ndarray:
        a_k, b_k, ra, rb, p_abs = self._args
        (plain_a, a, sub_a), (plain_b, b, sub_b) = _magnitudes(a_k, ra), _magnitudes(b_k, rb)
        if not (sub_a.any() or sub_b.any()):
            return p_abs  # no lift anywhere: L <= |B||A|^T in every block
        k = a.shape[1]
        if restart_k is None or restart_k >= k:
            return np.maximum(p_abs, _lifted_max(a, sub_a, b, sub_b))
        total = np.zeros_like(p_abs)
        for k0 in range(0, k, restart_k):
            blk = slice(k0, k0 + restart_k)
            s_b = plain_b[:, blk] @ plain_a[:, blk].T
            if sub_a[:, blk].any() or sub_b[:, blk].any():
                s_b = np.maximum(s_b, _lifted_max(a[:, blk], sub_a[:, blk], b[:, blk],
                                                  sub_b[:, blk]))
            total += s_b
        return total


def _lifted_max(a, sub_a, b, sub_b) -> np.ndarray:
    """L[m, n] = max over k of the products with a lifted (subnormal) code."""
    return np.maximum(_max_products(b, a * sub_a), _max_products(b * sub_b, a))


def _magnitudes(x_k: np.ndarray, r: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(|value|, |value| with subnormal codes lifted to twice the smallest normal, which codes
    were subnormal) of a K-last operand, quantized once; e2m1 goes through no FP8 MMA:
    nothing lifted."""
    bits, scales = quantize_k_last(x_k, r)
    plain = np.abs(dequantize_k_last(bits, scales, r))
    fmt = get_format(recipe_from_json(r).fmt)
    if fmt.packed:
        return plain, plain, np.zeros(plain.shape, bool)
    mant = (1 << fmt.mbits) - 1
    sub = ((bits & (0x7F & ~mant)) == 0) & ((bits & mant) != 0)
    # Exponent field 2, mantissa 0: twice the smallest normal (tiers.gemm.aligned_magnitude).
    lifted_bits = np.where(sub, np.uint8((mant + 1) * 2), bits & 0x7F).astype(np.uint8)
    return plain, np.abs(dequantize_k_last(lifted_bits, scales, r)), sub


_CHUNK_ELEMENTS = 1 << 24


def _max_products(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """out[m, n] = max_k b[m, k] a[n, k] for nonnegative b (M, K), a (N, K), in K chunks of at
    most 2^24 products (torch, on the reference device when there is one)."""
    from tealite_verify.references import _device as reference_device
    device = reference_device.current() or "cpu"
    bt, at = torch.from_numpy(b).to(device), torch.from_numpy(a).to(device)
    m, n, k = bt.shape[0], at.shape[0], bt.shape[1]
    out = torch.zeros((m, n), dtype=torch.float64, device=device)
    step = max(1, _CHUNK_ELEMENTS // max(1, m * n))
    for k0 in range(0, k, step):
        prod = bt[:, None, k0:k0 + step] * at[None, :, k0:k0 + step]
        out = torch.maximum(out, prod.amax(dim=-1))
    return out.cpu().numpy()


def same_precision(a_deq, b_deq, bias, out_dt):
    """The plain torch computation in fp32 (what torch can multiply; FP8 codes it cannot): the
    operands dequantized to fp32 (one rounding of code x scale), an fp32 matmul, the bias in
    fp32, rounded to ``out_dt``; float64 values.  The torch backend does exactly this, so its
    FlashAttention-style ratio is 1 by construction.  On the case's device (the reference
    device; the CPU off the GPU), as the backend ran."""
    from tealite_verify.references import _device as reference_device
    device = reference_device.current() or "cpu"
    a = torch.from_numpy(np.asarray(a_deq, dtype=np.float32)).to(device)
    b = torch.from_numpy(np.asarray(b_deq, dtype=np.float32)).to(device)
    y = b @ a.t()
    if bias is not None:
        y = y + torch.from_numpy(np.asarray(bias)).to(device, out_dt).float()
    return y.to(out_dt).double().cpu()


def _smoke(ra, rb, layout, m, n, k, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k, "layout": layout,
            "dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 21}
    case.update(kw)
    return case


_CUR = {"kind": "current", "fmt": "e4m3", "granularity": "tensor", "force_pow2_scales": False,
        "amax_epsilon": 0.0}
_ROW = dict(_CUR, granularity="row")
_MX4 = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
_MX8 = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_BLK = {"kind": "block", "fmt": "e4m3", "block": [128, 128], "force_pow2_scales": True,
        "amax_epsilon": 0.0}

register(OpSpec(
    name=Op.QGEMM, family="qgemm", cases=cases, make_inputs=make_inputs, call=call,
    reference=reference,
    coverage=(cov.recipe_cells("recipe_a")
              # b holds the activations: 1x128 blocks only (the op's contract, as TE's).
              + cov.recipe_cells("recipe_b", block=[_ACTIVATION_BLOCK])
              + cov.layout_cells("layout", LAYOUTS) + cov.layout_cells("bias", (True, False))
              + cov.edge_cells(cov.FINITE_EDGES + (cov.SQUARE,))
              # Per-row / block A operands in every layout: a transposed or mis-strided
              # operand shows only where the scales' axis matters.
              + cov.product_cells(cov.family_cells("recipe_a"),
                                  cov.layout_cells("layout", LAYOUTS))),
    smoke_cases=(
        _smoke(_CUR, _CUR, "TN", 29, 48, 257),
        _smoke(_ROW, _CUR, "NN", 33, 17, 96, bias=True),
        _smoke(_BLK, dict(_BLK, block=[1, 128]), "NT", 20, 130, 300, out_dtype="float32"),
        _smoke(_MX4, _MX4, "TN", 16, 24, 128),
        _smoke(_MX8, dict(_MX8, fmt="e5m2"), "TT", 0, 8, 64),
        # Shapes AITER's Triton GEMMs route to their other entry points (per-token scales;
        # MXFP4 with pre-shuffled scales, and with pre-shuffled weights and scales), so the
        # gate's case set reaches them: random draws rarely do.
        _smoke(_ROW, _ROW, "TN", 40, 64, 128, out_dtype="float16"),
        _smoke(_MX4, _MX4, "TN", 40, 48, 256, out_dtype="float16"),
        _smoke(_MX4, _MX4, "TN", 40, 64, 256, out_dtype="float16"),
    )))
