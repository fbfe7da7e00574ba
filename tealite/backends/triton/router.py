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

Selection: _router_select.py (exact, so any order of work gives the same map).
``VARIANTS.fast_sigmoid`` (the default since 2026-11-28, second session): the sigmoid router
on rows that fill the tile runs _sigmoid_choice_fast (the hardware division's own steps with
one reciprocal per row, no masks, no NaN or signed-zero handling), and a block with a row it
cannot vouch for (an input below -64 or NaN, a NaN or infinite bias, tied experts or groups)
runs the exact path from a second read of x.  Kernel alone, sigmoid with 8 groups / 4 kept /
bias at 16384 x 256 bf16 top-8: H100 23.8 us at b4eca1d -> 19.0 us (42 % of copy); H200 19.4
us (33 % of its faster copy); the same bits (docs/benchmarks.md).  Divisions whose quotient
is masked out divide 1, not 0 (_FAST_PATH).

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

from tealite.backends.triton import BACKEND, DEVICES, INTERPRET, PLATFORM
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.backends.triton._router_select import (_eligible, _kth_distinct,
                                                    _ordered_signed, _select,
                                                    _select_distinct, _select_packed,
                                                    _top_sum, _top_two_sum)
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
    _next_below passes 23.5 us (35.3 %) against 30.9 us without distinct_first.
    ``fast_sigmoid`` (needs ``distinct_first``): _sigmoid_choice_fast for the sigmoid router
    where the rows fill the tile (a power-of-two expert count and group size); H200, kernel
    alone, sigmoid with groups: 23.7 -> 20.8 us, the same bits."""

    map_check_in_kernel: bool = True
    distinct_first: bool = True
    fast_sigmoid: bool = True


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


# _FAST_SIGMOID: on CUDA, ``div_rn`` is MUFU.RCP, the refinement below and FCHK, a range
# check that branches to a ~100-instruction subroutine; written out with ex2.approx.ftz (the
# exp's denormal fix-up dropped: e < 2^-126 leaves 1 + e = 1 either way) it is 8 instead of
# 19 instructions per sigmoid (sm_90 SASS), and the normalisation's division by the row's
# total shares the total's refined reciprocal: 3 instructions per entry instead of 12.  The
# steps are the hardware's own (y = rcp(b); y += y (1 - b y); q = a y; q += y (a - b q)), so
# the quotients equal div_rn's where FCHK would pass, which x >= _SAFE_X keeps: 1 + exp(-x)
# < 2^93, so s > 2^-93 and a - b q (about a 2^-24, a multiple of a 2^-46) is exact, not
# subnormal.  H100, bit for bit against div_rn (devtmp check, 2026-11-28): the sigmoid of
# every bf16 and fp16 value >= -64 and of every fp32 in [-64, 200]; s / total for 671M
# pairs with s in [2^-93, 1], total in [s, 9] (below s = 2^-105 pairs do differ).  A block
# with any other input (below _SAFE_X, NaN) runs the exact path instead.
_SAFE_X = tl.constexpr(-64.0)


@triton.jit
def _rcp_approx(d, ASM: tl.constexpr):
    """MUFU.RCP (ASM: compiled for CUDA); elsewhere a correctly rounded 1 / d."""
    if ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), d)


@triton.jit
def _refined_rcp(b, ASM: tl.constexpr):
    """div.rn's reciprocal of ``b`` after its one Newton step."""
    y = _rcp_approx(b, ASM)
    return tl.fma(y, tl.fma(-b, y, 1.0), y)


@triton.jit
def _div_refined(a, b, y, ASM: tl.constexpr):
    """a / b as div.rn computes it from ``y = _refined_rcp(b)`` (equal to ``div_rn`` for the
    normal operands of _FAST_SIGMOID); outside CUDA ``div_rn`` itself."""
    if ASM:
        q = a * y
        return tl.fma(y, tl.fma(-b, q, a), q)
    else:
        return tl.math.div_rn(a, b)


@triton.jit
def _sigmoid_fast(x, ASM: tl.constexpr):
    """_sigmoid for x >= _SAFE_X (see _FAST_SIGMOID)."""
    if ASM:
        # tl.exp(-x) on CUDA is ex2.approx(x * -log2(e)) with this fp32 constant
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r",
                                      [x * -1.4426950408889634], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        e = tl.exp(-x)
    d = 1.0 + e
    return _div_refined(tl.full(x.shape, 1.0, tl.float32), d, _refined_rcp(d, ASM), ASM)


@triton.jit
def _sigmoid_route(x, bias_ptr, rows, cols, valid, HAS_BIAS: tl.constexpr,
                   VOLATILE: tl.constexpr):
    """(sigmoid scores, routing scores: + the expert bias), exact (div_rn)."""
    s = _sigmoid(x)
    route = s
    if HAS_BIAS:
        route = s + tl.load(bias_ptr + cols[None, :] + 0 * rows[:, None], mask=valid,
                            other=0.0, volatile=VOLATILE)
    return s, route


@triton.jit
def _normalised(s, chosen):
    """The chosen sigmoid scores over their sum + SIGMOID_NORM_EPS (TE's 1e-20), div_rn."""
    return tl.math.div_rn(s, (tl.sum(tl.where(chosen, s, 0.0), axis=1) + 1e-20)[:, None])


@triton.jit
def _sigmoid_choice_fast(x, bias, topk, group_topk, per_group, HAS_BIAS: tl.constexpr,
                         GROUPED: tl.constexpr, NORMALISE: tl.constexpr, BT: tl.constexpr,
                         BE: tl.constexpr, BG: tl.constexpr, BGS: tl.constexpr,
                         TOP_TWO: tl.constexpr, ASM: tl.constexpr):
    """The sigmoid router's (weights, chosen, unsure rows) for rows that fill the tile (experts
    = BE, groups of BGS filling it) with the _FAST_SIGMOID arithmetic and no masks: the
    kernel is bound by its integer and logic pipe (Nsight Compute on an H100, 2026-11-28:
    ALU 69 %), so each compare, select and logic op per entry that the exact path needs only
    for inputs outside _FAST_SIGMOID's range is left out, and a row with such an input is
    flagged ``unsure`` instead (the program then runs the exact path):

    * one fused check per entry, ``fma(bias, 0, x) >= _SAFE_X``: false for x below _SAFE_X,
      for a NaN x, and for a NaN or infinite bias (so every score below is finite);
    * the scores' order-preserving keys skip the signed-zero case (_ordered_signed):
      ``s + bias`` is never -0 (s >= +0, and x + (-x) rounds to +0), nor is a group score;
    * the groups (a power-of-two size, so the tile's (BG, BGS) view) are chosen on distinct
      keys, a tie among the best ``group_topk`` flagged as for the experts."""
    s = _sigmoid_fast(x, ASM)
    if HAS_BIAS:
        route = s + bias
        outside = ~(tl.fma(bias, 0.0, x) >= _SAFE_X)
    else:
        route = s
        outside = ~(x >= _SAFE_X)
    unsure = tl.max(outside.to(tl.int32), axis=1) != 0
    key = _ordered_signed(route)
    if GROUPED:
        if TOP_TWO:
            gscore = _top_two_sum(tl.reshape(route, (BT, BG, BGS)), 2)
        else:
            gscore = _top_sum(tl.reshape(route, (BT, BG, BGS)), per_group, 2)
        gsel, gunsure = _kth_distinct(_ordered_signed(gscore), group_topk)
        unsure = unsure | gunsure
        picked = tl.reshape(tl.broadcast_to(tl.expand_dims(gsel, 2), (BT, BG, BGS)), (BT, BE))
        key = tl.where(picked, key, -2147483648)
    chosen, tunsure = _kth_distinct(key, topk)
    unsure = unsure | tunsure
    w = s
    if NORMALISE:
        total = tl.sum(tl.where(chosen, s, 0.0), axis=1) + 1e-20  # + SIGMOID_NORM_EPS
        w = _div_refined(s, total[:, None], _refined_rcp(total, ASM)[:, None], ASM)
    return w, chosen, unsure


@triton.jit
def _router_fwd_kernel(x_ptr, bias_ptr, probs_ptr, map_ptr, tokens, experts, topk, num_groups,
                       group_topk, per_group, group_size, scale, KIND: tl.constexpr,
                       HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr, NORMALISE: tl.constexpr,
                       AUX: tl.constexpr, IS_BF16: tl.constexpr, BT: tl.constexpr,
                       BE: tl.constexpr, BG: tl.constexpr, BGS: tl.constexpr,
                       PADDED: tl.constexpr, PACKED: tl.constexpr, TOP_TWO: tl.constexpr,
                       DISTINCT: tl.constexpr, FAST: tl.constexpr, ASM: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    valid = (rows < tokens)[:, None] & (cols < experts)[None, :]
    offs = rows[:, None] * experts + cols[None, :]
    x = load_f32(x_ptr, offs, valid, IS_BF16)
    if FAST:  # the sigmoid router on full rows (see _sigmoid_choice_fast)
        bias = 0.0
        if HAS_BIAS:
            bias = tl.load(bias_ptr + cols[None, :] + 0 * rows[:, None])
        w, chosen, unsure = _sigmoid_choice_fast(x, bias, topk, group_topk, per_group,
                                                 HAS_BIAS, GROUPED, NORMALISE, BT, BE, BG, BGS,
                                                 TOP_TWO, ASM)
        if tl.max((unsure & (rows < tokens)).to(tl.int32), axis=0) != 0:
            # the exact path, from a second read of x (keeping x live through the fast path
            # cost 24 registers per thread, sm_90: one program fewer per SM)
            s, route = _sigmoid_route(load_f32(x_ptr, offs, valid, IS_BF16, True), bias_ptr,
                                      rows, cols, valid, HAS_BIAS, True)
            eligible = valid
            if GROUPED:
                eligible = _eligible(route, valid, cols, num_groups, group_topk, per_group,
                                     group_size, BT, BE, BG, BGS, PADDED, TOP_TWO)
            chosen = _select(route, eligible, topk, 1)
            w = _normalised(s, chosen) if NORMALISE else s
    else:
        if KIND == 2:
            s, route = _sigmoid_route(x, bias_ptr, rows, cols, valid, HAS_BIAS, False)
            if AUX and NORMALISE:  # aux scores: normalised over every expert
                s = _normalised(s, valid)
                route = s
        elif KIND == 1:
            s = _row_softmax(x, valid)
            route = s
        else:
            s = x
            route = x
        eligible = valid
        if GROUPED:
            eligible = _eligible(route, valid, cols, num_groups, group_topk, per_group,
                                 group_size, BT, BE, BG, BGS, PADDED, TOP_TWO)
        top = tl.zeros((BT,), tl.float32)
        if PACKED:
            chosen, top = _select_packed(route, eligible, cols, topk)
        elif DISTINCT:
            chosen = _select_distinct(route, eligible, topk)
        else:
            chosen = _select(route, eligible, topk, 1)
        if AUX:
            w = s
        elif KIND == 0 and PACKED:
            w = _row_softmax_from(tl.where(chosen, x, float("-inf")), chosen, top)
        elif KIND == 0:
            w = _row_softmax(x, chosen)
        elif KIND == 2 and NORMALISE:
            w = _normalised(s, chosen)
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
                 dtype: torch.dtype, tile: Tile, variants: RouterVariants,
                 cuda_asm: bool) -> tuple[int, dict]:
    """(tokens per program, the forward kernel's compile-time arguments): a pure function of
    the call's shape and options, so computed once per configuration, not per call."""
    bt, be, _ = _blocks(1, experts, tile)
    ng = config.num_groups or 1
    gs = experts // ng
    slot = _pow2(gs)  # a group's slot in the tile
    kind = _kind(config)
    packed = kind == _POST and not aux and dtype != torch.float32
    distinct = variants.distinct_first
    # _sigmoid_choice_fast: rows that fill the tile, groups (if any) a power-of-two size
    fast = (variants.fast_sigmoid and kind == _SIGMOID and not aux and distinct
            and experts == be and slot == gs)
    return bt, dict(KIND=kind, HAS_BIAS=has_bias, GROUPED=config.grouped,
                    NORMALISE=config.normalises, AUX=aux, IS_BF16=dtype == torch.bfloat16,
                    BT=bt, BE=be, BG=_pow2(ng) if slot != gs else be // slot, BGS=slot,
                    PADDED=config.grouped and slot != gs, PACKED=packed,
                    TOP_TWO=config.grouped and config.per_group == 2, DISTINCT=distinct,
                    FAST=fast, ASM=fast and cuda_asm,
                    num_warps=tile.warps)


def _launch_fwd(logits, config: RouterConfig, expert_bias, *, aux: bool):
    t, e = logits.shape
    x = logits.contiguous()
    out = torch.empty((t, e), dtype=torch.float32 if aux else x.dtype, device=x.device)
    chosen = torch.empty((t, e), dtype=torch.bool, device=x.device)
    if t == 0:
        return out, chosen
    bt, options = _fwd_options(e, config, aux, expert_bias is not None, x.dtype,
                               TILES.get().fwd, VARIANTS.get(),
                               not INTERPRET and not PLATFORM.get().rocm)
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
