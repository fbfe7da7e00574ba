"""AITER's CK MoE GEMM stage 2 (``ck_moe_stage2_fwd``, after ``moe_sorting_fwd``; ROCm) as
tealite's ``grouped_gemm`` (issue 16, "Backends": CK grouped / MoE entry points).

Written from amd-aiter 0.1.7.post2 (``aiter/ops/moe_op.py``, ``aiter/ops/moe_sorting.py``,
``aiter/fused_moe.py``'s ``moe_sorting`` / ``fused_moe_2stages``, and the C++ behind them:
``csrc/ck_gemm_moe_2stages_codegen/gemm_moe_ck2stages{.cu,_common.cuh}``,
``csrc/py_itfs_ck/moe_sorting_kernels.cu``, CK's ``reference_moe_sorting.hpp`` and
``gridwise_moe_gemm.hpp``); never run on AMD hardware, tested against a fake ``aiter`` that
checks every argument layout (tests/test_aiter_ck_grouped_gemm.py).

The mapping.  Stage 2 of CK's 2-stage MoE is a grouped GEMM over experts: with ``topk`` = 1
(one slot per token) and no routing weights it computes, for every token t routed to expert
e, ``out[t] = inter_states[t, 0] @ w2[e]^T`` (fp32 accumulation, stored by an atomic add into
``out``, which ``moe_sorting_fwd`` zeroes).  tealite's split-M layouts are exactly that with
token t's expert = its group (``m_splits`` -> ``topk_ids``):

    moe_sorting_fwd(topk_ids (M, 1) int32 = group of each row, topk_weights (M, 1) fp32 ones,
                    sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid_ids (2,),
                    moe_buf (M, N) dtype, num_experts=G, unit_size=block_m)
    ck_moe_stage2_fwd(inter_states = B as (M, 1, K), w1 = w2 (only its size(0) and dtype are
                      read: stage 2's E and kernel choice), w2 = A as (G, N, K), the sorted
                      tables, out = moe_buf, topk=1, block_m, sorted_weights=None,
                      quant_type=QuantType.No)

``TN`` passes A (G, N, K) as stored; ``NN``'s A (G, K, N) is transposed into a copy (CK reads
w2 as (E, N, K) with K contiguous); one shared weight is a single expert every row routes to.
The CK instances use ``GemmSpecialization::Default``, so K must be whole KPerBlock steps (64
or 128 elements for 16-bit inputs, by arch and block_m): K is zero-padded to a multiple of
128 in both operands (a zero product adds an exact zero to the fp32 accumulator), and N to a
multiple of 128 in the weight (the extra output columns are dropped).  An empty group is an
expert no row routes to: ``moe_sorting`` skips it, no rows (TN / NN have no output for it).

``grouped_qgemm`` with FP8 block scaling (TE's 1x128 activations x 128x128 weights, pow2 or
not) is the same call with ``QuantType.per_1x128`` (``get_moe_stage_module`` files
per_128x128 under it): codes in the arch's E4M3 (FNUZ on gfx942, OCP on gfx950), ``a2_scale``
the groups' (M, K/128) fp32 activation scales concatenated (row ``token * topk + slot``,
gridwise_moe_gemm_blockscale.hpp's gather), ``w2_scale`` the (E, N/128, K/128) weight
scales stacked (expert stride N/128 * K/128), ``block_m`` 64 (the blockscale stage-2
instances take 16 / 64; KPerBlock 128 at 64).  Zero codes pad K and N to multiples of 128
without changing the scale counts.  Each 128-long K block's partial sum is scaled by both
scales and accumulated in fp32, as the dense ``gemm_a8w8_blockscale`` (:mod:`.qgemm`).

Numerics (declared): fp32 accumulation, one rounding into the dtype (the atomic add of the
rounded row into a zeroed output is exact, but for a -0 row element, which comes out +0).  Refused with the reason: ``NT`` (wgrad: stage 2
splits the tokens, not the contraction), bias (stage 2 has no bias; the cktile path's
``exp_bias`` is another entry point, for MXFP4 weights), ``accumulate`` (stage 2 adds into
``moe_sorting``'s zeroed buffer; adding into a caller's bf16 output would round twice), fp32
inputs (CK's MoE kernels take bf16 / fp16), an ``out_dtype`` other than the input dtype.

Not mapped, with the reason:

* ``ck_moe_stage1_fwd``: always a gated activation fused into the GEMM (N = w1.size(1) / 2;
  the C++ turns ``activation`` into ``!activation``, so ``ActivationType.No`` (-1) gets the
  Gelu kernel): grouped GEMM + swiglu / geglu is no tealite op; it runs inside ``fused_moe``
  (``moe_ffn_fwd``, :mod:`.moe`).
* ``ck_moe_stage2_fwd`` with per-tensor / per-token FP8 (``QuantType.per_Tensor`` /
  ``per_Token``) or MXFP4 (``per_1x32``) operands as ``grouped_qgemm``: their scale layouts
  are read only from ``torch_moe_stage2``, not from the kernels' scale loads; not wired.
* ``batched_gemm_bf16`` / ``batched_gemm_a8w8``: one M for every batch (equal splits only);
  stage 2 takes any splits, so it is the one path here.
* ``moe_cktile2stages_gemm1`` / ``_gemm2``: MXFP4 weights with bf16 activations (a16w4),
  no tealite recipe pairs those.
"""
from __future__ import annotations

import torch

from tealite.backends.aiter import BACKEND, common_why_not, runtime
from tealite.backends.aiter_common.contracts import Contract, declare
from tealite.types import Op

SORTING, STAGE2 = "moe_sorting_fwd", "ck_moe_stage2_fwd"
ENTRY_POINTS = (SORTING, STAGE2)
_DTYPES = (torch.bfloat16, torch.float16)  # CK's MoE GEMM instances: no fp32
_LAYOUTS = ("TN", "NN")  # not NT (wgrad): stage 2 splits the tokens, not the contraction
# Rows per sorted block (moe_sorting's unit_size = stage 2's MPerBlock): 32 is fused_moe's
# default and has a stage-2 instance on every arch (gen_instances.py: 32 / 64 / 128 / 256).
BLOCK_M = 32
# K and N are padded to this: every 16-bit stage-2 instance's KPerBlock (64 / 128) divides it.
ALIGN = 128

declare(Contract(
    backend="aiter", entry_point=SORTING, op=Op.GROUPED_GEMM.value,
    layouts=("topk_ids:(M,1) int32 = group of each row", "topk_weights:(M,1) fp32 ones",
             "sorted_token_ids:(M+G*block_m-1,) int32 (slot<<24)|token, pad token=M",
             "sorted_expert_ids:(blocks,) int32", "num_valid_ids:(2,) int32",
             "moe_buf:(M,N) zeroed"),
    notes="the routing tables of the CK stage-2 grouped GEMM; experts without rows skipped",
    extra={"unit_size": BLOCK_M}))
declare(Contract(
    backend="aiter", entry_point=STAGE2, op=Op.GROUPED_GEMM.value,
    layouts=("inter_states:(M,1,K) row-major", "w2:(G,N,K) K contiguous",
             "w1: w2 again (E and dtype read)", "out:(M,N) = moe_buf, atomic add",
             "K, N zero-padded to multiples of 128"),
    notes="topk 1, no routing weights, QuantType.No; fp32 accumulation, one rounding; TN / NN "
          "(NN weight transposed into a copy), shared weight = one expert; no bias, no "
          "accumulate, bf16 / fp16; never run on AMD hardware",
    extra={"accumulate": "fp32", "bias": "none", "beta": "none", "empty_group": "no rows"}))


def why_not_params(params) -> str | None:
    """Why CK's stage-2 grouped GEMM cannot run this case here (None: it can)."""
    why = common_why_not(params, *ENTRY_POINTS)
    if why is not None:
        return why
    if params["out_dtype"] != params["dtype"]:
        return (f"ck_moe_stage2 writes the operands' dtype ({params['dtype']}), not "
                f"out_dtype {params['out_dtype']}")
    if params["bias"]:
        return "ck_moe_stage2 has no bias epilogue"
    if params["accumulate"]:
        return ("ck_moe_stage2 adds into moe_sorting's zeroed buffer; accumulating into out "
                "(beta = 1) would round the product and the sum separately")
    return None


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def expert_ids(splits, device) -> torch.Tensor:
    """topk_ids (M, 1) int32: the group (= expert) of every row, rows in group order."""
    groups = torch.arange(len(splits), dtype=torch.int32, device=device)
    counts = torch.tensor(splits, dtype=torch.int64, device=device)
    return torch.repeat_interleave(groups, counts, output_size=sum(splits)).unsqueeze(1)


def weights_nk(a: torch.Tensor, layout: str) -> torch.Tensor:
    """A as stage 2's w2 (E, N, K), K contiguous: TN as stored, NN transposed (a copy), one
    shared 2-D weight as a single expert."""
    w = a if a.dim() == 3 else a.unsqueeze(0)
    if layout == "NN":
        w = w.transpose(1, 2)
    return w.contiguous()


def _padded(t: torch.Tensor, dims: dict[int, int]) -> torch.Tensor:
    """``t`` zero-padded at the end of each dim in ``dims`` to the given size (no copy when
    nothing is padded); on the bit pattern, so FP8 codes pad with code 0."""
    extra = {d: size - t.shape[d] for d, size in dims.items() if size > t.shape[d]}
    if not extra:
        return t.contiguous()
    bits = t.view(torch.uint8) if t.element_size() == 1 else t
    out = bits.new_zeros([s + extra.get(d, 0) for d, s in enumerate(t.shape)])
    out[tuple(slice(0, s) for s in t.shape)] = bits
    return out.view(t.dtype)


def sorted_tables(rt, ids: torch.Tensor, groups: int, n: int, dtype: torch.dtype,
                  block_m: int = BLOCK_M) -> tuple:
    """moe_sorting_fwd's outputs (sorted_ids, sorted_expert_ids, num_valid_ids, moe_buf),
    allocated as aiter.fused_moe.moe_sorting does."""
    m, topk = ids.shape
    padded = m * topk + groups * block_m - topk
    dev = ids.device
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=dev)
    sorted_w = torch.empty(padded, dtype=torch.float32, device=dev)
    sorted_experts = torch.empty(-(-padded // block_m), dtype=torch.int32, device=dev)
    num_valid = torch.empty(2, dtype=torch.int32, device=dev)
    buf = torch.empty((m, n), dtype=dtype, device=dev)
    ones = torch.ones(ids.shape, dtype=torch.float32, device=dev)
    rt.functions[SORTING](ids, ones, sorted_ids, sorted_w, sorted_experts, num_valid, buf,
                          groups, block_m)
    return sorted_ids, sorted_experts, num_valid, buf


def _row_ids(splits, shared: bool, device) -> torch.Tensor:
    """topk_ids: each row's group, or expert 0 for every row when one weight is shared."""
    m = sum(splits)
    return torch.zeros((m, 1), dtype=torch.int32, device=device) if shared else \
        expert_ids(splits, device)


@BACKEND.implements(Op.GROUPED_GEMM, dtypes=_DTYPES, layouts=_LAYOUTS, check=why_not_params,
                    numerics={"entry_point": STAGE2, "compute_dtype": torch.float32})
def grouped_gemm(a, b, splits, *, layout, out_dtype, bias, out, accumulate):
    del bias, accumulate, out_dtype  # refused / equal to b's dtype (why_not_params)
    rt = runtime()
    w = weights_nk(a, layout)
    m, k = b.shape
    n = w.shape[1]
    if m == 0 or n == 0:
        y = torch.empty((m, n), dtype=b.dtype, device=b.device)
        return out.copy_(y) if out is not None else y
    k_pad, n_pad = max(_round_up(k, ALIGN), ALIGN), _round_up(n, ALIGN)
    w = _padded(w, {1: n_pad, 2: k_pad})
    x = _padded(b, {1: k_pad}).view(m, 1, k_pad)
    ids = _row_ids(splits, a.dim() == 2, b.device)
    sorted_ids, sorted_experts, num_valid, buf = sorted_tables(rt, ids, w.shape[0], n_pad,
                                                               b.dtype)
    rt.functions[STAGE2](x, w, w, sorted_ids, sorted_experts, num_valid, buf, 1,
                         block_m=BLOCK_M, sorted_weights=None,
                         quant_type=rt.module.QuantType.No,
                         activation=rt.module.ActivationType.Silu)
    y = buf[:, :n]
    if out is not None:
        return out.copy_(y)
    return y if n == n_pad else y.contiguous()



# ---- grouped_qgemm: FP8 block scaling through QuantType.per_1x128 ------------------------------

BLOCK_M_Q = 64  # a blockscale stage-2 instance (gen_instances.py: block_m 16 / 64)
STAGE2_BLOCK = f"{STAGE2}[per_1x128]"  # the same entry point, its blockscale contract
_SCALE_BLOCK = 128

declare(Contract(
    backend="aiter", entry_point=STAGE2_BLOCK, op=Op.GROUPED_QGEMM.value, fp8="arch",
    layouts=("inter_states:(M,1,K) fp8 codes", "a2_scale:(M,K/128) fp32 row-major",
             "w2:(G,N,K) fp8 codes", "w2_scale:(G,N/128,K/128) fp32 row-major",
             "out:(M,N) bf16|fp16 = moe_buf", "K, N zero-code-padded to multiples of 128"),
    notes="QuantType.per_1x128, topk 1, block_m 64; per 128-long K block: partial sum x "
          "a_scale x w_scale, accumulated in fp32, one rounding; TE's 1x128 x 128x128 "
          "blocks only; no bias, no accumulate; never run on AMD hardware",
    extra={"accumulate": "fp32", "bias": "none", "beta": "none", "empty_group": "no rows",
           "block_m": BLOCK_M_Q}))


def why_not_qparams(params) -> str | None:
    """Why CK's stage 2 cannot run this grouped_qgemm case here (None: it can)."""
    why = why_not_params(params)  # device, entry points, bias, accumulate
    if why is not None:
        return why
    if params["kind"] != "block":
        return (f"{params['kind']} operands: only FP8 block scaling (QuantType.per_1x128) is "
                "wired onto ck_moe_stage2 (the per-tensor / per-token / MXFP4 scale layouts "
                "are not pinned from its kernels)")
    e4m3 = runtime().e4m3_format
    if e4m3 is None:
        return "AITER has no FP8 type on this arch (aiter.dtypes falls back to uint8)"
    if not params["fmt_a"] == params["fmt_b"] == e4m3:
        return (f"ck_moe_stage2 takes {e4m3} codes for both operands on this arch, got "
                f"{params['fmt_a']} x {params['fmt_b']}")
    blocks = (tuple(params["recipe_a"].block), tuple(params["recipe_b"].block))
    if blocks != ((_SCALE_BLOCK, _SCALE_BLOCK), (1, _SCALE_BLOCK)):
        return (f"ck_moe_stage2's blockscale kernel reads 128x128 weight (A) and 1x128 "
                f"activation (B) scale blocks, got A {blocks[0]} and B {blocks[1]}")
    return None


def expert_weights(a_ops, n_pad: int, k_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w2 (E, N_pad, K_pad) codes and w2_scale (E, N/128, K/128) fp32: every group's weight
    (one when shared), zero codes padding K and N inside their last scale block (the scale
    counts stay)."""
    w = torch.stack([_padded(op.codes, {0: n_pad, 1: k_pad}).view(torch.uint8)
                     for op in a_ops]).view(a_ops[0].codes.dtype)
    return w, torch.stack([op.scales.float() for op in a_ops]).contiguous()


def token_rows(b_ops, k_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """inter_states (M, 1, K_pad) codes and a2_scale (M, K/128) fp32: the groups' rows in
    order, so row t's scales are row t (stage 2 gathers a scale row per sorted token)."""
    codes = torch.cat([op.codes.view(torch.uint8) for op in b_ops])
    x = _padded(codes, {1: k_pad}).view(b_ops[0].codes.dtype)
    return x.view(x.shape[0], 1, k_pad), torch.cat([op.scales.float() for op in b_ops]) \
        .contiguous()


@BACKEND.implements(Op.GROUPED_QGEMM, dtypes=_DTYPES, layouts=_LAYOUTS, check=why_not_qparams,
                    numerics={"entry_point": STAGE2_BLOCK, "compute_dtype": torch.float32})
def grouped_qgemm(recipe_a, a_ops, recipe_b, b_ops, splits, *, m, n, k, layout, out_dtype,
                  bias, out, accumulate):
    del recipe_a, recipe_b, layout, bias, accumulate  # checked by why_not_qparams
    rt = runtime()
    device = b_ops[0].codes.device
    if m == 0 or n == 0:
        y = torch.empty((m, n), dtype=out_dtype, device=device)
        return out.copy_(y) if out is not None else y
    k_pad, n_pad = max(_round_up(k, ALIGN), ALIGN), _round_up(n, ALIGN)
    w, w_scale = expert_weights(a_ops, n_pad, k_pad)
    x, x_scale = token_rows(b_ops, k_pad)
    ids = _row_ids(splits, len(a_ops) == 1, device)
    sorted_ids, sorted_experts, num_valid, buf = sorted_tables(rt, ids, w.shape[0], n_pad,
                                                               out_dtype, BLOCK_M_Q)
    rt.functions[STAGE2](x, w, w, sorted_ids, sorted_experts, num_valid, buf, 1,
                         w2_scale=w_scale, a2_scale=x_scale, block_m=BLOCK_M_Q,
                         sorted_weights=None, quant_type=rt.module.QuantType.per_1x128,
                         activation=rt.module.ActivationType.Silu)
    y = buf[:, :n]
    if out is not None:
        return out.copy_(y)
    return y if n == n_pad else y.contiguous()
