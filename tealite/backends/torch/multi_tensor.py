"""Multi-tensor apply in plain torch: a Python loop over the list, each tensor's update in
float32 in TE's operation order (semantics: tealite/ops/multi_tensor.py).

The building blocks are module-level functions (``adam_direction``, ``sumsq``, ...) so that the
mutation operators (tealite_verify/mutate/operators_multi_tensor.py) can swap one of them.
"""
from __future__ import annotations

import torch

from tealite.backends.torch import BACKEND
from tealite.formats import get_format
from tealite.training_types import AdamOptions, SGDOptions
from tealite.types import Op

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_F32_MANT = 23


def _f32(value: float, device) -> torch.Tensor:
    """A Python float as the fp32 scalar a kernel argument would carry."""
    return torch.tensor(value, dtype=torch.float32, device=device)


def any_nonfinite(x: torch.Tensor) -> bool:
    return bool((~torch.isfinite(x)).any()) if x.numel() else False


@BACKEND.implements(Op.MULTI_TENSOR_SCALE, dtypes=_FLOATS)
def multi_tensor_scale(tensors, scale, *, out_dtype, noop_flag):
    outs = []
    for x in tensors:
        outs.append((x.float() * _f32(scale, x.device)).to(out_dtype))
        if any_nonfinite(x):
            noop_flag.fill_(1)
    return tuple(outs)


def sumsq(x32: torch.Tensor) -> torch.Tensor:
    """The fp32 sum of squares of one tensor (torch's own summation order)."""
    return (x32 * x32).sum(dtype=torch.float32)


@BACKEND.implements(Op.MULTI_TENSOR_L2NORM, dtypes=_FLOATS)
def multi_tensor_l2norm(tensors, *, per_tensor, inv_scale, noop_flag):
    device = tensors[0].device if tensors else torch.device("cpu")
    sums = []
    for x in tensors:
        x32 = x.float().reshape(-1)
        if inv_scale is not None:
            x32 = x32 * inv_scale
        sums.append(sumsq(x32))
    sq = torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float32, device=device)
    if any_nonfinite(sq):
        noop_flag.fill_(1)
    total = torch.sqrt(sq.sum(dtype=torch.float32)).reshape(1)
    return total, (torch.sqrt(sq) if per_tensor else None)


# Unscale + L2 norm is the same loop with the inv_scale multiply (the front-end passes it).
BACKEND.implements(Op.MULTI_TENSOR_UNSCALE_L2NORM, dtypes=_FLOATS)(multi_tensor_l2norm)


def bias_corrections(o: AdamOptions) -> tuple[float, float]:
    """TE computes them on the host in double and passes floats."""
    if not o.bias_correction:
        return 1.0, 1.0
    b1 = float(torch.tensor(o.beta1, dtype=torch.float32))
    b2 = float(torch.tensor(o.beta2, dtype=torch.float32))
    return 1.0 - b1 ** o.step, 1.0 - b2 ** o.step


def adam_direction(g, p, m, v, o: AdamOptions, bc1, bc2):
    """One element-wise Adam step in fp32: returns (new p, new m, new v)."""
    d = g.device
    b1, b2, wd = _f32(o.beta1, d), _f32(o.beta2, d), _f32(o.weight_decay, d)
    one = _f32(1.0, d)
    if not o.adam_w_mode:
        g = g + wd * p
    m = b1 * m + (one - b1) * g
    v = b2 * v + (one - b2) * (g * g)
    denom = torch.sqrt(v / _f32(bc2, d)) + _f32(o.eps, d)
    update = (m / _f32(bc1, d)) / denom
    if o.adam_w_mode:
        update = update + wd * p
    return p - _f32(o.lr, d) * update, m, v


@BACKEND.implements(Op.MULTI_TENSOR_ADAM, dtypes=_FLOATS)
def multi_tensor_adam(grads, params, exp_avgs, exp_avg_sqs, options, *, master_params):
    bc1, bc2 = bias_corrections(options)
    for i, g in enumerate(grads):
        source = master_params[i] if master_params is not None else params[i]
        p, m, v = adam_direction(g.float(), source.float(), exp_avgs[i].float(),
                                 exp_avg_sqs[i].float(), options, bc1, bc2)
        exp_avgs[i].copy_(m)
        exp_avg_sqs[i].copy_(v)
        if master_params is not None:
            master_params[i].copy_(p)
        params[i].copy_(p.to(params[i].dtype))


def sgd_direction(g, w, mom, o: SGDOptions):
    """One element-wise SGD step in fp32: returns (new w, new mom)."""
    d = g.device
    wd, mu = _f32(o.weight_decay, d), _f32(o.momentum, d)
    g = g * _f32(o.scale, d)
    if o.weight_decay != 0 and not o.wd_after_momentum:
        g = g + wd * w
    if o.momentum != 0:
        mom = g if o.first_run else mu * mom + (_f32(1.0, d) - _f32(o.dampening, d)) * g
        g = g + mu * mom if o.nesterov else mom
    if o.weight_decay != 0 and o.wd_after_momentum:
        g = g + wd * w
    return w - _f32(o.lr, d) * g, mom


@BACKEND.implements(Op.MULTI_TENSOR_SGD, dtypes=_FLOATS)
def multi_tensor_sgd(grads, params, momenta, options, *, model_params, noop_flag):
    if bool(noop_flag.item()):
        return
    for i, g in enumerate(grads):
        w, mom = sgd_direction(g.float(), params[i].float(), momenta[i].float(), options)
        momenta[i].copy_(mom.to(momenta[i].dtype))
        params[i].copy_(w.to(params[i].dtype))
        if model_params is not None:
            model_params[i].copy_(w.to(model_params[i].dtype))


def scale_from_amax(amax, fmt: str, margin: int, force_pow2: bool, epsilon: float):
    """TE's compute_scale_from_amax with DelayedScaling's margin (fp32, see the front-end)."""
    a = torch.maximum(amax, _f32(epsilon, amax.device)) if epsilon > 0 else amax
    s = _f32(get_format(fmt).max, a.device) / a
    if margin:
        s = s / _f32(2.0 ** margin, a.device)
    s = torch.where(torch.isinf(s), torch.finfo(torch.float32).max, s)
    s = torch.where((a == 0) | ~torch.isfinite(a), torch.ones_like(s), s)
    if force_pow2:
        s = (s.view(torch.int32) & ~((1 << _F32_MANT) - 1)).view(torch.float32)
    return s


@BACKEND.implements(Op.MULTI_TENSOR_COMPUTE_SCALE, dtypes=(torch.float32,))
def multi_tensor_compute_scale(amaxes, fmt, *, margin, force_pow2, epsilon):
    scales = tuple(scale_from_amax(a, fmt, margin, force_pow2, epsilon) for a in amaxes)
    return scales, tuple(_f32(1.0, s.device) / s for s in scales)
