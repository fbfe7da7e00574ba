"""The bottom floor of tealite: what the op front-ends, the registry and the backends share.

Nothing here imports a front-end, the registry or a backend, so every layer may import it
(tests/test_architecture.py holds the layer order).  It holds plain data and pure functions:

* :class:`Op`: the name of every op, one constant each (front-ends dispatch with them, backends
  register with them, the harness's specs are named by them);
* :class:`QuantizedTensor`: what ``quantize`` returns and ``dequantize`` / ``qgemm`` take;
* the activation kinds (:data:`POINTWISE`, :data:`GATED`, :data:`ACTIVATION_KINDS`);
* the softmax kinds (:data:`SOFTMAX_KINDS`, :data:`SOFTMAX_MASK_FILL`, :func:`softmax_visible`);
* the GEMM layouts (:data:`LAYOUTS`, :func:`gemm_dims`);
* RoPE's tensor formats (:class:`TensorFormat`) and token positions (:func:`rope_positions`);
* AITER's pre-shuffled layouts as pure tensor permutations (:func:`weight_tile`,
  :func:`padded_scale_shape`, :func:`permute_weight_tiles`, :func:`permute_e8m0_scales`):
  the torch backend registers them as ``shuffle_weight`` / ``shuffle_e8m0`` and the AITER
  backends call them to lay out operands.  tealite/ops/layouts.py defines the layouts and
  validates their arguments.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Op(str, enum.Enum):
    """Every op a backend can implement.  A ``str`` enum: a member equals, hashes and formats
    as its plain name, so stored JSON, CLI arguments and plug-ins passing strings keep
    working, while a misspelled constant in our own code is an AttributeError at import."""

    GEMM = "gemm"
    QGEMM = "qgemm"
    LAYERNORM_FWD = "layernorm_fwd"
    LAYERNORM_BWD = "layernorm_bwd"
    RMSNORM_FWD = "rmsnorm_fwd"
    RMSNORM_BWD = "rmsnorm_bwd"
    ACT_FWD = "act_fwd"
    ACT_BWD = "act_bwd"
    DBIAS_DACT = "dbias_dact"
    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    AMAX = "amax"
    DELAYED_SCALING_UPDATE = "delayed_scaling_update"
    LAYERNORM_FWD_QUANTIZE = "layernorm_fwd_quantize"
    RMSNORM_FWD_QUANTIZE = "rmsnorm_fwd_quantize"
    ACT_FWD_QUANTIZE = "act_fwd_quantize"
    SHUFFLE_WEIGHT = "shuffle_weight"
    SHUFFLE_E8M0 = "shuffle_e8m0"
    SOFTMAX_FWD = "softmax_fwd"
    SOFTMAX_BWD = "softmax_bwd"
    ATTENTION_FWD = "attention_fwd"
    ATTENTION_BWD = "attention_bwd"
    # FP8 attention (a recipe given): its own op, so a backend takes part only by implementing
    # it; one that implements plain attention never sees a recipe it would ignore.
    ATTENTION_FWD_FP8 = "attention_fwd_fp8"
    ATTENTION_BWD_FP8 = "attention_bwd_fp8"
    ROPE_FWD = "rope_fwd"
    ROPE_BWD = "rope_bwd"
    # MoE (contract: tealite/moe_types.py).
    GROUPED_GEMM = "grouped_gemm"
    GROUPED_QGEMM = "grouped_qgemm"
    GROUPED_QUANTIZE = "grouped_quantize"
    ROUTER_FWD = "router_fwd"
    ROUTER_BWD = "router_bwd"
    ROUTER_AUX_SCORES_FWD = "router_aux_scores_fwd"
    ROUTER_AUX_SCORES_BWD = "router_aux_scores_bwd"
    MOE_AUX_LOSS_FWD = "moe_aux_loss_fwd"
    MOE_AUX_LOSS_BWD = "moe_aux_loss_bwd"
    MOE_PERMUTE = "moe_permute"
    MOE_UNPERMUTE = "moe_unpermute"
    MOE_UNPERMUTE_BWD = "moe_unpermute_bwd"
    MOE_SORT_CHUNKS = "moe_sort_chunks"
    MOE_PAD_ROWS = "moe_pad_rows"
    MOE_UNPAD_ROWS = "moe_unpad_rows"
    # Training utilities (issue 17; shared types: tealite/training_types.py).
    MULTI_TENSOR_SCALE = "multi_tensor_scale"
    MULTI_TENSOR_L2NORM = "multi_tensor_l2norm"
    MULTI_TENSOR_UNSCALE_L2NORM = "multi_tensor_unscale_l2norm"
    MULTI_TENSOR_ADAM = "multi_tensor_adam"
    MULTI_TENSOR_SGD = "multi_tensor_sgd"
    MULTI_TENSOR_COMPUTE_SCALE = "multi_tensor_compute_scale"
    DELAYED_SCALING_UPDATE_BULK = "delayed_scaling_update_bulk"
    DROPOUT_FWD = "dropout_fwd"
    DROPOUT_BWD = "dropout_bwd"
    TRANSPOSE = "transpose"
    # x (+ residual) -> RMSNorm, the output's hidden dim zero-padded (AITER's
    # fused_add_rmsnorm_pad; semantics in tealite/ops/norms.py).
    ADD_RMSNORM_PAD = "add_rmsnorm_pad"
    # The expert FFN forward with the routing folded in (fc1 -> gated act -> fc2 -> weighted
    # sum of a token's k rows): the op AITER's fused MoE kernels implement.
    MOE_FFN_FWD = "moe_ffn_fwd"

    # str() and f-strings give the plain name (Python 3.11 would give "Op.GEMM"): messages,
    # reasons and stored reports read as they did when ops were strings.
    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__

    @classmethod
    def named(cls, op: object, *, argument: str = "op") -> "Op":
        """``op`` (a member or its plain name) as a member; ValueError naming the valid ones."""
        try:
            return cls(op)
        except ValueError:
            raise ValueError(f"{argument} must be one of tealite's ops "
                             f"{sorted(o.value for o in cls)}, got {op!r}") from None


@dataclass
class QuantizedTensor:
    """Codes and scales of one quantization (field contents: tealite/ops/quantize.py)."""

    recipe: object
    shape: tuple
    data: torch.Tensor | None = None
    scale_inv: torch.Tensor | None = None
    columnwise_data: torch.Tensor | None = None
    columnwise_scale_inv: torch.Tensor | None = None
    amax: torch.Tensor | None = None


# Activation kinds (formulas: tealite/ops/activations.py).  A gated kind maps to the pointwise
# kind applied to the first half of its input.
POINTWISE = ("gelu", "gelu_tanh", "relu", "silu", "qgelu", "srelu")
GATED = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu", "qgeglu": "qgelu",
         "sreglu": "srelu"}
ACTIVATION_KINDS = POINTWISE + tuple(GATED)

class TensorFormat(str, enum.Enum):
    """How a RoPE input lays out sequence, batch, heads and head dim (TE's ``tensor_format``;
    semantics in tealite/ops/rope.py).  A ``str`` enum, as :class:`Op`: it equals and formats
    as its plain name."""

    SBHD = "sbhd"   # (s, b, h, d)
    BSHD = "bshd"   # (b, s, h, d)
    THD = "thd"     # (t, h, d): sequences packed along dim 0, bounded by cu_seqlens

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def rope_positions(local_lens, *, cp_size: int = 1, cp_rank: int = 0, starts=None,
                   device=None) -> torch.Tensor:
    """The RoPE position (int64) of every token, sequence after sequence (tealite/ops/rope.py):
    ``i + starts[b]`` without context parallelism, TE's two-chunk positions with it."""
    parts = []
    for b, n in enumerate(local_lens):
        i = torch.arange(n, dtype=torch.int64, device=device)
        if cp_size > 1:
            c = n // 2
            p = torch.where(i < c, i + cp_rank * c, (2 * cp_size - 1 - cp_rank) * c + i - c)
        else:
            p = i + (int(starts[b]) if starts is not None else 0)
        parts.append(p)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


# TE's fused softmax kinds (tealite/ops/softmax.py): plain, with a boolean mask, causal on a
# square (sq == sk) score matrix, and causal aligned to the bottom-right corner (sq != sk).
SOFTMAX_KINDS = ("scaled", "scaled_masked", "scaled_upper_triang", "scaled_aligned_causal")
# The value TE's scaled_masked / aligned-causal kernels write over a masked logit (after the
# scale, in fp32); the upper-triangular kernel writes -inf instead.
SOFTMAX_MASK_FILL = -10000.0

# TE's GEMM layouts (tealite/ops/gemm.py): first letter A transposed, second B transposed.
LAYOUTS = ("TN", "NN", "NT", "TT")


def gemm_dims(a_shape, b_shape, layout: str) -> tuple[int, int, int, int]:
    """Return (M, N, K_from_A, K_from_B) for stored shapes under ``layout``."""
    a_rows, a_cols = a_shape
    b_rows, b_cols = b_shape
    n, k_a = (a_rows, a_cols) if layout[0] == "T" else (a_cols, a_rows)
    m, k_b = (b_rows, b_cols) if layout[1] == "N" else (b_cols, b_rows)
    return m, n, k_a, k_b


def weight_tile(dtype: torch.dtype, layout=(16, 16)) -> tuple[int, int, int]:
    """(BN, BK, Kv) of the weight shuffle for ``dtype``."""
    in_, ik = layout
    elem = torch.empty((), dtype=dtype).element_size()
    return in_, 2 * ik, 16 // elem


def padded_scale_shape(m: int, s: int) -> tuple[int, int]:
    """The shape an (m, s) E8M0 scale tensor is padded to before shuffling."""
    return -(-m // 256) * 256, -(-s // 8) * 8


def permute_weight_tiles(w: torch.Tensor, layout, *, inverse: bool) -> torch.Tensor:
    """AITER's weight shuffle of a validated w (N, K), or its inverse."""
    bn, bk, kv = weight_tile(w.dtype, layout)
    n, k = w.shape
    plain = (n // bn, bn, k // bk, bk // kv, kv)
    tiled = (n // bn, k // bk, bk // kv, bn, kv)
    if inverse:
        return w.reshape(tiled).permute(0, 3, 1, 2, 4).contiguous().reshape(n, k)
    return w.reshape(plain).permute(0, 2, 3, 1, 4).contiguous().reshape(n, k)


def permute_e8m0_scales(scales: torch.Tensor, unshuffle_to=None) -> torch.Tensor:
    """AITER's E8M0 scale shuffle (zero padding), or with ``unshuffle_to=(m, s)`` its
    inverse."""
    if unshuffle_to is None:
        m, s = scales.shape
        sm, sn = padded_scale_shape(m, s)
        padded = torch.zeros(sm, sn, dtype=scales.dtype, device=scales.device)
        padded[:m, :s] = scales
        return padded.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1) \
            .contiguous().view(sm, sn)
    m, s = unshuffle_to
    sm, sn = scales.shape
    plain = scales.view(sm // 32, sn // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return plain.contiguous().view(sm, sn)[:m, :s].contiguous()


def softmax_visible(kind: str, sq: int, sk: int, device=None) -> torch.Tensor | None:
    """The (sq, sk) boolean matrix of the logits a causal softmax kind keeps (None for the
    others): key j is visible to query i when j <= i + (sk - sq), the bottom-right aligned
    diagonal (with sq == sk the upper-triangular kind's j <= i)."""
    if kind not in ("scaled_upper_triang", "scaled_aligned_causal"):
        return None
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j <= i + (sk - sq)
