"""TE's fused router as Triton kernels (semantics: tealite/ops/router.py): one program per
block of tokens, the block's whole (tokens, experts) tile in registers (experts padded to a
power of two, so any expert count, prime or not, runs with a masked tail).

Forward, per token: the routing scores in fp32 (logits; softmax: max, exp, sum, IEEE
division ``div_rn``; sigmoid ``div_rn(1, 1 + exp(-x))`` + bias), the group scores and the
best ``group_topk`` groups, then the top-k among the eligible experts, and among equal scores
the lowest expert index (declared ``topk_ties = lowest_index``); then the weights (softmax
over the chosen logits, the pre-softmax score, or the sigmoid normalised by its sum + 1e-20)
times the scaling factor.  Backward at the given map: the softmax / normalisation / sigmoid
gradients in fp32; it also counts each row's marks and sets a flag when one is not topk (the
front end's check of the map, done where the map is loaded anyway: one read after the launch
instead of three reduction kernels and a read before it; sm_90: ~100 more instructions per
thread of ~1000, two more barriers).  The aux-loss scores use the same kernels (softmax over all experts, or
the sigmoid normalised over all of them; their backward is the router backward with every
expert in the map).

Selection (exact, so any order of work gives the same map): the k-th largest score T of a
row is found by one pass per distinct value (row max, how many share it, those knocked out
to -inf), and the chosen are the scores above T plus the lowest-index ties at T (a running
count along the row).  A group's score adds its ``topk // group_topk`` best, largest first
into 0, as taking them one at a time does; the groups are a (groups, slot) view of the row
(gathered into padded slots when the group size is not a power of two; with two per group,
one (largest, second) reduction).  16-bit logits with the softmax after the top-k (TE's bf16
regime) pack the column into the 13 low bits a widened 16-bit float leaves zero, so every
key is distinct: the k-th largest key comes from k - 1 passes of "the largest key below the
last one" (_next_below: an add and an unsigned minimum per entry, nothing knocked out), and
the first pass's key is also the softmax's maximum.  Before 2026-11-27 the top-k took one
expert per pass over boolean tiles (832 SASS instructions per pass at 16 x 256 on sm_90;
counting passes 209, packed passes 98 until 2026-11-28, now 73; 35 at the default 8 x 256).
H100, kernel alone at 16384 x 256 bf16 top-8 (benchmarks/router_configs.py): 5-11 % of copy
with the old loop, 40-42 % with the knock-out passes, 57.0 % now (14.6 us).  Divisions whose
quotient is masked out divide 1, not 0 (_FAST_PATH).  ``VARIANTS.distinct_first`` (the
default since 2026-11-28: sigmoid with groups 25 -> 35 % of copy on an H100 with the
_next_below passes, same bits): float scores as order-preserving integer keys, passes
without counts, a block with a tie among a row's k largest falling back to the counting
passes (_select_distinct).

Numerics: fp32 throughout; ``tl.exp`` is numpy's in the interpreter (1 ulp) and an
exp2-based approximation on GPUs (2 ulps): ``exp_ulps`` 1 / 2.  The weights' reductions run
over the same (16 tokens x 256 experts, 4 warps) layout as before, so the sums' order is
unchanged; another program shape (``TILES``, swept by benchmarks/router_configs.py) may sum
in another order (within the declared bounds).  The forward cross-compiles with triton 3.9
for sm_90 without local-memory spills (tests/test_router_compiled.py) and for gfx942.  Rows
wider than 8192 experts are refused (one token block in registers; the packed keys' 13
column bits).  The aux loss: one program sums probs over the tokens block by block (fp32
column sums), weights them by the tokens per expert and multiplies by TE's constant
(computed on the host in float32 as the torch backend does); its backward writes ``C n_e g``
per token block (router_aux_loss.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite._checks import capturing
from tealite.moe_types import RouterConfig, ScoreFunction, TieRule
from tealite.router_checks import check_map_counts, checking_maps, counts_the_map
from tealite.scoped import Scoped
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_MAX_EXPERTS = 8192
# Score kinds (constexpr): softmax after the top-k, softmax before it, sigmoid.
_POST, _PRE, _SIGMOID = 0, 1, 2


@dataclass(frozen=True)
class Tile:
    """One kernel's program shape: at most ``rows`` tokens and ``elements`` (tokens x padded
    experts) per program, ``warps`` warps.  A row's reductions may change order with the shape
    (a sum is then rounded differently, within the declared bounds), so a config becomes the
    default only where benchmarks/router_configs.py reports the default's bits."""

    # H100 sweep (benchmarks/router_configs.py, 16384 x 256 bf16 top-8, kernel alone, same
    # bits for every shape; docs/benchmarks/2026-11-27-h100-router-configs.txt): 2048 x 8
    # rows x 4 warps is the fastest or within 3 % of it in all four rows (fwd softmax 40.6 %
    # of copy, sigmoid-groups 26.8 %, bwd 86.1 / 82.5 %; 4096 x 16 x 4: 32.8 / 26.1 / 62 / 62).
    # Swept again 2026-11-28 (docs/benchmarks/2026-11-28-s8/): 1024 x 8 x 2 within 2-7 %
    # either way, and no gain from register caps (maxnreg 40-72) or from programs that walk
    # several blocks (the compiler does not pipeline these loads).
    elements: int = 2048
    rows: int = 8
    warps: int = 4


@dataclass(frozen=True)
class RouterTiles:
    """The router kernels' program shapes (forward, backward); ``TILES.override(fwd=...)``
    sets them for one block and thread (the GPU config sweep)."""

    fwd: Tile = Tile()
    bwd: Tile = Tile()


TILES: Scoped[RouterTiles] = Scoped("triton.router.TILES", RouterTiles)


@dataclass(frozen=True)
class RouterVariants:
    """Ways of doing the same work (same bits out), swept by benchmarks/router_configs.py;
    ``VARIANTS.override(...)`` selects one for a block and thread.

    ``map_check_in_kernel``: the backward counts each row's marks in its kernel (the map is
    loaded there anyway) and sets a flag that the host reads once after the launch, instead
    of the front end's three reduction kernels and read before it (check_map_counts); a bad
    map gets the same error either way.  ``distinct_first``: the forward's top-k over float
    scores (all but the packed keys) tries ``_select_distinct`` first; sm_90 SASS, sigmoid
    with groups and a bias, 8 x 256 per program: ~1900 instructions per thread instead of
    ~2700.  H100, kernel alone at 16384 x 256 (benchmarks/router_configs.py, 2026-11-28):
    sigmoid with groups 33.3 -> 27.4 us (24.9 -> 30.4 % of copy), the same bits; with the
    _next_below passes 23.5 us (35.3 %) against 30.9 us without distinct_first."""

    map_check_in_kernel: bool = True
    distinct_first: bool = True


VARIANTS: Scoped[RouterVariants] = Scoped("triton.router.VARIANTS", RouterVariants)


def _numerics(params) -> dict:
    return {"compute_dtype": torch.float32, "exp_ulps": 1 if INTERPRET else 2,
            "topk_ties": TieRule.LOWEST_INDEX}


def _too_wide(params) -> str | None:
    if params["experts"] > _MAX_EXPERTS:
        return (f"experts = {params['experts']} > {_MAX_EXPERTS} (a token block's rows in "
                f"registers)")
    return None


def _kind(config: RouterConfig) -> int:
    if config.score_function == ScoreFunction.SIGMOID:
        return _SIGMOID
    return _PRE if config.use_pre_softmax else _POST


# _FAST_PATH: an IEEE division (``div_rn``) on sm_90 is a reciprocal, five FMAs and a range
# check (FCHK) that calls a ~100-instruction subroutine for operands the FMAs cannot handle.
# Read from the SASS (not yet timed): a zero dividend is one of them (the FMAs would turn -0
# into +0; the subroutine starts by testing the exponent fields for 0 and 255).  A warp runs
# the call when any lane needs it, so 0 / total for the ~97 % of a row outside the top-k
# would take it for every group of elements: divisions whose result is masked out divide 1
# instead (the kept quotients, hence the bits, are unchanged).


@triton.jit
def _row_softmax(x, keep):
    """Softmax over ``keep`` along axis 1 (0 elsewhere), IEEE division."""
    xs = tl.where(keep, x, float("-inf"))
    return _row_softmax_from(xs, keep, tl.max(xs, axis=1))


@triton.jit
def _row_softmax_from(xs, keep, m):
    """_row_softmax of ``xs`` (x where ``keep``, -inf elsewhere) given its row maxima ``m``
    (-inf, a row of -inf or nothing kept, counts as 0).  A zero's sign does not matter:
    x - (+0) and x - (-0) differ only for x = -0, where both exponentials are 1."""
    m = tl.where(m == float("-inf"), 0.0, m)
    e = tl.where(keep, tl.exp(xs - m[:, None]), 0.0)
    total = tl.sum(e, axis=1)
    # Outside ``keep`` the quotient is discarded: 1, not 0, goes in (see _FAST_PATH).
    return tl.where(keep, tl.math.div_rn(tl.where(keep, e, 1.0),
                                         tl.where(total == 0.0, 1.0, total)[:, None]), 0.0)


@triton.jit
def _sigmoid(x):
    return tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + tl.exp(-x))


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
        m = tl.max(w, axis=AXIS)
        hit = w == tl.expand_dims(m, AXIS)
        count = tl.sum(hit.to(tl.int32), axis=AXIS)
        w = tl.where(hit, float("-inf"), w)
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
def _ordered(x):
    """fp32 -> int32 with the same order (-0 and +0 one key, every NaN above +inf)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(x == 0.0, 0, bits ^ ((bits >> 31) & 0x7FFFFFFF))


@triton.jit
def _next_below(key, prev, AXIS: tl.constexpr):
    """Along ``AXIS``: the largest entry of ``key`` below ``prev`` (int32; -2^31 where there is
    none).  ``prev - 1 - key`` read as unsigned is smallest for it: entries at or above
    ``prev`` wrap to values above every candidate's, because the keys span less than 2^32.
    One add and a third of a three-input minimum per entry, where a knock-out of the taken
    entries and a maximum took a compare, a select and a maximum (sm_90 SASS)."""
    p = tl.expand_dims(prev, AXIS)
    gap = (p - 1 - key).to(tl.uint32, bitcast=True)
    nxt = prev - 1 - tl.min(gap, axis=AXIS).to(tl.int32, bitcast=True)
    return tl.where(prev == -2147483648, prev, nxt)


@triton.jit
def _select_distinct(r, eligible, k, AXIS: tl.constexpr):
    """``_select`` without counts or ranks where a row's ``k`` largest eligible scores are
    distinct (random fp32 scores: almost every row): the k-th largest distinct value T, by
    ``k - 1`` passes of _next_below over order-preserving integer keys; when exactly ``k``
    entries are >= T (so each pass took one) the chosen are the eligible ``r >= T``, which is
    what ``_select`` picks then (one tie at T, rank 1).  A block with any other row runs
    ``_select`` itself.  (Before 2026-11-28 each pass knocked the maximum's entries out to
    -inf: a maximum, a compare and a select per entry.)"""
    ok = eligible & (r == r)
    key = tl.where(ok, _ordered(r), -2147483648)
    t = tl.max(key, axis=AXIS)
    for _ in range(1, k):
        t = _next_below(key, t, AXIS)
    at_least = key >= tl.expand_dims(t, AXIS)  # ineligible keys (-2^31) only if t is: fallback
    n = tl.sum(at_least.to(tl.int32), axis=AXIS)
    chosen = ok & at_least
    if tl.max(((n != k) | (t == -2147483648)).to(tl.int32), axis=0) != 0:
        chosen = _select(r, eligible, k, AXIS)
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
        m = tl.max(w, axis=AXIS)
        hit = w == tl.expand_dims(m, AXIS)
        count = tl.sum(hit.to(tl.int32), axis=AXIS)
        w = tl.where(hit, float("-inf"), w)
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
    gsel = _select(gscore, (gcols < num_groups)[None, :], group_topk, 1)
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


@triton.jit
def _router_fwd_kernel(x_ptr, bias_ptr, probs_ptr, map_ptr, tokens, experts, topk, num_groups,
                       group_topk, per_group, group_size, scale, KIND: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr, NORMALISE: tl.constexpr,
                       AUX: tl.constexpr, IS_BF16: tl.constexpr, BT: tl.constexpr,
                       BE: tl.constexpr, BG: tl.constexpr, BGS: tl.constexpr,
                       PADDED: tl.constexpr, PACKED: tl.constexpr, TOP_TWO: tl.constexpr,
                       DISTINCT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    valid = (rows < tokens)[:, None] & (cols < experts)[None, :]
    offs = rows[:, None] * experts + cols[None, :]
    x = load_f32(x_ptr, offs, valid, IS_BF16)
    if KIND == 2:
        s = _sigmoid(x)
        if AUX and NORMALISE:  # aux scores: normalised over every expert
            s = tl.math.div_rn(s, (tl.sum(tl.where(valid, s, 0.0), axis=1) + 1e-20)[:, None])  # + SIGMOID_NORM_EPS
        route = s
        if HAS_BIAS:
            route = s + tl.load(bias_ptr + cols, mask=cols < experts, other=0.0)[None, :]
    elif KIND == 1:
        s = _row_softmax(x, valid)
        route = s
    else:
        s = x
        route = x
    eligible = valid
    if GROUPED:
        eligible = _eligible(route, valid, cols, num_groups, group_topk, per_group, group_size,
                             BT, BE, BG, BGS, PADDED, TOP_TWO)
    top = tl.zeros((BT,), tl.float32)
    if PACKED:
        chosen, top = _select_packed(route, eligible, cols, topk)
    elif DISTINCT:
        chosen = _select_distinct(route, eligible, topk, 1)
    else:
        chosen = _select(route, eligible, topk, 1)
    if AUX:
        w = s
    elif KIND == 0 and PACKED:
        w = _row_softmax_from(tl.where(chosen, x, float("-inf")), chosen, top)
    elif KIND == 0:
        w = _row_softmax(x, chosen)
    elif KIND == 2 and NORMALISE:
        w = tl.math.div_rn(s, (tl.sum(tl.where(chosen, s, 0.0), axis=1) + 1e-20)[:, None])
    else:
        w = s
    if not AUX:
        w = tl.where(chosen, w * scale, 0.0)
        store_f32(probs_ptr, offs, w, valid, IS_BF16)
    else:
        tl.store(probs_ptr + offs, w, mask=valid)
    tl.store(map_ptr + offs, chosen.to(tl.int8), mask=valid)


@triton.jit
def _router_bwd_kernel(g_ptr, x_ptr, map_ptr, dx_ptr, bad_ptr, tokens, experts, topk, scale,
                       KIND: tl.constexpr, NORMALISE: tl.constexpr, ALL: tl.constexpr,
                       G_F32: tl.constexpr, IS_BF16: tl.constexpr, BT: tl.constexpr,
                       BE: tl.constexpr, CHECK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    valid = (rows < tokens)[:, None] & (cols < experts)[None, :]
    offs = rows[:, None] * experts + cols[None, :]
    x = load_f32(x_ptr, offs, valid, IS_BF16)
    if G_F32:
        g = tl.load(g_ptr + offs, mask=valid, other=0.0)
    else:
        g = load_f32(g_ptr, offs, valid, IS_BF16)
    if ALL:
        m = valid
    else:
        m = valid & (tl.load(map_ptr + offs, mask=valid, other=0) != 0)
    if CHECK:  # a row marking other than topk experts sets the flag (every writer writes 1)
        wrong = (rows < tokens) & (tl.sum(m.to(tl.int32), axis=1) != topk)
        tl.store(bad_ptr, 1, mask=tl.max(wrong.to(tl.int32), axis=0) != 0)
    g = tl.where(m, g * scale, 0.0)
    if KIND == 2:
        s = _sigmoid(x)
        if NORMALISE:
            total = tl.sum(tl.where(m, s, 0.0), axis=1) + 1e-20
            p = tl.sum(g * tl.where(m, s, 0.0), axis=1)
            g = tl.where(m, tl.math.div_rn(tl.where(m, g, 1.0), total[:, None])  # _FAST_PATH
                         - tl.math.div_rn(p, total * total)[:, None], 0.0)
        dx = g * s * (1.0 - s)
    else:
        if KIND == 1:
            y = _row_softmax(x, valid)
        else:
            y = _row_softmax(x, m)
        dx = y * (g - tl.sum(g * y, axis=1)[:, None])
    store_f32(dx_ptr, offs, dx, valid, IS_BF16)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _blocks(tokens: int, experts: int, tile: Tile = Tile()) -> tuple[int, int, int]:
    be = _pow2(experts)
    bt = max(1, min(tile.rows, tile.elements // be))
    return bt, be, -(-tokens // bt)


@functools.lru_cache(maxsize=256)
def _fwd_options(experts: int, config: RouterConfig, aux: bool, has_bias: bool,
                 dtype: torch.dtype, tile: Tile, distinct: bool) -> tuple[int, dict]:
    """(tokens per program, the forward kernel's compile-time arguments): a pure function of
    the call's shape and options, so computed once per configuration, not per call."""
    bt, be, _ = _blocks(1, experts, tile)
    ng = config.num_groups or 1
    gs = experts // ng
    slot = _pow2(gs)  # a group's slot in the tile
    kind = _kind(config)
    return bt, dict(KIND=kind, HAS_BIAS=has_bias, GROUPED=config.grouped,
                    NORMALISE=config.normalises, AUX=aux, IS_BF16=dtype == torch.bfloat16,
                    BT=bt, BE=be, BG=_pow2(ng) if slot != gs else be // slot, BGS=slot,
                    PADDED=config.grouped and slot != gs,
                    PACKED=kind == _POST and not aux and dtype != torch.float32,
                    TOP_TWO=config.grouped and config.per_group == 2, DISTINCT=distinct,
                    num_warps=tile.warps)


def _launch_fwd(logits, config: RouterConfig, expert_bias, *, aux: bool):
    t, e = logits.shape
    x = logits.contiguous()
    out = torch.empty((t, e), dtype=torch.float32 if aux else x.dtype, device=x.device)
    chosen = torch.empty((t, e), dtype=torch.bool, device=x.device)
    if t == 0:
        return out, chosen
    bt, options = _fwd_options(e, config, aux, expert_bias is not None, x.dtype,
                               TILES.get().fwd, VARIANTS.get().distinct_first)
    bias = expert_bias.float().contiguous() if expert_bias is not None else x
    ng = config.num_groups or 1
    _router_fwd_kernel[(-(-t // bt),)](
        as_kernel_arg(x), bias, out if aux else as_kernel_arg(out), chosen.view(torch.int8),
        t, e, config.topk, ng, config.group_topk or 1, config.per_group, e // ng,
        float(config.scale), **options)
    return out, chosen


def _launch_bwd(grad, logits, routing_map, config: RouterConfig, *, aux: bool):
    t, e = logits.shape
    x, g = logits.contiguous(), grad.contiguous()
    dx = torch.empty_like(x)
    tile = TILES.get().bwd
    bt, be, grid = _blocks(t, e, tile)
    if grid == 0:
        return dx
    kind = _kind(config) if not aux else (_SIGMOID if config.score_function ==
                                          ScoreFunction.SIGMOID else _PRE)
    m = routing_map.contiguous().view(torch.int8) if routing_map is not None else x
    # While a CUDA graph is captured the flag is set but not read (no read-back there).
    vouched = routing_map is None or not checking_maps()  # check_values=False: no check
    check = not vouched and VARIANTS.get().map_check_in_kernel
    if not vouched and not check:
        check_map_counts(routing_map, config.topk)  # before the launch, as the front end
    bad = torch.zeros(1, dtype=torch.int32, device=x.device) if check else x
    _router_bwd_kernel[(grid,)](
        g if aux else as_kernel_arg(g), as_kernel_arg(x), m, as_kernel_arg(dx), bad, t, e,
        config.topk, 1.0 if aux else float(config.scale), KIND=kind,
        NORMALISE=config.normalises, ALL=routing_map is None, G_F32=aux,
        IS_BF16=x.dtype == torch.bfloat16, BT=bt, BE=be, CHECK=check, num_warps=tile.warps)
    if check and not capturing(bad) and bool(bad):  # the one read; the row only on error
        check_map_counts(routing_map, config.topk)
        raise AssertionError("the backward kernel flagged a routing map check_map_counts "
                             "accepts")
    return dx


@BACKEND.implements(Op.ROUTER_FWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_numerics)
def router_fwd(logits, config: RouterConfig, *, expert_bias):
    return _launch_fwd(logits, config, expert_bias, aux=False)


@BACKEND.implements(Op.ROUTER_BWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_numerics)
@counts_the_map
def router_bwd(grad_probs, logits, routing_map, config: RouterConfig):
    return _launch_bwd(grad_probs, logits, routing_map, config, aux=False)


@BACKEND.implements(Op.ROUTER_AUX_SCORES_FWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_too_wide, numerics=_numerics)
def router_aux_scores_fwd(logits, config: RouterConfig):
    aux = RouterConfig(config.topk, config.score_function, config.score_function ==
                       ScoreFunction.SOFTMAX)
    return _launch_fwd(logits, aux, None, aux=True)


@BACKEND.implements(Op.ROUTER_AUX_SCORES_BWD, dtypes=_FLOATS, devices=DEVICES,
                    check=_too_wide, numerics=_numerics)
def router_aux_scores_bwd(grad_scores, logits, config: RouterConfig):
    return _launch_bwd(grad_scores, logits, None, config, aux=True)
