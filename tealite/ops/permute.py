"""MoE token permutation: TE's ``moe_permute`` / ``moe_permute_with_probs`` / ``moe_unpermute``
(forward and backward), ``moe_sort_chunks_by_index`` and the per-expert row padding of
``Fp8Padding`` / ``Fp8Unpadding``.

Routing, the permuted order, dropped tokens and the row-id map (:class:`RowIdMap`) are
defined once in tealite/moe_types.py.  In short: the routed (token, slot) pairs are sorted by
(expert, token, slot); the first ``num_out_tokens`` of them are kept.

* ``moe_permute(x, routing, map_type=, num_experts=, num_out_tokens=, probs=,
  check_values=)`` -> ``Permuted``: ``out[rows[t, s]] = x[t]`` for every kept slot,
  ``probs_out[rows[t, s]] = probs[t, s]`` (``probs`` shaped like the slots), and the row-id
  map.  Pure data movement: exact.  ``check_values=False``: the caller vouches for the
  routing's values (no read-back; see the function).
* ``moe_unpermute(permuted, row_id_map, merging_probs=)`` -> (num_tokens, hidden):
  ``out[t] = sum_s p[t, s] * permuted[rows[t, s]]`` over the kept slots in slot order
  (``p = 1`` without merging probs), products and sum in fp32, one rounding into permuted's
  dtype; a token with no kept slot gets zeros.
* ``moe_unpermute_bwd(grad_out, row_id_map, permuted=, merging_probs=)`` -> ``UnpermuteGrads``:
  ``grad_permuted[rows[t, s]] = p[t, s] * grad_out[t]`` (fp32 product, rounded to grad_out's
  dtype; a copy without probs), and with merging probs ``grad_probs[t, s] =
  sum_h grad_out[t, h] * permuted[rows[t, s], h]`` (fp32 sum, rounded to the probs' dtype;
  0 where the slot has no row).  ``permuted`` is the forward's input (needed for grad_probs).
* ``moe_sort_chunks(x, split_sizes, sorted_index, probs=)`` -> ``SortedChunks``: x cut into
  consecutive chunks of ``split_sizes`` rows, written in the order ``sorted_index`` names
  (a permutation of the chunk ids); probs (one per row) move with their rows.
* ``moe_pad_rows(x, splits, align)`` -> ``PaddedRows``: each group of ``splits`` rows followed
  by zero rows up to a multiple of ``align`` (16 or 128 for FP8 GEMMs); ``moe_unpad_rows``
  drops them again.  ``moe_permute_and_pad`` composes permute and pad into one ``Permuted``
  whose row-id map points into the padded rows (what unpermute then takes).

Quantized inputs (``permute``, ``sort_chunks``, ``pad`` / ``unpad`` take a
:class:`QuantizedTensor`): the rowwise codes move by rows and so do their scales when they
are per row (per-row FP8 ``(M,)``, 1x128 blocks ``(M, ceil(K/128))``, MX ``(M, ceil(K/32))``),
exactly; a per-tensor scale is kept.  Padding rows get code 0 and scale 1 (fp32 1.0, E8M0
byte 127), so they dequantize to 0.  ``unpermute`` takes one without merging probs where no
token has two kept rows (top-1 routing): a move too, a token without a row getting a padding
row; summing rows (top-k > 1, or probs) would requantize, and TE's ``moe_unpermute`` forward
refuses quantized inputs altogether, so those are refused naming the argument.  Refused: columnwise data (the codes of x.T cannot move
by x's rows), 128x128 blocks (128 rows share a scale).  The result's ``amax`` is None (the
amax described the tensor before rows were dropped or added).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import tealite.recipes as R
import tealite.registry as registry
from tealite._checks import FLOAT_DTYPES, capturing, check_same_device, check_tensor, require
from tealite.moe_types import (MapType, RowIdMap, check_splits, padded_splits, slot_experts,
                               split_offsets)
from tealite.types import Op, QuantizedTensor

_INDEX_DTYPES = (torch.int32, torch.int64)
_MASK_DTYPES = (torch.bool, torch.int32, torch.int64, torch.uint8)
_PROBS_DTYPES = FLOAT_DTYPES
# E8M0 byte of 2^0: a padding row's MX scale (its zero codes dequantize to 0 either way).
E8M0_ONE = 127


@dataclass(frozen=True)
class Permuted:
    """``moe_permute``'s result: the permuted rows (a tensor, or a QuantizedTensor when x was
    one), the row-id map, and the permuted probs (num_out_tokens,) or None."""

    out: torch.Tensor | QuantizedTensor
    row_id_map: RowIdMap
    probs: torch.Tensor | None


@dataclass(frozen=True)
class UnpermuteGrads:
    grad_permuted: torch.Tensor
    grad_probs: torch.Tensor | None


@dataclass(frozen=True)
class SortedChunks:
    out: torch.Tensor | QuantizedTensor
    probs: torch.Tensor | None


@dataclass(frozen=True)
class PaddedRows:
    """Padded (or unpadded) rows and the splits they now have."""

    out: torch.Tensor | QuantizedTensor
    splits: tuple[int, ...]


# ---- quantized inputs: codes plus the scales that move with them ---------------------------

@dataclass(frozen=True)
class _Rows:
    """What moves by rows: the 2-D values (or codes) and row-indexed scales, or None."""

    data: torch.Tensor
    scale_inv: torch.Tensor | None
    q: QuantizedTensor | None


def _rows_of(name: str, x) -> _Rows:
    if not isinstance(x, QuantizedTensor):
        check_tensor(name, x, ndim=2)
        return _Rows(x, None, None)
    require(x.data is not None, f"{name} is a QuantizedTensor without rowwise data: only "
                                f"rowwise codes can move by rows")
    require(x.columnwise_data is None,
            f"{name} has columnwise data (the codes of x.T, stored (K, M)): it cannot move by "
            f"x's rows; quantize with rowwise=True, columnwise=False, and requantize the "
            f"permuted tensor columnwise")
    check_tensor(f"{name}.data", x.data, ndim=2, dtypes=None)
    gran = x.recipe.scale_granularity
    m = x.data.shape[0]
    if gran is R.Granularity.TENSOR:
        return _Rows(x.data, None, x)
    if gran is R.Granularity.BLOCK:
        require(tuple(x.recipe.block)[0] == 1,
                f"{name}: {tuple(x.recipe.block)} blocks share one scale across "
                f"{x.recipe.block[0]} rows, so rows cannot move alone; use 1x128 blocks "
                f"(TE's activation recipe)")
    scales = x.scale_inv.reshape(-1, 1) if gran is R.Granularity.ROW else x.scale_inv
    require(scales.dim() == 2 and scales.shape[0] == m,
            f"{name}.scale_inv must have one row per code row ({m}), got shape "
            f"{tuple(x.scale_inv.shape)}")
    return _Rows(x.data, scales, x)


def _scale_fill(rows: _Rows) -> float:
    """The scale of a padding row: 1 (fp32 1.0, or the E8M0 byte of 2^0)."""
    return float(E8M0_ONE) if rows.scale_inv is not None and \
        rows.scale_inv.dtype == torch.uint8 else 1.0


def _rebuild(rows: _Rows, data: torch.Tensor, scale_inv):
    if rows.q is None:
        return data
    q = rows.q
    if scale_inv is not None and q.recipe.scale_granularity is R.Granularity.ROW:
        scale_inv = scale_inv.reshape(-1)
    return replace(q, shape=(data.shape[0], q.shape[-1]), data=data,
                   scale_inv=q.scale_inv if scale_inv is None else scale_inv, amax=None)


def _base_params(rows: _Rows, device) -> dict:
    return dict(dtype=rows.data.dtype, hidden=rows.data.shape[1],
                quantized=rows.q is not None,
                recipe=rows.q.recipe if rows.q is not None else None,
                scale_dtype=None if rows.scale_inv is None else rows.scale_inv.dtype,
                device=registry.device_kind(device))


def _check_probs(name: str, probs, shape: tuple) -> None:
    if probs is None:
        return
    check_tensor(name, probs, ndim=len(shape), dtypes=_PROBS_DTYPES)
    require(tuple(probs.shape) == shape,
            f"{name} must have shape {shape} (one per slot), got {tuple(probs.shape)}")


def _int(name: str, v, lo: int) -> int:
    require(isinstance(v, int) and not isinstance(v, bool) and v >= lo,
            f"{name} must be an int >= {lo}, got {v!r}")
    return v


# ---- permute ------------------------------------------------------------------------------

def _routed_count(routing: torch.Tensor, map_type: MapType) -> int:
    """The routed slots: every index slot; a mask's nonzeros (one reduction and one read for
    a bool mask, which sums as it is)."""
    if map_type == MapType.INDEX:
        return routing.numel()
    return int((routing if routing.dtype == torch.bool else routing != 0).sum())


def _check_routing(routing, map_type: MapType, num_tokens: int, num_experts) -> int:
    if map_type == MapType.MASK:
        check_tensor("routing_map", routing, ndim=2, dtypes=_MASK_DTYPES)
        require(routing.shape[0] == num_tokens,
                f"routing_map must have one row per token ({num_tokens}), got shape "
                f"{tuple(routing.shape)}")
        require(num_experts is None or num_experts == routing.shape[1],
                f"num_experts ({num_experts}) must equal routing_map's columns "
                f"{routing.shape[1]}")
        require(routing.shape[1] >= 1, "routing_map must have at least one expert column")
        return routing.shape[1]
    check_tensor("indices", routing, ndim=2, dtypes=_INDEX_DTYPES)
    require(routing.shape[0] == num_tokens,
            f"indices must have one row per token ({num_tokens}), got shape "
            f"{tuple(routing.shape)}")
    return _int("num_experts", num_experts, 1)


def _index_bounds(routing, map_type: MapType) -> torch.Tensor | None:
    """The indices' (min, max), launched but not read yet (None: nothing to check -- a mask,
    no slots, or a CUDA-graph capture, where a read-back is illegal)."""
    if map_type == MapType.MASK or not routing.numel() or capturing(routing):
        return None
    return torch.stack(torch.aminmax(routing))


def _check_index_bounds(bounds, num_experts: int) -> None:
    """The indices' (min, max), a device pair or host ints, must lie in [0, num_experts)."""
    if bounds is None:
        return
    lo, hi = bounds.tolist() if isinstance(bounds, torch.Tensor) else bounds
    require(0 <= lo and hi < num_experts,
            f"indices must lie in [0, num_experts = {num_experts}), got values in [{lo}, {hi}]")


def _check_num_out(num_out_tokens: int, routed: int) -> None:
    require(num_out_tokens <= routed,
            f"num_out_tokens ({num_out_tokens}) must be <= the routed slots ({routed})")


def _out_tokens(routing, map_type: MapType, num_out_tokens, check_values: bool):
    """(num_out_tokens, routed) known without a read-back: an index map's routed slots are
    all of them; a mask's are a read-back (routed None), and so is its default num_out_tokens
    (None) unless the caller gives it (required with ``check_values=False``)."""
    if num_out_tokens is not None:
        _int("num_out_tokens", num_out_tokens, 0)
    if map_type == MapType.INDEX:
        routed = routing.numel()
        num_out_tokens = routed if num_out_tokens is None else num_out_tokens
        _check_num_out(num_out_tokens, routed)
        return num_out_tokens, routed
    require(check_values or num_out_tokens is not None,
            "num_out_tokens is required with check_values=False for a routing mask "
            "(counting its routed slots reads the mask back, a device sync)")
    return num_out_tokens, None


def _check_before(routing, map_type: MapType, num_out_tokens, num_experts: int) -> int:
    """The value checks for a backend that needs them before it runs: the indices' range,
    a mask's routed count (num_out_tokens' default; one read-back each).  Returns
    num_out_tokens."""
    if map_type == MapType.INDEX:
        _check_index_bounds(_index_bounds(routing, map_type), num_experts)
        return num_out_tokens
    routed = _routed_count(routing, map_type)
    num_out_tokens = routed if num_out_tokens is None else num_out_tokens
    _check_num_out(num_out_tokens, routed)
    return num_out_tokens


def _check_after(row_map: RowIdMap, routing, num_out_tokens) -> None:
    """The value checks from the counts a ``takes_unchecked_routing`` backend left in its map,
    read once after its launches: the indices' bounds; a given num_out_tokens against the
    mask's routed count (the kept rows fall short of it exactly when it exceeds them).
    Nothing is read while capturing a CUDA graph (the eager call before has checked)."""
    if capturing(routing):
        return
    bounds = row_map.settle()
    if row_map.map_type == MapType.INDEX:
        if bounds is None:  # a map that carried none: the check of its own (no slots: none)
            bounds = _index_bounds(routing, MapType.INDEX)
        _check_index_bounds(bounds, row_map.num_experts)
    elif num_out_tokens is not None:
        _check_num_out(num_out_tokens, sum(row_map.tokens_per_expert))


def moe_permute(x, routing, *, map_type: str = "mask", num_experts: int | None = None,
                num_out_tokens: int | None = None, probs=None, check_values: bool = True,
                backend: str | None = None) -> Permuted:
    """Group tokens by expert (module docstring).  ``routing``: the mask (num_tokens, E) or the
    indices (num_tokens, topk) with ``num_experts``; ``num_out_tokens`` (default: every routed
    slot) keeps only that many rows; ``probs`` (shaped like the slots) are permuted along.

    ``check_values=False`` skips the checks that read the routing's values back to the host
    (a device sync): indices in [0, num_experts) and, for a mask, num_out_tokens <= its
    routed slots (num_out_tokens is then required).  The caller vouches for both, as TE's
    ``moe_permute`` assumes; with the map's ``tokens_per_expert`` left unread the call then
    need not sync at all (triton).  Out-of-range indices are undefined then (triton gives
    them no row).  With the checks, triton syncs once, after its launches (the counts and
    the bounds in one read; ``tokens_per_expert`` is then known), or for a mask without
    num_out_tokens once before its data moves (the count sizes the output)."""
    require(map_type in tuple(m.value for m in MapType),
            f"map_type must be one of {tuple(m.value for m in MapType)}, got {map_type!r}")
    require(isinstance(check_values, bool), f"check_values must be a bool, got {check_values!r}")
    mt = MapType(map_type)
    rows = _rows_of("x", x)
    n = rows.data.shape[0]
    experts = _check_routing(routing, mt, n, num_experts)
    _check_probs("probs", probs, tuple(routing.shape))
    given = num_out_tokens
    num_out_tokens, routed = _out_tokens(routing, mt, num_out_tokens, check_values)
    device = check_same_device(x=rows.data, routing=routing, probs=probs)
    params = dict(_base_params(rows, device), map_type=mt.value, num_tokens=n,
                  num_experts=experts, slots=routing.shape[1], num_out_tokens=num_out_tokens,
                  routed=routed, with_probs=probs is not None)
    impl = registry.dispatch(Op.MOE_PERMUTE, params, backend)
    after = check_values and getattr(impl.fn, "takes_unchecked_routing", False)
    if check_values and not after:
        num_out_tokens = _check_before(routing, mt, num_out_tokens, experts)
    # a backend checked after takes the hint that its counts are read right after the call
    hint = dict(prefetch_counts=True) if after else {}
    out, row_map, probs_out, scale_out = impl.fn(
        rows.data, routing, map_type=mt, num_experts=experts, num_out_tokens=num_out_tokens,
        probs=probs, scale_inv=rows.scale_inv, **hint)
    if after:
        _check_after(row_map, routing, given)
    return Permuted(_rebuild(rows, out, scale_out), row_map, probs_out)


# ---- unpermute and its backward ------------------------------------------------------------

def _check_row_map(row_id_map) -> None:
    require(isinstance(row_id_map, RowIdMap),
            f"row_id_map must be the RowIdMap moe_permute returned, got "
            f"{type(row_id_map).__name__}")


def _check_one_row_per_token(row_id_map: RowIdMap) -> None:
    """A quantized unpermute is a move: no token may have two kept rows (their sum would need
    requantizing).  Static for one slot; else one reduction read back (skipped while capturing
    a CUDA graph, where the eager call before has checked it)."""
    rows = row_id_map.rows
    if row_id_map.slots <= 1 or not rows.numel() or capturing(rows):
        return
    most = int((rows >= 0).sum(dim=1).max())
    require(most <= 1,
            f"permuted is a QuantizedTensor, so each token may have at most one kept row (a "
            f"move of codes and scales); row_id_map gives a token {most} rows, whose sum would "
            f"need requantizing (TE's moe_unpermute forward refuses quantized inputs): route "
            f"top-1, or dequantize permuted first")


def _unpermute_quantized(permuted: QuantizedTensor, row_id_map: RowIdMap, merging_probs,
                         backend) -> QuantizedTensor:
    """Unpermute without probs of rowwise codes with their row scales: each token gets its one
    kept row's codes and scales, or code 0 and scale 1 (a zero row) when it has none."""
    require(merging_probs is None,
            "merging_probs must be None when permuted is a QuantizedTensor: weighting and "
            "summing a token's rows needs requantizing them (TE's moe_unpermute forward "
            "refuses quantized inputs); dequantize permuted first")
    rows = _rows_of("permuted", permuted)
    require(rows.data.shape[0] == row_id_map.num_out_tokens,
            f"permuted must have row_id_map.num_out_tokens = {row_id_map.num_out_tokens} "
            f"rows, got {rows.data.shape[0]}")
    _check_one_row_per_token(row_id_map)
    device = check_same_device(permuted=rows.data, row_id_map=row_id_map.rows)
    params = dict(_base_params(rows, device), num_tokens=row_id_map.num_tokens,
                  slots=row_id_map.slots, num_out_tokens=row_id_map.num_out_tokens,
                  map_type=row_id_map.map_type.value, with_probs=False)
    impl = registry.dispatch(Op.MOE_UNPERMUTE, params, backend)
    out, scale_out = impl.fn(rows.data, row_id_map, merging_probs=None,
                             scale_inv=rows.scale_inv, scale_fill=_scale_fill(rows))
    return _rebuild(rows, out, scale_out)


def moe_unpermute(permuted, row_id_map: RowIdMap, *, merging_probs=None,
                  backend: str | None = None) -> torch.Tensor | QuantizedTensor:
    """Scatter the permuted rows back to their tokens, summing a token's slots (weighted by
    ``merging_probs`` when given); a QuantizedTensor moves instead (module docstring)."""
    _check_row_map(row_id_map)
    if isinstance(permuted, QuantizedTensor):
        return _unpermute_quantized(permuted, row_id_map, merging_probs, backend)
    check_tensor("permuted", permuted, ndim=2)
    require(permuted.shape[0] == row_id_map.num_out_tokens,
            f"permuted must have row_id_map.num_out_tokens = {row_id_map.num_out_tokens} "
            f"rows, got {permuted.shape[0]}")
    _check_probs("merging_probs", merging_probs, tuple(row_id_map.rows.shape))
    device = check_same_device(permuted=permuted, row_id_map=row_id_map.rows,
                               merging_probs=merging_probs)
    params = dict(_base_params(_Rows(permuted, None, None), device),
                  num_tokens=row_id_map.num_tokens, slots=row_id_map.slots,
                  num_out_tokens=row_id_map.num_out_tokens,
                  map_type=row_id_map.map_type.value, with_probs=merging_probs is not None)
    impl = registry.dispatch(Op.MOE_UNPERMUTE, params, backend)
    return impl.fn(permuted, row_id_map, merging_probs=merging_probs, scale_inv=None,
                   scale_fill=None)[0]


def moe_unpermute_bwd(grad_out, row_id_map: RowIdMap, *, permuted=None, merging_probs=None,
                      backend: str | None = None) -> UnpermuteGrads:
    """The gradients of ``moe_unpermute`` w.r.t. its permuted input and its merging probs."""
    _check_row_map(row_id_map)
    check_tensor("grad_out", grad_out, ndim=2)
    require(grad_out.shape[0] == row_id_map.num_tokens,
            f"grad_out must have one row per token ({row_id_map.num_tokens}), got "
            f"{grad_out.shape[0]}")
    _check_probs("merging_probs", merging_probs, tuple(row_id_map.rows.shape))
    if merging_probs is not None:
        require(permuted is not None,
                "permuted (the forward's input) is needed for the merging probs' gradient")
        check_tensor("permuted", permuted, ndim=2)
        require(tuple(permuted.shape) == (row_id_map.num_out_tokens, grad_out.shape[1]),
                f"permuted must have shape {(row_id_map.num_out_tokens, grad_out.shape[1])}, "
                f"got {tuple(permuted.shape)}")
        require(permuted.dtype == grad_out.dtype,
                f"permuted dtype {permuted.dtype} must match grad_out's {grad_out.dtype}")
    device = check_same_device(grad_out=grad_out, row_id_map=row_id_map.rows,
                               permuted=permuted, merging_probs=merging_probs)
    params = dict(dtype=grad_out.dtype, hidden=grad_out.shape[1],
                  num_tokens=row_id_map.num_tokens, slots=row_id_map.slots,
                  num_out_tokens=row_id_map.num_out_tokens,
                  map_type=row_id_map.map_type.value, with_probs=merging_probs is not None,
                  device=registry.device_kind(device))
    impl = registry.dispatch(Op.MOE_UNPERMUTE_BWD, params, backend)
    grad_permuted, grad_probs = impl.fn(grad_out, row_id_map, permuted=permuted,
                                        merging_probs=merging_probs)
    return UnpermuteGrads(grad_permuted, grad_probs)


# ---- sort chunks, pad / unpad --------------------------------------------------------------

def moe_sort_chunks(x, split_sizes, sorted_index, *, probs=None,
                    backend: str | None = None) -> SortedChunks:
    """Reorder consecutive chunks of rows (TE's ``moe_sort_chunks_by_index``)."""
    rows = _rows_of("x", x)
    n = rows.data.shape[0]
    splits = check_splits("split_sizes", split_sizes, n)
    if isinstance(sorted_index, torch.Tensor):
        require(sorted_index.dim() == 1 and not sorted_index.is_floating_point(),
                f"sorted_index must be a 1-D integer tensor, got {sorted_index.dtype} "
                f"{tuple(sorted_index.shape)}")
        sorted_index = sorted_index.tolist()
    order = tuple(sorted_index)
    require(sorted(order) == list(range(len(splits))),
            f"sorted_index must be a permutation of the chunk ids 0..{len(splits) - 1}, got "
            f"{list(order)}")
    _check_probs("probs", probs, (n,))
    device = check_same_device(x=rows.data, probs=probs)
    params = dict(_base_params(rows, device), num_tokens=n, chunks=len(splits),
                  with_probs=probs is not None)
    impl = registry.dispatch(Op.MOE_SORT_CHUNKS, params, backend)
    out, probs_out, scale_out = impl.fn(rows.data, split_sizes=splits, sorted_index=order,
                                        probs=probs, scale_inv=rows.scale_inv)
    return SortedChunks(_rebuild(rows, out, scale_out), probs_out)


def _pad_args(x, splits, align):
    rows = _rows_of("x", x)
    _int("align", align, 1)
    return rows, align


def moe_pad_rows(x, splits, align: int = 16, *, backend: str | None = None) -> PaddedRows:
    """Zero rows after each group up to a multiple of ``align`` (TE's ``Fp8Padding``)."""
    rows, align = _pad_args(x, splits, align)
    splits = check_splits("splits", splits, rows.data.shape[0])
    device = check_same_device(x=rows.data)
    params = dict(_base_params(rows, device), num_tokens=rows.data.shape[0],
                  groups=len(splits), align=align)
    impl = registry.dispatch(Op.MOE_PAD_ROWS, params, backend)
    out, scale_out = impl.fn(rows.data, splits=splits, align=align, scale_inv=rows.scale_inv,
                             scale_fill=_scale_fill(rows))
    return PaddedRows(_rebuild(rows, out, scale_out), padded_splits(splits, align))


def _unpadded_splits(splits) -> tuple[int, ...]:
    """unpad's splits checked against their own sum (the padded x does not give it)."""
    as_list = splits.tolist() if isinstance(splits, torch.Tensor) and splits.dim() == 1 \
        else splits
    total = sum(as_list) if isinstance(as_list, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in as_list) else -1
    return check_splits("splits", splits, total)


def moe_unpad_rows(x, splits, align: int = 16, *, backend: str | None = None) -> PaddedRows:
    """Drop ``moe_pad_rows``' padding: ``splits`` are the unpadded group sizes."""
    rows, align = _pad_args(x, splits, align)
    splits = _unpadded_splits(splits)
    total = sum(padded_splits(splits, align))
    require(rows.data.shape[0] == total,
            f"x must have the padded row count {total} (splits {list(splits)} rounded up to "
            f"align {align}), got {rows.data.shape[0]}")
    device = check_same_device(x=rows.data)
    params = dict(_base_params(rows, device), num_tokens=sum(splits), groups=len(splits),
                  align=align)
    impl = registry.dispatch(Op.MOE_UNPAD_ROWS, params, backend)
    out, scale_out = impl.fn(rows.data, splits=splits, align=align, scale_inv=rows.scale_inv)
    return PaddedRows(_rebuild(rows, out, scale_out), splits)


def moe_permute_and_pad(x, routing, align: int = 16, *, map_type: str = "mask",
                        num_experts: int | None = None, num_out_tokens: int | None = None,
                        probs=None, backend: str | None = None) -> Permuted:
    """``moe_permute`` then ``moe_pad_rows`` of each expert's rows to a multiple of ``align``
    (TE's ``moe_permute_and_pad_with_probs``; the FP8 grouped GEMMs' 16 / 128 alignment), as
    one result whose row-id map points into the padded rows: ``num_out_tokens`` is the padded
    total and ``tokens_per_expert`` the padded splits (the grouped GEMM's m_splits), so
    ``moe_unpermute`` / ``moe_unpermute_bwd`` take the padded tensor as it is (padding rows are
    no slot's row).  Permuted probs are padded with 0."""
    _int("align", align, 1)
    p = moe_permute(x, routing, map_type=map_type, num_experts=num_experts,
                    num_out_tokens=num_out_tokens, probs=probs, backend=backend)
    m = p.row_id_map
    splits = m.tokens_per_expert
    padded = moe_pad_rows(p.out, splits, align, backend=backend)
    probs_out = None if p.probs is None else \
        moe_pad_rows(p.probs.reshape(-1, 1), splits, align, backend=backend).out.reshape(-1)
    # A kept row of expert e moves down by the padding of the experts before it.
    shift = torch.tensor([a - b for a, b in zip(split_offsets(padded.splits),
                                                split_offsets(splits))][:-1] or [0],
                         dtype=torch.int64, device=m.rows.device)
    experts = slot_experts(routing, m.map_type, m.num_experts).clamp(min=0)
    rows = torch.where(m.rows >= 0, m.rows.to(torch.int64) + shift[experts], -1)
    row_map = RowIdMap(rows.to(torch.int32), m.map_type, m.num_experts,
                       sum(padded.splits), padded.splits)
    return Permuted(padded.out, row_map, probs_out)


__all__ = ["moe_permute", "moe_permute_and_pad", "moe_unpermute", "moe_unpermute_bwd",
           "moe_sort_chunks", "moe_pad_rows", "moe_unpad_rows", "Permuted", "UnpermuteGrads",
           "SortedChunks", "PaddedRows"]
