"""``attention_fwd`` / ``attention_bwd`` on torch SDPA's CUDA kernels, with the LSE.

The aten ops (schemas of torch 2.13; 2.11 has the same required arguments, and the optional
ones this module passes are checked by name against the installed schema, :func:`_call`):

* flash (FlashAttention-2): ``_flash_attention_forward(query, key, value, cum_seq_q,
  cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *, scale,
  window_size_left, window_size_right, alibi_slopes, ...) -> (out, lse, rng_state, unused,
  debug_mask)``; q (b, s, h, d) or, varlen, (t, h, d) with cum_seq_*; lse (b, h, s) or
  (h, t).  ``_flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q,
  cum_seq_k, max_q, max_k, dropout_p, is_causal, rng_state, unused, *, scale,
  window_size_left, window_size_right) -> (dq, dk, dv)``; with dropout 0 the kernel never
  reads rng_state (torch's own varlen backward passes an empty ``unused`` the same way).
* efficient (cutlass): ``_efficient_attention_forward(query, key, value, bias, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, custom_mask_type,
  compute_log_sumexp, *, scale, ...) -> (out, lse, philox_seed, philox_offset, ...)``; q
  (b, s, h, d); lse (b, h, s rounded up to 32), its tail never read; ``custom_mask_type`` 0
  none, 1 causal from the top-left, 2 from the bottom-right.
  ``_efficient_attention_backward(grad_out_, query, key, value, bias, out, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, logsumexp, dropout_p, philox_seed,
  philox_offset, custom_mask_type, bias_requires_grad, *, scale, ...) -> (dq, dk, dv, dbias)``.

Adapter steps, as torch's own SDPA front-end does them: sbhd is passed as its strided bshd
view; flash gets head dims zero-padded to a multiple of 8 (zeros change no dot; sliced back);
the efficient kernel's bias is expanded to (b, h, s_q, s_kv) in a buffer whose rows are
padded to a multiple of 16 elements (the kernel's alignment) and its lse padded back to the
multiple of 32 it returned.

Refused with the reason (``check``; a kernel missing an argument: "adapter:" at call time):
padded bshd/sbhd and padded thd (no per-sequence lengths / gaps in these ops), thd on the
efficient kernel (wired for flash only), and per kernel what it cannot do -- flash: fp32, a
bias tensor, d_qk != d_v, head dims > 256, top-left causal with s_q != s_kv (FA2's causal is
bottom-right); efficient: GQA / MQA (SDPA repeats K/V for it: the dK / dV group sums would be
computed outside the kernel), windows, ALiBi, a bias in another dtype than q (the kernel
reads it in q's dtype: a rounding the caller did not ask for).

Numerics declared (not measured here: no GPU in CI; the integrator's device run checks
them): fp32 accumulation, P rounded to the input dtype before P @ V and P, dS rounded before
the backward products (both kernels feed the tensor cores in the input dtype), exp2 of
log2(e)-pre-multiplied scores (4 ulps, as AITER's Triton kernel on a GPU), online softmax
over key blocks declared as 32 (a lower bound of both kernels' tile widths: a smaller block
means more rescalings, a wider bound), 16-bit products summed with truncation on NVIDIA
tensor cores (u = 2^-23), fp32 inputs rounded to TF32 (the efficient kernel's tensor-op path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tealite.attention_types import (BOTTOM_RIGHT_MASKS, CAUSAL_MASKS, PADDING_MASKS,
                                     AttentionConfig)
from tealite.backends.sdpa import BACKEND, OPTIONS, PLATFORM
from tealite.errors import UnsupportedCase
from tealite.scoped import Scoped
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_HALF = (torch.bfloat16, torch.float16)
_FLASH_PAD, _BIAS_ALIGN, _LSE_ALIGN = 8, 16, 32
_FLASH_MAX_HEAD_DIM = 256
_TENSOR_CORE_U = 2.0 ** -23
_DECLARED_KV_BLOCK = 32
_EXP_ULPS = 4
ENTRY = {"flash": "aten._flash_attention_forward", "efficient": "aten._efficient_attention_forward"}
ENTRY_BWD = {"flash": "aten._flash_attention_backward",
             "efficient": "aten._efficient_attention_backward"}


@dataclass(frozen=True)
class AtenOps:
    """The aten ops called (a test substitutes fakes with ``ATEN.override(...)``)."""

    flash_fwd: Any
    flash_bwd: Any
    efficient_fwd: Any
    efficient_bwd: Any


def _detect_ops() -> AtenOps:
    aten = torch.ops.aten
    return AtenOps(aten._flash_attention_forward.default, aten._flash_attention_backward.default,
                   aten._efficient_attention_forward.default,
                   aten._efficient_attention_backward.default)


ATEN: Scoped[AtenOps] = Scoped("sdpa.ATEN", _detect_ops)


def _call(op, **kwargs):
    """``op`` with the arguments its schema names; a non-None argument it lacks is refused
    (torch versions differ in the optional ones)."""
    names = {a.name for a in op._schema.arguments}
    lacking = sorted(k for k, v in kwargs.items() if k not in names and v is not None)
    if lacking:
        raise UnsupportedCase(f"adapter: torch {torch.__version__}'s {op._schema.name} has no "
                              f"argument {', '.join(lacking)}")
    return op(**{k: v for k, v in kwargs.items() if k in names})


# ---- which kernel can run a case ---------------------------------------------------------

def _common_reason(p) -> str | None:
    if p["layout"] != "thd" and p["mask"] in PADDING_MASKS:
        return ("SDPA's kernels take no per-sequence lengths in their batched form (padded "
                "bshd/sbhd); a padded batch is thd")
    if p["thd_padded"]:
        return "padded thd (gaps between sequences) has no form in SDPA's varlen ops"
    if p["seqlen_q"] == 0 or p["seqlen_kv"] == 0:
        return "empty sequence dims: torch's SDPA returns before calling its kernels"
    return None


def _windowed(p) -> bool:
    return p["window"] not in ((-1, -1), (-1, 0)) or (p["window"] == (-1, 0)
                                                      and p["mask"] not in CAUSAL_MASKS)


def _top_left_differs(p) -> bool:
    return (p["mask"] in CAUSAL_MASKS and p["mask"] not in BOTTOM_RIGHT_MASKS
            and (p["layout"] == "thd" or p["seqlen_q"] != p["seqlen_kv"]))


def _flash_reason(p) -> str | None:
    if p["dtype"] not in _HALF:
        return "FlashAttention-2 takes fp16 / bf16 only"
    if p["bias"]:
        return "FlashAttention-2 has no bias tensor"
    if p["alibi"]:
        # torch's in-tree FlashAttention-2 is built without ALiBi: its forward raises "This
        # flash attention build does not support alibi" (seen on an H100, torch 2.11).
        return "torch's FlashAttention-2 build has no ALiBi ('does not support alibi')"
    if p["head_dim_qk"] != p["head_dim_v"]:
        return "FlashAttention-2 needs one head dim for q, k and v"
    if p["head_dim_qk"] > _FLASH_MAX_HEAD_DIM:
        return f"FlashAttention-2 takes head dims up to {_FLASH_MAX_HEAD_DIM}"
    if _top_left_differs(p):
        return ("FlashAttention-2's causal mask is bottom-right aligned; the top-left mask "
                "differs where s_q != s_kv (thd: refused, the lengths are not in the params)")
    return None


def _efficient_reason(p) -> str | None:
    if p["layout"] == "thd":
        return "thd is wired for the flash kernel only"
    if p["heads_q"] != p["heads_kv"]:
        return ("the memory-efficient kernel needs equal head counts (SDPA repeats K/V for "
                "GQA: the dK / dV sums over a group would be computed outside the kernel)")
    if _windowed(p):
        return "the memory-efficient kernel has no sliding window here"
    if p["mask"] in BOTTOM_RIGHT_MASKS and p["seqlen_q"] > p["seqlen_kv"]:
        # seen on an H100 (fp32, s_q 23, s_kv 12): rows that see no key got non-zero output
        # and rows that do a different LSE than the bottom-right contract's
        return ("the memory-efficient kernel's bottom-right causal mask disagrees with the "
                "contract when s_q > s_kv (rows that see no key, and the alignment)")
    align = 4 if p["dtype"] == torch.float32 else 8
    if p["head_dim_qk"] % align or p["head_dim_v"] % align:
        # seen on an H100 (d_qk 12, fp16): "cutlassF: no kernel found to launch"; torch's own
        # SDPA front-end pads for it, this adapter calls the kernel directly
        return (f"the memory-efficient kernel needs head dims divisible by {align} for "
                f"{p['dtype']} (got {p['head_dim_qk']}/{p['head_dim_v']})")
    if p["alibi"]:
        return "the memory-efficient kernel takes no ALiBi slopes (a bias tensor only)"
    if p["bias"] and p.get("bias_dtype", p["dtype"]) != p["dtype"]:
        return "the memory-efficient kernel reads the bias in q's dtype (give it so)"
    return None


_REASONS = {"flash": _flash_reason, "efficient": _efficient_reason}


def choose_kernel(p) -> tuple[str | None, str]:
    """(the first allowed kernel that can run the case, or None; why the others cannot)."""
    why = _common_reason(p)
    if why is not None:
        return None, why
    reasons = []
    for kernel in OPTIONS.get().kernels:
        r = _REASONS[kernel](p)
        if r is None:
            return kernel, ""
        reasons.append(f"{kernel}: {r}")
    return None, "; ".join(reasons) or "no SDPA kernel allowed (OPTIONS.kernels is empty)"


def _check(p) -> str | None:
    kernel, why = choose_kernel(p)
    return None if kernel is not None else why


def _numerics(backward: bool):
    def numerics(p) -> dict:
        kernel, _ = choose_kernel(p)
        dtype = p["dtype"]
        out = {"compute_dtype": torch.float32, "exp_ulps": _EXP_ULPS,
               "entry_point": (ENTRY_BWD if backward else ENTRY).get(kernel),
               "attention_p_rounded_to": dtype}
        if backward:
            out["attention_ds_rounded_to"] = dtype
            if p["heads_q"] != p["heads_kv"]:
                # FlashAttention-2's GQA backward writes dK / dV per query head in q's dtype
                # and sums the group afterwards (its dk_expanded); seen on an H100 as fp16
                # subnormal dK three steps off, beyond the bound without this declaration.
                out["partial_sums_rounded_to"] = dtype
        else:
            out["attention_kv_block"] = _DECLARED_KV_BLOCK
        if dtype == torch.float32:
            out["matmul_input_rounding"] = "tf32"
        elif not PLATFORM.get().hip:
            out["accumulator_unit_roundoff"] = _TENSOR_CORE_U
        return out
    return numerics


# ---- the case, as the kernels see it ---------------------------------------------------------

def case_facts(q, k, v, config: AttentionConfig) -> dict:
    """The dispatch params choose_kernel reads, from the tensors (the implementation is handed
    the config, not the params)."""
    qb, kb = _bshd(q, config.layout), _bshd(k, config.layout)
    return dict(dtype=q.dtype, layout=config.layout, mask=config.mask, window=config.window,
                bias=config.bias is not None, alibi=config.alibi_slopes is not None,
                bias_dtype=None if config.bias is None else config.bias.dtype,
                heads_q=q.shape[-2], heads_kv=k.shape[-2], head_dim_qk=q.shape[-1],
                head_dim_v=v.shape[-1], thd_padded=config.cu_seqlens_q_padded is not None
                or config.cu_seqlens_kv_padded is not None,
                seqlen_q=qb.shape[-3], seqlen_kv=kb.shape[-3])


def _kernel(q, k, v, config) -> str:
    kernel, why = choose_kernel(case_facts(q, k, v, config))
    if kernel is None:
        raise UnsupportedCase(why)
    return kernel


def _bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(0, 1) if layout == "sbhd" else t


def _pad8(t: torch.Tensor) -> torch.Tensor:
    d = t.shape[-1]
    return t if d % _FLASH_PAD == 0 else F.pad(t, [0, -(-d // _FLASH_PAD) * _FLASH_PAD - d])


def _varlen(config: AttentionConfig):
    """(cu_q, cu_kv, max_q, max_kv) for thd, Nones otherwise."""
    if config.layout != "thd":
        return None, None, None, None
    cq, ck = config.cu_seqlens_q.tolist(), config.cu_seqlens_kv.tolist()
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    return config.cu_seqlens_q, config.cu_seqlens_kv, max(lq), max(lk)


def _flash_window(config: AttentionConfig) -> tuple[int | None, int | None]:
    """(left, right) to pass: None where unbounded (so a torch without the arguments runs
    every unwindowed case); a causal mask sets right = 0 through is_causal."""
    left, right = config.window
    return (left if left >= 0 else None,
            right if right >= 0 and not config.causal else None)


def _mask_type(config: AttentionConfig) -> int:
    if not config.causal:
        return 0
    return 2 if config.bottom_right else 1


def _efficient_bias(config: AttentionConfig, b: int, h: int, sq: int, sk: int):
    if config.bias is None:
        return None
    padded = -(-sk // _BIAS_ALIGN) * _BIAS_ALIGN
    buf = torch.zeros(b, h, sq, padded, dtype=config.bias.dtype, device=config.bias.device)
    buf[..., :sk] = config.bias.expand(b, h, sq, sk)
    return buf[..., :sk]


def _rows_seeing_no_key(config: AttentionConfig, b: int, h: int, sq: int, sk: int, device):
    """(b | 1, h | 1, s_q) bool: rows the causal mask and the bias leave without a key (the
    efficient kernel's only routes to an empty row; windows and padding are refused)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if config.causal:
        vis = vis & (j <= i + (sk - sq if config.bottom_right else 0))
    if config.bias is not None:
        vis = vis & (config.bias > float("-inf"))
    return ~vis.any(-1).reshape((1, 1, sq) if vis.dim() == 2 else vis.shape[:-1])


def _lse_for_kernel(lse: torch.Tensor) -> torch.Tensor:
    """The contract's -inf for a row that sees no key, as the kernels' backward reads it:
    +inf (FlashAttention's convention), so that exp(s - lse) = 0 on that row."""
    return torch.where(lse == float("-inf"), float("inf"), lse)


@BACKEND.implements(Op.ATTENTION_FWD, dtypes=_FLOATS, devices=("cuda",), check=_check,
                    numerics=_numerics(False))
def attention_fwd(q, k, v, config: AttentionConfig):
    kernel = _kernel(q, k, v, config)
    ops = ATEN.get()
    qb, kb, vb = (_bshd(t, config.layout) for t in (q, k, v))
    if kernel == "flash":
        cu_q, cu_k, max_q, max_k = _varlen(config)
        left, right = _flash_window(config)
        d_v = vb.shape[-1]
        out, lse, *_ = _call(
            ops.flash_fwd, query=_pad8(qb), key=_pad8(kb), value=_pad8(vb), cum_seq_q=cu_q,
            cum_seq_k=cu_k, max_q=max_q if cu_q is not None else qb.shape[1],
            max_k=max_k if cu_k is not None else kb.shape[1], dropout_p=0.0,
            is_causal=config.causal, return_debug_mask=False, scale=config.softmax_scale,
            window_size_left=left, window_size_right=right, alibi_slopes=config.alibi_slopes)
        out = out[..., :d_v]
        if config.layout == "thd" and lse.shape != (q.shape[1], q.shape[0]):
            raise UnsupportedCase(f"adapter: this torch's varlen flash LSE has shape "
                                  f"{tuple(lse.shape)}, not (h, t)")
        # FlashAttention-2 writes lse = +inf for a row with no key; the contract's is -inf.
        lse = torch.where(lse == float("inf"), float("-inf"), lse)
    else:
        b, sq, h, _ = qb.shape
        out, lse, *_ = _call(
            ops.efficient_fwd, query=qb, key=kb, value=vb,
            bias=_efficient_bias(config, b, h, sq, kb.shape[1]), cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0,
            custom_mask_type=_mask_type(config), compute_log_sumexp=True,
            scale=config.softmax_scale)
        lse = lse[..., :sq]
        # The efficient kernel writes lse = 0 (not -inf) for a row that sees no key (seen on
        # an H100 with an all -inf bias row; its out row is 0): mapped to the contract's -inf.
        empty = _rows_seeing_no_key(config, b, h, sq, kb.shape[1], q.device)
        lse = torch.where(empty, float("-inf"), lse)
    return _bshd(out, config.layout).contiguous(), lse.contiguous()


@BACKEND.implements(Op.ATTENTION_BWD, dtypes=_FLOATS, devices=("cuda",), check=_check,
                    numerics=_numerics(True))
def attention_bwd(dout, q, k, v, out, lse, config: AttentionConfig):
    kernel = _kernel(q, k, v, config)
    ops = ATEN.get()
    layout = config.layout
    dob, qb, kb, vb, ob = (_bshd(t, layout) for t in (dout, q, k, v, out))
    if kernel == "flash":
        cu_q, cu_k, max_q, max_k = _varlen(config)
        left, right = _flash_window(config)
        dq, dk, dv = _call(
            ops.flash_bwd, grad_out=_pad8(dob), query=_pad8(qb), key=_pad8(kb),
            value=_pad8(vb), out=_pad8(ob), logsumexp=_lse_for_kernel(lse).contiguous(),
            cum_seq_q=cu_q,
            cum_seq_k=cu_k, max_q=max_q if cu_q is not None else qb.shape[1],
            max_k=max_k if cu_k is not None else kb.shape[1], dropout_p=0.0,
            is_causal=config.causal,
            rng_state=torch.zeros(2, dtype=torch.int64, device=q.device),
            unused=torch.empty(0, device=q.device), scale=config.softmax_scale,
            window_size_left=left, window_size_right=right)
        dq, dk, dv = dq[..., :q.shape[-1]], dk[..., :k.shape[-1]], dv[..., :v.shape[-1]]
    else:
        b, sq, h, _ = qb.shape
        lse_padded = F.pad(_lse_for_kernel(lse), [0, -(-sq // _LSE_ALIGN) * _LSE_ALIGN - sq])
        seed = torch.zeros((), dtype=torch.int64)
        dq, dk, dv, _ = _call(
            ops.efficient_bwd, grad_out_=dob, query=qb, key=kb, value=vb,
            bias=_efficient_bias(config, b, h, sq, kb.shape[1]), out=ob, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=sq, max_seqlen_k=kb.shape[1],
            logsumexp=lse_padded.contiguous(), dropout_p=0.0, philox_seed=seed,
            philox_offset=seed, custom_mask_type=_mask_type(config), bias_requires_grad=False,
            scale=config.softmax_scale)
    return tuple(_bshd(t, layout).contiguous() for t in (dq, dk, dv))
