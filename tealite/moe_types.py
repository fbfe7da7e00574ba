"""The mixture-of-experts contract every backend implements (bottom floor: plain data).

Issue 16 brings TE's MoE path: grouped GEMM, grouped quantization, the fused router and token
permutation.  The front-ends (tealite/ops/grouped_gemm.py, grouped_quantize.py, router.py,
permute.py) validate the caller's arguments; backends and the harness read the shared
definitions here.  The semantics, once:

Splits.  ``m_splits`` (a sequence of G non-negative Python ints, or a 1-D int tensor on the
host) cuts the *token* dimension into G consecutive groups, group ``g`` holding rows
``[offset[g], offset[g] + m_splits[g])`` with ``offset`` the exclusive prefix sum.  Zeros,
one group holding everything and many small groups are all legal; the sum must equal the
token count (:func:`check_splits`).

Grouped GEMM (TE's ``general_grouped_gemm`` / ``GroupedLinear``), TE's layout letters as in
tealite/ops/gemm.py (first letter: A transposed; A is the weight side, B the token side):

* ``TN`` (fprop) and ``NN`` (dgrad) split M: B holds the tokens (M_total, K) and group g's
  rows are multiplied by group g's weight A[g] (stored (N, K) for T, (K, N) for N); the output
  is (M_total, N), rows in B's order.  A "single weight" (one A for all groups) is legal.
* ``NT`` (wgrad) splits K: A (K_total, N) and B (K_total, M) hold the tokens, and group g
  contracts only its own K rows: out[g] = B[rows_g]^T A[rows_g], shape (G, M, N).  With
  ``accumulate=True`` the result is added into the caller's ``out`` (TE's fused wgrad
  accumulation, beta = 1); an empty group then leaves out[g] unchanged, and without it
  yields exact zeros.
* bias: one (N,) row per group, (G, N), added to that group's rows (split-M layouts only).

Parity (issue 16): the fused grouped path and the split per-group path (a loop of single
``gemm`` / ``qgemm`` / ``quantize`` calls) must agree bit for bit where a backend declares the
same accumulation order for both (``numerics.grouped_matches_split``), and within the GEMM
bound otherwise.

Router (TE's ``fused_topk_with_score_function``), see :class:`ScoreFunction`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from tealite._checks import require
from tealite.types import QuantizedTensor


class ScoreFunction(str, enum.Enum):
    """How router logits become expert scores (TE's ``score_function``)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def check_splits(name: str, splits, total: int, *, groups: int | None = None) -> tuple[int, ...]:
    """``splits`` as a tuple of ints after checking them: non-negative, summing to ``total``,
    and ``groups`` long when given.  A clear error names ``name`` and the broken constraint."""
    if isinstance(splits, torch.Tensor):
        require(splits.dim() == 1 and not splits.is_floating_point() and not splits.is_complex(),
                f"{name} must be a 1-D integer tensor or a sequence of ints, got a "
                f"{splits.dim()}-D {splits.dtype} tensor")
        splits = splits.tolist()
    require(isinstance(splits, Sequence) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in splits),
        f"{name} must be a sequence of ints, got {splits!r}")
    require(len(splits) > 0, f"{name} must name at least one group, got none")
    negative = next((i for i, s in enumerate(splits) if s < 0), None)
    require(negative is None, f"{name} must be non-negative, got {splits[negative or 0]} at "
                              f"index {negative}")
    require(sum(splits) == total, f"{name} must sum to the token count {total}, got "
                                  f"{sum(splits)} (splits {list(splits)})")
    if groups is not None:
        require(len(splits) == groups, f"{name} must have one entry per group ({groups}), got "
                                       f"{len(splits)}")
    return tuple(splits)


def split_offsets(splits: Sequence[int]) -> tuple[int, ...]:
    """The exclusive prefix sum of ``splits``, G + 1 long (offsets[g] is group g's first row)."""
    out = [0]
    for s in splits:
        out.append(out[-1] + s)
    return tuple(out)


# --- grouped GEMM (tealite/ops/grouped_gemm.py) -------------------------------------------

# The layouts a grouped GEMM takes (TE's grouped GEMM uses these three; TT has no MoE use).
GROUPED_LAYOUTS = ("TN", "NN", "NT")


def splits_k(layout: str) -> bool:
    """Whether ``layout`` splits the contraction dimension (NT, wgrad) rather than M."""
    return layout == "NT"


class ScaledOperand(NamedTuple):
    """One group's quantized operand as a grouped qgemm backend reads it: its codes and
    scales in the K-last orientation (tealite/ops/qgemm.py's ``k_last``), so that group g's
    product is ``B_g @ A_g^T`` whatever the layout."""

    codes: torch.Tensor
    scales: torch.Tensor | None


# ---- grouped quantization (tealite/ops/grouped_quantize.py) -------------------------------

@dataclass
class GroupedQuantized:
    """What ``grouped_quantize`` returns: one :class:`~tealite.types.QuantizedTensor` per group
    (group g's rows of x quantized exactly as ``quantize`` quantizes them alone), and with
    ``dbias=True`` the per-group column sums of x, (G, K) in x's dtype (None otherwise)."""

    tensors: tuple[QuantizedTensor, ...]
    dbias: torch.Tensor | None = None
