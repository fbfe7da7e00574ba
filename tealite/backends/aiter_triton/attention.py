"""``tealite.attention_fwd`` / ``attention_bwd`` on AITER's Triton flash attention
(``aiter/ops/triton/mha.py``, ``mha_onekernel_bwd.py``).

Entry points: the public ``flash_attn_func`` (bshd; sbhd passed as its strided bshd view: the
kernel reads every stride) and ``flash_attn_varlen_func`` (thd), both with
``return_lse=True``; backward ``flash_attn_onekernel_backward``, the kernel their autograd
Functions call by default (``mha_set_use_fused_bwd_kernel(False)``), called directly with the
caller's out and lse (the autograd path would recompute the forward); or, selected per call,
the fused backward ``flash_attn_fused_backward`` (:mod:`.attention_fused_bwd`: its semantics,
refusals and the switch).  The autograd's one
adapter step is repeated here: head dims not a multiple of 8 are zero-padded to one before
the backward kernel (its forward pads the same way inside ``flash_attn_func``), and the
gradients are sliced back.  ALiBi slopes of shape (h_q,) are passed as a stride-0 (b, h_q)
view (AITER reads ``alibi_slopes.stride(1)``).  The varlen LSE is AITER's (t_q, h_q); tealite's
is (h_q, t_q): transposed on the way out and back.

AITER's semantics (amd-aiter 0.1.7.post2, read in the kernels) and what is refused:

* causal: bottom-right aligned (FlashAttention-2), per sequence in varlen; the top-left masks
  run only where every sequence has len_q == len_kv (the two coincide there);
* ALiBi: ``-slope * |i + len_kv - len_q - j|`` in the forward and the backward: the contract's;
* GQA / MQA: query head h reads K/V head ``h // (h_q // h_kv)``: the contract's;
* d_qk != d_v (MLA): only as AITER's "PE" split, d_v and d_qk - d_v unpadded powers of 2
  (>= 16) (its assertion);
* refused: a bias tensor and sliding windows (0.1.7 raises "not supported yet in the Triton
  Backend"), padded bshd/sbhd (no per-sequence lengths in ``flash_attn_func``), padded thd
  (``flash_attn_varlen_func`` reads sequence i at ``cu_seqlens[i]``: no gaps);
* refused, a divergence: a query row that sees no key (causal with len_q > len_kv, or
  len_kv == 0) gets lse = 0 from AITER's early-exit path (the contract: -inf, the log of an
  empty sum); its varlen store of that 0 is also masked with the batch's max_seqlen_q instead
  of the sequence's length.  tests/test_aiter_attention.py keeps the lse = 0 as a strict
  expected failure;
* refused, a bug: backward with a (padded) head dim that is not a power of 2.
  ``flash_attn_onekernel_backward`` passes ``HEAD_DIM=`` the actual dim and
  ``ACTUAL_HEAD_DIM=`` its power-of-2 padding (swapped) and the kernels ``tl.arange(0,
  HEAD_DIM)``: Triton refuses a non-power-of-2 range (on a GPU as in the interpreter);
* bf16 under the interpreter: its ``tl.dot`` multiplies bf16 operands as raw bits and its
  fp32 -> bf16 casts (P before P @ V) truncate (tests/test_aiter_gemm.py proves both).

FP8 (``recipe``, forward): AITER's FP8 path is ``_flash_attn_forward`` with float8 q / k / v
and descales of shape (b, h) (``flash_attn_func`` passes none): scores ``qk * scale *
descale_q * descale_k``, P re-quantized per key block in the kernel with a dynamic scale
``FP8_MAX / max(P)`` (``_compute_fp8_scaling_factors``) before P @ V, ``* descale_p *
descale_v``; fp32 output.  The adapter quantizes q, k, v with the per-tensor recipe in torch
(as AITER's own FP8 wrapper, ``mha_v3._quantize_bshd``, quantizes in torch, there per (batch,
head)): scale = fmax / amax in fp32 (1 for amax 0), codes = RNE(x * scale) saturated, the
descale 1 / scale broadcast to AITER's (b, h); the fp32 output is rounded to q's dtype.  Only
the default rule is taken (no pow2 scales, epsilon, AITER's amax / fmax rule, non-saturating
casts); the E4M3 flavour is the pinned arch's (OCP on gfx950, FNUZ on gfx942).  Declared:
P rounded to that E4M3 (its dynamic per-block scale only shrinks the underflow the tier
allows).  Refused under the interpreter: its fp32 -> fp8 cast of P is wrong
(:data:`~tealite.backends.aiter_triton.INTERPRETER_FP8_CAST`).

FP8 backward (``recipe``): ``flash_attn_onekernel_backward`` with float8 dout / q / k / v and
descales of shape (b, h) (no public wrapper of 0.1.7 passes them): scores ``qk * descale_q
* descale_k``, dP ``do v^T * descale_do * descale_v``, delta ``rowsum(o * do * descale_do)``
(o not FP8: the caller's, in q's dtype), and P^T and dS^T re-quantized to FP8 per block with
the dynamic scale ``FP8_MAX / max(|block|, 1e-9)`` before the dV / dK / dQ products, each
descaled after; dq / dk / dv written to the fp32 buffers the adapter hands it, rounded once
to q's dtype.  The adapter quantizes dout, q, k, v as the forward does (zero head-dim padding
first: it changes no amax).  Declared: P and dS rounded to the arch's E4M3 with that dynamic
block scale (``attention_dynamic_block_scale``, ``amax_floor`` 1e-9), and on NVIDIA the
FP8 MMA's accumulator (u = 2^-13, measured: qgemm.py).  Refused under the
interpreter: the same fp32 -> fp8 ``.to()`` of P^T and dS^T.  Contract: ``BWD_FP8``.

Numerics (declared per case): fp32 scores, online softmax over key blocks of the config's
``BLOCK_N`` with ``tl.math.exp2`` of scores pre-multiplied by log2(e); P rounded to the
input dtype before P @ V, and in the backward P and dS rounded to it before the dV / dK / dQ
products; fp32 inputs multiply as TF32 on NVIDIA (``tl.dot``'s default there); 16-bit
products are summed with truncation on NVIDIA tensor cores (u = 2^-23).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tealite.attention_types import (BOTTOM_RIGHT_MASKS, CAUSAL_MASKS, PADDING_MASKS,
                                     AttentionConfig)
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import (BACKEND, DEVICES, INTERPRET, PLATFORM, NAME,
                                           fp8_platform_reason, kernels, why_missing)
from tealite.backends.aiter_triton import attention_fused_bwd as fused_bwd
from tealite.backends.aiter_triton.gemm import TENSOR_CORE_U
from tealite.backends.aiter_triton.norms import interpreter_bf16_reason
from tealite.backends.aiter_triton.qgemm import _FP8_MMA_U as FP8_MMA_U
from tealite.errors import UnsupportedCase
from tealite.numerics import FP8_CODE_ALIGNMENT
from tealite.types import Op

FWD_FP8 = "_flash_attn_forward"
FWD = "flash_attn_func"
FWD_VARLEN = "flash_attn_varlen_func"
BWD = "flash_attn_onekernel_backward"
# The same function driven with FP8 operands: its own contract (a key of the gate's table).
BWD_FP8 = f"{BWD}[fp8]"
_DS_AMAX_FLOOR = 1e-9  # _compute_fp8_scaling_factors: amax floored before FP8_MAX / amax
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_PAD = 8  # the autograd Functions pad head dims to a multiple of 8
# exp2 of a pre-multiplied score: 1 ulp for the exp2 (numpy's in the interpreter; ex2.approx
# on NVIDIA is within 2) plus the rounding of score * (scale * log2 e): declared as 2 / 4.
_EXP_ULPS_INTERPRETER, _EXP_ULPS_GPU = 2, 4

_EXTRA = {"causal": "bottom-right (FlashAttention-2)", "alibi": "-slope*|i + sk - sq - j|",
          "empty_row": "out 0, lse 0 (the contract: lse -inf): refused",
          "window": "unsupported (raises)", "bias": "unsupported (raises)",
          "head_dim": "padded to a multiple of 8; d_qk != d_v only as pow2 + pow2 (PE)"}
declare(Contract(backend=NAME, entry_point=FWD, op=Op.ATTENTION_FWD,
                 layouts=("q/k/v:bshd (strided)", "lse:(b,h,s) fp32"),
                 notes="online softmax (exp2), P rounded to the input dtype", extra=_EXTRA))
declare(Contract(backend=NAME, entry_point=FWD_VARLEN, op=Op.ATTENTION_FWD,
                 layouts=("q/k/v:thd (cu_seqlens, no gaps)", "lse:(t,h) fp32"),
                 notes="online softmax (exp2), P rounded to the input dtype", extra=_EXTRA))
declare(Contract(backend=NAME, entry_point=BWD, op=Op.ATTENTION_BWD,
                 layouts=("q/k/v:bshd|thd (strided)", "lse:(b,h,s)|(t,h) fp32"),
                 notes="P recomputed from lse; P and dS rounded to the input dtype",
                 extra={**_EXTRA, "head_dim": "a power of 2 after padding to 8 (0.1.7 bug)"}))


declare(Contract(backend=NAME, entry_point=FWD_FP8, op=Op.ATTENTION_FWD, family="fp8-current",
                 fp8="arch", scale_rule="fmax/amax", element_rounding="rne",
                 saturation="saturate",
                 layouts=("q/k/v:fp8 bshd|thd", "descale_q:(b,h_q)", "descale_k/v:(b,h_kv)",
                          "out:fp32"),
                 notes="q/k/v quantized per tensor by the adapter (torch, the recipe's rule); "
                       "P re-quantized per key block in-kernel (dynamic scale FP8_MAX/max P)",
                 extra={**_EXTRA, "p": "fp8, dynamic per-block scale"}))


declare(Contract(backend=NAME, entry_point=BWD_FP8, op=Op.ATTENTION_BWD_FP8,
                 family="fp8-current", fp8="arch", scale_rule="fmax/amax",
                 element_rounding="rne", saturation="saturate",
                 layouts=("do/q/k/v:fp8 bshd|thd", "descale_q/do:(b,h_q)", "descale_k/v:(b,h_kv)",
                          "o:q's dtype", "dq/dk/dv:fp32"),
                 notes="dout/q/k/v quantized per tensor by the adapter (torch, the recipe's "
                       "rule); P^T and dS^T re-quantized per block in-kernel (dynamic scale "
                       "FP8_MAX/max(|block|, 1e-9)), descaled after each product",
                 extra={**_EXTRA, "p": "fp8, dynamic per-block scale",
                        "ds": "fp8, dynamic per-block scale",
                        "head_dim": "a power of 2 after padding to 8 (0.1.7 bug)"}))


def _recipe_reason(p, entry: str = FWD) -> str | None:
    r = p.get("recipe")
    if r is None:
        return None
    from tealite.recipes import FP8ScaleRule, Saturation
    if r.force_pow2_scales or r.amax_epsilon or r.scale_rule is not FP8ScaleRule.FMAX_OVER_AMAX \
            or r.saturation is not Saturation.SATURATE or r.fmt != "e4m3":
        return ("AITER's FP8 attention is driven here with the default per-tensor E4M3 recipe "
                "only (fmax / amax, saturating, no pow2 scales or epsilon)")
    if p["head_dim_qk"] != p["head_dim_v"]:
        return "AITER's Triton mha has no FP8 path with d_qk != d_v (it asserts)"
    if not INTERPRET and PLATFORM.get().nvidia:
        # Seen on an H100 (triton 3.6): AITER pads the head dim to a power of 2 >= 16, and its
        # FP8 tl.dot over it fails to compile for 16 (forward: head dim 8; backward: 16);
        # sm_90's FP8 MMA takes K = 32.  32 and 64 compile and pass.
        if p["head_dim_qk"] <= 16:
            return (f"AITER's FP8 attention does not compile on NVIDIA for head dims up to 16 "
                    f"(an FP8 dot over the padded head dim; got {p['head_dim_qk']})")
        # Same run: the causal backward fails to compile at every head dim tried (32, 60):
        # its masked sub-blocks (BLOCK_M1 / BLK_SLICE_FACTOR rows) make an FP8 dot with K < 32.
        if entry == BWD and "causal" in p["mask"]:
            return ("AITER's FP8 attention backward with a causal mask does not compile on "
                    "NVIDIA (its masked sub-blocks give an FP8 dot with K < 32)")
    return fp8_platform_reason() or why_missing(entry)


def _ceil_pad(d: int) -> int:
    return -(-d // _PAD) * _PAD


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _head_dim_reason(p, backward: bool) -> str | None:
    dqk, dv = p["head_dim_qk"], p["head_dim_v"]
    if dqk != dv:
        pe = dqk - dv
        if not (_pow2(dv) and dv >= 16 and _pow2(pe) and pe >= 16):
            return (f"AITER's Triton mha takes d_qk != d_v only as its PE split: d_v and "
                    f"d_qk - d_v unpadded powers of 2 >= 16 (got {dqk}/{dv})")
    if backward and not _pow2(_ceil_pad(dv)):
        return (f"AITER 0.1.7 bug: flash_attn_onekernel_backward swaps HEAD_DIM and "
                f"ACTUAL_HEAD_DIM, so its kernels tl.arange over the head dim "
                f"({_ceil_pad(dv)} after padding to 8), which Triton refuses unless it is a "
                f"power of 2")
    if backward and not INTERPRET and _ceil_pad(min(dqk, dv)) < 16:
        # Seen on an H100 (triton 3.6): the backward's tl.dot over the head dim does not
        # compile for 8 (Triton's MMA takes K >= 16); AITER pads the head dim to 8 only.
        return (f"AITER's Triton mha backward does not compile for head dims below 16 "
                f"(got {dqk}/{dv}: tl.dot over the head dim needs >= 16)")
    return None


def _semantics_reason(p) -> str | None:
    mask, layout = p["mask"], p["layout"]
    if p["bias"]:
        return "AITER 0.1.7's Triton mha has no bias tensor (it raises 'Bias is not supported')"
    if p["window"] not in ((-1, -1), (-1, 0)) or (p["window"] == (-1, 0)
                                                  and mask not in CAUSAL_MASKS):
        return "AITER 0.1.7's Triton mha has no sliding window (it raises 'not supported yet')"
    if layout != "thd" and mask in PADDING_MASKS:
        return ("flash_attn_func has no per-sequence lengths (padded bshd/sbhd); a padded "
                "batch is thd through flash_attn_varlen_func")
    if p["thd_padded"]:
        return ("flash_attn_varlen_func reads sequence i at cu_seqlens[i]: padded thd "
                "(cu_seqlens_*_padded, gaps between sequences) has no AITER form")
    if layout != "thd":
        sq, sk = p["seqlen_q"], p["seqlen_kv"]
        if mask in CAUSAL_MASKS and mask not in BOTTOM_RIGHT_MASKS and sq != sk:
            return ("AITER's causal mask is bottom-right aligned (FlashAttention-2); the "
                    "top-left mask differs when s_q != s_kv")
        if sq > 0 and (sk == 0 or (mask in CAUSAL_MASKS and sq > sk)):
            return EMPTY_ROW
    return None


EMPTY_ROW = ("AITER's Triton mha writes lse = 0 for a query row that sees no key (the "
             "contract: -inf, the log of an empty sum; a strict xfail in "
             "tests/test_aiter_attention.py)")


def _check_for(backward: bool):
    def check(p) -> str | None:
        if backward and fused_bwd.fused_selected():
            nvidia = not INTERPRET and PLATFORM.get().nvidia
            why = (_semantics_reason(p) or interpreter_bf16_reason(p["dtype"])
                   or fused_bwd.reason(p, nvidia=nvidia))
            if why is None and p.get("recipe") is not None:
                return _recipe_reason(p, fused_bwd.FUSED_BWD)
            return why
        why = (_semantics_reason(p) or _head_dim_reason(p, backward)
               or interpreter_bf16_reason(p["dtype"]))
        if why is not None:
            return why
        if p.get("recipe") is not None:
            return _recipe_reason(p, BWD if backward else FWD)
        return why_missing(BWD) if backward else why_missing(FWD_VARLEN if p["layout"] == "thd"
                                                             else FWD)
    return check


def _config_block_n(dtype) -> int | None:
    """BLOCK_N of the forward config AITER picks for ``dtype`` (None: not readable)."""
    try:
        cfg = kernels().module_of(FWD)._get_config(False, dtype)
    except Exception:  # declared as unknown rather than guessed
        return None
    return cfg.get("BLOCK_N")


def _numerics(backward: bool):
    def numerics(p) -> dict:
        dtype = p["dtype"]
        nvidia = not INTERPRET and PLATFORM.get().nvidia
        entry = BWD if backward else (FWD_VARLEN if p["layout"] == "thd" else FWD)
        fp8 = p.get("recipe") is not None
        if backward and fused_bwd.fused_selected():  # the same roundings (its module doc)
            entry = fused_bwd.FUSED_BWD_FP8 if fp8 else fused_bwd.FUSED_BWD
        elif fp8:
            entry = BWD_FP8 if backward else FWD_FP8
        out = {"compute_dtype": torch.float32, "entry_point": entry,
               "exp_ulps": _EXP_ULPS_INTERPRETER if INTERPRET else _EXP_ULPS_GPU,
               "attention_p_rounded_to": _fp8_dtype() if fp8 else dtype}
        if backward:
            out["attention_ds_rounded_to"] = _fp8_dtype() if fp8 else dtype
            if fp8:  # P^T and dS^T: FP8_MAX / max(|block|, 1e-9) in-kernel
                out.update(attention_dynamic_block_scale=True, amax_floor=_DS_AMAX_FLOOR)
        else:
            out["attention_kv_block"] = _config_block_n(dtype)
        if nvidia and dtype == torch.float32 and not fp8:
            out["matmul_input_rounding"] = "tf32"
        elif nvidia and fp8:
            # Every FP8 tl.dot (forward: Q K^T and P V; backward: its four products) is one
            # Hopper FP8 MMA chain (<= a block or the head dim), its result descaled before the
            # fp32 add across blocks: 2^-13 bounds both (qgemm.py).
            out["accumulator_unit_roundoff"] = FP8_MMA_U
            out["alignment_floor"] = FP8_CODE_ALIGNMENT  # subnormal codes: qgemm.py
        elif nvidia:
            out["accumulator_unit_roundoff"] = TENSOR_CORE_U
        return out
    return numerics


def _fp8_dtype():
    try:
        return kernels().fp8_dtype
    except Exception:  # no AITER: the declaration is never used then
        return torch.float8_e4m3fn


# ---- sequences, read on the host (the front-end already did) -----------------------------

def _lengths(config: AttentionConfig) -> list[tuple[int, int]]:
    cq, ck = config.cu_seqlens_q.tolist(), config.cu_seqlens_kv.tolist()
    return [(cq[i + 1] - cq[i], ck[i + 1] - ck[i]) for i in range(len(cq) - 1)]


def _thd_reason(config: AttentionConfig) -> str | None:
    """What only the thd sequence lengths show (UnsupportedCase at call time)."""
    lengths = _lengths(config)
    if any(lq > 0 and (lk == 0 or (config.causal and lq > lk)) for lq, lk in lengths):
        return EMPTY_ROW
    if config.causal and not config.bottom_right and any(lq != lk for lq, lk in lengths):
        return ("AITER's causal mask is bottom-right aligned (FlashAttention-2); the top-left "
                "mask differs for a sequence with len_q != len_kv")
    return None


def _varlen(config: AttentionConfig) -> tuple[int, int, int]:
    """(batch, max_q, max_k) of a thd case AITER's varlen kernels can run (UnsupportedCase
    with the reason where only the lengths show it cannot)."""
    why = _thd_reason(config)
    if why is not None:
        raise UnsupportedCase(why)
    lengths = _lengths(config)
    return (len(lengths), max(lq for lq, _ in lengths), max(lk for _, lk in lengths))


def _alibi(config: AttentionConfig, batch: int):
    s = config.alibi_slopes
    if s is None or s.ndim == 2:
        return s
    return s.unsqueeze(0).expand(batch, s.shape[0])  # AITER reads stride(1): a (b, h) view


def _bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(0, 1) if layout == "sbhd" else t


def _kernels():
    return kernels()


def _fp8_entry():
    """``_flash_attn_forward``, the helper in flash_attn_func's module (its FP8 path takes
    descales, which the public wrappers do not pass)."""
    fn = getattr(kernels().module_of(FWD), FWD_FP8, None)
    if fn is None:
        raise UnsupportedCase(f"adapter: {FWD}'s module has no {FWD_FP8}")
    return fn


def _quantize_per_tensor(x: torch.Tensor, fp8) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale) of the recipe's rule (see the module docstring), in torch."""
    fmax = torch.finfo(fp8).max
    amax = x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
    # A tensor / tensor division: torch computes ``python_float / tensor`` as a reciprocal
    # times the float (two roundings), and that scale, one ulp off TE's fp32 quotient, moved
    # codes at ties (an H100 fuzz finding, reproduced on the CPU: 17.25 with amax 92 gave
    # 88 for TE's 80).
    scale = amax.new_full((), fmax) / amax
    # TE's rule: an infinite quotient (amax below fmax / FLT_MAX: subnormal inputs) becomes
    # FLT_MAX, amax 0 or non-finite gives 1.  Without the first, an H100 fuzz found NaN dq /
    # dk for a tiny dout (0 * inf in the codes) and a zero dv (descale 1 / inf).
    scale = torch.where(torch.isinf(scale), torch.finfo(torch.float32).max, scale)
    scale = torch.where((amax > 0) & torch.isfinite(amax), scale, torch.ones_like(amax))
    codes = (x.float() * scale).clamp(-fmax, fmax).to(fp8)
    return codes, torch.reciprocal(scale)


def _fp8_forward(q, k, v, config: AttentionConfig):
    fp8 = kernels().fp8_dtype
    (q8, dq), (k8, dk), (v8, dv) = (_quantize_per_tensor(t, fp8) for t in (q, k, v))
    if config.layout == "thd":
        batch, max_q, max_k = _varlen(config)
        cu_q, cu_k = config.cu_seqlens_q, config.cu_seqlens_kv
    else:
        q8, k8, v8 = (_bshd(t, config.layout) for t in (q8, k8, v8))
        batch, max_q, max_k = q8.shape[0], q8.shape[1], k8.shape[1]
        cu_q = cu_k = None
    hq, hk = q.shape[-2], k.shape[-2]
    descale = [d.reshape(1, 1).expand(batch, h).contiguous()
               for d, h in ((dq, hq), (dk, hk), (dv, hk))]
    out, lse, *_ = _fp8_entry()(
        q8, k8, v8, 0.0, config.softmax_scale, config.causal, -1, -1, None,
        _alibi(config, batch), True, False, max_q, max_k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        descale_q=descale[0], descale_k=descale[1], descale_v=descale[2])
    out = out.to(q.dtype)  # AITER's FP8 path writes fp32: the contract's dtype, one rounding
    if config.layout == "thd":
        return out, lse.t().contiguous()
    return _bshd(out, config.layout).contiguous(), lse


@BACKEND.implements(Op.ATTENTION_FWD_FP8, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(False), numerics=_numerics(False))
@BACKEND.implements(Op.ATTENTION_FWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(False), numerics=_numerics(False))
def attention_fwd(q, k, v, config: AttentionConfig):
    if config.recipe is not None:
        return _fp8_forward(q, k, v, config)
    causal = config.causal
    if config.layout == "thd":
        batch, max_q, max_k = _varlen(config)
        out, lse = _kernels().flash_attn_varlen_func(
            q, k, v, config.cu_seqlens_q, config.cu_seqlens_kv, max_q, max_k,
            softmax_scale=config.softmax_scale, causal=causal,
            alibi_slopes=_alibi(config, batch), return_lse=True)
        return out, lse.t().contiguous()  # AITER's (t, h) -> (h, t)
    qb, kb, vb = (_bshd(t, config.layout) for t in (q, k, v))
    out, lse = _kernels().flash_attn_func(qb, kb, vb, softmax_scale=config.softmax_scale,
                                         causal=causal, alibi_slopes=_alibi(config, qb.shape[0]),
                                         return_lse=True)
    return _bshd(out, config.layout).contiguous(), lse


def _pad_head(t: torch.Tensor) -> torch.Tensor:
    d = t.shape[-1]
    return t if d % _PAD == 0 else F.pad(t, [0, _ceil_pad(d) - d])


def _fp8_backward(dout, q, k, v, out, lse, config: AttentionConfig):
    layout = config.layout
    fp8 = kernels().fp8_dtype
    batch, max_q, max_k, cu_q, cu_k, lse_k = _bwd_geometry(q, k, lse, config)
    # Padded in q's dtype, then quantized (zeros change no amax); o stays in q's dtype.
    do_, q_, k_, v_, o_ = (_pad_head(_bshd(t, layout)).contiguous()
                           for t in (dout, q, k, v, out))
    (do8, s_do), (q8, s_q), (k8, s_k), (v8, s_v) = (_quantize_per_tensor(t, fp8)
                                                    for t in (do_, q_, k_, v_))
    hq, hk = q.shape[-2], k.shape[-2]
    descale = {f"descale_{n}": s.reshape(1, 1).expand(batch, h).contiguous()
               for n, s, h in (("q", s_q, hq), ("k", s_k, hk), ("v", s_v, hk), ("do", s_do, hq))}
    if fused_bwd.fused_selected():
        dq, dk, dv = fused_bwd.run(do8, q8, k8, v8, o_, lse_k, scale=config.softmax_scale,
                                   causal=config.causal, cu_q=cu_q, cu_k=cu_k, max_q=max_q,
                                   max_k=max_k, **descale)
    else:
        dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device)
                      for t in (q_, k_, v_))
        _kernels().flash_attn_onekernel_backward(
            do8, q8, k8, v8, o_, lse_k, dq, dk, dv, None, config.softmax_scale,
            _alibi(config, batch), config.causal, cu_q, cu_k, max_seqlen_q=max_q,
            max_seqlen_k=max_k, dropout_p=0.0, USE_INT64_STRIDES=True, **descale)
    # fp32 gradients: the contract's dtype, one rounding each
    return tuple(_bshd(g[..., :t.shape[-1]], layout).to(t.dtype).contiguous()
                 for g, t in ((dq, q), (dk, k), (dv, v)))


def _bwd_geometry(q, k, lse, config: AttentionConfig):
    """(batch, max_q, max_k, cu_q, cu_k, AITER's lse) of a backward call."""
    layout = config.layout
    if layout == "thd":
        batch, max_q, max_k = _varlen(config)
        # tealite's (h, t) -> AITER's (t, h)
        return (batch, max_q, max_k, config.cu_seqlens_q, config.cu_seqlens_kv,
                lse.t().contiguous())
    qb, kb = _bshd(q, layout), _bshd(k, layout)
    return qb.shape[0], qb.shape[1], kb.shape[1], None, None, lse.contiguous()


@BACKEND.implements(Op.ATTENTION_BWD_FP8, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(True), numerics=_numerics(True))
@BACKEND.implements(Op.ATTENTION_BWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_check_for(True), numerics=_numerics(True))
def attention_bwd(dout, q, k, v, out, lse, config: AttentionConfig):
    if config.recipe is not None:
        return _fp8_backward(dout, q, k, v, out, lse, config)
    layout = config.layout
    dqk, dv_ = q.shape[-1], v.shape[-1]
    batch, max_q, max_k, cu_q, cu_k, lse_k = _bwd_geometry(q, k, lse, config)
    # The autograd Functions' step: head dims padded to a multiple of 8 (zeros change no dot).
    do_, q_, k_, v_, o_ = (_pad_head(_bshd(t, layout)) for t in (dout, q, k, v, out))
    if fused_bwd.fused_selected():
        grads = fused_bwd.run(do_, q_, k_, v_, o_, lse_k, scale=config.softmax_scale,
                              causal=config.causal, cu_q=cu_q, cu_k=cu_k, max_q=max_q,
                              max_k=max_k)
        # fp32 gradients: one rounding each to the input dtype
        return tuple(_bshd(g[..., :t.shape[-1]], layout).to(t.dtype).contiguous()
                     for g, t in zip(grads, (q, k, v)))
    dq, dk, dv = torch.zeros_like(q_), torch.empty_like(k_), torch.empty_like(v_)
    _kernels().flash_attn_onekernel_backward(
        do_, q_, k_, v_, o_, lse_k, dq, dk, dv, None, config.softmax_scale,
        _alibi(config, batch), config.causal, cu_q, cu_k, max_seqlen_q=max_q,
        max_seqlen_k=max_k, dropout_p=0.0, USE_INT64_STRIDES=True)
    return (_bshd(dq[..., :dqk], layout).contiguous(), _bshd(dk[..., :dqk], layout).contiguous(),
            _bshd(dv[..., :dv_], layout).contiguous())
