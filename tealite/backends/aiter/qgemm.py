"""``qgemm`` on AITER's CK / ASM GEMMs (never run on AMD hardware; see the package docstring).

tealite's ``D (M, N) = op_B(B) @ op_A(A)`` maps onto AITER's ``Y = XQ @ WQ^T``: XQ (M, K) is
tealite's B (activations), WQ (N, K) its A (weights), both K-last as ``tealite.qgemm`` hands
them over.  Entry point per recipe family; the backend picks the weight layout: ``aiter`` plain
weights, ``aiter_bpreshuffle`` pre-shuffled ones (the case's numerics name what ran):

* FP8 per-tensor / per-row: ``gemm_a8w8`` (CK); preshuffled: ``gemm_a8w8_bpreshuffle`` (CK);
* FP8 blocks (A 128x128, B 1x128): ``gemm_a8w8_blockscale`` (CK); preshuffled:
  ``gemm_a8w8_blockscale_bpreshuffle`` (CK);
* MXFP4 x MXFP4: ``gemm_a4w4`` (always preshuffled weights and e8m0-shuffled scales).

Adapter steps (each from the C++ that reads the argument, csrc/ck_gemm_*):

* rowwise CK epilogue ``e = acc * w_scale[n] * x_scale[m] (+ bias[n])`` in fp32 (scale tensors
  are read with stride 0 along the other dim): per-tensor scales are broadcast to
  ``x_scale (M, 1)`` / ``w_scale (1, N)`` fp32 -- the shapes AITER's wrappers document;
* ``splitK=0`` is passed to ``gemm_a8w8``: a tuned ``splitK > 0`` would add the bias once per
  K split (csrc/ck_gemm_a8w8/README.md: "change bias to bias/(2^k)");
* block scales: ``x_scale (M, K/128)`` row-major for the plain kernel; the bpreshuffle kernel
  reads it column-major (gridwise_gemm_xdl_cshuffle_v3_multi_d_blockscale_b_preshuffle.hpp:
  a_scale strides (1, M)), so it gets ``x_scale.T.contiguous().view(M, K/128)``;
  ``w_scale (N/128, K/128)`` row-major for both;
* shuffled weights: :func:`tealite.types.permute_weight_tiles` (``shuffle_weight``) with
  layout (16, 16) (fp8: tiles of 16 rows x 16 bytes; FP4 shuffled as bytes);
* ``gemm_a4w4``: scales through :func:`tealite.types.permute_e8m0_scales` (padding
  zero-filled), A's rows zero-padded to a multiple of 32 (its ASM path asserts the output has
  such rows; zero codes add nothing) and the output sliced back: ``meta["padded"]`` says so.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, BACKEND_BPRESHUFFLE, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.recipe_facts import outside, qgemm_kind
from tealite.recipes import Family, Granularity
from tealite.types import Op, permute_e8m0_scales, permute_weight_tiles

_OUT = (torch.bfloat16, torch.float16)
_SHUFFLE = (16, 16)
_BLOCK = 128


def _entry_point(params, pre: bool) -> str | None:
    """The AITER GEMM for a case; ``pre``: the weights go in pre-shuffled (16, 16)."""
    kind = params["kind"]
    if kind == "fp8":
        return "gemm_a8w8_bpreshuffle" if pre else "gemm_a8w8"
    if kind == "block":
        return "gemm_a8w8_blockscale_bpreshuffle" if pre else "gemm_a8w8_blockscale"
    if kind == "mx" and params["fmt_a"] == params["fmt_b"] == "e2m1":
        return "gemm_a4w4"
    return None


def _why_not_fp8(params, ep: str, arch_e4m3: str | None) -> str | None:
    if arch_e4m3 is None:
        return "AITER has no FP8 type on this arch (aiter.dtypes falls back to uint8)"
    if not params["fmt_a"] == params["fmt_b"] == arch_e4m3:
        return (f"{ep} takes {arch_e4m3} codes for both operands on this arch, got "
                f"{params['fmt_a']} x {params['fmt_b']}")
    kmod = 32 if ep == "gemm_a8w8" else 128
    if params["n"] % 16 or params["k"] % kmod:
        return (f"{ep} needs N % 16 == 0 and K % {kmod} == 0 (conservative: CK vector loads, "
                f"shuffled K tiles, 128-long scale blocks), got N={params['n']} K={params['k']}")
    if params["bias"] and ep != "gemm_a8w8":
        return f"{ep} takes no bias (the wrapper asserts bias is None or has no bias argument)"
    if params["kind"] == "block" and tuple(params["recipe_a"].block) != (_BLOCK, _BLOCK):
        return (f"{ep} reads 128x128 weight (A) scale blocks (ScaleBlockN = ScaleBlockK = 128), "
                f"got A block {tuple(params['recipe_a'].block)}")
    return None


def _why_not_a4w4(params, arch: str) -> str | None:
    if arch != "gfx950":
        return f"gemm_a4w4 raises on {arch} (MXFP4 MFMA is gfx950 only)"
    if params["out_dtype"] != torch.bfloat16:
        return "gemm_a4w4's ASM path writes bfloat16 only (and the wrapper picks ASM or CK by a " \
               "tuned table, so only bfloat16 is safe)"
    if params["bias"]:
        return ("gemm_a4w4 drops the bias silently when its tuned table picks the CK kernel, and "
                "its ASM 'bias' is an (M, N) C matrix: no bias")
    if params["n"] % 16 or params["k"] % 256:
        return (f"gemm_a4w4 needs N % 16 == 0 (weight shuffle) and K % 256 == 0 (CK KPerBlock "
                f"and the ASM K split; conservative), got N={params['n']} K={params['k']}")
    return None


def _operand_reason(params, name: str) -> str | None:
    """The operand facts AITER's GEMMs take: float32 scales per tensor or row (gemm_a8w8*),
    per 128x128 (A) / 1x128 (B) block (blockscale: _why_not_fp8), E8M0 per 32 (gemm_a4w4)."""
    if params["kind"] == "mx":
        return outside(params[name], f"gemm_a4w4 ({name})", family=(Family.MX,), block=(32,))
    return outside(params[name], f"AITER's FP8 GEMMs ({name})", family=(Family.FP8,))


def _why_not(params, pre: bool) -> str | None:
    ep = _entry_point(params, pre)
    if ep is None:
        return (f"no AITER HIP GEMM is wired for {params['fmt_a']} x {params['fmt_b']} "
                "MX operands (only MXFP4 x MXFP4: gemm_a4w4)")
    why = _operand_reason(params, "recipe_a") or _operand_reason(params, "recipe_b")
    if why:
        return why
    why = common_why_not(params, ep)
    if why:
        return why
    if min(params["m"], params["n"], params["k"]) == 0:
        return "AITER's GEMMs launch no kernel for an empty dim (M, N or K = 0)"
    if params["out_dtype"] not in _OUT:
        return f"{ep} writes bfloat16 or float16 only, not {params['out_dtype']}"
    rt = runtime()
    if ep == "gemm_a4w4":
        return _why_not_a4w4(params, rt.arch)
    return _why_not_fp8(params, ep, rt.e4m3_format)


def _numerics(params, pre: bool) -> dict:
    # CK/ASM FP8 and FP4 MFMA: exact products, fp32 accumulation, fp32 epilogue, one rounding.
    return {"entry_point": _entry_point(params, pre) or "-", "compute_dtype": torch.float32,
            "weight_layout": "preshuffled" if pre else "plain"}


# ---- adapter steps (small pure functions; the tests seed bugs into them) --------------------

def _per_row_scales(scales: torch.Tensor, recipe, rows: int) -> torch.Tensor:
    """fp32 scales, one per row: a per-tensor scale broadcast (exact), per-row ones as given."""
    s = scales.float().reshape(-1)
    if recipe.scale_granularity is not Granularity.ROW:
        s = s.expand(rows)
    return s.contiguous()


def _shuffle_weight(w: torch.Tensor) -> torch.Tensor:
    return permute_weight_tiles(w.contiguous(), _SHUFFLE, inverse=False)


def _x_block_scales_transposed(x_scale: torch.Tensor) -> torch.Tensor:
    """(M, K/128) scales stored column-major, as the bpreshuffle blockscale kernel reads them
    (a_scale descriptor strides (1, M))."""
    m, kb = x_scale.shape
    return x_scale.t().contiguous().view(m, kb)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t.contiguous()
    out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def _check_bias(bias, out_dtype) -> None:
    if bias is not None and bias.dtype != out_dtype:
        # csrc/ck_gemm_a8w8/gemm_a8w8.cu TORCH_CHECKs it; converting would round the bias.
        raise UnsupportedCase(f"gemm_a8w8 needs the bias in the output dtype {out_dtype}, got "
                              f"{bias.dtype}")


def _rowwise(fn, ep, recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m, n,
             out_dtype, bias):
    x_scale = _per_row_scales(b_scales, recipe_b, m).view(m, 1)
    w_scale = _per_row_scales(a_scales, recipe_a, n).view(1, n)
    xq = b_codes.contiguous()
    if ep == "gemm_a8w8":
        _check_bias(bias, out_dtype)
        return fn(xq, a_codes.contiguous(), x_scale, w_scale, bias=bias, dtype=out_dtype,
                  splitK=0)
    return fn(xq, _shuffle_weight(a_codes), x_scale, w_scale, bias=None, dtype=out_dtype)


def _blockscale(fn, ep, a_codes, a_scales, b_codes, b_scales, out_dtype):
    x_scale = b_scales.float().contiguous()
    w_scale = a_scales.float().contiguous()
    if ep == "gemm_a8w8_blockscale":
        return fn(b_codes.contiguous(), a_codes.contiguous(), x_scale, w_scale, dtype=out_dtype)
    return fn(b_codes.contiguous(), _shuffle_weight(a_codes), _x_block_scales_transposed(x_scale),
              w_scale, dtype=out_dtype)


def _a4w4(fn, rt, a_codes, a_scales, b_codes, b_scales, m, n, out_dtype, meta):
    m_pad = -(-m // 32) * 32
    if m_pad != m:
        meta["padded"] = {"m": [m, m_pad]}
    fp4, e8m0 = rt.dtype("fp4x2"), rt.dtype("fp8_e8m0")
    a = _pad_rows(b_codes.view(torch.uint8), m_pad).view(fp4)
    b = _shuffle_weight(a_codes.view(torch.uint8)).view(fp4)
    a_scale = permute_e8m0_scales(b_scales.contiguous()).view(e8m0)
    b_scale = permute_e8m0_scales(a_scales.contiguous()).view(e8m0)
    # Zeroed: with a tuned K split the kernels accumulate into `out` (the ASM path zeroes it
    # itself; the CK path's split-K atomics are not known to).
    out = torch.zeros((m_pad, n), dtype=out_dtype, device=b_codes.device)
    y = fn(a, b, a_scale, b_scale, out, bias=None, alpha=1.0, beta=0.0, bpreshuffle=True)
    return y[:m]


def _qgemm(pre: bool, recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n,
           out_dtype, bias):
    rt = runtime()
    kind = qgemm_kind(recipe_a)
    ep = _entry_point({"kind": kind, "fmt_a": recipe_a.fmt, "fmt_b": recipe_b.fmt}, pre)
    fn = rt.functions[ep]
    meta: dict = {}
    if kind == "fp8":
        y = _rowwise(fn, ep, recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m, n,
                     out_dtype, bias)
    elif kind == "block":
        y = _blockscale(fn, ep, a_codes, a_scales, b_codes, b_scales, out_dtype)
    else:
        y = _a4w4(fn, rt, a_codes, a_scales, b_codes, b_scales, m, n, out_dtype, meta)
    return y, meta


def _register(backend, pre: bool) -> None:
    @backend.implements(Op.QGEMM, dtypes=(torch.float32, torch.bfloat16, torch.float16),
                        check=lambda params: _why_not(params, pre),
                        numerics=lambda params: _numerics(params, pre))
    def qgemm(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
              bias):
        return _qgemm(pre, recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, m=m, n=n,
                      out_dtype=out_dtype, bias=bias)


_register(BACKEND, pre=False)
_register(BACKEND_BPRESHUFFLE, pre=True)


# ---- contracts ---------------------------------------------------------------------------

_GEMM_NOTE = ("fp32 accumulation of exact FP8 products; epilogue acc * w_scale * x_scale in "
              "fp32, one rounding to bf16/fp16 (CK type_convert: RNE)")
_ROWWISE = ("XQ:(M,K)=tealite B K-last", "WQ:(N,K)=tealite A K-last", "x_scale:(M,1) fp32",
            "w_scale:(1,N) fp32")
declare(Contract(
    backend="aiter", entry_point="gemm_a8w8", op=Op.QGEMM, fp8="arch",
    layouts=_ROWWISE + ("bias:(N,) in the output dtype", "out:bf16|fp16"),
    notes=_GEMM_NOTE + "; splitK=0 forced (a tuned splitK>0 adds the bias 2^splitK times); "
          "bias must already be in the output dtype (the kernel checks it)"))
declare(Contract(
    backend="aiter", entry_point="gemm_a8w8_bpreshuffle", op=Op.QGEMM, fp8="arch",
    layouts=_ROWWISE + ("w:shuffle(16,16)", "out:bf16|fp16"),
    notes=_GEMM_NOTE + "; no bias"))
declare(Contract(
    backend="aiter", entry_point="gemm_a8w8_blockscale", op=Op.QGEMM, fp8="arch",
    layouts=("XQ:(M,K)", "WQ:(N,K)", "x_scale:(M,K/128) row-major",
             "w_scale:(N/128,K/128) row-major", "out:bf16|fp16"),
    notes="per 128-long K block: partial sum x a_scale x b_scale, accumulated in fp32; "
          "A (weights) 128x128 blocks, B (activations) 1x128; no bias"))
declare(Contract(
    backend="aiter", entry_point="gemm_a8w8_blockscale_bpreshuffle", op=Op.QGEMM, fp8="arch",
    layouts=("XQ:(M,K)", "w:shuffle(16,16)", "x_scale:(M,K/128) column-major (transposed view)",
             "w_scale:(N/128,K/128) row-major", "out:bf16|fp16"),
    notes="as gemm_a8w8_blockscale; the activation scales are read column-major"))
declare(Contract(
    backend="aiter", entry_point="gemm_a4w4", op=Op.QGEMM,
    layouts=("A:(M_pad32,K/2) fp4x2, low nibble = even element", "B:shuffle(16,16) as bytes",
             "scales:e8m0_shuffle (M,N padded to 256, K/32 to 8)", "out:(M_pad32,N) bf16"),
    notes="gfx950 only (raises on gfx942); dispatches to CK or ASM by a tuned (cu_num,M,N,K) "
          "table: the CK path ignores bias (AITER bug), so bias is rejected; bf16 output only",
    extra={"arch": ["gfx950"]}))
