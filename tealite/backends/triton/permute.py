"""MoE token permutation in Triton (semantics: tealite/ops/permute.py, tealite/moe_types.py).

Three kernels:

* ``_scatter_rows_kernel`` (permute): one program per tile of tokens x hidden columns loads
  the tokens' block once and stores it to each of their kept rows (a -1 slot of the row-id
  map stores nothing); the permuted probs and row-indexed scales go through the same kernel
  as one-column rows.  Every token is read once and every copy written once, what a copy
  costs, so the kernel is bandwidth bound (benchmarks/test_bench_permute.py).
* ``_gather_rows_kernel`` (sort-chunks, pad, unpad, and unpermute of quantized rows, one
  kept row per token): one program per tile of output rows copies their source rows, or
  writes the fill pattern where the source is -1; a quantized tensor's row scales move in
  the same launch (the programs of column block 0 take them).
* ``_unpermute_kernel``: one program per tile of tokens sums each token's kept slots in slot
  order in fp32 (``acc + x * p``: the compiler may contract it into an FMA, which
  tiers/permute_sum.py's gamma_k covers).  ``_unpermute_bwd_kernel`` (with merging probs; a
  plain sum's backward is permute's scatter): one program per tile of tokens writes
  ``p * dy`` to each kept row and reduces ``dy . permuted[row]`` over the hidden blocks for
  every slot.
* Tiles hold up to 4096 elements: registers on a GPU, and few large programs in the
  interpreter, whose cost is per program (one row per program cost CI minutes).

Data movement runs on bit patterns (the host passes same-width integer views), so FP8 codes,
packed e2m1 bytes, E8M0 scales and bf16 move exactly on every target; arithmetic reads bf16
through ``_io`` (the interpreter's bf16 conversions are wrong).  The row-id map is Triton of its
own over the caller's routing as given (a bool mask viewed as bytes, int masks and indices
read in their own dtype: no conversion ops), one program per expert: ``_rows_kernel`` writes
each slot's row from the rows of the experts before its own and a block cumsum over its
candidate slots, after ``_count_kernel`` for a mask (an index map's programs count the
experts below their own themselves); independent of the torch backend's torch-op
construction.  So a permute is two launches (index) or three (mask) plus one per moved
tensor.  The per-expert counts (an index map's followed by the indices' min and max, the
front end's range check) go into the map as ``PendingCounts``, read once by the front end's
value check after every launch, or when ``tokens_per_expert`` (the grouped GEMM's m_splits)
is first asked for; the backend reads them itself only for a mask without
``num_out_tokens``, whose count sizes the output.  Where they are read within the call
(``prefetch_counts``, and that mask) their copy to the host starts right after the kernel
that computes them (``HostCopy``: pinned memory and an event on CUDA), so the read waits
for the map kernels only, while the scatters queued after them keep the device busy
(op-level host cost: docs/benchmarks.md).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite._checks import capturing
from tealite.moe_types import (HostCopy, MapType, PendingCounts, RowIdMap, chunk_source_rows,
                               pad_source_rows, takes_unchecked_routing, unpad_source_rows)
from tealite.types import Op

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
MOVABLE = FLOATS + (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                    torch.float8_e5m2fnuz, torch.uint8)
_NUMERICS = {"compute_dtype": torch.float32}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_BLOCK_H = 1024


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The least power of two >= n (n >= 1).  Plain ints: triton.cdiv / next_power_of_2 are
    constexpr functions costing microseconds a call on the host, several a permute."""
    return 1 << (n - 1).bit_length()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.element_size()])


def _block(h: int) -> int:
    return min(_BLOCK_H, _pow2(max(h, 1)))


@triton.jit
def _tile(pid_r, pid_h, N, H, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """The (BLOCK_R, BLOCK_H) tile of a program: its row ids (int64), column ids and masks."""
    rows = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    return rows, cols, rows < N, cols < H


@triton.jit
def _scatter_rows_kernel(x_ptr, rows_ptr, out_ptr, N, H, SLOTS, stride_x, stride_o,
                         BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    t, cols, t_ok, c_ok = _tile(tl.program_id(0), tl.program_id(1), N, H, BLOCK_R, BLOCK_H)
    m = t_ok[:, None] & c_ok[None, :]
    v = tl.load(x_ptr + t[:, None] * stride_x + cols[None, :], mask=m)
    for s in range(0, SLOTS):
        r = tl.load(rows_ptr + t * SLOTS + s, mask=t_ok, other=-1).to(tl.int64)
        tl.store(out_ptr + r[:, None] * stride_o + cols[None, :], v,
                 mask=m & (r >= 0)[:, None])


@triton.jit
def _gather_tile(x_ptr, out_ptr, r, i, i_ok, cols, c_ok, fill, stride_x, stride_o):
    m = i_ok[:, None] & c_ok[None, :]
    got = (r >= 0)[:, None]
    v = tl.load(x_ptr + tl.maximum(r, 0)[:, None] * stride_x + cols[None, :], mask=m & got,
                other=0)
    v = tl.where(got, v, tl.zeros_like(v) + fill)
    tl.store(out_ptr + i[:, None] * stride_o + cols[None, :], v, mask=m)


@triton.jit
def _gather_rows_kernel(x_ptr, src_ptr, out_ptr, N, H, SLOTS, fill, stride_x, stride_o,
                        y_ptr, out_y_ptr, HY, fill_y, stride_y, stride_oy,
                        BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, WITH_Y: tl.constexpr,
                        BLOCK_HY: tl.constexpr):
    """Gather x's rows; with ``WITH_Y`` the programs of column block 0 also gather the same
    rows of y (a quantized tensor's row scales: one launch for both, _gather_with_scales)."""
    i, cols, i_ok, c_ok = _tile(tl.program_id(0), tl.program_id(1), N, H, BLOCK_R, BLOCK_H)
    # Output row i's source: the largest of its SLOTS entries (-1 but at most one: a
    # quantized unpermute's row-id map row; one entry for every other gather).
    r = tl.full((BLOCK_R,), -1, tl.int64)
    for s in range(0, SLOTS):
        r = tl.maximum(r, tl.load(src_ptr + i * SLOTS + s, mask=i_ok, other=-1).to(tl.int64))
    _gather_tile(x_ptr, out_ptr, r, i, i_ok, cols, c_ok, fill, stride_x, stride_o)
    if WITH_Y:
        if tl.program_id(1) == 0:
            cy = tl.arange(0, BLOCK_HY)
            _gather_tile(y_ptr, out_y_ptr, r, i, i_ok, cy, cy < HY, fill_y, stride_y,
                         stride_oy)


@triton.jit
def _unpermute_kernel(x_ptr, rows_ptr, p_ptr, out_ptr, N, H, SLOTS, stride_x, stride_o,
                      WITH_PROBS: tl.constexpr, IS_BF16: tl.constexpr,
                      PROBS_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    t, cols, t_ok, c_ok = _tile(tl.program_id(0), tl.program_id(1), N, H, BLOCK_R, BLOCK_H)
    m = t_ok[:, None] & c_ok[None, :]
    acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
    for s in range(0, SLOTS):
        r = tl.load(rows_ptr + t * SLOTS + s, mask=t_ok, other=-1).to(tl.int64)
        keep = (r >= 0)[:, None]
        x = load_f32(x_ptr, tl.maximum(r, 0)[:, None] * stride_x + cols[None, :], m & keep,
                     IS_BF16)
        if WITH_PROBS:
            p = load_f32(p_ptr, t * SLOTS + s, t_ok & (r >= 0), PROBS_BF16)
            acc = tl.where(keep, acc + x * p[:, None], acc)
        else:
            acc = tl.where(keep, acc + x, acc)
    store_f32(out_ptr, t[:, None] * stride_o + cols[None, :], acc, m, IS_BF16)


@triton.jit
def _unpermute_bwd_kernel(dy_ptr, x_ptr, rows_ptr, p_ptr, gx_ptr, gp_ptr, N, H, SLOTS,
                          stride_dy, stride_x, stride_gx,
                          IS_BF16: tl.constexpr, PROBS_BF16: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    t, lanes, t_ok, _ = _tile(tl.program_id(0), 0, N, H, BLOCK_R, BLOCK_H)
    for s in range(0, SLOTS):
        r = tl.load(rows_ptr + t * SLOTS + s, mask=t_ok, other=-1).to(tl.int64)
        keep = t_ok & (r >= 0)
        p = load_f32(p_ptr, t * SLOTS + s, keep, PROBS_BF16)
        dot = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            cols = h0 + lanes
            m = keep[:, None] & (cols < H)[None, :]
            dy = load_f32(dy_ptr, t[:, None] * stride_dy + cols[None, :], m, IS_BF16)
            x = load_f32(x_ptr, tl.maximum(r, 0)[:, None] * stride_x + cols[None, :], m,
                         IS_BF16)
            store_f32(gx_ptr, tl.maximum(r, 0)[:, None] * stride_gx + cols[None, :],
                      dy * p[:, None], m, IS_BF16)
            dot += dy * x
        # A slot with no row gets 0 (every load of it was masked to 0).
        store_f32(gp_ptr, t * SLOTS + s, tl.sum(dot, axis=1), t_ok, PROBS_BF16)


@triton.jit
def _candidates(routing_ptr, b, e, TOTAL, SLOTS, COLUMN: tl.constexpr, BLOCK: tl.constexpr):
    """Block b of expert e's candidate slots, read straight off the caller's routing: a
    mask's column e (hit: nonzero), or every index slot (hit: == e).  Returns (offsets, in
    bounds, value, hit)."""
    i = (b + tl.arange(0, BLOCK)).to(tl.int64)
    ok = i < TOTAL
    off = i * SLOTS + e if COLUMN else i
    v = tl.load(routing_ptr + off, mask=ok, other=0 if COLUMN else -1)
    hit = ok & (v != 0) if COLUMN else ok & (v == e)
    return off, ok, v, hit


@triton.jit
def _count_kernel(routing_ptr, count_ptr, TOTAL, SLOTS, COLUMN: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Program e counts the slots routed to expert e (launched for masks: an index map's rows
    kernel counts for itself)."""
    e = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.int32)
    for b in range(0, TOTAL, BLOCK):
        _, _, _, hit = _candidates(routing_ptr, b, e, TOTAL, SLOTS, COLUMN, BLOCK)
        acc += hit.to(tl.int32)
    tl.store(count_ptr + e, tl.sum(acc, axis=0))


@triton.jit
def _rows_kernel(routing_ptr, count_ptr, rows_ptr, TOTAL, SLOTS, E, num_out,
                 COLUMN: tl.constexpr, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    """Program e writes the rows of expert e's slots in (token, slot) order: the rows of the
    experts before e, then a running block cumsum; -1 at / past num_out (dropped).

    A mask's program reads the rows before e off ``_count_kernel``'s counts (the exclusive
    sum) and writes its whole column (-1 where unrouted).  An index map needs no count
    kernel: program e first counts the slots of the experts below e (a pass over the indices,
    which every program reads anyway) and stores its own count at the end; program 0 also
    stores the indices' min and max after the E counts (the front end's range check, read
    with the counts in one read-back).  Every valid index slot is one expert's; program 0
    also writes -1 into the slots no expert owns (out of range: the front end raises after
    this kernel, or its check was skipped)."""
    e = tl.program_id(0)
    if COLUMN:
        j = tl.arange(0, BLOCK_E)
        carry = tl.sum(tl.load(count_ptr + j, mask=j < e, other=0), axis=0)
    else:
        below = tl.zeros((BLOCK,), tl.int32)
        # the bounds' neutral element: a real index (slot 0), so no dtype sentinel is needed
        slot0 = tl.load(routing_ptr)
        lo = tl.zeros((BLOCK,), routing_ptr.dtype.element_ty) + slot0
        hi = lo
        for b in range(0, TOTAL, BLOCK):
            _, ok, v, _ = _candidates(routing_ptr, b, e, TOTAL, SLOTS, COLUMN, BLOCK)
            below += (ok & (v >= 0) & (v < e)).to(tl.int32)
            lo = tl.minimum(lo, tl.where(ok, v, slot0))
            hi = tl.maximum(hi, tl.where(ok, v, slot0))
        carry = tl.sum(below, axis=0)
        if e == 0:
            tl.store(count_ptr + E, tl.min(lo, axis=0))
            tl.store(count_ptr + E + 1, tl.max(hi, axis=0))
    first = carry
    for b in range(0, TOTAL, BLOCK):
        off, ok, v, hit = _candidates(routing_ptr, b, e, TOTAL, SLOTS, COLUMN, BLOCK)
        h = hit.to(tl.int32)
        row = tl.cumsum(h, axis=0) - 1 + carry
        row = tl.where(hit & (row < num_out), row, -1)
        if COLUMN:
            tl.store(rows_ptr + off, row, mask=ok)
        else:
            # (e + 0 * h: the program id as a vector; the interpreter's scalar mask is not one)
            orphan = ok & ((v < 0) | (v >= E)) & (e + 0 * h == 0)
            tl.store(rows_ptr + off, row, mask=hit | orphan)
        carry += tl.sum(h, axis=0)
    if not COLUMN:
        tl.store(count_ptr + e, carry - first)


# Slots a map program scans per step.  Its programs (one per expert) walk the slots serially,
# so the step count sets the map kernels' device time: 4096 (8 warps) is 8 steps a pass at
# the bench's 32768 index slots where 1024 took 32.  Tests shrink it to cover the carry.
_MAP_BLOCK = 4096
_MAP_WARPS = 8


def _host_copy(counts: torch.Tensor) -> HostCopy | None:
    """The counts' copy to the host, started after the kernel that computes them (none while
    a CUDA graph is captured: nothing is read then)."""
    return None if capturing(counts) else HostCopy.start(counts)


def _launch_row_map(routing, map_type, num_experts: int, num_out_tokens: int | None,
                    prefetch: bool):
    """Launch the row-id map (moe_types' order) over the caller's routing as it is (no
    conversion ops): every slot's row, after a count kernel for a mask (an index map's rows
    kernel counts for itself).  Returns the rows, the device int64 per-expert counts (an
    index map's followed by the indices' min and max; None without slots), not read yet,
    and, with ``prefetch``, their copy to the host, started as soon as they are final (a
    mask's before its rows kernel; else None).  ``num_out_tokens`` None: every routed slot
    kept (no row reaches the routing's size)."""
    n, slots = routing.shape
    rows = torch.empty((n, slots), dtype=torch.int32, device=routing.device)
    if not routing.numel():
        return rows, None, None
    r = (routing.view(torch.uint8) if routing.dtype == torch.bool else routing).contiguous()
    column = map_type == MapType.MASK
    total = n if column else n * slots
    counts = torch.empty(num_experts + (0 if column else 2), dtype=torch.int64,
                         device=routing.device)
    keep = routing.numel() if num_out_tokens is None else num_out_tokens
    if column:
        _count_kernel[(num_experts,)](r, counts, total, slots, COLUMN=True, BLOCK=_MAP_BLOCK,
                                      num_warps=_MAP_WARPS)
        copy = _host_copy(counts) if prefetch else None
    else:
        copy = None
    _rows_kernel[(num_experts,)](r, counts, rows, total, slots, num_experts, keep,
                                 COLUMN=column, BLOCK=_MAP_BLOCK, BLOCK_E=_pow2(num_experts),
                                 num_warps=_MAP_WARPS)
    if not column and prefetch:
        copy = _host_copy(counts)
    return rows, counts, copy


def _blocks(h: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_H): up to 4096 elements a tile (registers on a GPU; few, large
    programs in the interpreter, whose cost is per program)."""
    bh = _block(h)
    return max(1, min(64, 4096 // bh)), bh


def _scatter(x: torch.Tensor | None, rows: torch.Tensor,
             num_out: int) -> torch.Tensor | None:
    """out[rows[t, s]] = x[t] for x (num_tokens, w) and rows (num_tokens, slots), bit for
    bit; out has num_out rows."""
    if x is None:
        return None
    out = torch.empty((num_out,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    n, h = x.shape[0], x.shape[1] if x.dim() > 1 else 1
    if n and h and num_out:
        xb = _rows_2d(x)
        ob = _bits(out).reshape(-1, h)
        br, bh = _blocks(h)
        grid = (_cdiv(n, br), _cdiv(h, bh))
        _scatter_rows_kernel[grid](xb, rows.contiguous(), ob, n, h, rows.shape[1], xb.stride(0),
                                   ob.stride(0), BLOCK_R=br, BLOCK_H=bh)
    return out


@functools.lru_cache(maxsize=64)
def _fill_bits(dtype: torch.dtype, fill: float) -> int:
    """The fill value's bit pattern (cached: a host tensor per call cost ~20 us on the H100
    machine's CPU, two per quantized unpermute)."""
    if dtype == torch.uint8:
        return int(fill)
    return int(_bits(torch.tensor([fill], dtype=dtype))[0])


def _rows_2d(t: torch.Tensor) -> torch.Tensor:
    """``t``'s rows as a 2-D same-width integer view (a 1-D tensor: one column)."""
    return _bits(t.contiguous()).reshape(t.shape[0], t.shape[1] if t.dim() > 1 else 1)


def _gather(x: torch.Tensor | None, src, fill: float = 0.0):
    """out[i] = x[src[i]], or ``fill`` where src[i] == -1, bit for bit.  ``src``: host ints,
    or a device (n, slots) int tensor whose row i holds output row i's source among -1s (a
    row-id map)."""
    return _gather_with_scales(x, src, None, fill=fill)[0]


def _gather_with_scales(x: torch.Tensor | None, src, scales: torch.Tensor | None,
                        scale_fill: float = 0.0, fill: float = 0.0):
    """(_gather(x, src, fill), _gather(scales, src, scale_fill)): a quantized tensor's codes
    and row scales in one launch where the scale rows fit one column block (a Triton launch
    cost ~50 us of host time on the H100 machine, more than the kernel at 16384 x 4096)."""
    if x is None:
        return None, None if scales is None else _gather(scales, src, scale_fill)
    n, slots = (len(src), 1) if isinstance(src, list) else tuple(src.shape)
    out = torch.empty((n,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    h = x.shape[1] if x.dim() > 1 else 1
    hy = 0 if scales is None else (scales.shape[1] if scales.dim() > 1 else 1)
    # one program's scale tile (its BLOCK_R rows) stays within a tile's 4096 elements
    fused = bool(scales is not None and n and h and slots and 0 < hy
                 and _blocks(h)[0] * _block(hy) <= 4096)
    out_y = None
    if scales is not None and not fused:
        out_y = _gather(scales, src, scale_fill)
    if n and h and slots:
        xb = _rows_2d(x)
        ob = _bits(out).reshape(-1, h)
        s = torch.tensor(src, dtype=torch.int64, device=x.device) if isinstance(src, list) \
            else src.contiguous()
        y_args = (xb, ob, 0, 0, 0, 0)
        if fused:
            out_y = torch.empty((n,) + tuple(scales.shape[1:]), dtype=scales.dtype,
                                device=scales.device)
            yb = _rows_2d(scales)
            oyb = _bits(out_y).reshape(-1, hy)
            y_args = (yb, oyb, hy, _fill_bits(scales.dtype, scale_fill), yb.stride(0),
                      oyb.stride(0))
        br, bh = _blocks(h)
        _gather_rows_kernel[(_cdiv(n, br), _cdiv(h, bh))](
            xb, s, ob, n, h, slots, _fill_bits(x.dtype, fill), xb.stride(0), ob.stride(0),
            *y_args, BLOCK_R=br, BLOCK_H=bh, WITH_Y=fused, BLOCK_HY=_block(hy))
    elif n and h:  # no slots: every row is a fill row
        _bits(out).fill_(_fill_bits(x.dtype, fill))
    return out, out_y


def _kept(counts: torch.Tensor | None, copy: HostCopy | None, map_type, num_experts: int,
          num_out_tokens):
    """(kept per expert, num_out_tokens): the counts left pending (PendingCounts) where
    num_out_tokens is given; read here where it is not (a checked mask's default: the count
    sizes the output, the call's one read-back)."""
    if counts is None:
        return (0,) * num_experts, num_out_tokens or 0
    if num_out_tokens is None:
        kept = tuple((counts if copy is None else copy).tolist()[:num_experts])
        return kept, sum(kept)
    return PendingCounts(counts, num_out_tokens, map_type == MapType.INDEX, copy), \
        num_out_tokens


@BACKEND.implements(Op.MOE_PERMUTE, dtypes=MOVABLE, devices=DEVICES, numerics=_NUMERICS)
@takes_unchecked_routing
def moe_permute(x, routing, *, map_type, num_experts, num_out_tokens, probs, scale_inv,
                prefetch_counts=False):
    # the counts' host copy costs a device copy between the map and the scatters: only
    # where they are read right away (the front end's check, or here: a mask's output size)
    prefetch = prefetch_counts or num_out_tokens is None
    rows, counts, copy = _launch_row_map(routing, map_type, num_experts, num_out_tokens,
                                         prefetch)
    kept, num_out_tokens = _kept(counts, copy, map_type, num_experts, num_out_tokens)
    out = _scatter(x, rows, num_out_tokens)
    # A token's probs are one (slots,) row; each kept slot's value goes to its own row.
    probs_out = None if probs is None else \
        _scatter(probs.reshape(-1, 1), rows.reshape(-1, 1), num_out_tokens).reshape(-1)
    scales_out = _scatter(scale_inv, rows, num_out_tokens)
    return out, RowIdMap(rows, map_type, num_experts, num_out_tokens, kept), probs_out, \
        scales_out


def _is_bf16(t) -> bool:
    return t is not None and t.dtype == torch.bfloat16


@BACKEND.implements(Op.MOE_UNPERMUTE, dtypes=MOVABLE, devices=DEVICES, numerics=_NUMERICS)
def moe_unpermute(permuted, row_id_map, *, merging_probs, scale_inv, scale_fill):
    if permuted.dtype not in FLOATS:  # codes (with row scales): moved, never summed
        return _gather_with_scales(permuted, row_id_map.rows, scale_inv, scale_fill)
    n, h = row_id_map.num_tokens, permuted.shape[1]
    out = torch.empty((n, h), dtype=permuted.dtype, device=permuted.device)
    if n and h:
        x = permuted.contiguous()
        p = merging_probs.contiguous() if merging_probs is not None else x
        br, bh = _blocks(h)
        grid = (_cdiv(n, br), _cdiv(h, bh))
        _unpermute_kernel[grid](as_kernel_arg(x), row_id_map.rows.contiguous(),
                                as_kernel_arg(p), as_kernel_arg(out), n, h, row_id_map.slots,
                                x.stride(0), out.stride(0),
                                WITH_PROBS=merging_probs is not None,
                                IS_BF16=_is_bf16(x), PROBS_BF16=_is_bf16(merging_probs),
                                BLOCK_R=br, BLOCK_H=bh)
    return out, None


@BACKEND.implements(Op.MOE_UNPERMUTE_BWD, dtypes=FLOATS, devices=DEVICES, numerics=_NUMERICS)
def moe_unpermute_bwd(grad_out, row_id_map, *, permuted, merging_probs):
    if merging_probs is None:  # the transposed scatter of a plain sum is permute's scatter
        return _scatter(grad_out, row_id_map.rows, row_id_map.num_out_tokens), None
    h = grad_out.shape[1]
    grad_permuted = torch.empty((row_id_map.num_out_tokens, h), dtype=grad_out.dtype,
                                device=grad_out.device)
    grad_probs = torch.zeros_like(merging_probs)
    if row_id_map.num_tokens:
        dy, x, p = grad_out.contiguous(), permuted.contiguous(), merging_probs.contiguous()
        gp = grad_probs.contiguous()
        n = row_id_map.num_tokens
        br, bh = _blocks(h)
        _unpermute_bwd_kernel[(_cdiv(n, br),)](
            as_kernel_arg(dy), as_kernel_arg(x), row_id_map.rows.contiguous(), as_kernel_arg(p),
            as_kernel_arg(grad_permuted), as_kernel_arg(gp), n, h, row_id_map.slots,
            dy.stride(0), x.stride(0), grad_permuted.stride(0),
            IS_BF16=_is_bf16(dy), PROBS_BF16=_is_bf16(p), BLOCK_R=br, BLOCK_H=bh)
        grad_probs = gp
    return grad_permuted, grad_probs


@BACKEND.implements(Op.MOE_SORT_CHUNKS, dtypes=MOVABLE, devices=DEVICES, numerics=_NUMERICS)
def moe_sort_chunks(x, *, split_sizes, sorted_index, probs, scale_inv):
    src = chunk_source_rows(split_sizes, sorted_index)
    probs_out = None if probs is None else _gather(probs.reshape(-1, 1), src).reshape(-1)
    out, scales_out = _gather_with_scales(x, src, scale_inv)
    return out, probs_out, scales_out


@BACKEND.implements(Op.MOE_PAD_ROWS, dtypes=MOVABLE, devices=DEVICES, numerics=_NUMERICS)
def moe_pad_rows(x, *, splits, align, scale_inv, scale_fill):
    src = pad_source_rows(splits, align)
    return _gather_with_scales(x, src, scale_inv, scale_fill)


@BACKEND.implements(Op.MOE_UNPAD_ROWS, dtypes=MOVABLE, devices=DEVICES, numerics=_NUMERICS)
def moe_unpad_rows(x, *, splits, align, scale_inv):
    src = unpad_source_rows(splits, align)
    return _gather_with_scales(x, src, scale_inv)
