"""The expert FFN forward (``moe_ffn_fwd``): a loop over experts, fp32 GEMMs with the fc1
output and the activation rounded to the dtype (the op's default arithmetic, as
tealite/ops/moe_ffn.py states it), the weighted rows summed in fp32, one rounding."""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.backends.torch.activations import act_fwd
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@BACKEND.implements(Op.MOE_FFN_FWD, dtypes=_FLOATS, numerics={"compute_dtype": torch.float32})
def moe_ffn_fwd(x, w1, w2, topk_weights, topk_ids, *, kind):
    y = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for e in range(w1.shape[0]):
        tokens, slots = torch.nonzero(ids == e, as_tuple=True)
        if tokens.numel() == 0:
            continue
        h1 = (x[tokens].float() @ w1[e].float().T).to(x.dtype)
        a = act_fwd(h1, kind=kind)
        rows = a.float() @ w2[e].float().T
        y.index_add_(0, tokens, rows * topk_weights[tokens, slots, None])
    return y.to(x.dtype)
