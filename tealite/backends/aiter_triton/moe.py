"""AITER's fused-MoE Triton kernels as ``moe_ffn_fwd`` (tealite/ops/moe_ffn.py), the expert
FFN of the composed MoE layer (issue 16): ``moe_align_block_size_triton`` sorts the routed
(token, slot) pairs by expert, ``fused_moe`` runs both expert GEMMs with the routing folded
in.  Forward only: AITER's fused MoE is an inference kernel (no dgrad / wgrad).

The mapping (amd-aiter 0.1.7, ``aiter/ops/triton/moe_op.py``, ``_fused_moe_kernel``):

* ``moe_align_block_size_triton(topk_ids (T, k) int32, E, BLOCK_SIZE_M, sorted_ids, expert_ids,
  num_post_pad)``: the flat (token, slot) ids grouped by expert, in flat order within an expert,
  each expert's run padded to a multiple of BLOCK_SIZE_M with the sentinel T*k (the caller
  fills ``sorted_ids`` with it first); ``expert_ids`` one expert per M block.  Integer: exact.
* fc1 = ``fused_moe(x, w1 (E, 2F, H), C1 (T, k, 2F), ..., mul_routed_weight=False,
  top_k=k)``: C1[t, s] = x[t] @ w1[e(t, s)].T, fp32 ``tl.dot`` accumulation, one rounding to
  the compute dtype.
* the gated SiLU between the two (TE's swiglu: silu(first half) * second half, AITER's
  ``torch_moe_act`` order too) is computed here in fp32 and rounded to the dtype: AITER's
  Triton package has no plain ``silu_and_mul`` in 0.1.7.
* fc2 = ``fused_moe(a (T*k, F), w2 (E, H, F), C2 (T*k, 1, H), ..., mul_routed_weight=True,
  top_k=1)``: the routing weight multiplies the fp32 accumulator *before* the rounding, so
  each weighted row is rounded on its own (declared ``weighted_rows_rounded``), then the k
  rows of a token are summed by torch (fp32 accumulation of the dtype's values, one rounding).

Refused, with the reason: activations other than swiglu (the fused path pairs with gated
SiLU), bias, FP8 / int8 / int4 weights (their scales are not part of the layer's contract
here), bf16 under Triton's interpreter (its ``tl.dot`` of bf16 operands is garbage).
"""
from __future__ import annotations

import torch

from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.backends.aiter_triton import BACKEND, DEVICES, INTERPRET, kernels, why_missing
from tealite.backends.aiter_triton.gemm import INTERPRETER_BF16, nvidia, run_or_unsupported
from tealite.errors import UnsupportedCase
from tealite.moe_types import MoEMerge
from tealite.types import Op

ENTRY_ALIGN = "moe_align_block_size_triton"
ENTRY_GEMM = "fused_moe"
ENTRY_POINTS = (ENTRY_ALIGN, ENTRY_GEMM)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Block sizes: AITER's fused_moe takes the config from its caller (no tuned table for this
# entry point in 0.1.7).  Small blocks under the interpreter so CI's tiny shapes span several
# programs, K steps and padded expert runs.
CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
INTERPRETER_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16,
                      "GROUP_SIZE_M": 1}

# moe_align_block_size_triton's contract is declared with moe_permute (permute.py), which
# maps it too; here it only sorts the routed pairs for fused_moe.
declare(Contract(
    backend="aiter_triton", entry_point=ENTRY_GEMM, op=Op.MOE_FFN_FWD.value,
    layouts=("x:(T,K)", "w:(E,N,K)", "out:(T,k,N)", "w1: gate rows first (silu(first half) "
             "* second half)"),
    notes="fp32 tl.dot accumulation, one rounding to the compute dtype; mul_routed_weight "
          "multiplies the fp32 accumulator before that rounding (each weighted row rounded, "
          "then the token's rows summed); no bias; inference only (no backward)",
    extra={"moe_merge": MoEMerge.ROWS_ROUNDED.value}))


def why_not_params(params) -> str | None:
    """Why the fused path cannot run this case here (None: it can); ``params`` as
    tealite/ops/moe_ffn.py builds them."""
    why = why_missing(*ENTRY_POINTS)
    if why is not None:
        return why
    if params["kind"] != "swiglu":
        return (f"activation {params['kind']!r}: AITER's fused MoE path pairs its two GEMMs "
                "with gated SiLU (swiglu) only")
    if params["dtype"] not in _DTYPES:
        return (f"{ENTRY_GEMM} here takes fp16 / bf16 / fp32 x, w1, w2, got {params['dtype']} "
                "(its FP8 / int weights need scales the op does not carry)")
    if INTERPRET and params["dtype"] == torch.bfloat16:
        return f"bf16 under the interpreter: {INTERPRETER_BF16}"
    return None


def why_not(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, kind: str) -> str | None:
    """:func:`why_not_params` of tensors (the harness's direct call)."""
    if w1.dtype != x.dtype or w2.dtype != x.dtype:
        return f"x, w1 and w2 must share a dtype, got {x.dtype}, {w1.dtype}, {w2.dtype}"
    return why_not_params({"kind": kind, "dtype": x.dtype})


def _align(topk_ids: torch.Tensor, experts: int, block: int):
    """AITER's sorted ids / expert ids / padded count for ``topk_ids`` (vLLM's sizing)."""
    numel = topk_ids.numel()
    cap = numel + experts * (block - 1)
    sorted_ids = torch.full((cap,), numel, dtype=torch.int32, device=topk_ids.device)
    expert_ids = torch.zeros((-(-cap // block),), dtype=torch.int32, device=topk_ids.device)
    post_pad = torch.empty((1,), dtype=torch.int32, device=topk_ids.device)
    kernels().moe_align_block_size_triton(topk_ids, experts, block, sorted_ids, expert_ids,
                                          post_pad)
    return sorted_ids, expert_ids, post_pad


def _compute_type(dtype: torch.dtype):
    import triton.language as tl
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
            torch.float32: tl.float32}[dtype]


def _gemm(a, w, out, weights, ids, aligned, top_k: int, mul_weight: bool, config: dict):
    sorted_ids, expert_ids, post_pad = aligned
    run_or_unsupported(kernels().fused_moe, a, w, out, None, None, None, weights, ids,
                       sorted_ids, expert_ids, post_pad, mul_weight, top_k,
                       _compute_type(a.dtype), False, False, False, None, dict(config))


def fused_experts(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  kind: str = "swiglu") -> torch.Tensor:
    """y (T, H) = sum_s topk_weights[t, s] * ffn_{topk_ids[t, s]}(x[t]), the expert FFN being
    fc1 (w1 (E, 2F, H)), swiglu, fc2 (w2 (E, H, F)); an UnsupportedCase says why not."""
    why = why_not(x, w1, w2, kind)
    if why is not None:
        raise UnsupportedCase(why)
    t, k = topk_ids.shape
    experts, f2, h = w1.shape
    config = INTERPRETER_CONFIG if INTERPRET else CONFIG
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.to(torch.float32).contiguous()
    aligned = _align(ids, experts, config["BLOCK_SIZE_M"])
    c1 = torch.zeros((t, k, f2), dtype=x.dtype, device=x.device)
    _gemm(x.contiguous(), w1.contiguous(), c1, weights, ids, aligned, k, False, config)
    g, u = c1.view(t * k, f2).float().split(f2 // 2, dim=-1)
    a = (torch.nn.functional.silu(g) * u).to(x.dtype)
    c2 = torch.zeros((t * k, 1, w2.shape[1]), dtype=x.dtype, device=x.device)
    _gemm(a, w2.contiguous(), c2, weights, ids, aligned, 1, True, config)
    return c2.view(t, k, -1).sum(dim=1)


def _numerics(params) -> dict:
    num = {"entry_point": ENTRY_GEMM, "compute_dtype": torch.float32,
           "moe_merge": MoEMerge.ROWS_ROUNDED}
    if nvidia(params) and params["dtype"] == torch.float32:
        # the kernel's tl.dot takes Triton's default input precision: TF32 on NVIDIA (an
        # fp32 case on an H100 was off by 3e-3 relative, 300 times the fp32 bound)
        num["matmul_input_rounding"] = "tf32"
    return num


@BACKEND.implements(Op.MOE_FFN_FWD, dtypes=_DTYPES, devices=DEVICES, check=why_not_params,
                    numerics=_numerics)
def moe_ffn_fwd(x, w1, w2, topk_weights, topk_ids, *, kind):
    return fused_experts(x, w1, w2, topk_weights, topk_ids, kind=kind)
