"""The Triton router's selection (used by tealite/backends/triton/router.py): which experts
and groups a token takes, exactly, so that any order of work gives the same map.

The k-th largest score T of a row is found by one pass per distinct value (row max, how many
share it, those knocked out to -inf), and the chosen are the scores above T plus the
lowest-index ties at T (a running count along the row): _select.  A group's score adds its
``topk // group_topk`` best, largest first into 0, as taking them one at a time does; the
groups are a (groups, slot) view of the row (gathered into padded slots when the group size
is not a power of two; with two per group, one (largest, second) reduction), chosen on
64-bit keys (score, then lowest group index), distinct by construction (_select_keyed:
_next_below passes; the running count it replaced took four barriers, sm_90).

16-bit logits with the softmax after the top-k (TE's bf16 regime) pack the column into the
13 low bits a widened 16-bit float leaves zero, so every key is distinct: the k-th largest
key comes from k - 1 passes of "the largest key below the last one" (_next_below: an add and
an unsigned minimum per entry, nothing knocked out), and the first pass's key is also the
softmax's maximum (_select_packed).  Before 2026-11-27 the top-k took one expert per pass
over boolean tiles (832 SASS instructions per pass at 16 x 256 on sm_90; counting passes
209, packed passes 98 until 2026-11-28, now 73; 35 at the default 8 x 256).  H100, kernel
alone at 16384 x 256 bf16 top-8 (benchmarks/router_configs.py): 5-11 % of copy with the old
loop, 40-42 % with the knock-out passes, 57.0 % now (14.6 us).  Float scores
(``VARIANTS.distinct_first``, the default since 2026-11-28: sigmoid with groups 25 -> 35 %
of copy on an H100, same bits) take the same passes over order-preserving integer keys
(_kth_distinct), a block with a tie among a row's k largest falling back to _select
(_select_distinct).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _knock_out_max(w, AXIS: tl.constexpr):
    """One counting pass along ``AXIS``: (the maximum, how many entries share it, ``w`` with
    those knocked out to -inf)."""
    m = tl.max(w, axis=AXIS)
    hit = w == tl.expand_dims(m, AXIS)
    return m, tl.sum(hit.to(tl.int32), axis=AXIS), tl.where(hit, float("-inf"), w)


@triton.jit
def _kth_largest(w, k, AXIS: tl.constexpr):
    """Along ``AXIS``: the k-th largest entry T of ``w`` counted with multiplicity, and how
    many entries exceed it.  ``w`` holds -inf wherever nothing may be taken (never NaN).

    One pass per distinct value, largest first: its maximum, how many entries share it, and
    those leave ``w`` (k passes always suffice).  Per pass and entry that is a max, a compare,
    a count and a select on floats: the earlier one-expert-per-pass loop carried boolean
    tiles and reduced twice per pass (value, then lowest index), four times the work in the
    sm_90 SASS."""
    T = tl.full(tl.max(w, axis=AXIS).shape, float("-inf"), tl.float32)
    above = tl.zeros(T.shape, tl.int32)
    seen = tl.zeros(T.shape, tl.int32)
    for _ in range(0, k):
        m, count, w = _knock_out_max(w, AXIS)
        short = seen < k
        T = tl.where(short, m, T)
        above = tl.where(short, seen, above)
        seen += count
    return T, above


@triton.jit
def _select(r, eligible, k, AXIS: tl.constexpr):
    """The ``k`` largest eligible ``r`` along ``AXIS``; among equal scores the lowest index
    (``topk_ties = lowest_index``): what taking the maximum k times, lowest index first,
    chooses.  NaN is never chosen (fewer than k when the rest are NaN)."""
    T, above = _kth_largest(tl.where(eligible & (r == r), r, float("-inf")), k, AXIS)
    at = tl.expand_dims(T, AXIS)
    tie = eligible & (r == at)
    rank = tl.cumsum(tie.to(tl.int32), axis=AXIS)  # 1 for the lowest-index tie
    return eligible & ((r > at) | (tie & (rank <= tl.expand_dims(k - above, AXIS))))


@triton.jit
def _ordered_signed(x):
    """fp32 -> int32 with the same order, -0 below +0 (scores that are never -0 skip
    _ordered's compare and select); every NaN above +inf."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _ordered(x):
    """fp32 -> int32 with the same order (-0 and +0 one key, every NaN above +inf)."""
    return tl.where(x == 0.0, 0, _ordered_signed(x))


@triton.jit
def _next_below(key, prev, AXIS: tl.constexpr):
    """Along ``AXIS``: the largest entry of ``key`` below ``prev`` (int32 or int64; the type's
    minimum where there is none).  ``prev - 1 - key`` read as unsigned is smallest for it:
    entries at or above ``prev`` wrap to values above every candidate's, because the keys
    span less than the type's range.  One add and a third of a three-input minimum per entry
    (int32), where a knock-out of the taken entries and a maximum took a compare, a select
    and a maximum (sm_90 SASS)."""
    p = tl.expand_dims(prev, AXIS)
    if key.dtype == tl.int64:
        gap = (p - 1 - key).to(tl.uint64, bitcast=True)
        nxt = prev - 1 - tl.min(gap, axis=AXIS).to(tl.int64, bitcast=True)
        return tl.where(prev == -9223372036854775808, prev, nxt)
    else:
        gap = (p - 1 - key).to(tl.uint32, bitcast=True)
        nxt = prev - 1 - tl.min(gap, axis=AXIS).to(tl.int32, bitcast=True)
        return tl.where(prev == -2147483648, prev, nxt)


@triton.jit
def _kth_distinct(key, k):
    """Along axis 1 of the int32 ``key``: (chosen, unsure) where chosen are the entries >= the
    k-th largest distinct key T (``k - 1`` passes of _next_below) and ``unsure`` marks the rows
    where that is not the k largest (a tie at or above T: more than k entries >= T)."""
    t = tl.max(key, axis=1)
    for _ in range(1, k):
        t = _next_below(key, t, 1)
    chosen = key >= t[:, None]
    return chosen, tl.sum(chosen.to(tl.int32), axis=1) != k


@triton.jit
def _select_keyed(r, eligible, idx, k):
    """``_select`` (along axis 1) for a few entries per row (the group scores): 64-bit keys,
    the score's order-preserving integer above ``8191 - idx``, are distinct and ordered as
    (score, lowest index first), so the keys _kth_distinct takes are what ``_select``
    chooses, never unsure, with no counts, no ranks among ties (a cumulative sum that took
    shared-memory round trips and four barriers, sm_90) and no fallback."""
    ok = eligible & (r == r)
    chosen, _ = _kth_distinct(tl.where(ok, (_ordered(r).to(tl.int64) << 13) | (8191 - idx),
                                       -9223372036854775808), k)
    return ok & chosen


@triton.jit
def _choose_distinct(r, eligible, k):
    """``_select`` (along axis 1) without counts or ranks where a row's ``k`` largest eligible
    scores are distinct (random fp32 scores: almost every row): _kth_distinct on their
    order-preserving integer keys; when exactly ``k`` entries are >= T the chosen are the
    eligible ``r >= T``, which is what ``_select`` picks then (one tie at T, rank 1; with
    fewer than k eligible, all of them).  Returns (chosen, unsure): the rows where that does
    not hold, which _select must redo."""
    ok = eligible & (r == r)
    chosen, unsure = _kth_distinct(tl.where(ok, _ordered(r), -2147483648), k)
    return ok & chosen, unsure


@triton.jit
def _select_distinct(r, eligible, k):
    """_choose_distinct; a block with an unsure row runs ``_select`` instead.  (Before
    2026-11-28 each pass knocked the maximum's entries out to -inf: a maximum, a compare and
    a select per entry.)"""
    chosen, unsure = _choose_distinct(r, eligible, k)
    if tl.max(unsure.to(tl.int32), axis=0) != 0:
        chosen = _select(r, eligible, k, 1)
    return chosen


@triton.jit
def _select_packed(x, eligible, cols, k):
    """``_select`` for scores that are 16-bit floats widened to fp32 (their low 13 bits are
    zero; experts <= 8192): the order-preserving integer of the score with ``8191 - column``
    in those bits is one distinct key per expert, ordered as (score, lowest index first), so
    the k-th largest key T comes from ``k - 1`` passes of _next_below and the chosen are the
    keys >= T, with no counts and no rank among ties (TE's regime: bf16 logits, softmax after
    the top-k).  Also returns the largest chosen score (0 where none): the softmax's maximum,
    read off the first pass's key instead of another reduction."""
    ok = eligible & (x == x)
    key = tl.where(ok, (_ordered(x) & -8192) | (8191 - cols)[None, :], -2147483648)
    top = tl.max(key, axis=1)
    t = top
    for _ in range(1, k):
        t = _next_below(key, t, 1)
    # the first key's score: undo _ordered on the bits above the column's (a widened 16-bit
    # float's low 13 bits are zero)
    bits = top & -8192
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits) & -8192
    top_score = tl.where(top == -2147483648, 0.0, bits.to(tl.float32, bitcast=True))
    return ok & (key >= t[:, None]), top_score


@triton.jit
def _top_sum(w, p, AXIS: tl.constexpr):
    """Along ``AXIS``: the sum of the ``p`` largest entries of ``w`` (with multiplicity, -inf
    where nothing may be taken), added largest first into 0 as taking them one at a time
    does (the same fp32 additions in the same order)."""
    total = tl.zeros(tl.max(w, axis=AXIS).shape, tl.float32)
    seen = tl.zeros(total.shape, tl.int32)
    for _ in range(0, p):
        m, count, w = _knock_out_max(w, AXIS)
        for j in range(0, p):  # m once per copy still needed
            total = tl.where((j < count) & (seen + j < p), total + m, total)
        seen += count
    return total


@triton.jit
def _best_two(a1, a2, b1, b2):
    """Combine two (largest, second largest) pairs, counting equal values twice."""
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _top_two_sum(w, AXIS: tl.constexpr):
    """``_top_sum(w, 2, AXIS)`` in one reduction (DeepSeek-V3's 8 groups, 4 kept, top-8):
    the largest and the second largest (with multiplicity), added into 0 in that order."""
    first, second = tl.reduce((w, tl.full(w.shape, float("-inf"), tl.float32)), AXIS,
                              _best_two)
    return (0.0 + first) + second


@triton.jit
def _padded_slots(w, cols, num_groups, group_size, BT: tl.constexpr, BG: tl.constexpr,
                  BGS: tl.constexpr):
    """The (BT, BE) scores re-laid as (BT, BG * BGS) group slots, -inf in the padding: slot
    (g, j) holds column g * group_size + j.  One exact masked max per slot instead of
    ``tl.gather``: Triton 3.6's sm_90 compiler aborts on this gather (OptimizeThreadLocality:
    'GatherLoweringHelper(op).isWarpLocal()' assertion, seen on an H100), Triton 3.9
    compiles it.  Only group sizes that are not a power of two take this path."""
    slot = tl.arange(0, BG * BGS)
    out = tl.full((BT, BG * BGS), float("-inf"), tl.float32)
    for s in tl.static_range(BG * BGS):
        g = s // BGS
        j = s % BGS
        col = tl.max(tl.where((cols == g * group_size + j)[None, :], w, float("-inf")), 1)
        keep = (slot == s) & (j < group_size) & (g < num_groups)
        out = tl.where(keep[None, :], col[:, None], out)
    return out


@triton.jit
def _eligible(route, valid, cols, num_groups, group_topk, per_group, group_size,
              BT: tl.constexpr, BE: tl.constexpr, BG: tl.constexpr, BGS: tl.constexpr,
              PADDED: tl.constexpr, TOP_TWO: tl.constexpr):
    """The experts of each row's ``group_topk`` best groups (group score: the sum of its
    ``per_group`` best routing scores; ties to the lowest group).  The row is viewed as a
    (BG, BGS) tile of group slots: as it is when the group size is a power of two (slots
    past ``num_groups`` empty), else gathered into padded slots (``PADDED``)."""
    w = tl.where(valid & (route == route), route, float("-inf"))
    if PADDED:
        w = _padded_slots(w, cols, num_groups, group_size, BT, BG, BGS)
    if TOP_TWO:
        gscore = _top_two_sum(tl.reshape(w, (BT, BG, BGS)), 2)
    else:
        gscore = _top_sum(tl.reshape(w, (BT, BG, BGS)), per_group, 2)
    gcols = tl.arange(0, BG)
    gsel = _select_keyed(gscore, (gcols < num_groups)[None, :], gcols[None, :], group_topk)
    if PADDED:
        gid = tl.minimum(cols // group_size, BG - 1)
        sel = gsel.to(tl.int32)
        picked = tl.zeros((BT, BE), tl.int32)
        for gi in tl.static_range(BG):  # column gi of sel, spread over group gi's experts
            col = tl.max(tl.where((gcols == gi)[None, :], sel, 0), 1)
            picked = tl.where((gid == gi)[None, :], col[:, None], picked)
    else:
        picked = tl.reshape(tl.broadcast_to(tl.expand_dims(gsel.to(tl.int32), 2),
                                            (BT, BG, BGS)), (BT, BE))
    return valid & (picked != 0)
