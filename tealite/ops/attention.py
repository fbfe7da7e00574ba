"""Dot-product attention, forward and backward (semantics: tealite/attention_types.py).

    out, lse = tealite.attention_fwd(q, k, v, layout="bshd", mask="causal")
    dq, dk, dv = tealite.attention_bwd(dout, q, k, v, out, lse, layout="bshd", mask="causal")

Every argument is validated here, before any backend runs: bad input raises
TealiteArgumentError naming the argument and the constraint, and nothing is computed.
cu_seqlens / seqlens are read on the host once (their values decide shapes and validity).
"""
from __future__ import annotations

import math

import torch

import tealite.recipes as R
import tealite.registry as registry
from tealite._checks import (check_choice, check_finite_number, check_same_device, check_shape,
                             check_tensor, require)
from tealite.attention_types import (MASKS, PADDING_MASKS, QKV_LAYOUTS, AttentionBwd,
                                     AttentionConfig, AttentionFwd)
from tealite.types import Op

_F32 = (torch.float32,)
_INT32 = (torch.int32,)


def _dims(name: str, t: torch.Tensor, layout: str) -> tuple[int | None, int, int, int]:
    """(batch or None for thd, seq or total tokens, heads, head dim) of a q/k/v tensor."""
    check_tensor(name, t, ndim=3 if layout == "thd" else 4)
    if layout == "thd":
        t_, h, d = t.shape
        return None, t_, h, d
    if layout == "bshd":
        b, s, h, d = t.shape
    else:
        s, b, h, d = t.shape
    return b, s, h, d


def _check_heads(q, k, v, layout):
    bq, sq, hq, dqk = _dims("q", q, layout)
    bk, sk, hk, dk_ = _dims("k", k, layout)
    bv, sv, hv, dv = _dims("v", v, layout)
    require(k.dtype == q.dtype and v.dtype == q.dtype,
            f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    require(bk == bq and bv == bq, f"q, k and v must have one batch size, got {bq}, {bk}, {bv}")
    require(sv == sk, f"k and v must have one sequence length (tokens), got {sk} and {sv}")
    require(hv == hk, f"k and v must have one head count, got {hk} and {hv}")
    require(hk > 0 and hq % hk == 0,
            f"q's head count ({hq}) must be a positive multiple of k/v's ({hk}) (MHA, GQA, MQA)")
    require(dk_ == dqk, f"k's head dim ({dk_}) must equal q's ({dqk})")
    require(dqk > 0 and dv > 0, f"head dims must be > 0, got d_qk={dqk}, d_v={dv}")
    return bq, sq, sk, hq, hk, dqk, dv


def _host_ints(name: str, t, length: int) -> list[int]:
    check_tensor(name, t, ndim=1, dtypes=_INT32)
    check_shape(name, t, (length,), "one entry per sequence (cu_seqlens: one more)")
    return [int(x) for x in t.tolist()]


def _check_cu(name: str, t, batch_plus_1: int, total: int, *, exact_total: bool) -> list[int]:
    cu = _host_ints(name, t, batch_plus_1)
    require(cu[0] == 0, f"{name} must start at 0, got {cu[0]}")
    require(all(a <= b for a, b in zip(cu, cu[1:])),
            f"{name} must be non-decreasing (monotone), got {cu}")
    if exact_total:
        require(cu[-1] == total, f"{name} must end at the token count {total}, got {cu[-1]}")
    else:
        require(cu[-1] <= total, f"{name} must end at most at the token count {total}, "
                                 f"got {cu[-1]}")
    return cu


def _check_thd(cu_q, cu_kv, cu_q_pad, cu_kv_pad, tq, tk):
    require(cu_q is not None and cu_kv is not None,
            "layout 'thd' needs cu_seqlens_q and cu_seqlens_kv (int32, batch + 1 entries)")
    check_tensor("cu_seqlens_q", cu_q, ndim=1, dtypes=_INT32)
    n = cu_q.shape[0]
    require(n >= 2, f"cu_seqlens_q must have at least 2 entries (one sequence), got {n}")
    for side, cu, cu_pad, total in (("q", cu_q, cu_q_pad, tq), ("kv", cu_kv, cu_kv_pad, tk)):
        padded = cu_pad is not None
        lens = _check_cu(f"cu_seqlens_{side}", cu, n, total, exact_total=not padded)
        if padded:
            offs = _check_cu(f"cu_seqlens_{side}_padded", cu_pad, n, total, exact_total=False)
            for i in range(n - 1):
                require(lens[i + 1] - lens[i] <= offs[i + 1] - offs[i],
                        f"sequence {i} has {lens[i + 1] - lens[i]} tokens (cu_seqlens_{side}) "
                        f"but its slot in cu_seqlens_{side}_padded holds "
                        f"{offs[i + 1] - offs[i]}")
    return n - 1


def _check_seqlens(seqlens_q, seqlens_kv, b, sq, sk):
    require(seqlens_q is not None and seqlens_kv is not None,
            "padding masks with layout bshd/sbhd need seqlens_q and seqlens_kv (int32, (b,))")
    for name, t, s in (("seqlens_q", seqlens_q, sq), ("seqlens_kv", seqlens_kv, sk)):
        vals = _host_ints(name, t, b)
        require(all(0 <= x <= s for x in vals),
                f"{name} entries must lie in [0, {s}] (the padded length), got {vals}")


def _check_window(window, mask: str) -> tuple[int, int]:
    require(isinstance(window, (tuple, list)) and len(window) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window),
            f"window must be a pair of ints (left, right), got {window!r}")
    left, right = window
    require(left >= -1 and right >= -1, f"window sizes must be >= -1 (-1: unbounded), got "
                                        f"{tuple(window)}")
    if "causal" in mask:
        require(right in (-1, 0), f"a causal mask ({mask!r}) needs window right in (-1, 0), "
                                  f"got {right}")
        right = 0
    return left, right


def _check_bias(bias, alibi_slopes, layout, b, hq, sq, sk, dtype):
    require(bias is None or alibi_slopes is None, "give bias or alibi_slopes, not both")
    if bias is not None:
        require(layout != "thd", "bias is not supported with layout 'thd' (TE's rule)")
        check_tensor("bias", bias, ndim=4, dtypes=(dtype, torch.float32))
        bb, bh, bsq, bsk = bias.shape
        require(bb in (1, b) and bh in (1, hq) and (bsq, bsk) == (sq, sk),
                f"bias must have shape (1|{b}, 1|{hq}, {sq}, {sk}), got {tuple(bias.shape)}")
    if alibi_slopes is not None:
        check_tensor("alibi_slopes", alibi_slopes, dtypes=_F32)
        require(tuple(alibi_slopes.shape) in ((hq,), (b, hq)),
                f"alibi_slopes must have shape ({hq},) or ({b}, {hq}), got "
                f"{tuple(alibi_slopes.shape)}")


def _check_recipe(recipe, dtype) -> None:
    """FP8 attention takes a per-tensor FP8 current-scaling recipe (scale from each tensor's
    amax), for 16-bit or fp32 q / k / v."""
    if recipe is None:
        return
    require(isinstance(recipe, R.RECIPES) and recipe.family is R.Family.FP8
            and recipe.scale_granularity is R.Granularity.TENSOR and not recipe.scale_given,
            f"recipe must be a per-tensor FP8 current-scaling recipe (e.g. "
            f"Float8CurrentScaling()), got {recipe!r}")
    require(dtype in (torch.float16, torch.bfloat16, torch.float32),
            f"FP8 attention quantizes fp16 / bf16 / fp32 q, k, v, got {dtype}")


def make_config(q, k, v, *, layout, mask, window, softmax_scale, bias, alibi_slopes,
                seqlens_q, seqlens_kv, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                cu_seqlens_kv_padded, recipe=None) -> tuple[AttentionConfig, dict]:
    """Validate the arguments; return the config and the dispatch params."""
    check_choice("layout", layout, QKV_LAYOUTS)
    check_choice("mask", mask, MASKS)
    b, sq, sk, hq, hk, dqk, dv = _check_heads(q, k, v, layout)
    if layout == "thd":
        require(mask in PADDING_MASKS, f"layout 'thd' needs a padding mask {PADDING_MASKS}, "
                                       f"got {mask!r} (TE's rule)")
        require(seqlens_q is None and seqlens_kv is None,
                "layout 'thd' takes cu_seqlens_*, not seqlens_*")
        b = _check_thd(cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                       sq, sk)
    else:
        require(all(t is None for t in (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                        cu_seqlens_kv_padded)),
                f"cu_seqlens_* are for layout 'thd'; layout {layout!r} takes seqlens_*")
        if mask in PADDING_MASKS:
            _check_seqlens(seqlens_q, seqlens_kv, b, sq, sk)
        else:
            require(seqlens_q is None and seqlens_kv is None,
                    f"seqlens_* need a padding mask {PADDING_MASKS}, got mask {mask!r}")
    window = _check_window(window, mask)
    _check_bias(bias, alibi_slopes, layout, b, hq, sq, sk, q.dtype)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(dqk)
    softmax_scale = check_finite_number("softmax_scale", softmax_scale, positive=True)
    device = check_same_device(q=q, k=k, v=v, bias=bias, alibi_slopes=alibi_slopes,
                               seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                               cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                               cu_seqlens_q_padded=cu_seqlens_q_padded,
                               cu_seqlens_kv_padded=cu_seqlens_kv_padded)
    _check_recipe(recipe, q.dtype)
    config = AttentionConfig(
        layout=layout, mask=mask, softmax_scale=softmax_scale, window=window, bias=bias,
        alibi_slopes=alibi_slopes, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        recipe=recipe)
    params = dict(dtype=q.dtype, layout=layout, mask=mask, window=window, batch=b,
                  seqlen_q=sq, seqlen_kv=sk, heads_q=hq, heads_kv=hk, head_dim_qk=dqk,
                  head_dim_v=dv, bias=bias is not None, alibi=alibi_slopes is not None,
                  thd_padded=cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None,
                  device=registry.device_kind(device), recipe=recipe)
    return config, params


def _lse_shape(q: torch.Tensor, layout: str) -> tuple[int, ...]:
    if layout == "thd":
        return (q.shape[1], q.shape[0])
    b, s = (q.shape[0], q.shape[1]) if layout == "bshd" else (q.shape[1], q.shape[0])
    return (b, q.shape[2], s)


def attention_fwd(q, k, v, *, layout: str = "bshd", mask: str = "none",
                  window: tuple[int, int] = (-1, -1), softmax_scale: float | None = None,
                  bias=None, alibi_slopes=None, seqlens_q=None, seqlens_kv=None,
                  cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                  cu_seqlens_kv_padded=None, recipe=None,
                  backend: str | None = None) -> AttentionFwd:
    """out, lse of softmax(scale * q k^T + bias) v under ``mask`` / ``window``; with an FP8
    ``recipe`` (per-tensor current scaling), of q, k, v quantized with it."""
    check_tensor("q", q)
    config, params = make_config(
        q, k, v, layout=layout, mask=mask, window=window, softmax_scale=softmax_scale,
        bias=bias, alibi_slopes=alibi_slopes, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        recipe=recipe)
    op = Op.ATTENTION_FWD if recipe is None else Op.ATTENTION_FWD_FP8
    impl = registry.dispatch(op, params, backend)
    return AttentionFwd(*impl.fn(q, k, v, config))


def attention_bwd(dout, q, k, v, out, lse, *, layout: str = "bshd", mask: str = "none",
                  window: tuple[int, int] = (-1, -1), softmax_scale: float | None = None,
                  bias=None, alibi_slopes=None, seqlens_q=None, seqlens_kv=None,
                  cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                  cu_seqlens_kv_padded=None, recipe=None,
                  backend: str | None = None) -> AttentionBwd:
    """dq, dk, dv of attention_fwd given dout and the forward's out and lse; with an FP8
    ``recipe`` (the forward's), of q, k, v and dout quantized with it (out, lse as given)."""
    check_tensor("q", q)
    config, params = make_config(
        q, k, v, layout=layout, mask=mask, window=window, softmax_scale=softmax_scale,
        bias=bias, alibi_slopes=alibi_slopes, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
        recipe=recipe)
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    for name, t in (("dout", dout), ("out", out)):
        check_tensor(name, t, dtypes=(q.dtype,))
        check_shape(name, t, out_shape, "q's shape with v's head dim")
    check_tensor("lse", lse, dtypes=_F32)
    check_shape("lse", lse, _lse_shape(q, layout), "float32 (b, h_q, s_q), or (h_q, t_q) "
                                                   "for thd")
    check_same_device(q=q, dout=dout, out=out, lse=lse)
    op = Op.ATTENTION_BWD if recipe is None else Op.ATTENTION_BWD_FP8
    impl = registry.dispatch(op, params, backend)
    return AttentionBwd(*impl.fn(dout, q, k, v, out, lse, config))


__all__ = ["attention_fwd", "attention_bwd", "AttentionFwd", "AttentionBwd"]
