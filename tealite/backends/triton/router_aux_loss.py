"""TE's MoE auxiliary load-balancing loss as Triton kernels (semantics: tealite/ops/router.py;
numerics and support as the router's, tealite/backends/triton/router.py): one program sums
probs over the tokens block by block (fp32 column sums), weights them by the tokens per expert
and multiplies by TE's constant, computed on the host in float32 as the torch backend does;
the backward writes ``C n_e g`` per token block."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tealite.backends.triton import BACKEND, DEVICES
from tealite.backends.triton._io import as_kernel_arg, load_f32, store_f32
from tealite.backends.triton.router import _FLOATS, _blocks, _numerics, _too_wide
from tealite.types import Op


@triton.jit
def _aux_loss_fwd_kernel(p_ptr, n_ptr, c_ptr, out_ptr, tokens, experts, IS_BF16: tl.constexpr,
                         BT: tl.constexpr, BE: tl.constexpr):
    cols = tl.arange(0, BE)
    incol = cols < experts
    acc = tl.zeros((BE,), tl.float32)
    for t0 in range(0, tokens, BT):
        rows = t0 + tl.arange(0, BT).to(tl.int64)
        valid = (rows < tokens)[:, None] & incol[None, :]
        p = load_f32(p_ptr, rows[:, None] * experts + cols[None, :], valid, IS_BF16)
        acc += tl.sum(p, axis=0)
    n = tl.load(n_ptr + cols, mask=incol, other=0).to(tl.float32)
    loss = tl.sum(acc * n, axis=0) * tl.load(c_ptr)
    store_f32(out_ptr, tl.arange(0, 1), tl.full((1,), 0.0, tl.float32) + loss,
              tl.arange(0, 1) < 1, IS_BF16)


@triton.jit
def _aux_loss_bwd_kernel(g_ptr, n_ptr, c_ptr, dp_ptr, tokens, experts, IS_BF16: tl.constexpr,
                         BT: tl.constexpr, BE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.arange(0, BE)
    valid = (rows < tokens)[:, None] & (cols < experts)[None, :]
    g = load_f32(g_ptr, tl.arange(0, 1), tl.arange(0, 1) < 1, IS_BF16)
    n = tl.load(n_ptr + cols, mask=cols < experts, other=0).to(tl.float32)
    row = n * tl.load(c_ptr) * tl.sum(g, axis=0)
    store_f32(dp_ptr, rows[:, None] * experts + cols[None, :],
              tl.zeros((BT, BE), tl.float32) + row[None, :], valid, IS_BF16)



def _aux_constant(experts: int, total_num_tokens: int, topk: int, coeff: float, device):
    """TE's C = E * coeff / topk / T / T, each step in float32 (as the torch backend)."""
    c = torch.tensor(experts * coeff, dtype=torch.float32)
    for divisor in (topk, total_num_tokens, total_num_tokens):
        c = c / torch.tensor(float(divisor), dtype=torch.float32)
    return c.reshape(1).to(device)


@BACKEND.implements(Op.MOE_AUX_LOSS_FWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_numerics)
def moe_aux_loss_fwd(probs, tokens_per_expert, *, total_num_tokens, topk, coeff):
    t, e = probs.shape
    p = probs.contiguous()
    out = torch.empty((), dtype=p.dtype, device=p.device)
    bt, be, _ = _blocks(t, e)
    c = _aux_constant(e, total_num_tokens, topk, coeff, p.device)
    _aux_loss_fwd_kernel[(1,)](as_kernel_arg(p), tokens_per_expert.contiguous(), c,
                               as_kernel_arg(out.reshape(1)), t, e,
                               IS_BF16=p.dtype == torch.bfloat16, BT=bt, BE=be)
    return out


@BACKEND.implements(Op.MOE_AUX_LOSS_BWD, dtypes=_FLOATS, devices=DEVICES, check=_too_wide,
                    numerics=_numerics)
def moe_aux_loss_bwd(grad_aux_loss, probs, tokens_per_expert, *, total_num_tokens, topk,
                     coeff):
    t, e = probs.shape
    dp = torch.empty((t, e), dtype=probs.dtype, device=probs.device)
    bt, be, grid = _blocks(t, e)
    if grid == 0:
        return dp
    c = _aux_constant(e, total_num_tokens, topk, coeff, probs.device)
    g = grad_aux_loss.to(probs.dtype).reshape(1).contiguous()
    _aux_loss_bwd_kernel[(grid,)](as_kernel_arg(g), tokens_per_expert.contiguous(), c,
                                  as_kernel_arg(dp), t, e, IS_BF16=probs.dtype == torch.bfloat16,
                                  BT=bt, BE=be)
    return dp
