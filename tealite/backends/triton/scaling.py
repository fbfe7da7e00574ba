"""Triton ``delayed_scaling_update_bulk``: every tensor's history roll and scale update in
**one launch** (TE's bulk kernel in recipe/delayed_scaling.cu does the same with pointer
arrays in its kernel arguments).

The host builds device tables, one row per tensor: int64 addresses of the input history, the
input scale and the output history slot; int64 history length, element stride and algorithm;
float32 fp8 max and 2^margin.  A history may be a strided view (TE keeps a module's histories
as the columns of one (H, N) buffer): it is read in place, never copied.  Program i reads its row, loads its whole history (<= 1024 floats, one block),
and writes the rolled history and the new scale into two packed output buffers, which are
returned as per-tensor views (no copy).

Bit equality with the per-tensor op (torch's ``delayed_scaling_update``):
* max over the history is NaN-propagating there; ``tl.max`` is not, so a NaN count decides;
* two IEEE fp32 divisions, fmax / amax then / 2^margin: ``div_rn`` (Triton's ``/`` is an
  approximate divide on CUDA); 2^margin is computed on the host, exact in fp32;
* the old scale is kept where amax is 0, negative, NaN or Inf.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.formats import get_format
from tealite.training_types import BULK_SCALING_MAX_HISTORY, BulkScalingUpdate
from tealite.types import Op

MOST_RECENT = 1  # the algorithm column's code for "most_recent" (0: "max")
_MOST_RECENT = tl.constexpr(MOST_RECENT)  # a kernel reads only constexpr globals when compiled


@triton.jit
def _bulk_update_kernel(h_in_tab, s_in_tab, h_out_off, meta_tab, consts_tab, h_out, s_out,
                        BLOCK: tl.constexpr):
    i = tl.program_id(0)
    h_in = tl.load(h_in_tab + i).to(tl.pointer_type(tl.float32))
    s_in = tl.load(s_in_tab + i).to(tl.pointer_type(tl.float32))
    n = tl.load(meta_tab + 3 * i)
    stride = tl.load(meta_tab + 3 * i + 1).to(tl.int64)
    algo = tl.load(meta_tab + 3 * i + 2)
    fmax = tl.load(consts_tab + 2 * i)
    pow2_margin = tl.load(consts_tab + 2 * i + 1)
    offs = tl.arange(0, BLOCK)
    live = offs < n
    hist = tl.load(h_in + offs * stride, mask=live, other=float("-inf"))
    nans = tl.sum(tl.where(live & (hist != hist), 1, 0), axis=0)
    hmax = tl.where(nans > 0, float("nan"), tl.max(hist, axis=0))
    newest = tl.load(h_in)
    amax = tl.where(algo == _MOST_RECENT, newest, hmax)
    new = tl.math.div_rn(tl.math.div_rn(fmax, amax), pow2_margin)
    keep = ~(amax > 0.0) | (amax == float("inf"))
    tl.store(s_out + i, tl.where(keep, tl.load(s_in), new))
    # roll(history, -1) with slot 0 cleared: out[j] = in[j + 1 mod n], out[0] = 0
    nxt = tl.where(offs + 1 < n, offs + 1, 0)
    rolled = tl.load(h_in + nxt * stride, mask=live, other=0.0)
    base = tl.load(h_out_off + i)
    tl.store(h_out + base + offs, tl.where(offs == 0, 0.0, rolled), mask=live)


def _why_not(p) -> str | None:
    if p["max_history_len"] > BULK_SCALING_MAX_HISTORY:
        return (f"one program holds a whole amax history: at most {BULK_SCALING_MAX_HISTORY} "
                f"entries, got {p['max_history_len']}")
    return None


def _tables(histories, scales, recipes, device):
    """The per-tensor rows the kernel reads (built on the host, one copy each to the device)."""
    lens = [h.numel() for h in histories]
    offsets = [0] * len(lens)
    for j in range(1, len(lens)):
        offsets[j] = offsets[j - 1] + lens[j - 1]
    meta = [v for h, r in zip(histories, recipes)
            for v in (h.numel(), h.stride(0),
                      MOST_RECENT if r.amax_compute_algo == "most_recent" else 0)]
    consts = [v for r in recipes for v in (get_format(r.fmt).max, 2.0 ** r.margin)]

    def put(values, dtype):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return (put([h.data_ptr() for h in histories], torch.int64),
            put([s.data_ptr() for s in scales], torch.int64),
            put(offsets, torch.int64), put(meta, torch.int64), put(consts, torch.float32),
            lens)


@BACKEND.implements(Op.DELAYED_SCALING_UPDATE_BULK, dtypes=(torch.float32,), devices=DEVICES,
                    check=_why_not)
def delayed_scaling_update_bulk(histories, scales, recipes):
    device = histories[0].device
    h_in, s_in, h_off, meta, consts, lens = _tables(histories, scales, recipes, device)
    h_out = torch.empty(sum(lens), dtype=torch.float32, device=device)
    s_out = torch.empty(len(scales), dtype=torch.float32, device=device)
    block = triton.next_power_of_2(max(lens))
    _bulk_update_kernel[(len(lens),)](h_in, s_in, h_off, meta, consts, h_out, s_out,
                                      BLOCK=block)
    return BulkScalingUpdate(list(h_out.split(lens)), list(s_out.split(1)))
