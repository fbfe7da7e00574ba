"""Detection thresholds: per op, the smallest single-element error, in output ulps, its tier
catches on the suite's cases.

For each case the torch backend's output (the op's primary output, :data:`TARGETS`) gets one
element moved k ulps away from zero (its magnitude bits + k: k steps of the output format,
codes and E8M0 bytes included), for k = 1, 2, 4, ... 2^20; the case's threshold is the
smallest k at which the case fails.  The element is the largest-magnitude one that can still
move (finite, below the format's largest value), where a relative bound is tightest in ulps:
the threshold is the op's best case, and a cancelling element elsewhere can hide more.
Reported per (op, dtype): the largest threshold over the cases (what is caught on *every*
case) and the median; ``None`` when some case does not catch even 2^20.  The tiers judge values
near zero at an absolute resolution (the compute format's smallest normal, times what the
value is multiplied by later: ``tiers.primitives.underflow_error``), so an all-zero or
subnormal-range output hides any k up to 2^20 by design; ``every_normal`` is the every-case
figure over the cases whose moved element is at least :data:`NORMAL_FLOOR` in magnitude.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from tealite import recipes as R
from tealite_verify.mutate import plugin
from tealite_verify.mutate.base import (INT_VIEW, Mutation, bump_ulps,
                                        max_finite_magnitude_bits)
from tealite_verify.mutate.runner import cases_for, dtypes_for, outputs_differ
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

MAX_LOG2 = 20
# 2^-100 is 2^26 times fp32's smallest normal: far above any underflow allowance of the tiers.
NORMAL_FLOOR = 2.0 ** -100


# ---- moving one element ---------------------------------------------------------------------

def _movable_index(mags: torch.Tensor, top: int) -> int | None:
    """Flat index of the largest magnitude (as integers: bit patterns / codes) below ``top``."""
    ok = mags < top
    if mags.numel() == 0 or not bool(ok.any()):
        return None
    return int(torch.where(ok, mags, torch.full_like(mags, -1)).argmax().item())


def _float_target(t: torch.Tensor) -> int | None:
    flat = t.detach().contiguous().view(-1)
    bits = flat.view(INT_VIEW[flat.element_size()]).long()
    width = 8 * flat.element_size()
    mags = bits & ((1 << (width - 1)) - 1)
    return _movable_index(mags, max_finite_magnitude_bits(t.dtype))


def move_float(t: torch.Tensor, k: int) -> torch.Tensor:
    i = _float_target(t)
    return t if i is None else bump_ulps(t, k, i)


def move_bytes(t: torch.Tensor, k: int, top: int = 254) -> torch.Tensor:
    """Integer codes (E8M0 scales, int8 / uint8 bit patterns): the byte + k, at most ``top``."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    i = _movable_index(flat.long(), top)
    if i is None:
        return t
    out = flat.clone()
    out[i] = min(int(out[i]) + k, top)
    return out.view(t.dtype).reshape(t.shape)


def move_e2m1(t: torch.Tensor, k: int) -> torch.Tensor:
    """Packed E2M1: one low-nibble code's magnitude + k (at most 7 = 6.0)."""
    flat = t.detach().contiguous().view(-1)
    i = _movable_index((flat & 0x7).long(), 7)
    if i is None:
        return t
    out = flat.clone()
    b = int(out[i])
    out[i] = (b & 0xF8) | min((b & 0x7) + k, 7)
    return out.reshape(t.shape)


def move_tensor(t: torch.Tensor, k: int) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return move_float(t, k)
    return move_bytes(t, k)


def _move_codes(q, k: int):
    name = "data" if q.data is not None else "columnwise_data"
    codes = getattr(q, name)
    packed = q.recipe.family is R.Family.MX and q.recipe.fmt == "e2m1"
    setattr(q, name, move_e2m1(codes, k) if packed else move_tensor(codes, k))
    return q


def _at(index: int, name: str):
    """Move element ``index`` of the result tuple (spec output ``name``)."""
    def move(result, k):
        items = list(result)
        items[index] = move_tensor(items[index], k)
        return tuple(items)
    return move, name


def _codes_at(index: int | None):
    def move(result, k):
        if index is None:
            return _move_codes(result, k)
        items = list(result)
        items[index] = _move_codes(items[index], k)
        return tuple(items)
    return move, "data"


# op -> (move(result, k) -> result, the spec output it lands in)
TARGETS: dict[str, tuple[Callable, str]] = {
    "gemm": _at(0, "out"),
    "qgemm": _at(0, "out"),
    "layernorm_fwd": _at(0, "y"), "layernorm_bwd": _at(0, "dx"),
    "rmsnorm_fwd": _at(0, "y"), "rmsnorm_bwd": _at(0, "dx"),
    "act_fwd": (lambda r, k: move_tensor(r, k), "y"),
    "act_bwd": (lambda r, k: move_tensor(r, k), "dx"),
    "dbias_dact": _at(0, "dx"),
    "quantize": _codes_at(None),
    "dequantize": (lambda r, k: move_tensor(r, k), "y"),
    "amax": (lambda r, k: move_tensor(r, k), "amax"),
    "delayed_scaling_update": _at(1, "scale"),
    "shuffle_weight": (lambda r, k: move_tensor(r, k), "shuffled"),
    "shuffle_e8m0": (lambda r, k: move_tensor(r, k), "shuffled"),
    "layernorm_fwd_quantize": _codes_at(0), "rmsnorm_fwd_quantize": _codes_at(0),
    "act_fwd_quantize": _codes_at(None),
    "rope_fwd": (lambda r, k: move_tensor(r, k), "y"),
    "rope_bwd": (lambda r, k: move_tensor(r, k), "dx"),
    "softmax_fwd": (lambda r, k: move_tensor(r, k), "y"),
    "softmax_bwd": (lambda r, k: move_tensor(r, k), "dx"),
    "attention_fwd": _at(0, "out"), "attention_bwd": _at(0, "dq"),
    "grouped_gemm": (lambda r, k: move_tensor(r, k), "out"),
    "grouped_qgemm": (lambda r, k: move_tensor(r, k), "out"),
    "router_fwd": _at(0, "probs"), "router_aux_scores_fwd": _at(0, "scores"),
    "router_bwd": (lambda r, k: move_tensor(r, k), "grad_logits"),
    "router_aux_scores_bwd": (lambda r, k: move_tensor(r, k), "grad_logits"),
    "moe_aux_loss_fwd": (lambda r, k: move_tensor(r, k), "aux_loss"),
    "moe_aux_loss_bwd": (lambda r, k: move_tensor(r, k), "grad_probs"),
    "moe_permute": _at(0, "out"), "moe_unpermute": _at(0, "out"),
    "moe_unpermute_bwd": _at(0, "grad_permuted"), "moe_sort_chunks": _at(0, "out"),
    "moe_pad_rows": _at(0, "out"), "moe_unpad_rows": _at(0, "out"),
    "moe_ffn_fwd": (lambda r, k: move_tensor(r, k), "y"),
    # Group 0's codes (a case whose group 0 is empty or columnwise only does not count).
    "grouped_quantize": (lambda r, k: (_move_codes(r.tensors[0], k), r)[1], "g0.data"),
    "dropout_fwd": _at(0, "y"), "dropout_bwd": (lambda r, k: move_tensor(r, k), "dx"),
    # The multi-tensor ops: the first output tensor of the list (an empty one moves nothing).
    "multi_tensor_scale": (lambda r, k: (move_tensor(r[0], k),) + tuple(r[1:]), "out"),
    "multi_tensor_l2norm": _at(0, "total"), "multi_tensor_unscale_l2norm": _at(0, "total"),
    "multi_tensor_compute_scale": (lambda r, k: ((move_tensor(r[0][0], k),) + r[0][1:], r[1]),
                                   "scale"),
    # Tensor 0's new scale.
    "delayed_scaling_update_bulk": (lambda r, k: type(r)(
        r.amax_histories, [move_tensor(r.scales[0], k)] + list(r.scales[1:])), "s0"),
    "transpose": (lambda r, k: move_tensor(r, k), "y"),
    "add_rmsnorm_pad": _at(0, "y"),
}


# ---- measuring ------------------------------------------------------------------------------

@dataclass
class Threshold:
    op: str
    dtype: str
    output: str
    tier: str
    cases: int            # cases measured (output non-empty, an element could move)
    every: int | None     # caught on every case from this k (None: some case > 2^MAX_LOG2)
    median: float | None
    cases_normal: int     # cases whose moved element is >= NORMAL_FLOOR
    every_normal: int | None
    per_case: list        # each case's threshold (None: not caught up to 2^MAX_LOG2)
    seconds: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class _Injector:
    """The mutant whose op adds ``k`` ulps at one element; k is changed between runs."""

    def __init__(self, op: str):
        self.k = 0
        move, self.output = TARGETS[op]

        def wrap(fn):
            def mutated(*args, **kwargs):
                result = fn(*args, **kwargs)
                if op == "gemm" and kwargs.get("out") is not None:
                    # gemm writes into C when given: keep that contract.
                    moved = move(result, self.k)
                    kwargs["out"].copy_(moved[0])
                    return kwargs["out"], moved[1]
                return move(result, self.k)
            return mutated

        self.mutation = Mutation(f"{op}.one_element_k_ulps", op, "k-ulp",
                                 "k output ulps at one element", wrap)


@dataclass
class _CaseResult:
    k: int | None        # smallest k caught (None: not up to 2^MAX_LOG2)
    tier: str
    normal: bool         # the moved element is at least NORMAL_FLOOR in magnitude


def _moved_magnitude(t: torch.Tensor) -> float:
    """|value| of the element a float output gets moved at (integer codes: inf, they have no
    underflow range)."""
    if not t.dtype.is_floating_point:
        return float("inf")
    i = _float_target(t)
    return 0.0 if i is None else float(t.detach().reshape(-1)[i].float().abs())


def _case_threshold(spec, case, inj: _Injector) -> _CaseResult | None:
    """The case's threshold; None when the case does not count (torch fails it, the mutant
    cannot run it, the output is empty or no element of it can move)."""
    inj.k = 0
    base = run_case(spec, case, backends=["torch", plugin.NAME], pairwise=False)
    if base.verdict != "pass" or base.outcomes[plugin.NAME].status != "ok":
        return None
    out = base.outcomes["torch"].outputs.get(inj.output)
    tier = next((c.metrics.tier for c in base.comparisons if c.output == inj.output), "")
    if out is None or out.numel() == 0:
        return None
    normal = _moved_magnitude(out) >= NORMAL_FLOOR
    for j in range(MAX_LOG2 + 1):
        inj.k = 1 << j
        rep = run_case(spec, case, backends=[plugin.NAME], pairwise=False)
        if j == 0 and not _changed(rep, base, inj.output):
            return None
        if rep.verdict == "fail":
            return _CaseResult(inj.k, tier, normal)
    return _CaseResult(None, tier, normal)


def _changed(rep, base, name) -> bool:
    a = base.outcomes["torch"].outputs.get(name)
    b = rep.outcomes[plugin.NAME].outputs.get(name)
    return b is not None and outputs_differ({name: a}, {name: b})


def op_thresholds(op: str, *, dtypes: list[str] | None = None, size: str = "ci") -> list[Threshold]:
    if op not in TARGETS:
        raise KeyError(f"no threshold target for op {op!r}; known: {sorted(TARGETS)}")
    spec = get_spec(op)
    inj = _Injector(op)
    rows = []
    with plugin.registered(inj.mutation):
        for dtype in dtypes_for(op, dtypes):
            t0 = time.monotonic()
            results = [r for r in (_case_threshold(spec, c, inj)
                                   for c in cases_for(op, dtype, size)) if r is not None]
            rows.append(_summary(op, dtype, inj.output, results, time.monotonic() - t0))
    return rows


def _every(ks: list) -> int | None:
    return max(ks) if ks and None not in ks else None


def _summary(op, dtype, output, results: list[_CaseResult], seconds) -> Threshold:
    per_case = [r.k for r in results]
    normal = [r.k for r in results if r.normal]
    inf = float("inf")
    median = statistics.median([k if k is not None else inf for k in per_case]) \
        if per_case else None
    return Threshold(op, dtype, output, "/".join(sorted({r.tier for r in results})),
                     len(per_case), _every(per_case), None if median == inf else median,
                     len(normal), _every(normal), per_case, seconds)
