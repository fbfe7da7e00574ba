"""AITER's Triton grouped GEMMs (``aiter/ops/triton/gmm.py``: ``gmm``, ``ptgmm``, ``nptgmm``)
as tealite's ``grouped_gemm``.

AITER's entry points (read in the pinned 0.1.7.post2; ``group_sizes`` is a device int32 (G,)
tensor, every operand fp16 / bf16 and sharing one dtype, the output fp16 / bf16):

* ``gmm(lhs (M, K), rhs (G, K, N), group_sizes)``: out (M, N), rows of group g times rhs[g]:
  tealite's split-M layouts.  lhs row-major; rhs row-major (``TRANS_RHS`` False: NN, A (G, K,
  N) as stored) or column-major (stride (K*N, 1, K), ``TRANS_RHS`` True: TN, A (G, N, K)
  viewed transposed, no copy).  One persistent kernel walking every group's tiles.
* ``ptgmm`` / ``nptgmm(lhs (K', M'), rhs (M', N), group_sizes)``: out (G, K', N), out[g] =
  lhs[:, cols_g] @ rhs[rows_g]: tealite's NT (wgrad) with lhs = B^T, a column-major view of
  B (K_total, M) (``TRANS_LHS``), rhs = A (K_total, N).  ``ptgmm`` is persistent (a grid of
  GRID_DIM programs walking the G x tiles list), ``nptgmm`` one program per (group, tile).
  They differ on an empty group: ptgmm stores zeros, nptgmm returns without storing, so the
  adapter gives nptgmm a zeroed output (both then give exact +0).  The adapter uses ptgmm
  when there are more tiles than its config's GRID_DIM programs (persistence pays) and
  nptgmm otherwise.

Refused with the reason (``check``): bias (no epilogue), ``accumulate`` (they overwrite the
output), one weight shared by every group (rhs must be a (G, K, N) tensor: a copy per group
would be the adapter's), fp32 inputs or outputs, K == 0 and an empty token dimension (their
wrappers assert M, K, N, G > 0; tealite's answer there is zeros, which would be computed
here), shapes whose strides AITER's row / column-major test cannot tell apart, bf16 under the
interpreter (its bf16 ``tl.dot`` multiplies raw bits and its ``.to(bf16)`` truncates), and the
entry point missing from the installed AITER.

Numerics: ``acc += tl.dot(lhs, rhs)`` per K block (a fresh dot added to the fp32
accumulator), ``acc.to(out dtype)``: one rounding; on NVIDIA the tensor cores' truncating
accumulation (u = 2^-23) and fp16 subnormal alignment, as the dense adapter declares.  Not the
arithmetic of aiter_triton's own dense GEMM (gemm_a16w16), so no ``grouped_matches_split``.
Under the interpreter AITER's tuned blocks (256 x 256, 304 programs) would leave every CI
shape in one tile: blocks are capped at 32 and GRID_DIM at 4 there.
"""
from __future__ import annotations

import torch

from tealite.backends._host_tables import device_table
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, INTERPRET, NAME, kernels, why_missing
from tealite.backends.aiter_triton.gemm import (INTERPRETER_BF16, INTERPRETER_BF16_STORE,
                                                TENSOR_CORE_U, aiter_module, nvidia,
                                                run_or_unsupported)
from tealite.types import Op

GMM, PTGMM, NPTGMM = "gmm", "ptgmm", "nptgmm"
ENTRY_POINTS = (GMM, PTGMM, NPTGMM)
_INPUTS = (torch.bfloat16, torch.float16)
# Seen on an H100 (torch 2.11, triton 3.6): capturing gmm in a CUDA graph fails, since the
# pinned release's wrappers check and size the grid on the host.
_HOST_SYNC = ("AITER's gmm / ptgmm / nptgmm read group_sizes on the host (.item() in their "
              "input checks and their grid size, ops/triton/gmm.py of 0.1.7.post2): a "
              "device-to-host sync, which CUDA graph capture refuses")
_LAYOUTS = ("TN", "NN", "NT")
INTERPRETER_CAPS = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GRID_DIM": 4}

declare(Contract(
    backend=NAME, entry_point=GMM, op=Op.GROUPED_GEMM,
    layouts=("lhs:(M,K) row-major", "rhs:(G,K,N) row-major (NN) or column-major (TN)",
             "group_sizes:(G,) int32 on the device", "out:(M,N) row-major"),
    notes="persistent; fp32 accumulation, one rounding; no bias, no accumulate, per-group "
          "weights only; M, K, N > 0",
    extra={"accumulate": "fp32", "bias": "none", "beta": "none", "empty_group": "no rows"}))
for _entry in (PTGMM, NPTGMM):
    declare(Contract(
        backend=NAME, entry_point=_entry, op=Op.GROUPED_GEMM,
        layouts=("lhs:(K',M') column-major = B^T", "rhs:(M',N) row-major = A",
                 "group_sizes:(G,) int32 on the device", "out:(G,K',N) row-major"),
        notes=("persistent" if _entry == PTGMM else "one program per (group, tile)") +
              "; fp32 accumulation, one rounding; no accumulate into out",
        extra={"accumulate": "fp32", "beta": "none",
               "empty_group": "zeros" if _entry == PTGMM else "unwritten (adapter zeroes)"}))


def _config(entry: str, m: int, k: int, n: int, g: int) -> dict:
    """A private copy of AITER's config for ``entry`` (its get_config is lru-cached: never
    hand its dict to a wrapper), capped under the interpreter."""
    cfg = dict(aiter_module(entry).get_config(entry, m, k, n, g))
    if INTERPRET:
        for key, cap in INTERPRETER_CAPS.items():
            if key in cfg:
                cfg[key] = min(cfg[key], cap)
    return cfg


def entry_point(params) -> str:
    if params["layout"] != "NT":
        return GMM
    # AITER's (M, K, N) for tgmm: tokens, our M (its K), our N.
    cfg = _config(PTGMM, params["k"], params["m"], params["n"], params["groups"])
    tiles = params["groups"] * -(-params["m"] // cfg["BLOCK_SIZE_K"]) * \
        -(-params["n"] // cfg["BLOCK_SIZE_N"])
    return PTGMM if tiles > cfg["GRID_DIM"] else NPTGMM


def _why_not(params) -> str | None:
    why = why_missing(*ENTRY_POINTS)
    if why is not None:
        return why
    if params["dtype"] not in _INPUTS or params["out_dtype"] not in _INPUTS:
        return (f"AITER's gmm family takes fp16 / bf16 operands and outputs, got "
                f"{params['dtype']} -> {params['out_dtype']}")
    if INTERPRET and params["dtype"] == torch.bfloat16:
        return f"bf16 inputs under the interpreter: {INTERPRETER_BF16}"
    if INTERPRET and params["out_dtype"] == torch.bfloat16:
        return f"bf16 output under the interpreter: {INTERPRETER_BF16_STORE}"
    if params["bias"]:
        return "AITER's gmm has no bias epilogue"
    if params["accumulate"]:
        return "AITER's gmm / ptgmm / nptgmm overwrite the output: no accumulate (beta = 1)"
    if params["shared_weight"]:
        return ("AITER's gmm reads one weight per group (rhs (G, K, N)); one shared weight "
                "would need a copy per group here")
    if params["k"] == 0:
        return "K == 0: AITER's gmm wrappers assert K > 0 (tealite's answer is zeros)"
    m, n, k = params["m"], params["n"], params["k"]
    if params["layout"] == "NT" and m == 1 and k == 1 or \
            params["layout"] != "NT" and n == 1 and k == 1:
        return ("1 x 1 operand planes: AITER's row- / column-major stride test cannot tell "
                "the layouts apart (it asserts exactly one holds)")
    return None


def _numerics(params) -> dict:
    num = {"entry_point": entry_point(params), "compute_dtype": torch.float32,
           "not_capturable": _HOST_SYNC}
    if nvidia(params):
        num["accumulator_unit_roundoff"] = TENSOR_CORE_U
        num["alignment_floor"] = params["dtype"]
    return num


@BACKEND.implements(Op.GROUPED_GEMM, dtypes=_INPUTS, devices=DEVICES, layouts=_LAYOUTS,
                    check=_why_not, numerics=_numerics)
def grouped_gemm(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    del bias, accumulate  # refused by _why_not
    # cached: a per-call host-to-device copy would make the launch uncapturable in a CUDA graph
    sizes = device_table(splits, torch.int32, b.device)
    if layout == "NT":
        k_total, n = a.shape
        m = b.shape[1]
        shape = (len(splits), m, n)
        if m == 0 or n == 0:
            return out if out is not None else torch.empty(shape, dtype=out_dtype,
                                                           device=b.device)
        lhs = b.contiguous().t()  # (M, K_total), column-major
        rhs = a.contiguous()
        entry = entry_point({"layout": layout, "k": k_total, "m": m, "n": n,
                             "groups": len(splits)})
        target = out if out is not None and out.is_contiguous() else None
        if entry == NPTGMM:  # it leaves an empty group's plane unwritten
            target = target.zero_() if target is not None else torch.zeros(
                shape, dtype=out_dtype, device=b.device)
        y = run_or_unsupported(kernels().functions[entry], lhs, rhs, sizes,
                               preferred_element_type=out_dtype, existing_out=target,
                               config=_config(entry, k_total, m, n, len(splits)))
    else:
        n = a.shape[1] if layout == "TN" else a.shape[2]
        m, k = b.shape
        if m == 0 or n == 0:
            return out if out is not None else torch.empty((m, n), dtype=out_dtype,
                                                           device=b.device)
        rhs = a.contiguous().transpose(1, 2) if layout == "TN" else a.contiguous()
        target = out if out is not None and out.is_contiguous() else None
        y = run_or_unsupported(kernels().functions[GMM], b.contiguous(), rhs, sizes,
                               preferred_element_type=out_dtype, existing_out=target,
                               config=_config(GMM, m, k, n, len(splits)))
    if out is not None and y is not out:
        out.copy_(y)
        return out
    return y
