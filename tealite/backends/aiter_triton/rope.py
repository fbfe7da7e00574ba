"""AITER's Triton RoPE (``aiter/ops/triton/rope.py``) as tealite's ``rope_fwd`` / ``rope_bwd``.

AITER names the rotation by its ``rotate_style``: ``NEOX`` rotates halves,
``(-x[h:], x[:h])`` (its ``_get_neox_rotated_x``: negate the second half, flip each half,
flip the whole row), which is TE's ``interleaved=False``; ``GPTJ`` rotates pairs,
``(-x[2k+1], x[2k])``, TE's ``interleaved=True``.  Its kernels read one angle per element
(``REUSE_FREQS_FRONT_PART=False``: freqs (s, 1, 1, d2) as TE gives them, angle ``k`` for
element ``k``) and backward applies ``x cos + rotate^T(x sin)``: the transpose of forward for
any table, as tealite defines it.

Entry points, each covering exactly the cases below (everything else is refused with the
reason in ``check``):

* ``rope_fwd`` / ``rope_bwd`` (sbhd; bshd through a transposed view): positions 0..s-1, so
  no start positions and no context parallelism;
* ``rope_thd_fwd`` / ``rope_thd_bwd``: thd with cu_seqlens, positions restart at 0 per
  sequence, the same restrictions;
* ``rope_cached_positions_fwd`` / ``_bwd`` (sbhd, bshd) and
  ``rope_cached_thd_positions_2c_fwd`` / ``_bwd`` (thd; its second tensor, meant for k, is
  given t again and its result dropped): every other case.  They read cos / sin caches and a
  position per token; the adapter builds the caches as ``torch.cos`` / ``torch.sin`` of the
  float32 freqs (what the caller of a cached entry point does) and the positions with
  :func:`tealite.types.rope_positions` (start offsets, TE's two-chunk cp layout).

Limits of AITER's kernels (refused): the cached thd entry points with a head count that is
not a power of two (:data:`THD_2C_HEADS`: they write past the last head); the rotated width
is a ``tl.arange`` tile, so it must be a power of two; partial rotary only as ``d2 == d / 2``
(its ``HAVE_NOPE``: the tail is the other half).  bf16 under Triton's interpreter: AITER
rounds with ``.to()``, which the interpreter truncates (``norms.interpreter_bf16_reason``).

Numerics: fp32 math, ``x * cos + rotate(x) * sin`` (tiers/rotary.py's gamma_2), output
rounded by ``.to()``.  cos / sin: ``tl.cos`` / ``tl.sin`` in the plain entry points (numpy's
float32 in the interpreter, measured <= 1.2 units of 2^-24; on a GPU unmeasured here: if it
lowers to ``cos.approx.f32`` a long-context case shows it), torch's in the cached ones.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, NAME, kernels, why_missing
from tealite.backends.aiter_triton.norms import interpreter_bf16_reason
from tealite.types import Op, TensorFormat, rope_positions

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
NEOX, GPTJ = 0, 1  # AITER's RotateStyle values

_PLAIN = {"sbhd": "rope", "thd": "rope_thd"}
_CACHED = {"sbhd": "rope_cached_positions", "thd": "rope_cached_thd_positions_2c"}
ENTRY_POINTS = tuple(f"{base}_{d}" for base in (*_PLAIN.values(), *_CACHED.values())
                     for d in ("fwd", "bwd"))

for _entry in ENTRY_POINTS:
    declare(Contract(
        backend=NAME, entry_point=_entry,
        op=Op.ROPE_BWD if _entry.endswith("_bwd") else Op.ROPE_FWD,
        layouts=("x:(t,h,d)" if "thd" in _entry else "x:(s,b,h,d) strided",
                 "freqs:(s,1,1,d2) fp32" if "cached" not in _entry else "cos,sin:cache fp32"),
        notes="rotate_style NEOX = TE interleaved=False, GPTJ = interleaved=True; "
              "d2 a power of two, == d or d/2",
        extra={"trig": "torch cos/sin caches" if "cached" in _entry else "tl.cos / tl.sin",
               "positions": "given per token" if "cached" in _entry else "0.. per sequence"}))


# Read from AITER 0.1.7's _rope_kernel_thd_cached_2c_fwd / _bwd (the h == kh path) and shown
# by tests/test_aiter_rope.py through the in-place variant: the grid covers
# next_power_of_2(h) heads in SPLIT_H_SIZE groups and the head loop has no mask.
THD_2C_HEADS = ("AITER 0.1.7 bug: rope_cached_thd_positions_2c_* split the heads as if there "
                "were next_power_of_2(h) of them, with no head mask: with h not a power of two "
                "they read and write past the last head (out of bounds)")


def entry_point(params, *, backward: bool) -> str:
    fmt = "thd" if params["tensor_format"] == "thd" else "sbhd"
    shifted = params["cp_size"] > 1 or params["start_positions"]
    base = (_CACHED if shifted else _PLAIN)[fmt]
    return f"{base}_{'bwd' if backward else 'fwd'}"


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_for(backward: bool):
    def check(params) -> str | None:
        why = interpreter_bf16_reason(params["dtype"])
        if why is not None:
            return why
        d, d2 = params["d"], params["d2"]
        if not (d2 == d or 2 * d2 == d):
            return (f"AITER's rope kernels rotate the whole head or exactly its first half "
                    f"(HAVE_NOPE), got d2 = {d2} of d = {d}")
        if not _pow2(d2):
            return f"AITER's rope kernels tile the rotated width with tl.arange: d2 = {d2} " \
                   f"is not a power of two"
        entry = entry_point(params, backward=backward)
        if entry.startswith("rope_cached_thd") and not _pow2(params["heads"]):
            return THD_2C_HEADS
        return why_missing(entry)

    return check


def _numerics(backward: bool):
    def numerics(params) -> dict:
        return {"compute_dtype": torch.float32,
                "entry_point": entry_point(params, backward=backward)}

    return numerics


def _sbhd_view(t: torch.Tensor, tensor_format: TensorFormat) -> torch.Tensor:
    return t.transpose(0, 1) if tensor_format == TensorFormat.BSHD else t


def _positions(t, tensor_format, cu_seqlens, cp_size, cp_rank, start_positions):
    if tensor_format == TensorFormat.THD:
        cu = [int(v) for v in cu_seqlens.tolist()]
        lens = [(cu[i + 1] - cu[i]) // cp_size for i in range(len(cu) - 1)]
    else:
        s, b = _sbhd_view(t, tensor_format).shape[:2]
        lens = [s] * b
    starts = start_positions.tolist() if start_positions is not None else None
    return rope_positions(lens, cp_size=cp_size, cp_rank=cp_rank, starts=starts,
                          device=t.device), lens


def _run(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank, start_positions,
         *, backward: bool):
    at = kernels()
    style = GPTJ if interleaved else NEOX
    params = {"tensor_format": tensor_format.value, "cp_size": cp_size,
              "start_positions": start_positions is not None}
    name = entry_point(params, backward=backward)
    fn = getattr(at, name)
    f = freqs.contiguous()
    if t.numel() == 0:
        return torch.empty_like(t)
    if tensor_format == TensorFormat.THD:
        x = t.contiguous()
        if name.startswith("rope_thd"):
            return fn(x, cu_seqlens.contiguous(), f, style, False, False)
        pos, _ = _positions(t, tensor_format, cu_seqlens, cp_size, cp_rank, start_positions)
        f2 = f.reshape(f.shape[0], f.shape[-1])
        out, _ = fn(x, x, torch.cos(f2), torch.sin(f2), pos, style, False, False)
        return out
    x = _sbhd_view(t, tensor_format)
    if name.startswith("rope_cached"):
        pos, lens = _positions(t, tensor_format, cu_seqlens, cp_size, cp_rank, start_positions)
        pos_sb = pos.reshape(len(lens), x.shape[0]).t()  # (s, b), strided
        out = fn(x, torch.cos(f), torch.sin(f), pos_sb, style, False, False)
    else:
        out = fn(x, f, style, False, False)
    return _sbhd_view(out, tensor_format).contiguous()


@BACKEND.implements(Op.ROPE_FWD, dtypes=_FLOATS, devices=DEVICES, check=_check_for(False),
                    numerics=_numerics(False))
def rope_fwd(t, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _run(t, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                start_positions, backward=False)


@BACKEND.implements(Op.ROPE_BWD, dtypes=_FLOATS, devices=DEVICES, check=_check_for(True),
                    numerics=_numerics(True))
def rope_bwd(dy, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions):
    return _run(dy, freqs, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
                start_positions, backward=True)
