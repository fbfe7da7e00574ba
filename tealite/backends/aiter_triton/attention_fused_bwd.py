"""``tealite.attention_bwd`` on AITER's *fused* Triton backward, ``flash_attn_fused_backward``
(``aiter/ops/triton/mha_fused_bwd.py``), the kernel AITER's autograd Functions call after
``mha_set_use_fused_bwd_kernel(True)``: a second, selectable backward of the ``aiter_triton``
attention (:mod:`tealite.backends.aiter_triton.attention` drives it; the default stays
``flash_attn_onekernel_backward``).

Selection: :data:`BWD_KERNEL` (a :class:`~tealite.scoped.Scoped` ``BwdChoice``; tests write
``BWD_KERNEL.override(kernel=BwdKernel.FUSED)``), outside an override the environment
variable ``TEALITE_AITER_ATTENTION_BWD`` (``onekernel`` | ``fused``), read on every call so
that a fuzz worker or the CLI reaches it.  The numerics declared for a case follow the
selected kernel (its ``entry_point``).

What the kernels do (amd-aiter 0.1.7.post2, read in ``_triton_kernels/mha_fused_bwd.py``):

* a preprocess kernel writes delta = rowsum(o * do) in fp32; one dK/dV/dQ kernel then tiles
  the keys (BLOCK_N 128, or 64 for fp32 inputs and head dims > 160; BLOCK_M 16) and loops over
  the query blocks, recomputing P^T = exp(scale * k q^T - lse) (``tl.math.exp``, not the
  one-kernel path's exp2), dV += P^T do, dS^T = P^T (v do^T - delta), dK += dS^T q, and adds
  each query block's dQ partial ``scale * dS k`` into dq with a relaxed ``tl.atomic_add``;
* causal: bottom-right aligned (``offs_m - (len_q - len_kv) >= offs_n``), per sequence in
  varlen: the contract's for the masks the forward accepts;
* GQA / MQA: query head h reads K/V head ``h // (h_q / h_kv)``.  Non-causal, one program per
  K/V head loops over its group and stores dK / dV once; causal, one program per *query*
  head atomically adds its dK / dV partial into the K/V head's;
* head dims: any, the kernels mask up to the next power of 2 (>= 16).  d_qk != d_v is not
  supported (it raises for d_qk > d_v, "PE"; for d_qk < d_v it would use d_qk for v too);
* refused, a divergence: ALiBi.  The wrapper takes ``alibi_slopes`` and never passes it to
  a kernel: the gradients would be those of attention without the bias;
* refused, a bug: causal with h_q a multiple of 29.  The causal kernel spreads heads with
  ``(h * 29) % h_q``, no permutation then (h_q = 29: every program computes head 0);
* bias raises ("not supported yet"), dropout is not driven (p = 0), windows and padded
  layouts are refused as for the forward, empty rows as for the forward (lse = 0);
* AITER's autograd allocates dq in q's dtype (every atomic add would round again) and, for
  the causal kernel's atomic dK / dV, ``empty_like`` buffers.  The adapter hands zeroed fp32
  buffers and rounds each gradient once to the input dtype (as for the FP8 path).

FP8 (``recipe``, op ``attention_bwd_fp8``, contract ``flash_attn_fused_backward[fp8]``): the
same call with float8 dout / q / k / v and (b, h) descales, quantized by the adapter as for
the one-kernel FP8 backward (attention.py).  The kernel re-quantizes P^T and dS^T per
(BLOCK_N x BLOCK_M) block with AITER's shared ``_compute_fp8_scaling_factors`` (FP8_MAX /
max(|block|, 1e-9)) before the dV / dK / dQ products (dQ's from the same dS^T codes as dK's)
and descales after; delta = rowsum(o * do * descale_do): declared as the one-kernel FP8
backward.  Refused under the interpreter (its fp32 -> fp8 cast) and, not measured, compiled
on NVIDIA: its dV and dK FP8 dots reduce over BLOCK_M = 16 query rows, and an FP8 dot with
K < 32 is what failed to compile on an H100 for the one-kernel backward.

Numerics (declared as for the one-kernel backward): fp32 scores and delta, P and dS rounded
to the input dtype before the dV / dK / dQ products, fp32 accumulation.  The order of the
atomic fp32 sums (dQ over key blocks; causal GQA dK / dV over the group) is not fixed on a
GPU (sequential in the interpreter): the attention tier's reduction bound (gamma_n, any
order) holds for every order, so nothing more is declared.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import NAME, kernels, why_missing
from tealite.errors import TealiteArgumentError
from tealite.scoped import Scoped
from tealite.types import Op

FUSED_BWD = "flash_attn_fused_backward"
FUSED_BWD_FP8 = f"{FUSED_BWD}[fp8]"  # its own contract, as the one-kernel FP8 backward's
ENV_BWD = "TEALITE_AITER_ATTENTION_BWD"
_HEAD_SPREAD = 29  # the causal kernel's (h * 29) % h_q


class BwdKernel(enum.Enum):
    ONEKERNEL = "onekernel"  # flash_attn_onekernel_backward (AITER's default)
    FUSED = "fused"          # flash_attn_fused_backward


@dataclass(frozen=True)
class BwdChoice:
    """Which AITER backward kernel ``attention_bwd`` calls."""

    kernel: BwdKernel = BwdKernel.ONEKERNEL


def _from_env() -> BwdChoice:
    raw = os.environ.get(ENV_BWD, BwdKernel.ONEKERNEL.value)
    try:
        return BwdChoice(BwdKernel(raw))
    except ValueError:
        raise TealiteArgumentError(
            f"{ENV_BWD} must be one of {[k.value for k in BwdKernel]}, got {raw!r}") from None


# detect() runs on every read outside an override: the environment is read at call time.
BWD_KERNEL: Scoped[BwdChoice] = Scoped("aiter_triton.attention.BWD_KERNEL", _from_env)


def fused_selected() -> bool:
    return BWD_KERNEL.get().kernel is BwdKernel.FUSED


declare(Contract(backend=NAME, entry_point=FUSED_BWD, op=Op.ATTENTION_BWD,
                 layouts=("q/k/v:bshd|thd (strided)", "lse:(b,h,s)|(t,h) fp32",
                          "dq/dk/dv:fp32 zeroed (atomic adds)"),
                 notes="P recomputed from lse (exp); P and dS rounded to the input dtype; dQ "
                       "(and causal GQA dK/dV) summed by fp32 atomics, order not fixed",
                 extra={"causal": "bottom-right (FlashAttention-2)",
                        "alibi": "ignored by the wrapper: refused",
                        "empty_row": "lse 0 from the forward: refused",
                        "window": "unsupported", "bias": "unsupported (raises)",
                        "head_dim": "any (masked to a power of 2 >= 16); d_qk == d_v only",
                        "heads": "causal: h_q not a multiple of 29 (head remap bug)",
                        "select": f"{ENV_BWD}=fused"}))


declare(Contract(backend=NAME, entry_point=FUSED_BWD_FP8, op=Op.ATTENTION_BWD_FP8,
                 family="fp8-current", fp8="arch", scale_rule="fmax/amax",
                 element_rounding="rne", saturation="saturate",
                 layouts=("do/q/k/v:fp8 bshd|thd", "descale_q/do:(b,h_q)", "descale_k/v:(b,h_kv)",
                          "o:q's dtype", "dq/dk/dv:fp32 zeroed (atomic adds)"),
                 notes="dout/q/k/v quantized per tensor by the adapter (torch, the recipe's "
                       "rule); P^T and dS^T re-quantized per block in-kernel (dynamic scale "
                       "FP8_MAX/max(|block|, 1e-9)), descaled after each product; dQ summed "
                       "by fp32 atomics, order not fixed",
                 extra={"p": "fp8, dynamic per-block scale", "ds": "fp8, dynamic per-block scale",
                        "alibi": "ignored by the wrapper: refused",
                        "head_dim": "d_qk == d_v only", "select": f"{ENV_BWD}=fused"}))


def _fp8_reason(nvidia: bool) -> str | None:
    if nvidia:
        return ("AITER's fused FP8 attention backward is not run on NVIDIA: its dV / dK FP8 "
                "dots reduce over BLOCK_M = 16 rows, and FP8 dots with K < 32 did not "
                "compile on an H100 (the one-kernel backward's)")
    return None


def reason(p, *, nvidia: bool = False) -> str | None:
    """Why the fused backward cannot take a case the one-kernel checks let through
    (``nvidia``: compiled for an NVIDIA GPU)."""
    if p.get("recipe") is not None and _fp8_reason(nvidia):
        return _fp8_reason(nvidia)
    if p["alibi"]:
        return ("AITER 0.1.7's flash_attn_fused_backward takes alibi_slopes but never passes "
                "them to its kernels: the gradients would ignore the ALiBi bias")
    if p["head_dim_qk"] != p["head_dim_v"]:
        return (f"AITER's fused attention backward needs d_qk == d_v (it raises for PE, "
                f"d_qk > d_v, and reads v with d_qk otherwise; got "
                f"{p['head_dim_qk']}/{p['head_dim_v']})")
    if nvidia and (min(p["head_dim_qk"], p["head_dim_v"]) + 7) // 8 * 8 < 16:  # padded to 8
        # Measured on an H100 (triton 3.6, 2026-11-27, docs/device-runs.md): a causal
        # batch-2 fp32 case with d = 8 (padded by the adapter to 8, by the kernel to a 16-wide
        # block) gave dV 581x too large at one key (the interpreter is right; d = 16 / 32 of
        # the same case are right).  The one-kernel backward does not compile below 16 there.
        return (f"AITER's fused attention backward gave wrong dV on an H100 for a head dim "
                f"padded to 8 (d_qk/d_v {p['head_dim_qk']}/{p['head_dim_v']}; measured, "
                f"docs/device-runs.md): head dims below 16 are refused on NVIDIA")
    if "causal" in p["mask"] and p["heads_q"] % _HEAD_SPREAD == 0:
        return (f"AITER 0.1.7 bug: the fused causal backward maps program heads with "
                f"(h * 29) % h_q, no permutation when h_q is a multiple of 29 (got "
                f"{p['heads_q']}): some heads are never computed")
    return why_missing(FUSED_BWD)


def run(do, q, k, v, o, lse, *, scale: float, causal: bool, cu_q, cu_k, max_q: int,
        max_k: int, **descales) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in fp32 of AITER's fused backward on bshd / thd tensors (head dims
    already padded) and AITER's lse layout; ``descales``: FP8's descale_q / _k / _v / _do."""
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device)
                  for t in (q, k, v))
    kernels().functions[FUSED_BWD](
        do, q, k, v, o, lse, dq, dk, dv, None, scale, None, causal, cu_q, cu_k,
        max_seqlen_q=max_q, max_seqlen_k=max_k, dropout_p=0.0, USE_INT64_STRIDES=True,
        **descales)
    return dq, dk, dv
