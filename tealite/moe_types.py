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

Token permutation (tealite/ops/permute.py): routing maps, the permuted order, dropped tokens
and the typed row-id map, in the section at the bottom.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
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


# --- router (tealite/ops/router.py) -----------------------------------------------------

class TieRule(str, enum.Enum):
    """Which expert a backend's top-k picks among equal scores (a backend declares it in its
    numerics as ``topk_ties``; undeclared means unspecified: any of the tied experts)."""

    LOWEST_INDEX = "lowest_index"   # among equal scores, the lowest expert index first

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


@dataclass(frozen=True)
class RouterConfig:
    """The router's options, validated by tealite/ops/router.py (TE's
    ``fused_topk_with_score_function`` arguments other than the tensors).

    ``num_groups`` / ``group_topk`` (both or neither): group-limited top-k, the experts cut
    into ``num_groups`` consecutive groups, a group's score the sum of its best
    ``topk // group_topk`` routing scores, the top-k taken over the best ``group_topk``
    groups' experts.  ``scaling_factor`` None means 1."""

    topk: int
    score_function: ScoreFunction = ScoreFunction.SOFTMAX
    use_pre_softmax: bool = False
    num_groups: int | None = None
    group_topk: int | None = None
    scaling_factor: float | None = None

    @property
    def grouped(self) -> bool:
        return self.group_topk is not None

    @property
    def per_group(self) -> int:
        """How many of a group's best scores make its group score."""
        return self.topk // self.group_topk if self.grouped else self.topk

    @property
    def scale(self) -> float:
        return 1.0 if self.scaling_factor is None else float(self.scaling_factor)

    @property
    def selects_on_logits(self) -> bool:
        """Softmax after the top-k: the selection reads the raw logits."""
        return self.score_function == ScoreFunction.SOFTMAX and not self.use_pre_softmax

    @property
    def normalises(self) -> bool:
        """Sigmoid with topk > 1: the chosen scores are divided by their sum (+ 1e-20)."""
        return self.score_function == ScoreFunction.SIGMOID and self.topk > 1


# TE's epsilon in the sigmoid normalisation ``s / (sum s + eps)``.
SIGMOID_NORM_EPS = 1e-20


# ---- Token permutation (tealite/ops/permute.py) ------------------------------------------
#
# Routing.  A token's experts are given as a ``mask`` (bool / int (num_tokens, E), nonzero =
# routed) or as ``index`` (int (num_tokens, topk) expert ids, in [0, E)).  Either way a token has
# *slots*: one per expert for a mask, one per top-k position for indices; merging probs are
# shaped like the slots ((num_tokens, E) or (num_tokens, topk)).
#
# Order.  The permuted tensor holds the routed (token, slot) pairs sorted by (expert, token,
# slot): expert 0's tokens in token order, then expert 1's, ...  With ``num_out_tokens`` smaller
# than the routed count, the first ``num_out_tokens`` rows of that order are kept and the rest
# dropped (TE's index-map rule: the highest experts' last tokens go first).  A token routed to
# nobody (an all-zero mask row) has no row.


class MapType(str, enum.Enum):
    """How the routing is given (TE's ``map_type``)."""

    MASK = "mask"
    INDEX = "index"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def kept_per_expert(counts: Sequence[int], num_out_tokens: int) -> tuple[int, ...]:
    """The kept rows per expert from the routed slots per expert: dropping takes the tail of
    the expert-major order, so expert e keeps what is left of ``num_out_tokens`` after the
    experts before it, at most its own count."""
    kept, before = [], 0
    for c in counts:
        kept.append(min(c, max(0, num_out_tokens - before)))
        before += c
    return tuple(kept)


@dataclass(frozen=True)
class HostCopy:
    """A device tensor's copy to the host, started now: on CUDA into pinned memory with an
    event after it, so that reading it waits only for the work queued before the copy, not
    for the kernels launched after it (a permute's scatters keep the device busy while the
    host waits on its map kernel's counts).  Elsewhere the tensor itself (a CPU tensor is
    host memory; the interpreter's kernels have run)."""

    host: torch.Tensor
    done: object | None  # torch.cuda.Event, or None where nothing is in flight

    @staticmethod
    def start(t: torch.Tensor) -> HostCopy:
        if not t.is_cuda:
            return HostCopy(t, None)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)  # on t's device's current stream, as its kernels
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(t.device))
        return HostCopy(host, done)

    def tolist(self) -> list:
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


@dataclass(frozen=True)
class PendingCounts:
    """A row-id map's kept rows per expert not read back yet: the routed slots per expert
    (an int tensor (E,) on the map's device, which a backend's kernels computed) and
    ``num_out_tokens``.  Reading them is a device sync, so a backend hands this to
    :class:`RowIdMap` and the read happens when ``tokens_per_expert`` is first asked for
    (never, for a caller that only moves rows).  ``index_bounds``: ``routed`` holds two more
    values, the indices' min and max, so that the front end's range check and the counts
    are one read (:meth:`RowIdMap.settle`).  ``copy``: their copy to the host, started by the
    backend right after the kernel that computed them (None: read ``routed`` itself)."""

    routed: torch.Tensor
    num_out_tokens: int
    index_bounds: bool = False
    copy: HostCopy | None = None

    def read_all(self) -> tuple[tuple[int, ...], tuple[int, int] | None]:
        """(kept per expert, the indices' (min, max) or None), in one read-back."""
        values = (self.routed if self.copy is None else self.copy).tolist()
        e = len(values) - 2 if self.index_bounds else len(values)
        bounds = (values[e], values[e + 1]) if self.index_bounds else None
        return kept_per_expert(values[:e], self.num_out_tokens), bounds

    def read(self) -> tuple[int, ...]:
        return self.read_all()[0]


def takes_unchecked_routing(fn):
    """Marks a backend's ``moe_permute`` that the front end may call before checking the
    routing's values: out-of-range indices get no row and move nothing, a ``num_out_tokens``
    above the routed count leaves rows unwritten (the front end raises either way before the
    result is returned), ``num_out_tokens=None`` for a mask means every routed slot (the
    backend reads the count where it must size the output), and the index map's
    :class:`PendingCounts` carry the indices' bounds; it takes ``prefetch_counts=True``
    (start the counts' :class:`HostCopy`: they are read right after the call).  The front
    end then checks from that one read after the backend's launches instead of syncing
    before them."""
    fn.takes_unchecked_routing = True
    return fn


@dataclass(frozen=True, init=False)
class RowIdMap:
    """Where every (token, slot) went in the permuted tensor: the contract between
    ``moe_permute`` and ``moe_unpermute`` / ``moe_unpermute_bwd``.

    ``rows``: int32 (num_tokens, slots); ``rows[t, s]`` is the permuted row of token ``t``'s slot
    ``s`` (slot = expert for a mask map, top-k position for an index map), or -1 where the slot
    is not routed (mask 0) or its row was dropped (beyond ``num_out_tokens``).  The kept rows are
    exactly ``0 .. num_out_tokens - 1``, each once.
    ``tokens_per_expert``: the kept rows per expert, in order (the grouped GEMM's m_splits), a
    tuple of ints.  A backend may construct the map with :class:`PendingCounts` instead: the
    tuple is then read back on first access, and kept.
    """

    rows: torch.Tensor
    map_type: MapType
    num_experts: int
    num_out_tokens: int
    # not compared or hashed: a first read replaces the pending counts by their tuple
    kept: tuple[int, ...] | PendingCounts = field(compare=False)

    def __init__(self, rows: torch.Tensor, map_type: MapType, num_experts: int,
                 num_out_tokens: int, tokens_per_expert: tuple[int, ...] | PendingCounts):
        for name, value in (("rows", rows), ("map_type", map_type),
                            ("num_experts", num_experts), ("num_out_tokens", num_out_tokens),
                            ("kept", tokens_per_expert)):
            object.__setattr__(self, name, value)

    @property
    def tokens_per_expert(self) -> tuple[int, ...]:
        self.settle()
        return self.kept

    def settle(self) -> tuple[int, int] | None:
        """Read pending counts now (one read-back, then kept) and return the index bounds
        they carried; None when they carried none or were read before."""
        if not isinstance(self.kept, PendingCounts):
            return None
        kept, bounds = self.kept.read_all()
        object.__setattr__(self, "kept", kept)
        return bounds

    @property
    def num_tokens(self) -> int:
        return self.rows.shape[0]

    @property
    def slots(self) -> int:
        return self.rows.shape[1]


def slot_experts(routing: torch.Tensor, map_type: MapType, num_experts: int) -> torch.Tensor:
    """int64 (num_tokens, slots): the expert of every slot, -1 where the slot is not routed."""
    if map_type == MapType.MASK:
        e = torch.arange(num_experts, device=routing.device).expand(routing.shape[0], -1)
        return torch.where(routing != 0, e, -1)
    return routing.to(torch.int64)


def make_row_id_map(routing: torch.Tensor, map_type: MapType, num_experts: int,
                    num_out_tokens: int) -> RowIdMap:
    """The row-id map of a validated routing (the order above), in torch integer ops on
    routing's device, then rows >= num_out_tokens dropped.  A mask: each expert's column
    cumsum ranks its tokens, after the experts before it (one pass over the mask, as TE's
    kernels do).  Indices: a stable sort of the token-major flattened slots by expert keeps
    (token, slot) order within an expert (n * topk keys; a one-hot would be n * topk * E)."""
    n = routing.shape[0]
    if map_type == MapType.MASK:
        routed = (routing != 0).to(torch.int64)
        counts = routed.sum(dim=0)
        before = torch.cumsum(counts, dim=0) - counts  # rows of the experts before e
        pos = before.unsqueeze(0) + torch.cumsum(routed, dim=0) - 1
        keep = (routed != 0) & (pos < num_out_tokens)
    else:
        flat = routing.reshape(-1).to(torch.int64)
        order = torch.sort(flat, stable=True).indices
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=order.device)
        pos = pos.reshape(routing.shape)
        keep = pos < num_out_tokens
    rows = torch.where(keep, pos, -1).to(torch.int32).reshape(n, routing.shape[1])
    experts = slot_experts(routing, map_type, num_experts)
    kept = torch.bincount(experts[keep], minlength=num_experts) if experts.numel() else \
        torch.zeros(num_experts, dtype=torch.int64)
    return RowIdMap(rows, map_type, num_experts, num_out_tokens,
                    tuple(int(c) for c in kept.tolist()))


def padded_splits(splits: Sequence[int], align: int) -> tuple[int, ...]:
    """Each split rounded up to a multiple of ``align`` (0 stays 0)."""
    return tuple(-(-s // align) * align for s in splits)


def pad_source_rows(splits: Sequence[int], align: int) -> list[int]:
    """For every row of the padded tensor, the source row it copies, -1 for a padding row."""
    src: list[int] = []
    for start, s, p in zip(split_offsets(splits), splits, padded_splits(splits, align)):
        src.extend(range(start, start + s))
        src.extend([-1] * (p - s))
    return src


def unpad_source_rows(splits: Sequence[int], align: int) -> list[int]:
    """For every row of the unpadded tensor, its row in the padded tensor."""
    src: list[int] = []
    for start, s in zip(split_offsets(padded_splits(splits, align)), splits):
        src.extend(range(start, start + s))
    return src


def chunk_source_rows(split_sizes: Sequence[int], sorted_index: Sequence[int]) -> list[int]:
    """For every output row of sort-chunks-by-index, its input row: the chunks in the order
    ``sorted_index`` names them."""
    offsets = split_offsets(split_sizes)
    src: list[int] = []
    for c in sorted_index:
        src.extend(range(offsets[c], offsets[c + 1]))
    return src


# ---- The expert FFN forward (tealite/ops/moe_ffn.py) ----------------------------------------

class MoEMerge(str, enum.Enum):
    """How a backend merges a token's k weighted expert rows p * h2 (``numerics.moe_merge``;
    undeclared: the products in fp32, summed in fp32, one rounding to the dtype)."""

    # each weighted row rounded to the dtype first, then summed in fp32 (AITER's Triton
    # fused_moe with mul_routed_weight: the weight multiplies the fp32 accumulator)
    ROWS_ROUNDED = "rows_rounded"
    # ... and summed in the dtype itself (rows added into the output one by one)
    ROWS_ROUNDED_DTYPE_SUM = "rows_rounded_dtype_sum"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__
# ---- grouped quantization (tealite/ops/grouped_quantize.py) -------------------------------

@dataclass
class GroupedQuantized:
    """What ``grouped_quantize`` returns: one :class:`~tealite.types.QuantizedTensor` per group
    (group g's rows of x quantized exactly as ``quantize`` quantizes them alone), and with
    ``dbias=True`` the per-group column sums of x, (G, K) in x's dtype (None otherwise)."""

    tensors: tuple[QuantizedTensor, ...]
    dbias: torch.Tensor | None = None
