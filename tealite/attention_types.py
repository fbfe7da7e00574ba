"""The dot-product attention contract every backend implements (bottom floor: plain data).

The front-end (tealite/ops/attention.py) validates the caller's arguments and hands each
backend the tensors plus one :class:`AttentionConfig`; the harness's reference and tiers read
the same config.  The semantics, once:

Layouts (``QKV_LAYOUTS``), with Q/K head dim ``d_qk`` and V head dim ``d_v`` (MLA: 192/128):

* ``bshd``: q (b, s_q, h_q, d_qk), k (b, s_kv, h_kv, d_qk), v (b, s_kv, h_kv, d_v);
* ``sbhd``: the same with the first two dims swapped;
* ``thd``: sequences packed along dim 0: q (t_q, h_q, d_qk), k (t_kv, h_kv, d_qk),
  v (t_kv, h_kv, d_v).  Sequence ``i`` of q occupies rows ``[offset_q[i], offset_q[i] +
  len_q[i])`` where ``len_q = diff(cu_seqlens_q)`` and ``offset_q = cu_seqlens_q_padded``
  when given (TE's padded thd: gaps between sequences), else ``cu_seqlens_q``.  Rows in no
  sequence (the gaps) are outside attention: their outputs and gradients are 0.

Heads: ``h_q`` is a multiple of ``h_kv`` (MHA: equal; GQA; MQA: ``h_kv == 1``); query head
``h`` reads K/V head ``h // (h_q // h_kv)``.  dK and dV sum over the query heads of a group.

Scores, for query row ``i`` and key ``j`` of the same sequence, with actual lengths
``sq_b, skv_b`` (``seqlens_*`` for padded bshd/sbhd, the cu_seqlens differences for thd,
the full dims otherwise):

    s[i, j] = softmax_scale * <q_i, k_j> + bias[i, j]
    bias = the given post-scale ``bias`` tensor (broadcast over b and h), or ALiBi
           -slope_h * |i + (skv_b - sq_b) - j|  (FlashAttention's form), or 0.
    P = softmax_j(s) over the visible keys; out_i = sum_j P[i, j] v_j;
    lse_i = log sum_j exp(s[i, j])  (natural log, of the scaled and biased scores).

Visibility of key ``j`` to query ``i`` (``MASKS``): ``j < skv_b`` and ``i < sq_b`` always
(padding); the causal masks add ``j <= i + off`` where ``off = 0`` for the top-left masks
(``causal``, ``padding_causal``) and ``off = skv_b - sq_b`` for the bottom-right ones
(``causal_bottom_right``, ``padding_causal_bottom_right``).  A sliding ``window = (left,
right)`` (-1: unbounded) adds ``i + off - left <= j <= i + off + right`` with the same
``off`` (bottom-right, as FlashAttention and TE document it, for the non-causal masks).
Causal masks force ``right = 0``.  A ``-inf`` in ``bias`` hides that key too.

A query row that sees no key (fully masked, padding, window past the keys, all-``-inf``
bias) has ``out = 0`` and ``lse = -inf`` (the logsumexp of an empty set), and its dQ row is
0; keys no query sees get dK = dV = 0.

FP8 (``recipe``): q, k and v are each quantized with the recipe (a per-tensor FP8
current-scaling recipe, TE's rule: scale = fmax / amax, codes = RNE(x * scale)) and the
attention above is computed on their dequantized values (codes * scale_inv); a backend may
round more on the way (P quantized too: its declared numerics say so).  The backward with a
recipe quantizes dout the same way too (q, k, v, dout each as a whole) and returns the
gradients below of the dequantized values; ``out`` and ``lse`` are taken as given (out in
q's dtype, not quantized), and a backend may round P and dS to FP8 on the way (declared).

Outputs: ``out`` in q's layout with d_v and q's dtype; ``lse`` float32 of shape
(b, h_q, s_q) for bshd/sbhd and (h_q, t_q) for thd.  Backward takes dout (out's shape and
dtype), q, k, v, out and lse, and returns dq, dk, dv in their inputs' shapes and dtype:
    dP = dout v^T,  D_i = sum(dout_i * out_i),  dS = P * (dP - D),
    dq = scale * dS k,  dk = scale * dS^T q,  dv = P^T dout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:  # the annotation only: the recipe object is the caller's
    from tealite.recipes import Recipe

QKV_LAYOUTS = ("bshd", "sbhd", "thd")
# TE's attn_mask_type names (its "no_mask" is "none" here).
MASKS = ("none", "causal", "causal_bottom_right", "padding", "padding_causal",
         "padding_causal_bottom_right")
PADDING_MASKS = ("padding", "padding_causal", "padding_causal_bottom_right")
CAUSAL_MASKS = ("causal", "causal_bottom_right", "padding_causal",
                "padding_causal_bottom_right")
BOTTOM_RIGHT_MASKS = ("causal_bottom_right", "padding_causal_bottom_right")


class AttentionFwd(NamedTuple):
    out: torch.Tensor
    lse: torch.Tensor


class AttentionBwd(NamedTuple):
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


@dataclass(frozen=True)
class AttentionConfig:
    """Everything but q, k, v (and the backward's dout, out, lse) that defines a case.

    Built and validated by tealite/ops/attention.py; ``window`` is normalized there (causal
    masks have ``right == 0``).  The int32 tensors are on the inputs' device.
    """

    layout: str
    mask: str
    softmax_scale: float
    window: tuple[int, int] = (-1, -1)
    bias: torch.Tensor | None = None            # (1|b, 1|h_q, s_q, s_kv), bshd/sbhd only
    alibi_slopes: torch.Tensor | None = None    # float32 (h_q,) or (b, h_q)
    seqlens_q: torch.Tensor | None = None       # int32 (b,): padded bshd/sbhd
    seqlens_kv: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None    # int32 (b + 1,): thd
    cu_seqlens_kv: torch.Tensor | None = None
    cu_seqlens_q_padded: torch.Tensor | None = None  # int32 (b + 1,): padded thd offsets
    cu_seqlens_kv_padded: torch.Tensor | None = None
    recipe: "Recipe | None" = None              # FP8 attention: q, k, v (, dout) quantized

    @property
    def causal(self) -> bool:
        return self.mask in CAUSAL_MASKS

    @property
    def bottom_right(self) -> bool:
        """Whether the diagonal (causal and window) is aligned at the bottom-right corner:
        the bottom-right masks and every non-causal mask (a window then uses it)."""
        return self.mask in BOTTOM_RIGHT_MASKS or not self.causal

    @property
    def padded(self) -> bool:
        return self.mask in PADDING_MASKS


def diagonal_offset(config: AttentionConfig, len_q: int, len_kv: int) -> int:
    """``off`` of the visibility rule for one sequence of the given actual lengths."""
    return len_kv - len_q if config.bottom_right else 0
