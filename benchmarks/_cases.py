"""What the benchmarks run: shapes, quantize variants, exact byte and FLOP counts, targets.

Bandwidth counts the fewest bytes an op must move: every input read once and every output
written once, as the op's contract lays them out (``tealite/ops/quantize.py``, ``norms.py``).
An implementation that reads x twice (per-tensor current scaling: an amax pass, then the cast)
is charged for one read, so its GB/s says how far it is from a single pass.  The copy
reference is ``dst.copy_(src)`` counted as bytes read + bytes written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tealite import recipes as R
from tealite.formats import get_format

# Issue 4 targets (tealite's triton backend on an H100/H200 at the large sizes).
TARGETS = {
    "quantize": ("copy", 85.0),
    "norm": ("copy", 80.0),
    "gemm": ("torch.matmul", 90.0),
    "qgemm_fp8": ("torch._scaled_mm", 80.0),
    "rope": ("copy", 80.0),  # issue 15
    "softmax": ("copy", 80.0),   # issue 15
    "router": ("copy", 50.0),    # issue 16
    "grouped_gemm": ("dense GEMM, same FLOPs", 85.0),  # issue 16: bf16 and FP8 block
    "permute": ("copy", 70.0),   # issue 16: moe_permute / moe_unpermute
    "dropout": ("copy", 80.0),   # issue 17: dropout forward / backward
    "multi_tensor_adam": ("copy", 70.0),  # issue 17: bytes one Adam step must move
    # issue 17: the bulk delayed-scaling update, one launch >= 20x the per-tensor loop
    "scaling_bulk": ("per-tensor delayed_scaling_update loop", 2000.0),
}

# Dropout input (tokens, hidden), bf16: 16k tokens of 8192 (an MLP activation); tiny: a prime
# tail the interpreter runs in a second.
DROPOUT_SHAPES = {"large": (16384, 8192), "tiny": (7, 130)}

# Router logits (tokens, experts): TE's MoE regime (issue 16), and a tiny one for the smoke run.
ROUTER_SHAPES = {"large": (16384, 256), "tiny": (8, 64)}

# MoE permutation (tokens, hidden, experts, top-k), bf16: 16k tokens of 4096 routed top-2 of 8
# (Mixtral-like); tiny: primes the interpreter runs in a second.
PERMUTE_SHAPES = {"large": (16384, 4096, 8, 2), "tiny": (13, 40, 5, 2)}

# RoPE input (s, b, h, d), sbhd, full rotary: a training shape (8 sequences of 4096 tokens,
# 32 heads of 128), and a tiny one for the smoke run.
ROPE_SHAPES = {"large": (4096, 8, 32, 128), "tiny": (4, 1, 2, 16)}


@dataclass(frozen=True)
class Sizes:
    rows: int          # quantize / norm input (rows, hidden), bf16
    hidden: int
    gemm: tuple        # (M, N, K)
    copy_elems: int    # elements of the bf16 tensor copied for the reference bandwidth


LARGE = Sizes(rows=16384, hidden=8192, gemm=(8192, 8192, 8192), copy_elems=2 * 16384 * 8192)
# Smoke mode (no GPU, Triton's interpreter): the smallest shapes every recipe accepts (MX
# columnwise needs M % 32 == 0, block scaling K >= 128 for a full block).
TINY = Sizes(rows=32, hidden=128, gemm=(32, 32, 128), copy_elems=32 * 128)
SIZES = {"large": LARGE, "tiny": TINY}
# Softmax scores (b, h, sq, sk), bf16, square (the upper-triangular kind needs sq == sk):
# TE's attention-probability shape at 2k tokens; tiny: a prime sk (a masked row tail) the
# interpreter runs in seconds.
SOFTMAX_SHAPES = {"large": (4, 16, 2048, 2048), "tiny": (1, 1, 29, 29)}


@dataclass(frozen=True)
class QuantVariant:
    id: str
    label: str
    recipe: object
    rowwise: bool
    columnwise: bool


def quant_variants() -> list[QuantVariant]:
    ct = "cast-transpose (rowwise + columnwise)"
    return [
        QuantVariant("fp8-tensor-row", "FP8 per-tensor, rowwise", R.Float8CurrentScaling(),
                     True, False),
        QuantVariant("fp8-tensor-ct", f"FP8 per-tensor, {ct}", R.Float8CurrentScaling(),
                     True, True),
        QuantVariant("fp8-perrow", "FP8 per-row (per-token), rowwise",
                     R.Float8CurrentScaling(granularity="row"), True, False),
        QuantVariant("fp8-block1x128", "FP8 block 1x128, rowwise", R.Float8BlockScaling(),
                     True, False),
        QuantVariant("fp8-block1x128-ct", f"FP8 block 1x128, {ct}", R.Float8BlockScaling(),
                     True, True),
        QuantVariant("mxfp8-row", "MXFP8 (e4m3, RCEIL), rowwise", R.MXFP8BlockScaling(),
                     True, False),
        QuantVariant("mxfp8-ct", f"MXFP8 (e4m3, RCEIL), {ct}", R.MXFP8BlockScaling(),
                     True, True),
        QuantVariant("mxfp4-row", "MXFP4 (e2m1, FLOOR), rowwise", R.MXFP4BlockScaling(),
                     True, False),
        QuantVariant("mxfp4-ct", f"MXFP4 (e2m1, FLOOR), {ct}", R.MXFP4BlockScaling(),
                     True, True),
    ]


def _codes_bytes(recipe, rows: int, cols: int) -> int:
    if get_format(recipe.fmt).packed:
        return rows * math.ceil(cols / 2)  # two e2m1 codes per byte
    return rows * cols


def _scale_bytes(recipe, rows: int, cols: int) -> int:
    if isinstance(recipe, R.MXBlockScaling):
        return rows * math.ceil(cols / recipe.block)  # one E8M0 byte per 32 elements
    if isinstance(recipe, R.Float8BlockScaling):
        bm, bn = recipe.block
        return 4 * math.ceil(rows / bm) * math.ceil(cols / bn)
    if isinstance(recipe, R.Float8CurrentScaling) and recipe.granularity == "row":
        return 4 * rows
    return 4  # per-tensor float32 scale_inv


def _amax_bytes(recipe, rows: int) -> int:
    if isinstance(recipe, R.Float8CurrentScaling):
        return 4 * rows if recipe.granularity == "row" else 4
    if isinstance(recipe, R.DelayedScaling):
        return 4
    return 0  # block and MX recipes report no amax


def quantize_bytes(recipe, m: int, k: int, *, rowwise: bool, columnwise: bool,
                   in_itemsize: int, amax: bool = True) -> int:
    """Input read once + codes + scales (+ the reported amax, which tealite's contract
    returns and AITER's kernels do not), per the quantize contract; columnwise data is the
    rowwise quantization of x.T (K rows of M)."""
    total = in_itemsize * m * k + (_amax_bytes(recipe, m) if amax else 0)
    if rowwise:
        total += _codes_bytes(recipe, m, k) + _scale_bytes(recipe, m, k)
    if columnwise:
        total += _codes_bytes(recipe, k, m) + _scale_bytes(recipe, k, m)
    return total


def norm_bytes(kind: str, rows: int, hidden: int, itemsize: int) -> int:
    """x read, y written, gamma (and beta) read, float32 statistics written
    (rsigma; LayerNorm also mean)."""
    weights = 2 if kind == "layernorm" else 1
    stats = 2 if kind == "layernorm" else 1
    return 2 * itemsize * rows * hidden + weights * itemsize * hidden + stats * 4 * rows


def add_rmsnorm_pad_bytes(rows: int, hidden: int, hidden_out: int, itemsize: int) -> int:
    """x and the residual read, y (padded) and residual_out written, the weight read (no
    statistics)."""
    return itemsize * (3 * rows * hidden + rows * hidden_out + hidden)


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def rope_bytes(shape, d2: int, itemsize: int) -> int:
    """t read and y written once, in t's dtype, plus the float32 freqs rows (s, d2) read once
    (forward and backward alike)."""
    return 2 * itemsize * math.prod(shape) + 4 * shape[0] * d2


def router_bytes(tokens: int, experts: int, itemsize: int, *, bwd: bool = False) -> int:
    """Forward: logits read, probs (logits' dtype) and the bool routing map written; backward:
    grad_probs, logits and the map read, grad_logits written."""
    n = tokens * experts
    return (3 * itemsize + 1) * n if bwd else (2 * itemsize + 1) * n


def dropout_bytes(numel: int, itemsize: int) -> int:
    """Forward: x read, y and the bool kept mask written; backward: dy and the mask read, dx
    written.  The same count both ways: two tensors of the dtype and one byte per element."""
    return (2 * itemsize + 1) * numel


def permute_bytes(x, routing, out, rows) -> int:
    """moe_permute: x and the routing read once, the permuted rows and the int32 row-id map
    written once."""
    return x.nbytes + routing.nbytes + out.nbytes + rows.nbytes


def unpermute_bytes(permuted, rows, y, probs=None) -> int:
    """moe_unpermute: the permuted rows, the row-id map (and merging probs) read once, the
    merged tokens written once."""
    return permuted.nbytes + rows.nbytes + y.nbytes + (0 if probs is None else probs.nbytes)


def softmax_bytes(kind: str, shape, itemsize: int, *, bwd: bool = False,
                  mask_batch: int = 1) -> int:
    """Forward: x read, y written (and the bool mask (mask_batch, 1, sq, sk) read for
    scaled_masked); backward: dy and y read, dx written."""
    n = math.prod(shape)
    if bwd:
        return 3 * n * itemsize
    mask = mask_batch * shape[-2] * shape[-1] if kind == "scaled_masked" else 0
    return 2 * n * itemsize + mask
