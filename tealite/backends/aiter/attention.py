"""``attention_fwd`` / ``attention_bwd`` on AITER's CK fmha (``aiter.mha_fwd``, ``mha_bwd``,
``mha_varlen_fwd``, ``mha_varlen_bwd``; never run on AMD hardware, see the package
docstring).

Written from amd-aiter 0.1.7.post2's ``aiter/ops/mha.py`` and the C++ behind it
(``aiter_meta/csrc/py_itfs_ck/mha_{fwd,bwd,varlen_fwd,varlen_bwd}_kernels.cu``):

* q/k/v (b, s, h, d) batch mode or (t, h, d) group mode (varlen), last dim contiguous (the
  other strides are read: sbhd goes as its strided bshd view); GQA / MQA by head count; head
  dims multiples of 8 up to 256 (TORCH_CHECK), d_qk and d_v separate;
* masks "b:left,right" from (is_causal, window): causal and windows are bottom-right aligned
  (FlashAttention's convention); a causal mask is "b:left,0";
* bias: one (s_q, s_kv) tensor broadcast over batch and heads (batch mode only); ALiBi slopes
  (h,) or (b, h), FlashAttention's -slope * |i + s_kv - s_q - j|;
* lse: (b, h, s_q) in batch mode, (h, t_q) in group mode: the contract's; padded thd through
  ``cu_seqlens_*_padded`` (the physical sequence starts); ``zero_tensors=True`` zeroes the
  rows in gaps (the contract: 0);
* outputs and P / dS go through ck_tile's ``type_convert``: fp16 RNE, bf16 *truncation*
  (``module_mha_*`` are built with ``CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=2``, truncate), which
  tealite's tolerance model cannot express: bf16 is refused, as for the CK norms and
  activations; fp32 is not taken.  Scores in fp32 with ``CK_TILE_FMHA_FWD_FAST_EXP2``.

Refused besides (``check``): a bias with a batch or head dimension, padded bshd/sbhd (batch
mode has no per-sequence lengths), top-left causal where s_q != s_kv (thd: at the call, from
the lengths), empty batches (TORCH_CHECK batch > 0).
"""
from __future__ import annotations

import torch

from tealite.attention_types import (BOTTOM_RIGHT_MASKS, CAUSAL_MASKS, PADDING_MASKS,
                                     AttentionConfig)
from tealite.backends.aiter import BACKEND, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.errors import UnsupportedCase
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
FWD = {"batch": "mha_fwd", "group": "mha_varlen_fwd"}
BWD = {"batch": "mha_bwd", "group": "mha_varlen_bwd"}
_MAX_HEAD_DIM, _HEAD_DIM_STEP = 256, 8
_DECLARED_KV_BLOCK = 32  # a lower bound of CK's fmha tile widths (more rescalings: wider)
_EXP_ULPS = 4            # exp2 of log2(e)-pre-multiplied scores (FAST_EXP2)
TOP_LEFT = ("CK's fmha masks are bottom-right aligned (FlashAttention's convention); the "
            "top-left causal mask differs where s_q != s_kv")

_NOTES = ("fp32 scores, exp2 (FAST_EXP2); P, dS and outputs converted by ck_tile type_convert "
          "(fp16 RNE, bf16 truncation: refused); masks bottom-right; bias (s_q, s_kv) only")
for _op, _entries in ((Op.ATTENTION_FWD, FWD), (Op.ATTENTION_BWD, BWD)):
    for _mode, _entry in _entries.items():
        declare(Contract(
            backend="aiter", entry_point=_entry, op=_op, element_rounding="bf16:rtz, fp16:rne",
            layouts=(("q/k/v:(b,s,h,d) strided", "lse:(b,h,s)") if _mode == "batch" else
                     ("q/k/v:(t,h,d) + cu_seqlens[_padded]", "lse:(h,t)")),
            notes=_NOTES, extra={"causal": "bottom-right", "head_dim": "multiple of 8, <= 256"}))


def _mode(p) -> str:
    return "group" if p["layout"] == "thd" else "batch"


def _semantics_reason(p) -> str | None:
    if p["dtype"] == torch.bfloat16:
        return ("AITER's CK fmha converts P and its outputs to bf16 by truncation "
                "(CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=2 in module_mha_*), which tealite's "
                "tolerance model cannot express")
    if p["dtype"] != torch.float16:
        return f"AITER's CK fmha takes fp16 / bf16 (and FP8), not {p['dtype']}"
    for name in ("head_dim_qk", "head_dim_v"):
        d = p[name]
        if d % _HEAD_DIM_STEP or d > _MAX_HEAD_DIM:
            return f"CK's fmha needs head dims that are multiples of 8 up to 256 ({name}={d})"
    if p["layout"] != "thd" and p["mask"] in PADDING_MASKS:
        return "CK's batch-mode fmha has no per-sequence lengths (padded bshd/sbhd); use thd"
    if p["batch"] == 0:
        return "CK's fmha needs a positive batch size (TORCH_CHECK)"
    if (p["layout"] != "thd" and p["mask"] in CAUSAL_MASKS
            and p["mask"] not in BOTTOM_RIGHT_MASKS and p["seqlen_q"] != p["seqlen_kv"]):
        return TOP_LEFT
    return None


def _check_for(entries):
    def check(p) -> str | None:
        return common_why_not(p, entries[_mode(p)]) or _semantics_reason(p)
    return check


def _numerics_for(entries, backward: bool):
    def numerics(p) -> dict:
        dt = p["dtype"]
        out = {"entry_point": entries[_mode(p)], "compute_dtype": torch.float32,
               "exp_ulps": _EXP_ULPS, "attention_p_rounded_to": dt}
        if backward:
            out["attention_ds_rounded_to"] = dt
        else:
            out["attention_kv_block"] = _DECLARED_KV_BLOCK
        return out
    return numerics


def _bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(0, 1) if layout == "sbhd" else t


def _bias2d(config: AttentionConfig):
    b = config.bias
    if b is None:
        return None
    if b.shape[0] != 1 or b.shape[1] != 1:
        raise UnsupportedCase("CK's fmha takes one (s_q, s_kv) bias for every batch row and "
                              f"head, not one of shape {tuple(b.shape)}")
    return b[0, 0].contiguous()


def _group(config: AttentionConfig) -> dict:
    """Group-mode (varlen) arguments: cu_seqlens, the max lengths, the padded starts."""
    cq, ck = config.cu_seqlens_q.tolist(), config.cu_seqlens_kv.tolist()
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    if config.causal and not config.bottom_right and lq != lk:
        raise UnsupportedCase(TOP_LEFT)
    return dict(cu_seqlens_q=config.cu_seqlens_q, cu_seqlens_k=config.cu_seqlens_kv,
                max_seqlen_q=max(lq), max_seqlen_k=max(lk),
                cu_seqlens_q_padded=config.cu_seqlens_q_padded,
                cu_seqlens_k_padded=config.cu_seqlens_kv_padded)


def _mask_args(config: AttentionConfig) -> dict:
    left, right = config.window
    return dict(is_causal=config.causal, window_size_left=left, window_size_right=right)


def _fn(name: str):
    return runtime().functions[name]


@BACKEND.implements(Op.ATTENTION_FWD, dtypes=_FLOATS, check=_check_for(FWD),
                    numerics=_numerics_for(FWD, False))
def attention_fwd(q, k, v, config: AttentionConfig):
    common = dict(dropout_p=0.0, softmax_scale=config.softmax_scale, **_mask_args(config),
                  return_softmax_lse=True, return_dropout_randval=False,
                  alibi_slopes=config.alibi_slopes)
    if config.layout == "thd":
        out, lse, _, _ = _fn(FWD["group"])(q, k, v, **_group(config), min_seqlen_q=0,
                                           logits_soft_cap=0.0, zero_tensors=True, **common)
        return out, lse
    qb, kb, vb = (_bshd(t, config.layout) for t in (q, k, v))
    out, lse, _, _ = _fn(FWD["batch"])(qb, kb, vb, bias=_bias2d(config), **common)
    return _bshd(out, config.layout).contiguous(), lse


@BACKEND.implements(Op.ATTENTION_BWD, dtypes=_FLOATS, check=_check_for(BWD),
                    numerics=_numerics_for(BWD, True))
def attention_bwd(dout, q, k, v, out, lse, config: AttentionConfig):
    common = dict(dropout_p=0.0, softmax_scale=config.softmax_scale, **_mask_args(config),
                  deterministic=True, alibi_slopes=config.alibi_slopes)
    if config.layout == "thd":
        dq, dk, dv, _ = _fn(BWD["group"])(dout, q, k, v, out, lse, **_group(config),
                                          zero_tensors=True, **common)
        return dq, dk, dv
    t = [_bshd(x, config.layout) for x in (dout, q, k, v, out)]
    dq, dk, dv, _ = _fn(BWD["batch"])(*t, lse, bias=_bias2d(config), **common)
    return tuple(_bshd(g, config.layout).contiguous() for g in (dq, dk, dv))
