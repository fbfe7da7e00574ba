"""Multi-tensor apply (TE's ``multi_tensor_*`` kernels, driven by its fused optimizers).

Every op takes Python sequences of tensors ("lists"; list i of every argument belongs to the
same parameter), computes in float32 and, like TE, works tensor by tensor, elementwise,
chunk by chunk (``MTA_CHUNK_ELEMENTS``) in a fused backend.  Within one list all tensors share
one dtype and one device (TE dispatches a list on its first tensor's dtype); empty tensors are
allowed and contribute nothing.

* ``multi_tensor_scale(tensors, scale, out_dtype=None, noop_flag=None)``: ``out_i =
  round_out(fp32(x_i) * fp32(scale))``, and the int32 (1,) ``noop_flag`` set to 1 when any
  *input* element is NaN or Inf (TE's overflow check of a loss-scaled gradient; it is never
  cleared here).  Returns :class:`ScaleResult`.
* ``multi_tensor_l2norm(tensors, per_tensor=True, noop_flag=None)``: the float32 2-norm of all
  elements together and of each tensor (sum of fp32 squares, square root), and the int32 (1,)
  flag set to 1 when a sum of squares is not finite (TE's L2NormFunctor propagates NaN / Inf
  into the norm and fires the flag per chunk).  Returns :class:`L2Norms`.
* ``multi_tensor_unscale_l2norm(tensors, inv_scale, per_tensor=True)``: the same norms of
  ``fp32(x) * inv_scale`` (inv_scale a float32 (1,) tensor, TE's unscale-then-clip path).
* ``multi_tensor_adam(grads, params, exp_avgs, exp_avg_sqs, options, master_params=None)``:
  one Adam / AdamW step (options: :class:`tealite.training_types.AdamOptions`), TE's order::

      g = fp32(grad); p = master if given else fp32(param)
      L2 mode:   g = g + wd * p
      m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g * g
      bc1, bc2 = (1 - b1^step, 1 - b2^step) if bias_correction else (1, 1)   (host, double)
      u = (m / bc1) / (sqrt(v / bc2) + eps)
      AdamW:     u = u + wd * p
      p = p - lr * u

  exp_avgs / exp_avg_sqs share one dtype (float32, or bf16 / fp16 states: read into fp32,
  rounded back once); master_params are float32; params float32 / bf16 / fp16.  The tensors
  are updated in place and returned (:class:`AdamResult`).
* ``multi_tensor_sgd(grads, params, momenta, options, model_params=None, noop_flag=None)``:
  one SGD step (options: :class:`tealite.training_types.SGDOptions`), apex / TE's order::

      g = fp32(grad) * scale
      if wd and not wd_after_momentum: g = g + wd * w
      if momentum: mom = g if first_run else momentum * mom + (1 - dampening) * g
                   g = g + momentum * mom if nesterov else mom
      if wd and wd_after_momentum: g = g + wd * w
      w = w - lr * g ;  model_params (a low-precision copy) = round(w)

  momenta share the params' dtype.  A set ``noop_flag`` skips the step (TE skips an update
  after an overflow).  Updated in place and returned (:class:`SGDResult`).
* ``multi_tensor_compute_scale(amaxes, fmt, margin=0, force_pow2=False, epsilon=0.0)``: per
  element of each float32 amax tensor (TE's lists hold amax tensors of any size; a per-tensor
  recipe's is (1,)), TE's current-scaling rule ``scale = (fmt_max / max(amax, epsilon)) /
  2^margin`` in fp32, an infinite quotient becoming FLT_MAX, amax 0 / NaN / Inf giving 1,
  optionally floored to a power of two; ``scale_inv = 1 / scale``.  Returns :class:`Scales`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import torch

import tealite.registry as registry
from tealite._checks import (FLOAT_DTYPES, check_choice, check_finite_number, dtype_name,
                             one_dtype_and_device, require)
from tealite.formats import FP8_FORMATS
from tealite.training_types import AdamOptions, SGDOptions
from tealite.types import Op

F32 = (torch.float32,)
_SHAPE = operator.attrgetter("shape")


@dataclass(frozen=True)
class ScaleResult:
    outputs: tuple[torch.Tensor, ...]
    noop_flag: torch.Tensor  # int32 (1,)


@dataclass(frozen=True)
class L2Norms:
    total: torch.Tensor                # float32 (1,)
    per_tensor: torch.Tensor | None    # float32 (N,), or None when not asked for
    noop_flag: torch.Tensor            # int32 (1,)


@dataclass(frozen=True)
class AdamResult:
    params: tuple[torch.Tensor, ...]
    exp_avgs: tuple[torch.Tensor, ...]
    exp_avg_sqs: tuple[torch.Tensor, ...]
    master_params: tuple[torch.Tensor, ...] | None


@dataclass(frozen=True)
class SGDResult:
    params: tuple[torch.Tensor, ...]
    momenta: tuple[torch.Tensor, ...]
    model_params: tuple[torch.Tensor, ...] | None


@dataclass(frozen=True)
class Scales:
    scales: tuple[torch.Tensor, ...]
    scale_invs: tuple[torch.Tensor, ...]


def _all_tensors(tensors) -> bool:
    """Every entry a torch.Tensor (or a subclass such as Parameter): a C-level pass over the
    types, then one check per distinct type (a list holds one or two)."""
    return all(issubclass(k, torch.Tensor) for k in set(map(type, tensors)))


def _same_shapes(tensors, like) -> bool:
    """Entry by entry, C-level: each pair's two ``torch.Size`` are freed at once.  (Holding a
    list of 1000 sizes alive per call made the garbage collector run: ~0.1 ms of young
    collections per Adam step and a full collection, ~100 ms, every ~100 steps.)"""
    return all(map(operator.eq, map(_SHAPE, tensors), map(_SHAPE, like)))


def check_list(name: str, tensors, *, dtypes=FLOAT_DTYPES, length: int | None = None,
               like=None) -> tuple[torch.Tensor, ...]:
    """A list of tensors of one dtype (among ``dtypes``) and one device; ``length``: the
    first list's length; ``like``: the first list, whose shapes this one must match.
    Checked in one cheap pass per property (an optimizer step runs this over 4-5 lists of
    ~1000 tensors: the front end's host time is these per-entry attribute reads), the message
    built only for the first bad entry."""
    require(isinstance(tensors, (list, tuple)),
            f"{name} must be a list or tuple of tensors, got {type(tensors).__name__}")
    tensors = tuple(tensors)
    if length is not None:
        require(len(tensors) == length, f"{name} must have {length} tensors (one per entry of "
                                        f"the first list), got {len(tensors)}")
    if not tensors:
        return tensors
    first = tensors[0]
    if _all_tensors(tensors) and first.dtype in dtypes and one_dtype_and_device(
            tensors) is not None and (like is None or _same_shapes(tensors, like)):
        return tensors
    for i, t in enumerate(tensors):
        _check_entry(name, i, t, first, dtypes, None if like is None else like[i])
    return tensors


def _check_entry(name: str, i: int, t, first, dtypes, partner) -> None:
    require(isinstance(t, torch.Tensor),
            f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    allowed = ", ".join(dtype_name(d) for d in dtypes)
    require(t.dtype in dtypes, f"{name}[{i}] dtype must be one of ({allowed}), got "
                               f"{dtype_name(t.dtype)}")
    require(t.dtype == first.dtype, f"{name}[{i}] dtype {dtype_name(t.dtype)} differs "
                                    f"from {name}[0]'s {dtype_name(first.dtype)}"
                                    f" (one dtype per list)")
    require(t.device == first.device, f"{name}[{i}] is on {t.device}, {name}[0] on "
                                      f"{first.device} (one device per call)")
    if partner is not None:
        require(t.shape == partner.shape, f"{name}[{i}] shape {tuple(t.shape)} differs from "
                                          f"its partner's {tuple(partner.shape)}")


def _same_device(first: str, lists: dict[str, tuple]) -> None:
    ref = lists[first]
    if not ref:
        return
    for name, ts in lists.items():
        require(not ts or ts[0].device == ref[0].device,
                f"{name} is on {ts[0].device if ts else None}, {first} on {ref[0].device} "
                f"(one device per call)")


def _flag(noop_flag, device) -> torch.Tensor:
    if noop_flag is None:
        return torch.zeros(1, dtype=torch.int32, device=device)
    require(isinstance(noop_flag, torch.Tensor) and noop_flag.dtype == torch.int32
            and tuple(noop_flag.shape) == (1,),
            "noop_flag must be an int32 tensor of shape (1,)")
    require(noop_flag.device == device, f"noop_flag is on {noop_flag.device}, the tensors on "
                                        f"{device}")
    return noop_flag


def _params(op: Op, first: tuple, dtype, **extra) -> dict:
    device = first[0].device if first else torch.device("cpu")
    return dict(op=op, dtype=dtype, device=registry.device_kind(device), count=len(first),
                numels=tuple(map(torch.Tensor.numel, first)), **extra)


def _device(tensors) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")


def multi_tensor_scale(tensors, scale: float, *, out_dtype: torch.dtype | None = None,
                       noop_flag: torch.Tensor | None = None,
                       backend: str | None = None) -> ScaleResult:
    xs = check_list("tensors", tensors)
    scale = check_finite_number("scale", scale)
    out_dtype = out_dtype or (xs[0].dtype if xs else torch.float32)
    require(out_dtype in FLOAT_DTYPES, f"out_dtype must be one of float32, bfloat16, float16, "
                                       f"got {out_dtype}")
    flag = _flag(noop_flag, _device(xs))
    dtype = xs[0].dtype if xs else torch.float32
    impl = registry.dispatch(Op.MULTI_TENSOR_SCALE,
                             _params(Op.MULTI_TENSOR_SCALE, xs, dtype, out_dtype=out_dtype),
                             backend)
    outs = impl.fn(xs, scale, out_dtype=out_dtype, noop_flag=flag)
    return ScaleResult(tuple(outs), flag)


def multi_tensor_l2norm(tensors, *, per_tensor: bool = True,
                        noop_flag: torch.Tensor | None = None,
                        backend: str | None = None) -> L2Norms:
    xs = check_list("tensors", tensors)
    require(isinstance(per_tensor, bool), f"per_tensor must be a bool, got {per_tensor!r}")
    dtype = xs[0].dtype if xs else torch.float32
    impl = registry.dispatch(Op.MULTI_TENSOR_L2NORM,
                             _params(Op.MULTI_TENSOR_L2NORM, xs, dtype), backend)
    flag = _flag(noop_flag, _device(xs))
    total, per = impl.fn(xs, per_tensor=per_tensor, inv_scale=None, noop_flag=flag)
    return L2Norms(total, per, flag)


def multi_tensor_unscale_l2norm(tensors, inv_scale: torch.Tensor, *, per_tensor: bool = True,
                                noop_flag: torch.Tensor | None = None,
                                backend: str | None = None) -> L2Norms:
    xs = check_list("tensors", tensors)
    require(isinstance(inv_scale, torch.Tensor) and inv_scale.dtype == torch.float32
            and tuple(inv_scale.shape) == (1,), "inv_scale must be a float32 tensor of shape (1,)")
    require(not xs or inv_scale.device == xs[0].device,
            f"inv_scale is on {inv_scale.device}, the tensors on {_device(xs)}")
    dtype = xs[0].dtype if xs else torch.float32
    impl = registry.dispatch(Op.MULTI_TENSOR_UNSCALE_L2NORM,
                             _params(Op.MULTI_TENSOR_UNSCALE_L2NORM, xs, dtype), backend)
    flag = _flag(noop_flag, _device(xs))
    total, per = impl.fn(xs, per_tensor=per_tensor, inv_scale=inv_scale, noop_flag=flag)
    return L2Norms(total, per, flag)


def _check_adam_options(o) -> None:
    require(isinstance(o, AdamOptions), f"options must be an AdamOptions, got {type(o).__name__}")
    for name in ("lr", "beta1", "beta2", "eps", "weight_decay"):
        check_finite_number(f"options.{name}", getattr(o, name))
    require(0.0 <= o.beta1 < 1.0, f"options.beta1 must be in [0, 1), got {o.beta1}")
    require(0.0 <= o.beta2 < 1.0, f"options.beta2 must be in [0, 1), got {o.beta2}")
    require(o.eps > 0.0, f"options.eps must be > 0, got {o.eps}")
    require(isinstance(o.step, int) and o.step >= 1, f"options.step must be an int >= 1, got "
                                                     f"{o.step!r}")


def multi_tensor_adam(grads, params, exp_avgs, exp_avg_sqs, options: AdamOptions, *,
                      master_params=None, backend: str | None = None) -> AdamResult:
    _check_adam_options(options)
    gs = check_list("grads", grads)
    ps = check_list("params", params, length=len(gs), like=gs)
    ms = check_list("exp_avgs", exp_avgs, length=len(gs), like=gs)
    vs = check_list("exp_avg_sqs", exp_avg_sqs, dtypes=(ms[0].dtype,) if ms else FLOAT_DTYPES,
                    length=len(gs), like=gs)
    masters = None if master_params is None else check_list(
        "master_params", master_params, dtypes=F32, length=len(gs), like=gs)
    _same_device("grads", dict(grads=gs, params=ps, exp_avgs=ms, exp_avg_sqs=vs,
                               master_params=masters or ()))
    dtype = ps[0].dtype if ps else torch.float32
    impl = registry.dispatch(Op.MULTI_TENSOR_ADAM, _params(
        Op.MULTI_TENSOR_ADAM, ps, dtype, grad_dtype=gs[0].dtype if gs else dtype,
        master=masters is not None, adam_w_mode=options.adam_w_mode,
        state_dtype=ms[0].dtype if ms else torch.float32), backend)
    impl.fn(gs, ps, ms, vs, options, master_params=masters)
    return AdamResult(ps, ms, vs, masters)


def _check_sgd_options(o) -> None:
    require(isinstance(o, SGDOptions), f"options must be an SGDOptions, got {type(o).__name__}")
    for name in ("lr", "momentum", "dampening", "weight_decay", "scale"):
        check_finite_number(f"options.{name}", getattr(o, name))
    require(not o.nesterov or (o.momentum > 0 and o.dampening == 0),
            "options.nesterov needs momentum > 0 and dampening == 0")


def multi_tensor_sgd(grads, params, momenta, options: SGDOptions, *, model_params=None,
                     noop_flag: torch.Tensor | None = None,
                     backend: str | None = None) -> SGDResult:
    _check_sgd_options(options)
    gs = check_list("grads", grads)
    ps = check_list("params", params, length=len(gs), like=gs)
    moms = check_list("momenta", momenta, dtypes=(ps[0].dtype,) if ps else FLOAT_DTYPES,
                      length=len(gs), like=gs)
    copies = None if model_params is None else check_list(
        "model_params", model_params, length=len(gs), like=gs)
    _same_device("grads", dict(grads=gs, params=ps, momenta=moms, model_params=copies or ()))
    flag = _flag(noop_flag, _device(gs))
    dtype = ps[0].dtype if ps else torch.float32
    impl = registry.dispatch(Op.MULTI_TENSOR_SGD, _params(
        Op.MULTI_TENSOR_SGD, ps, dtype, grad_dtype=gs[0].dtype if gs else dtype,
        model_copy=copies is not None), backend)
    impl.fn(gs, ps, moms, options, model_params=copies, noop_flag=flag)
    return SGDResult(ps, moms, copies)


def multi_tensor_compute_scale(amaxes, fmt: str, *, margin: int = 0, force_pow2: bool = False,
                               epsilon: float = 0.0, backend: str | None = None) -> Scales:
    amax = check_list("amaxes", amaxes, dtypes=F32)
    check_choice("fmt", fmt, FP8_FORMATS)
    require(isinstance(margin, int) and not isinstance(margin, bool) and 0 <= margin <= 64,
            f"margin must be an int in [0, 64], got {margin!r}")
    epsilon = check_finite_number("epsilon", epsilon)
    require(epsilon >= 0.0, f"epsilon must be >= 0, got {epsilon}")
    impl = registry.dispatch(Op.MULTI_TENSOR_COMPUTE_SCALE, _params(
        Op.MULTI_TENSOR_COMPUTE_SCALE, amax, torch.float32, fmt=fmt), backend)
    scales, invs = impl.fn(amax, fmt, margin=margin, force_pow2=force_pow2, epsilon=epsilon)
    return Scales(tuple(scales), tuple(invs))
