"""``tealite.qgemm`` on AITER's quantized GEMMs (``Y = X @ W^T`` with the scales applied).

tealite's qgemm hands each operand in its K-last orientation (tealite.ops.qgemm: the rowwise
data of an operand stored K-last, the columnwise data of one stored K-first): A's codes
(N, K) and B's codes (M, K).  That is AITER's ``x`` = B (M, K), ``w`` = A (N, K) for every TE
layout, so no operand is transposed here.

Routes (one AITER entry point per case, chosen from the case alone, never from what the
installed AITER has: a missing entry point rejects the case with the loader's reason):

* FP8 per-tensor / per-row (Float8CurrentScaling, DelayedScaling): ``gemm_a8w8`` when there is
  a bias (the only one with a bias epilogue) or both operands are per-tensor, else
  ``gemm_a8w8_per_token_scale``.  Both take dequantization multipliers x_scale (M, 1) and
  w_scale (1, N) / (N, 1): a per-tensor scale is materialized as such a vector (the kernels
  index the scale pointer per row / column, without strides for gemm_a8w8, and assume
  positive strides for the other, so a stride-0 expand is not an option).
* FP8 block scaling (B 1x128, A 1x128 or 128x128): ``gemm_a8w8_blockscale``; x_scale (M, K/128),
  w_scale (N/128, K/128) or (N, K/128) for 1x128 weights (the kernel derives the scale block
  along N from w_scale's shape: next_power_of_2(cdiv(N, rows)) = 128 or 1).
* MXFP4 (both MXBlockScaling e2m1; packed e2m1 (rows, K/2) uint8, E8M0 (rows, K/32)): the first
  of :data:`MXFP4_PREFERENCE` whose shape rule holds -- ``gemm_afp4wfp4_preshuffled_weight_scales``
  (N % 32 == 0, K % 256 == 0: AITER's own test conditions), ``gemm_afp4wfp4_preshuffled_scales``
  (M >= 32, K % 256 == 0), else ``gemm_afp4wfp4``.  The preshuffled layouts are produced from
  tealite's plain operands by tealite.types' permutations: ``shuffle_e8m0_scales``
  (AITER's e8m0_shuffle, padded to 256 rows x 8 columns) viewed as (rows/32, columns*32) for w
  and, when the kernel's BLOCK_SIZE_M >= 32 (its own switch), for x; ``shuffle_weight(w,
  (16, 16))`` on the packed bytes viewed as (N/16, K/2*16).

FP8 dtype: only the one AITER's kernels take on the loaded arch (``kernels().fp8_dtype``: OCP
e4m3 under the default gfx950 pin, FNUZ on gfx942); MXFP8 has no AITER Triton GEMM here.

Adapter steps that only protect memory (the result is AITER's; see the contract notes):
``gemm_a8w8`` computes its scale / bias offsets as ``pid * BLOCK + arange(BLOCK) % dim``
(operator precedence) and so reads up to BLOCK - 1 elements past their ends for the last tile;
those values only reach rows / columns its store masks.  Its scale and bias vectors are handed
to it inside buffers padded to whole tiles.  ``..._preshuffled_weight_scales`` wraps its weight
row groups modulo N instead of N / 16: the shuffled weight likewise lives in a buffer padded to
whole BLOCK_SIZE_N tiles (zero codes).  The bias of ``gemm_a8w8`` is widened to fp32 (exact):
AITER rounds the fp32 accumulator to the bias dtype before adding it, which for a bf16 bias
would be two extra roundings that the case's numerics (no bias dtype in its params) could not
declare.  Every call gets its own copy of AITER's config (``gemm.aiter_config``: the wrappers
write their adjustments into the cached dict), and the preshuffled-weight call passes
``use_aot=False`` where the wrapper has it (AITER's AOT metadata are gfx950 binaries; v0.1.15
dropped the parameter).  Output dtypes: AITER documents
bf16 / fp16; fp32 goes through the same ``.to(c_ptr.type.element_ty)`` store.

Across AITER versions: the config a wrapper finally launches with (after its split-K and
K-step adjustments, which change between releases) is observed in a dry run of the wrapper
(``launched``: kernel launches recorded, nothing executes) rather than replayed; the 0.1.7.post2
replay (``replayed_config``) decides only where the dry run cannot (the wrapper raises).
Whether a ragged last K step is safe is read from the launched kernel's source (masked E8M0
scale loads, added in v0.1.12).  ``gemm_a8w8`` configs that split K (v0.1.12 on) are rejected
with an "adapter:" reason: their per-split partials are not what this backend declares.

Rejected (``check``) with the reason: formats other than the above; a bias on any entry point
but ``gemm_a8w8`` (the others have no bias epilogue); MXFP4 cases whose K is not
a multiple of the kernel's K step (AITER's EVEN_K: its E8M0 scale loads are unmasked, so a
ragged last step reads scale bytes of another row or past the tensor, and a 0xFF there makes
the output NaN; the preshuffled-weight kernel has no masked path at all); split-K configs whose
split is not a whole number of K steps (the per-token and blockscale kernels then sum
overlapping K ranges); blockscale configs whose K step is not its scale block (AITER's assert);
K == 0 where the kernel stores nothing; bf16 output under the interpreter (it truncates
fp32 -> bf16).

Numerics (``_numerics``; the gemm tier): code products exact; fp32 accumulation (AMD MFMA, the
interpreter's numpy dots), on NVIDIA the FP8 WGMMA accumulator (~14 bits, never promoted by
Triton's sm_90 default: the per-tensor / per-row kernels accumulate all of K in it, blockscale
one 128-long block) and bf16 tensor-core truncation (u = 2^-23) for ``tl.dot_scaled``, which
sm_90 emulates with bf16 operands.  Blockscale multiplies each block's partial by its two
scales before adding it (two fp32 roundings per partial: the tier's operand term), and so does
the per-token kernel per split-K partial.  MXFP4 split-K partials are fp32 unless AITER's global
``set_use_gemm_splitk_bf16(True)`` was called (then rounded to the output dtype, declared).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from tealite._checks import require
from tealite.errors import TealiteArgumentError, UnsupportedCase
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, INTERPRET, kernels, why_missing
from tealite.backends.aiter_triton.gemm import (INTERPRETER_BF16_STORE, TENSOR_CORE_U, accepts,
                                                aiter_module, config_or_reason, nvidia,
                                                positive_strides, run_or_unsupported)
from tealite.backends.aiter_triton._qgemm_configs import (
    _BLOCK_SCALE_K, _MX_SCALE_K, _SHUFFLE_K, _WEIGHT_TILE_N, A8W8, A8W8_BLOCK, A8W8_PER_TOKEN,
    FP4, FP4_SHUFFLED_SCALES, FP4_SHUFFLED_WEIGHT, MXFP4_PREFERENCE, _caps, _config,
    _config_args, _fp4_even_k, _ragged_k_safe, _shuffled_scales, effective_config)
from tealite.formats import get_format
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.recipe_facts import outside, qgemm_kind
from tealite.recipes import Family, Granularity
from tealite.scoped import Scoped
from tealite.types import Op, permute_weight_tiles

_OUT = (torch.float32, torch.bfloat16, torch.float16)
# Hopper FP8 MMA: products cut toward zero at 2^(E - 13), subnormal codes aligned at the
# smallest normal exponent (measured on an H200, tests/test_fp8_mma_accumulator.py; tealite's
# triton and scaled_mm backends declare the same).
_FP8_MMA_U = 2.0 ** -13
_FP8_CODE_ALIGNMENT = FP8_CODE_ALIGNMENT


# ---- routing ----------------------------------------------------------------------------------

def _per_tensor(recipe) -> bool:
    return recipe.scale_granularity is Granularity.TENSOR


def _mx_route_ok(entry: str, m: int, n: int, k: int) -> bool:
    if entry == FP4_SHUFFLED_WEIGHT:
        return n % 32 == 0 and k % _SHUFFLE_K == 0 and k > 0
    if entry == FP4_SHUFFLED_SCALES:
        return m >= 32 and k % _SHUFFLE_K == 0 and k > 0
    return True


@dataclass(frozen=True)
class Routing:
    """Options of the route, read through ``ROUTING.get()``; a test forces one MXFP4 entry
    point for a block with ``ROUTING.override(mxfp4_preference=(entry,))``.

    ``mxfp4_preference``: the MXFP4 entry points the route may take, in order; it takes the
    first whose shape rule holds, else the last (the catch-all)."""

    mxfp4_preference: tuple[str, ...] = MXFP4_PREFERENCE

    def __post_init__(self):
        prefs = self.mxfp4_preference
        if not isinstance(prefs, tuple) or not prefs or \
                any(e not in MXFP4_PREFERENCE for e in prefs):
            raise TealiteArgumentError(
                f"mxfp4_preference must be a non-empty tuple of entry points among "
                f"{MXFP4_PREFERENCE}, got {prefs!r}")


ROUTING: Scoped[Routing] = Scoped("aiter_triton.qgemm.ROUTING", Routing)


def route(kind: str, recipe_a, recipe_b, m: int, n: int, k: int, has_bias: bool) -> str:
    """The AITER entry point that runs this case (from the case alone)."""
    if kind == "fp8":
        both_tensor = _per_tensor(recipe_a) and _per_tensor(recipe_b)
        return A8W8 if has_bias or both_tensor else A8W8_PER_TOKEN
    if kind == "block":
        return A8W8_BLOCK
    preference = ROUTING.get().mxfp4_preference
    for entry in preference:
        if _mx_route_ok(entry, m, n, k):
            return entry
    return preference[-1]


def _route_params(p) -> str:
    return route(p["kind"], p["recipe_a"], p["recipe_b"], p["m"], p["n"], p["k"], p["bias"])


# ---- check ------------------------------------------------------------------------------------

def _operand_reason(p, name: str) -> str | None:
    """The operand facts AITER's GEMMs take: E8M0 bytes per 32 along K (gemm_afp4wfp4*),
    float32 scales per tensor or row (gemm_a8w8*: the front-end's "fp8" kind), or per
    1x128 / 128x128 block (gemm_a8w8_blockscale; B's is 1x128, the front-end's rule)."""
    recipe, kind = p[name], p["kind"]
    if kind == "mx":
        return outside(recipe, f"AITER's MX GEMMs ({name})", family=(Family.MX,),
                       block=(_MX_SCALE_K,))
    why = outside(recipe, f"AITER's FP8 GEMMs ({name})", family=(Family.FP8,))
    if why or kind != "block":
        return why
    return outside(recipe, f"{A8W8_BLOCK} ({name})",
                   block=((1, _BLOCK_SCALE_K), (_BLOCK_SCALE_K, _BLOCK_SCALE_K)))


def _formats_reason(p) -> str | None:
    fa, fb = p["fmt_a"], p["fmt_b"]
    if p["kind"] == "mx" and (fa != "e2m1" or fb != "e2m1"):
        return (f"MX {fa} x {fb}: AITER's Triton MX GEMMs here are MXFP4 x MXFP4 "
                "(gemm_afp4wfp4*); no MXFP8 entry point")
    why = _operand_reason(p, "recipe_a") or _operand_reason(p, "recipe_b")
    if why or p["kind"] == "mx":
        return why
    want = kernels().fp8_dtype
    for name, fmt in (("a", fa), ("b", fb)):
        if get_format(fmt).torch_dtype != want:
            return (f"{name} is {fmt}: AITER's FP8 GEMMs take {want} on {kernels().arch} "
                    "(aiter dtypes.fp8)")
    return None


NVIDIA_FP8_DOT_MIN_K = 32  # Triton on NVIDIA: "Input shapes should have ... K >= 32" (fp8)


def _entry_reason(entry: str, p) -> str | None:
    m, n, k = p["m"], p["n"], p["k"]
    if p["bias"] and entry != A8W8:
        return f"bias: {entry} has no bias epilogue (only gemm_a8w8 adds one)"
    if k == 0 and entry != A8W8:
        return f"K == 0: {entry}'s kernel stores nothing for an empty K range"
    _, why = config_or_reason(entry, *_config_args(entry, m, n, k), caps=_caps(entry, m))
    if why is not None:
        return why
    cfg = effective_config(entry, m, n, k)
    if entry == A8W8 and cfg.get("NUM_KSPLIT", 1) > 1:
        return (f"adapter: {entry} of this AITER splits K (NUM_KSPLIT={cfg['NUM_KSPLIT']}; "
                "split-K came with v0.1.12): its per-split partials and bias added in the "
                "reduce are not what this backend declares for it")
    if entry in (A8W8, A8W8_PER_TOKEN, A8W8_BLOCK) and nvidia(p) and \
            cfg["BLOCK_SIZE_K"] < NVIDIA_FP8_DOT_MIN_K:
        # Found by a 2-minute fuzz on an H100 (blockscale, K = 9): AITER shrinks its K step to
        # the K it is given, and NVIDIA's FP8 tl.dot refuses K < 32 at compile time.
        return (f"{entry}: its K step {cfg['BLOCK_SIZE_K']} for K={k} is below the "
                f"{NVIDIA_FP8_DOT_MIN_K} NVIDIA's FP8 tl.dot compiles (a platform limit)")
    if entry in (A8W8_PER_TOKEN, A8W8_BLOCK) and cfg["NUM_KSPLIT"] > 1 and \
            cfg["SPLITK_BLOCK_SIZE"] % cfg["BLOCK_SIZE_K"]:
        return (f"{entry} config splits K={k} into {cfg['SPLITK_BLOCK_SIZE']}-long parts, "
                f"not whole {cfg['BLOCK_SIZE_K']}-long K steps: the kernel would sum "
                "overlapping K ranges")
    if entry == A8W8_BLOCK:
        group_k = triton.next_power_of_2(triton.cdiv(k, triton.cdiv(k, _BLOCK_SCALE_K)))
        if group_k != cfg["BLOCK_SIZE_K"]:
            return (f"{entry} asserts its K step equals the scale block: K={k} gives "
                    f"GROUP_K={group_k}, BLOCK_SIZE_K={cfg['BLOCK_SIZE_K']}")
    if entry in (FP4, FP4_SHUFFLED_SCALES, FP4_SHUFFLED_WEIGHT):
        if not _fp4_avail(entry):
            return f"{entry}: AITER reports no MXFP4 on arch {kernels().arch}"
        if k % _MX_SCALE_K:
            return f"{entry} takes K // 32 E8M0 scales per row: K={k} is not a multiple of 32"
        if not _fp4_even_k(cfg, k) and not _ragged_k_safe(entry, m, n, k):
            return (f"{entry}: K={k} is not a whole number of its {cfg['BLOCK_SIZE_K']}-long K "
                    "steps (AITER's EVEN_K): its E8M0 scale loads are unmasked, so the last "
                    "step would read scale bytes past K/32 (another row's, or past the tensor)")
        if entry != FP4 and cfg["BLOCK_SIZE_K"] % _SHUFFLE_K:
            return (f"{entry} reads shuffled scales in 256-long K groups: its K step "
                    f"{cfg['BLOCK_SIZE_K']} is not a multiple of 256")
        if not _mx_route_ok(entry, m, n, k):  # reachable when mxfp4_preference is narrowed
            return (f"{entry} needs " + ("N % 32 == 0 and K % 256 == 0 (whole shuffle tiles)"
                                         if entry == FP4_SHUFFLED_WEIGHT else
                                         "M >= 32 (asserted) and K % 256 == 0") +
                    f", got M={m}, N={n}, K={k}")
    return None


def _fp4_avail(entry: str) -> bool:
    """AITER's own answer (its wrappers assert arch_info.is_fp4_avail())."""
    info = getattr(aiter_module(entry), "arch_info", None)
    return bool(info is not None and info.is_fp4_avail())


def _why_not(p) -> str | None:
    why = _formats_reason(p)
    if why is not None:
        return why
    entry = _route_params(p)
    why = why_missing(entry)
    if why is not None:
        return why
    if INTERPRET and p["out_dtype"] == torch.bfloat16:
        return f"bf16 output under the interpreter: {INTERPRETER_BF16_STORE}"
    return _entry_reason(entry, p)


# ---- numerics ---------------------------------------------------------------------------------

def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def _numerics(p) -> dict:
    entry = _route_params(p)
    m, n, k = p["m"], p["n"], p["k"]
    num = {"entry_point": entry, "compute_dtype": torch.float32}
    cfg = effective_config(entry, m, n, k)
    split = cfg.get("NUM_KSPLIT", 1) > 1
    if entry == A8W8_BLOCK or (entry == A8W8_PER_TOKEN and split):
        # Each K block's (blockscale) or K split's (per-token) partial is multiplied by its
        # scales in fp32 before it is added: two roundings per partial, 2u |B||A|.
        num["operands_dequantized_to"] = torch.float32
    if entry in (FP4, FP4_SHUFFLED_SCALES, FP4_SHUFFLED_WEIGHT) and split and \
            getattr(aiter_module(entry), "_USE_GEMM_SPLITK_BF16", False):
        num["partial_sums_rounded_to"] = p["out_dtype"]
    if not nvidia(p) or k == 0:
        return num  # AMD MFMA / the interpreter's numpy dots: fp32 round-to-nearest sums
    if entry in (A8W8, A8W8_PER_TOKEN, A8W8_BLOCK):
        num["alignment_floor"] = _FP8_CODE_ALIGNMENT
    if entry in (A8W8, A8W8_PER_TOKEN):
        num["accumulator_unit_roundoff"] = _FP8_MMA_U  # all of K in the WGMMA accumulator
    elif entry == A8W8_BLOCK:
        # A fresh dot per 128-long block at ~14 bits, then at most K partials in fp32: the
        # tier bounds gamma_K(u) |B||A| >= K u |B||A|, so u = (that sum's bound) / K is true.
        # Its lifted (subnormal-code) magnitudes add per block too: mma_restart_k.
        inner = min(k, cfg["BLOCK_SIZE_K"])
        num["accumulator_unit_roundoff"] = max(
            (_gamma(inner, _FP8_MMA_U) + _gamma(k, 2.0 ** -24)) / k, 2.0 ** -24)
        num["mma_restart_k"] = inner
    else:
        num["accumulator_unit_roundoff"] = TENSOR_CORE_U  # dot_scaled as bf16 MMA on sm_90
    return num


# ---- contracts --------------------------------------------------------------------------------

_FP8_NOTES = "scales are dequantization multipliers (scale_inv); codes are not re-rounded"
CONTRACTS = {c.entry_point: declare(c) for c in (
    Contract(BACKEND.name, A8W8, Op.QGEMM, fp8="arch", scale_rule="given",
             layouts=("x:(M,K) fp8 = B codes K-last", "w:(N,K) fp8 = A codes K-last",
                      "x_scale:(M,1) fp32 (per-tensor materialized)",
                      "w_scale:(1,N) fp32 (per-tensor materialized)", "bias:(N,) fp32"),
             notes=(f"{_FP8_NOTES}; y = (acc * (sx * sw)).to(bias dtype) + bias: AITER rounds "
                    "the fp32 accumulator to the bias dtype before adding it (the bias is passed "
                    "widened to fp32, exact); scale/bias offsets pid*B + arange % dim read up to "
                    "B-1 elements past the end (buffers padded to whole tiles here)"),
             extra={"accumulate": "fp32 over K (NVIDIA: FP8 WGMMA ~14 bits)",
                    "bias_rounding": "accumulator rounded to bias dtype",
                    "oob_read": "scale and bias vectors, last tile"}),
    Contract(BACKEND.name, A8W8_PER_TOKEN, Op.QGEMM, fp8="arch", scale_rule="given",
             layouts=("x:(M,K) fp8 = B codes K-last", "w:(N,K) fp8 = A codes K-last",
                      "x_scale:(M,1) fp32", "w_scale:(N,1) fp32 (read through w_scale.T)"),
             notes=(f"{_FP8_NOTES}; no bias; split-K scales each fp32 partial before the reduce; "
                    "the wrapper writes its BLOCK_SIZE_K adjustment into _get_config's cached "
                    "dict (a copy is passed here)"),
             extra={"accumulate": "fp32 over K or per split"}),
    Contract(BACKEND.name, A8W8_BLOCK, Op.QGEMM, fp8="arch", scale_rule="given",
             layouts=("x:(M,K) fp8 = B codes K-last", "w:(N,K) fp8 = A codes K-last",
                      "x_scale:(M,ceil(K/128)) fp32 (1x128)",
                      "w_scale:(ceil(N/128),ceil(K/128)) fp32 (128x128) or (N,ceil(K/128)) (1x128)"),
             notes=(f"{_FP8_NOTES}; each 128-long K block's partial times x_scale*w_scale in "
                    "fp32; asserts BLOCK_SIZE_K == scale block; mutates _get_config's cached "
                    "dict (a copy is passed here)"),
             extra={"accumulate": "fp32 of scaled 128-long block partials"}),
    Contract(BACKEND.name, FP4, Op.QGEMM, scale_rule="given",
             layouts=("x:(M,K/2) uint8 packed e2m1, even element in the low nibble",
                      "w:(N,K/2) uint8 packed e2m1", "x_scales:(M,K/32) uint8 e8m0",
                      "w_scales:(N,K/32) uint8 e8m0"),
             notes=("tl.dot_scaled, fp32 accumulation; E8M0 scale loads unmasked (K must be "
                    "whole K steps); split-K partials fp32 (bf16 after "
                    "set_use_gemm_splitk_bf16(True))"),
             extra={"accumulate": "fp32", "oob_read": "scales past K/32 when not EVEN_K"}),
    Contract(BACKEND.name, FP4_SHUFFLED_SCALES, Op.QGEMM, scale_rule="given",
             layouts=("x:(M,K/2) uint8 packed e2m1", "w:(N,K/2) uint8 packed e2m1",
                      "x_scales: e8m0_shuffle(M,K/32) viewed (M'/32, K'/32*32) when "
                      "BLOCK_SIZE_M >= 32 (M', K'/32 padded to 256, 8), else plain (M,K/32)",
                      "w_scales: e8m0_shuffle(N,K/32) viewed (N'/32, K'/32*32)"),
             notes="as gemm_afp4wfp4; asserts M >= 32; K steps of >= 256 (whole shuffle groups)",
             extra={"accumulate": "fp32"}),
    Contract(BACKEND.name, FP4_SHUFFLED_WEIGHT, Op.QGEMM, scale_rule="given",
             layouts=("x:(M,K/2) uint8 packed e2m1",
                      "w: shuffle_weight(w bytes (N,K/2), (16,16)) viewed (N/16, K/2*16)",
                      "x_scales: e8m0_shuffle viewed (M'/32, K'/32*32) when BLOCK_SIZE_M >= 32 "
                      "(M >= 32), else plain (M,K/32)",
                      "w_scales: e8m0_shuffle(N,K/32) viewed (N'/32, K'/32*32)"),
             notes=("dot_scaled per K step added to the fp32 accumulator; no masked K path "
                    "(EVEN_K required); weight row groups wrap modulo N, not N/16 (reads past "
                    "the weight for a ragged last N tile: buffer padded to whole tiles here)"),
             extra={"accumulate": "fp32", "oob_read": "weight rows, last N tile"}),
)}


# ---- adapters ---------------------------------------------------------------------------------

def _fp32_vector(scales: torch.Tensor, rows: int, per_tensor: bool, name: str) -> torch.Tensor:
    want = 1 if per_tensor else rows
    require(scales.numel() == want, f"{name} scales: {want} value(s) expected "
                                    f"({'per tensor' if per_tensor else 'per row'}), got "
                                    f"shape {tuple(scales.shape)}")
    s = scales.reshape(-1).to(torch.float32)  # widening: exact
    return s.expand(rows) if per_tensor else s


def _in_tile_buffer(v: torch.Tensor, block: int, fill: float) -> torch.Tensor:
    """``v`` (1-D) copied to the front of a buffer of whole ``block`` tiles; returns the view
    of its first len(v) elements (reads past it stay inside the buffer)."""
    n = v.shape[0]
    buf = torch.full((max(triton.cdiv(n, block), 1) * block,), fill, dtype=v.dtype,
                     device=v.device)
    buf[:n] = v
    return buf[:n]


def _block_scales(scales: torch.Tensor, rows: int, k: int, per: int, name: str):
    want = (triton.cdiv(rows, per), triton.cdiv(k, _BLOCK_SCALE_K))
    require(tuple(scales.shape) == want, f"{name} scales: shape {want} expected for "
                                         f"{per}x128 blocks, got {tuple(scales.shape)}")
    return positive_strides(scales.to(torch.float32))


def _e8m0(scales: torch.Tensor, rows: int, k: int, name: str) -> torch.Tensor:
    want = (rows, k // _MX_SCALE_K)
    require(tuple(scales.shape) == want,
            f"{name} scales: E8M0 shape {want} expected, got {tuple(scales.shape)}")
    return scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales


def _shuffled_weight(codes: torch.Tensor, n: int, block_n: int) -> torch.Tensor:
    w = permute_weight_tiles(codes.contiguous(), (16, 16), inverse=False)
    groups = n // _WEIGHT_TILE_N
    padded = triton.cdiv(n, block_n) * block_n // _WEIGHT_TILE_N
    buf = torch.zeros((max(padded, groups), w.shape[1] * _WEIGHT_TILE_N), dtype=torch.uint8,
                      device=w.device)
    buf[:groups] = w.reshape(groups, -1)
    return buf[:groups]


def _codes(codes: torch.Tensor, fmt: str, rows: int, k: int, name: str) -> torch.Tensor:
    f = get_format(fmt)
    want = (rows, k // 2 if f.packed else k)
    require(tuple(codes.shape) == want,
            f"{name} codes: shape {want} expected for {fmt}, got {tuple(codes.shape)}")
    return positive_strides(codes.view(torch.uint8) if f.packed else codes.view(f.torch_dtype))


# ---- the implementation -----------------------------------------------------------------------

# Measured with triton 3.9's interpreter: loading e4m3fn code 0x7F (NaN) and converting it (or
# dotting it) gives 480.0, a finite value, so a NaN operand code yields a finite product there;
# on a GPU the conversion gives NaN.  The case is data-dependent (NaN inputs, or overflow under
# a non-saturating recipe), so it is rejected at call time, with this reason
# (tests/test_aiter_qgemm.py proves the interpreter behaviour).
INTERPRETER_FP8_NAN = ("the interpreter converts an FP8 NaN code (e4m3fn 0x7F) to the finite "
                       "480.0, so NaN operand codes would give finite products")


def _has_nan(codes: torch.Tensor) -> bool:
    return codes.dtype.is_floating_point and bool(torch.isnan(codes.float()).any())


def _run_fp8(entry, fn, cfg, ra, a, sa, rb, b, sb, m, n, out_dtype, bias):
    sx = _fp32_vector(sb, m, _per_tensor(rb), "b")
    sw = _fp32_vector(sa, n, _per_tensor(ra), "a")
    if entry == A8W8_PER_TOKEN:
        return fn(b, a, sx.contiguous().view(m, 1), sw.contiguous().view(n, 1), dtype=out_dtype,
                  config=cfg)
    bm, bn = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"]
    x_scale = _in_tile_buffer(sx, bm, 1.0).view(m, 1)
    w_scale = _in_tile_buffer(sw, bn, 1.0).view(1, n)
    bias32 = None if bias is None else _in_tile_buffer(bias.reshape(-1).to(torch.float32), bn,
                                                       0.0)
    return fn(b, a, x_scale, w_scale, bias=bias32, dtype=out_dtype, config=cfg)


def _run_mxfp4(entry, fn, cfg, a, sa, b, sb, m, n, k, out_dtype):
    xs, ws = _e8m0(sb, m, k, "b"), _e8m0(sa, n, k, "a")
    if entry == FP4:
        return fn(b, a, xs, ws, dtype=out_dtype, config=cfg)
    # The kernel reads x's scales shuffled exactly when its BLOCK_SIZE_M >= 32 (unchanged by
    # AITER's wrapper adjustments, which touch K and N only).
    x_scales = _shuffled_scales(xs) if cfg["BLOCK_SIZE_M"] >= 32 else xs
    w_scales = _shuffled_scales(ws)
    if entry == FP4_SHUFFLED_SCALES:
        return fn(b, a, x_scales, w_scales, dtype=out_dtype, config=cfg)
    block_n = effective_config(entry, m, n, k)["BLOCK_SIZE_N"]
    # use_aot (AOT metadata are gfx950 binaries) is off where the wrapper has it; v0.1.15
    # dropped the parameter (and the AOT path with it).
    aot = {"use_aot": False} if accepts(fn, "use_aot") else {}
    return fn(b, _shuffled_weight(a, n, block_n), x_scales, w_scales, dtype=out_dtype,
              config=cfg, **aot)


@BACKEND.implements(Op.QGEMM, dtypes=_OUT, devices=DEVICES, check=_why_not, numerics=_numerics)
def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
          bias):
    kind = qgemm_kind(recipe_a)
    entry = route(kind, recipe_a, recipe_b, m, n, k, bias is not None)
    fn = kernels().functions[entry]
    cfg = _config(entry, m, n, k)
    a = _codes(a_codes, recipe_a.fmt, n, k, "a")
    b = _codes(b_codes, recipe_b.fmt, m, k, "b")
    if INTERPRET and kind != "mx" and (_has_nan(a) or _has_nan(b)):
        raise UnsupportedCase(f"{entry} under Triton's interpreter: {INTERPRETER_FP8_NAN}")
    if kind == "fp8":
        y = run_or_unsupported(_run_fp8, entry, fn, cfg, recipe_a, a, a_scales, recipe_b, b,
                               b_scales, m, n, out_dtype, bias)
    elif kind == "block":
        xs = _block_scales(b_scales, m, k, 1, "b")
        ws = _block_scales(a_scales, n, k, recipe_a.block[0], "a")
        y = run_or_unsupported(fn, b, a, xs, ws, dtype=out_dtype, config=cfg)
    else:
        y = run_or_unsupported(_run_mxfp4, entry, fn, cfg, a, a_scales, b, b_scales, m, n, k,
                               out_dtype)
    return y, {}
