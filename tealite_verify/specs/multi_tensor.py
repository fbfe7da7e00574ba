"""Specs for the multi-tensor ops (issue 17): scale, L2 norm, unscale + L2 norm, Adam / AdamW,
SGD, compute-scale.

Inputs are named ``<list>.<i>`` (tensor i of a list); outputs concatenate a list's tensors
flattened in order (``out``, ``params``, ...), so an element's position names its tensor.

* ``out`` of scale, the ``noop_flag``, compute-scale's ``scale`` / ``scale_inv``, and every
  output of an SGD step skipped by a set flag: ``exact`` (the reference performs the fp32
  roundings the op specifies; tealite_verify/references/multi_tensor.py).
* the norms: ``ulp`` with the summation bound of tealite_verify/tiers/multi_tensor.py
  (gamma_n of the sum of squares, carried through the square root).
* Adam / SGD params and states: ``ulp`` with the running error bound of the update formula
  itself, evaluated per element (same module), plus the storage rounding.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import tealite
from tealite.formats import FP8_FORMATS
from tealite.training_types import AdamOptions, SGDOptions
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import multi_tensor as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.training import (mta_adam_options, mta_sgd_options, mta_sizes,
                                                mta_values)
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import multi_tensor as mt
from tealite_verify.tiers.metrics import Tier
from tealite_verify.tiers.primitives import compute_dtype

FLOATS = ("float32", "bfloat16", "float16")
HUGE_LOG2 = {"float32": 40, "bfloat16": 40, "float16": 8}  # |g| * 2^k stays in range


def _list(inputs, name: str, n: int) -> list:
    return [inputs[f"{name}.{i}"] for i in range(n)]


def _cat(tensors, dtype: torch.dtype) -> torch.Tensor:
    flat = [t.reshape(-1) for t in tensors]
    return torch.cat(flat) if flat else torch.zeros(0, dtype=dtype)


def _cat_np(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a).reshape(-1) for a in arrays]) if arrays else \
        np.zeros(0)


_SALT = {"x": 0, "g": 1, "p": 2, "m": 3, "v": 4, "w": 5, "mom": 6}  # one stream per list


def _exact(values, dtype: torch.dtype) -> torch.Tensor:
    """An exact-tier expectation as a tensor of ``dtype`` (values already representable in it;
    the exact tier compares bit patterns as torch reads them)."""
    return torch.tensor(np.asarray(values, dtype=np.float64).reshape(-1)).to(dtype)


def _gen(case, name: str, i: int, size: int, dtype: str, device, *, scale_log2: int = 0):
    dist = case["dist"]
    t = generate(dist, (size,), torch.float32, case["seed"] * 7919 + i * 31 + _SALT[name])
    return (t * 2.0 ** scale_log2).to(dtype_of(dtype)).to(device)


# ---- scale ---------------------------------------------------------------------------------

@st.composite
def scale_cases(draw, dtype=None, size="ci"):
    dtype = dtype or draw(float_dtypes())
    return {"dtype": dtype, "sizes": draw(mta_sizes(size)), "out_dtype": draw(pick(*FLOATS)),
            "scale": draw(pick(2.0 ** -8, 0.5, 3.0, 65536.0, 1e-30)),
            "values": draw(pick("plain", "plain", "nonfinite")),
            "flag_in": draw(pick(0, 0, 1)),
            "dist": draw(distributions(dtype)), "seed": draw(seeds())}


def _poison(xs, case) -> None:
    """A NaN or Inf in the last non-empty tensor (the one a flag reduction reaches last)."""
    full = [t for t in xs if t.numel()]
    if case["values"] == "nonfinite" and full:
        full[-1].view(-1)[case["seed"] % full[-1].numel()] = \
            (float("nan"), float("inf"), -float("inf"))[case["seed"] % 3]


def scale_inputs(case, device):
    xs = [_gen(case, "x", i, n, case["dtype"], device) for i, n in enumerate(case["sizes"])]
    _poison(xs, case)
    return {f"x.{i}": x for i, x in enumerate(xs)}


def scale_call(inputs, case, backend):
    n = len(case["sizes"])
    flag = torch.full((1,), case["flag_in"], dtype=torch.int32,
                      device=inputs["x.0"].device)
    r = tealite.multi_tensor_scale(_list(inputs, "x", n), case["scale"],
                                   out_dtype=dtype_of(case["out_dtype"]), noop_flag=flag,
                                   backend=backend)
    return {"out": _cat(r.outputs, dtype_of(case["out_dtype"])), "noop_flag": r.noop_flag}


def scale_reference(inputs, case):
    xs = _list(inputs, "x", len(case["sizes"]))
    out = [ref.scale(x, case["scale"], case["out_dtype"]) for x in xs]
    value = np.concatenate(out) if out else np.zeros(0, ref.OUT_TYPES[case["out_dtype"]])
    out_dtype = dtype_of(case["out_dtype"])
    return {"out": Expected(_exact(value, out_dtype), out_dtype, Tier.EXACT),
            "noop_flag": Expected(torch.from_numpy(ref.noop_flag(xs, case["flag_in"])),
                                  torch.int32, Tier.EXACT)}


# ---- L2 norms ------------------------------------------------------------------------------

@st.composite
def norm_cases(draw, dtype=None, size="ci"):
    dtype = dtype or draw(float_dtypes())
    return {"dtype": dtype, "sizes": draw(mta_sizes(size)),
            "algo": draw(pick("per_tensor", "total_only")),
            "inv_scale": draw(pick(1.0, 2.0 ** -16, 0.3)),
            "values": draw(pick("plain", "plain", "plain", "nonfinite")),
            "dist": draw(distributions(dtype)), "seed": draw(seeds())}


def _norm_call(unscale: bool):
    def call(inputs, case, backend):
        xs = _list(inputs, "x", len(case["sizes"]))
        per = case["algo"] == "per_tensor"
        if unscale:
            inv = torch.tensor([case["inv_scale"]], dtype=torch.float32, device=xs[0].device)
            r = tealite.multi_tensor_unscale_l2norm(xs, inv, per_tensor=per, backend=backend)
        else:
            r = tealite.multi_tensor_l2norm(xs, per_tensor=per, backend=backend)
        return {"total": r.total, "noop_flag": r.noop_flag,
                **({"per_tensor": r.per_tensor} if per else {})}
    return call


def _norm_reference(unscale: bool):
    def reference(inputs, case):
        xs = _list(inputs, "x", len(case["sizes"]))
        inv = ref.f32(case["inv_scale"]) if unscale else None
        with np.errstate(invalid="ignore"):
            sums = np.array([ref.sum_of_squares(x, inv) for x in xs])
        total, per = ref.l2norms(xs, inv)
        sizes = np.array(case["sizes"], dtype=np.float64)

        def bound(values, n):
            return lambda num: mt.norm_tolerance(values, n, num, unscaled=unscale)
        # The flag: a chunk's fp32 sum of squares not finite.  The strategies keep |x| far
        # below sqrt(FLT_MAX / n), so that is exactly a NaN / Inf among the inputs.
        out = {"total": Expected(total, torch.float32, Tier.ULP,
                                 bound(np.array([sums.sum()]), np.array([sizes.sum()]))),
               "noop_flag": Expected(torch.from_numpy(ref.noop_flag(xs)), torch.int32,
                                     Tier.EXACT)}
        if case["algo"] == "per_tensor":
            out["per_tensor"] = Expected(per, torch.float32, Tier.ULP, bound(sums, sizes))
        return out
    return reference


# ---- Adam ----------------------------------------------------------------------------------

@st.composite
def adam_cases(draw, dtype=None, size="ci"):
    dtype = dtype or draw(float_dtypes())
    return {"dtype": dtype, "sizes": draw(mta_sizes(size)), "options": draw(mta_adam_options()),
            "algo": draw(pick("adamw", "adam")), "master": draw(st.booleans()),
            "state_dtype": draw(pick("float32", "float32", "bfloat16", "float16")),
            # fp32 gradients with low-precision params (a grad accumulated in fp32)
            "grad_dtype": draw(pick(dtype, dtype, "float32")),
            "values": draw(mta_values()),
            "dist": draw(distributions(dtype, wide=False)), "seed": draw(seeds())}


def adam_inputs(case, device):
    dt, out = case["dtype"], {}
    huge = HUGE_LOG2[dt] if case["values"] == "huge" else 0
    for i, n in enumerate(case["sizes"]):
        g = _gen(case, "g", i, n, case.get("grad_dtype", dt), device, scale_log2=huge)
        master = _gen(case, "p", i, n, "float32", device)
        state = dtype_of(case.get("state_dtype", "float32"))
        m = _gen(case, "m", i, n, "float32", device, scale_log2=-3).to(state)
        v = (_gen(case, "v", i, n, "float32", device, scale_log2=-3) ** 2).to(state)
        if case["values"] == "zero_v":
            v.zero_()
            g[::2] = 0
        out.update({f"g.{i}": g, f"p.{i}": master.to(dtype_of(dt)), f"m.{i}": m, f"v.{i}": v})
        if case["master"]:
            out[f"master.{i}"] = master
    return out


def _adam_options(case) -> AdamOptions:
    return AdamOptions(adam_w_mode=case["algo"] == "adamw", **case["options"])


def adam_call(inputs, case, backend):
    n, dt = len(case["sizes"]), dtype_of(case["dtype"])
    lists = {k: [t.clone() for t in _list(inputs, k, n)] for k in ("g", "p", "m", "v")}
    masters = [t.clone() for t in _list(inputs, "master", n)] if case["master"] else None
    r = tealite.multi_tensor_adam(lists["g"], lists["p"], lists["m"], lists["v"],
                                  _adam_options(case), master_params=masters, backend=backend)
    state = dtype_of(case.get("state_dtype", "float32"))
    out = {"params": _cat(r.params, dt), "exp_avgs": _cat(r.exp_avgs, state),
           "exp_avg_sqs": _cat(r.exp_avg_sqs, state)}
    if masters is not None:
        out["master_params"] = _cat(r.master_params, torch.float32)
    return out


def _values_and_bounds(step, lists, n, outputs):
    """{name: Expected} for ``outputs`` = ((name, index in step's result, storage dtype), ...):
    the values from ``step`` on float64 arrays, the bounds from ``step`` on Tracked inputs
    (evaluated once per compute dtype)."""
    plain = [step(*(lst[i] for lst in lists)) for i in range(n)]
    cache: dict = {}

    def tracked(numerics):
        key = compute_dtype(numerics)
        if key not in cache:
            cache[key] = [step(*(mt.exact_input(lst[i], numerics) for lst in lists))
                          for i in range(n)]
        return cache[key]

    expected = {}
    for name, j, dtype in outputs:
        def bound(numerics, j=j, dtype=dtype):
            return _cat_np([mt.storage_tolerance(r[j], dtype) for r in tracked(numerics)])
        expected[name] = Expected(_cat_np([r[j] for r in plain]), dtype, Tier.ULP, bound)
    return expected


def adam_reference(inputs, case):
    n, o = len(case["sizes"]), case["options"]
    c = ref.AdamConstants.of(o["lr"], o["beta1"], o["beta2"], o["eps"], o["step"],
                             o["weight_decay"], case["algo"] == "adamw", o["bias_correction"])
    source = "master" if case["master"] else "p"
    lists = [_list(inputs, k, n) for k in ("g", source, "m", "v")]

    def step(g, p, m, v):
        return ref.adam_update(g, p, m, v, c, sqrt=np.sqrt if isinstance(g, np.ndarray)
                               else mt.tracked_sqrt)
    state = dtype_of(case.get("state_dtype", "float32"))
    outputs = [("params", 0, dtype_of(case["dtype"])), ("exp_avgs", 1, state),
               ("exp_avg_sqs", 2, state)]
    if case["master"]:
        outputs.append(("master_params", 0, torch.float32))
    return _values_and_bounds(step, lists, n, outputs)


# ---- SGD -----------------------------------------------------------------------------------

@st.composite
def sgd_cases(draw, dtype=None, size="ci"):
    dtype = dtype or draw(float_dtypes())
    copy = draw(pick(None, "bfloat16", "float16")) if dtype == "float32" else None
    return {"dtype": dtype, "sizes": draw(mta_sizes(size)), "options": draw(mta_sgd_options()),
            "algo": draw(pick("momentum", "nesterov", "plain")), "model_copy": copy,
            "noop": draw(pick(False, False, False, True)), "values": draw(mta_values()),
            "dist": draw(distributions(dtype, wide=False)), "seed": draw(seeds())}


def sgd_inputs(case, device):
    dt, out = case["dtype"], {}
    huge = HUGE_LOG2[dt] if case["values"] == "huge" else 0
    for i, n in enumerate(case["sizes"]):
        out[f"g.{i}"] = _gen(case, "g", i, n, dt, device, scale_log2=huge)
        out[f"w.{i}"] = _gen(case, "w", i, n, dt, device)
        out[f"mom.{i}"] = _gen(case, "mom", i, n, dt, device, scale_log2=-3)
    return out


def _sgd_options(case) -> SGDOptions:
    o = dict(case["options"])
    if case["algo"] == "plain":
        o["momentum"] = 0.0
    nesterov = case["algo"] == "nesterov"
    if nesterov:
        o["dampening"] = 0.0
    return SGDOptions(nesterov=nesterov, **o)


def sgd_call(inputs, case, backend):
    n, dt = len(case["sizes"]), dtype_of(case["dtype"])
    g, w, mom = ([t.clone() for t in _list(inputs, k, n)] for k in ("g", "w", "mom"))
    copies = ([torch.zeros_like(t, dtype=dtype_of(case["model_copy"])) for t in w]
              if case["model_copy"] else None)
    flag = torch.full((1,), int(case["noop"]), dtype=torch.int32, device=inputs["g.0"].device)
    r = tealite.multi_tensor_sgd(g, w, mom, _sgd_options(case), model_params=copies,
                                 noop_flag=flag, backend=backend)
    out = {"params": _cat(r.params, dt), "momenta": _cat(r.momenta, dt)}
    if copies is not None:
        out["model_params"] = _cat(r.model_params, dtype_of(case["model_copy"]))
    return out


def sgd_reference(inputs, case):
    n, dt = len(case["sizes"]), dtype_of(case["dtype"])
    w, mom = _list(inputs, "w", n), _list(inputs, "mom", n)
    if case["noop"]:  # skipped: unchanged params and momenta, untouched (zero) copies
        out = {"params": Expected(_exact(_cat_np(w), dt), dt, Tier.EXACT),
               "momenta": Expected(_exact(_cat_np(mom), dt), dt, Tier.EXACT)}
        if case["model_copy"]:
            copy = dtype_of(case["model_copy"])
            out["model_params"] = Expected(torch.zeros(int(sum(case["sizes"])), dtype=copy),
                                           copy, Tier.EXACT)
        return out
    o = _sgd_options(case)
    c = ref.SGDConstants.of(o.lr, o.momentum, o.dampening, o.nesterov, o.weight_decay,
                            o.first_run, o.wd_after_momentum, o.scale)
    lists = [_list(inputs, "g", n), w, mom]

    def step(g, w_, m_):
        return ref.sgd_update(g, w_, m_, c)
    outputs = [("params", 0, dt), ("momenta", 1, dt)]
    if case["model_copy"]:
        outputs.append(("model_params", 0, dtype_of(case["model_copy"])))
    return _values_and_bounds(step, lists, n, outputs)


# ---- compute scale -------------------------------------------------------------------------

# Named (cases are JSON: no NaN / Inf literals): TE's amax 0 / NaN / Inf rule, a subnormal
# amax whose quotient overflows to FLT_MAX, a huge one, the E4M3 max, one.
AMAX_SPECIALS = {"zero": 0.0, "inf": float("inf"), "nan": float("nan"), "subnormal": 1e-40,
                 "huge": 3e38, "fmax": 448.0, "one": 1.0}


@st.composite
def compute_scale_cases(draw, dtype=None, size="ci"):
    count = draw(st.integers(1, {"ci": 8, "local": 300, "large": 2000}[size]))
    return {"dtype": "float32", "count": count, "fmt": draw(pick(*FP8_FORMATS)),
            "margin": draw(pick(0, 1, 3)), "force_pow2": draw(st.booleans()),
            "epsilon": draw(pick(0.0, 0.0, 1e-12, 100.0)),  # TE's test: 0 and 100
            "specials": draw(st.lists(pick(*sorted(AMAX_SPECIALS)), max_size=min(count, 4))),
            "dist": draw(distributions("float32")), "seed": draw(seeds())}


def compute_scale_inputs(case, device):
    amax = generate(case["dist"], (case["count"],), torch.float32, case["seed"]).abs()
    for i, name in enumerate(case["specials"]):
        amax[i] = AMAX_SPECIALS[name]
    return {f"amax.{i}": amax[i:i + 1].clone().to(device) for i in range(case["count"])}


def compute_scale_call(inputs, case, backend):
    r = tealite.multi_tensor_compute_scale(
        _list(inputs, "amax", case["count"]), case["fmt"], margin=case["margin"],
        force_pow2=case["force_pow2"], epsilon=case["epsilon"], backend=backend)
    return {"scale": _cat(r.scales, torch.float32), "scale_inv": _cat(r.scale_invs,
                                                                      torch.float32)}


def compute_scale_reference(inputs, case):
    amax = _cat_np(_list(inputs, "amax", case["count"]))
    s, inv = ref.compute_scale(amax, case["fmt"], case["margin"], case["force_pow2"],
                               case["epsilon"])
    return {"scale": Expected(_exact(s, torch.float32), torch.float32, Tier.EXACT),
            "scale_inv": Expected(_exact(inv, torch.float32), torch.float32, Tier.EXACT)}


# ---- registration --------------------------------------------------------------------------

_DIST = {"kind": "normal", "scale": 1.0, "sample_dtype": "float32"}
_SMOKE_SIZES = ([555, 0, 17], [1, 3, 0, 64])

register(OpSpec(
    name=Op.MULTI_TENSOR_SCALE, family="multi_tensor", cases=scale_cases,
    make_inputs=scale_inputs, call=scale_call, reference=scale_reference,
    coverage=cov.layout_cells("out_dtype", FLOATS),
    # seed 4 poisons with +Inf (seed % 3 == 1): a flag checking NaN only misses it.
    smoke_cases=tuple({"dtype": dt, "sizes": s, "out_dtype": od, "scale": 0.5, "values": v,
                       "flag_in": 0, "dist": _DIST, "seed": 4}
                      for dt, s, od, v in (("float32", _SMOKE_SIZES[0], "bfloat16", "plain"),
                                           ("float16", _SMOKE_SIZES[1], "float32",
                                            "nonfinite")))))

for _op, _unscale in ((Op.MULTI_TENSOR_L2NORM, False), (Op.MULTI_TENSOR_UNSCALE_L2NORM, True)):
    register(OpSpec(
        name=_op, family="multi_tensor", cases=norm_cases, make_inputs=scale_inputs,
        call=_norm_call(_unscale), reference=_norm_reference(_unscale),
        coverage=cov.layout_cells("algo", ("per_tensor", "total_only")),
        smoke_cases=tuple({"dtype": "float32", "sizes": s, "algo": "per_tensor",
                           "inv_scale": 0.3, "values": "plain", "dist": _DIST, "seed": 5}
                          for s in _SMOKE_SIZES)))

register(OpSpec(
    name=Op.MULTI_TENSOR_ADAM, family="multi_tensor", cases=adam_cases, make_inputs=adam_inputs,
    call=adam_call, reference=adam_reference,
    coverage=cov.layout_cells("algo", ("adam", "adamw")),  # state dtypes: drawn, not cells
    smoke_cases=tuple({"dtype": dt, "sizes": _SMOKE_SIZES[0], "algo": a, "master": mst,
                       "values": "plain", "dist": _DIST, "seed": 7,
                       "options": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                   "step": 3, "weight_decay": 0.01, "bias_correction": True}}
                      for dt, a, mst in (("float32", "adamw", False),
                                         ("bfloat16", "adam", True)))))

register(OpSpec(
    name=Op.MULTI_TENSOR_SGD, family="multi_tensor", cases=sgd_cases, make_inputs=sgd_inputs,
    call=sgd_call, reference=sgd_reference,
    coverage=cov.layout_cells("algo", ("plain", "momentum", "nesterov")),
    smoke_cases=({"dtype": "float32", "sizes": _SMOKE_SIZES[0], "algo": "nesterov",
                  "model_copy": "float16", "noop": False, "values": "plain", "dist": _DIST,
                  "seed": 9, "options": {"lr": 0.1, "momentum": 0.9, "dampening": 0.0,
                                         "weight_decay": 0.01, "first_run": False,
                                         "wd_after_momentum": False, "scale": 1.0}},)))

register(OpSpec(
    name=Op.MULTI_TENSOR_COMPUTE_SCALE, family="multi_tensor", cases=compute_scale_cases,
    make_inputs=compute_scale_inputs, call=compute_scale_call,
    reference=compute_scale_reference, dtypes=("float32",),
    coverage=cov.layout_cells("fmt", FP8_FORMATS),
    smoke_cases=({"dtype": "float32", "count": 7, "fmt": "e4m3", "margin": 1,
                  "force_pow2": False, "epsilon": 0.0, "specials": sorted(AMAX_SPECIALS),
                  "dist": _DIST, "seed": 1},)))
