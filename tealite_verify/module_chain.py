"""The compound-module check (issue 17 part 5): a LayerNormLinear or LayerNormMLP of
tealite.modules, run forward and backward (autograd) with every sub-op on the backends a
``ModuleBackends`` names, judged against the float64 composition (references/modules.py) under
the propagated bound (tiers/modules.py, the derivation).

:class:`ModuleCase` describes one case; :func:`make_module` / :func:`make_inputs` build it,
:func:`run_module` runs it and :func:`check_module` judges its outputs.  Delayed scaling's
scales are set from the amaxes of an unquantized float64 pass (a history that saw this step),
rounded down to a power of two, as a recipe's margin would leave them; they travel with the
inputs (``scales``) as the parameters do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import tealite.recipes as R
from tealite.modules import LayerNormLinear, LayerNormMLP, ModuleBackends
from tealite.modules.layernorm_mlp import CASTS
from tealite.types import GATED
from tealite_verify.references import modules as ref
from tealite_verify.tiers import bounded
from tealite_verify.tiers.metrics import Metrics, Tier
from tealite_verify.tiers.modules import ModuleNumerics, bounds
from tealite_verify.tiers.primitives import to_f64

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RECIPES = {"none": None, "current": R.Float8CurrentScaling(), "delayed": R.DelayedScaling(),
           "mxfp8": R.MXFP8BlockScaling()}


@dataclass(frozen=True)
class ModuleCase:
    module: str = "mlp"             # "linear" | "mlp"
    tokens: int = 8
    hidden: int = 16
    ffn: int = 16                   # out_features of a LayerNormLinear
    dtype: str = "bfloat16"
    normalization: str = "LayerNorm"
    activation: str = "gelu"
    recipe: str = "none"
    zero_centered_gamma: bool = False
    bias: bool = True
    return_layernorm_output: bool = False
    seed: int = 0
    eps: float = 1e-5

    def __post_init__(self):
        if self.module not in ("linear", "mlp"):
            raise ValueError(f"module must be 'linear' or 'mlp', got {self.module!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {self.recipe!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def mlp(self) -> bool:
        return self.module == "mlp"


def make_inputs(case: ModuleCase, device: str = "cpu") -> dict:
    """x, dy (and dz_out with return_layernorm_output) and the module's parameters (gamma,
    beta, w1, b1, w2, b2: weights scaled by 1/sqrt(fan-in), gamma around 1, or 0 when
    zero-centred), all in the case's dtype; under delayed scaling also ``scales`` (float32,
    one per CASTS entry)."""
    g = torch.Generator().manual_seed(case.seed)
    dt, t, h, f = case.torch_dtype, case.tokens, case.hidden, case.ffn
    fc1_out = 2 * f if case.mlp and case.activation in GATED else f

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale
    out = {"x": rnd(t, h, scale=2.0) + 0.5, "dy": rnd(t, h if case.mlp else f),
           "gamma": rnd(h, scale=0.5) + (0.0 if case.zero_centered_gamma else 1.0),
           "w1": rnd(fc1_out, h, scale=h ** -0.5)}
    if case.return_layernorm_output:
        out["dz_out"] = rnd(t, h)
    if case.normalization == "LayerNorm":
        out["beta"] = rnd(h, scale=0.5)
    if case.bias:
        out["b1"] = rnd(fc1_out, scale=0.5)
    if case.mlp:
        out["w2"] = rnd(h, f, scale=f ** -0.5)
        if case.bias:
            out["b2"] = rnd(h, scale=0.5)
    out = {k: v.to(dt) for k, v in out.items()}
    if case.recipe == "delayed":
        out["scales"] = _delayed_scales(case, {k: to_f64(v) for k, v in out.items()})
    return {k: v.to(device) for k, v in out.items()}


_PARAMS = {"linear": {"w1": "weight", "b1": "bias"},
           "mlp": {"w1": "fc1_weight", "b1": "fc1_bias", "w2": "fc2_weight", "b2": "fc2_bias"}}


def make_module(case: ModuleCase, inputs: dict, backends: ModuleBackends):
    """The module holding ``inputs``' parameters (and delayed scaling's scales)."""
    kw = dict(normalization=case.normalization, zero_centered_gamma=case.zero_centered_gamma,
              return_layernorm_output=case.return_layernorm_output, bias=case.bias,
              recipe=RECIPES[case.recipe], backends=backends, dtype=case.torch_dtype,
              device=inputs["x"].device, eps=case.eps)
    if case.mlp:
        mod = LayerNormMLP(case.hidden, case.ffn, activation=case.activation, **kw)
    else:
        mod = LayerNormLinear(case.hidden, case.ffn, **kw)
    with torch.no_grad():
        mod.layer_norm_weight.copy_(inputs["gamma"])
        if mod.layer_norm_bias is not None:
            mod.layer_norm_bias.copy_(inputs["beta"])
        for name, attr in _PARAMS[case.module].items():
            if getattr(mod, attr) is not None:
                getattr(mod, attr).copy_(inputs[name])
        if "scales" in inputs:
            for i, name in enumerate(CASTS):
                getattr(mod, f"fp8_scale_{name}").copy_(inputs["scales"][i:i + 1])
    return mod


def run_module(mod, inputs: dict) -> dict:
    """Forward and backward; the outputs of tiers.modules.OUTPUTS the module has."""
    for p in mod.parameters():
        p.grad = None
    x = inputs["x"].clone().requires_grad_(True)
    res = mod(x)
    y, z = res if isinstance(res, tuple) else (res, None)
    grads = [inputs["dy"]] + ([inputs["dz_out"]] if z is not None else [])
    torch.autograd.backward([y] + ([z] if z is not None else []), grads)
    out = {"y": y.detach(), "dx": x.grad, "dgamma": mod.layer_norm_weight.grad}
    if z is not None:
        out["z"] = z.detach()
    if mod.layer_norm_bias is not None:
        out["dbeta"] = mod.layer_norm_bias.grad
    for name, attr in _PARAMS["mlp" if isinstance(mod, LayerNormMLP) else "linear"].items():
        if getattr(mod, attr) is not None:
            out["d" + name] = getattr(mod, attr).grad
    return out


def _reference(case: ModuleCase, f: dict, steps: dict) -> dict:
    return ref.layer(f["x"], f["gamma"], f.get("beta"), f["w1"], f.get("b1"), f.get("w2"),
                     f.get("b2"), f["dy"], normalization=case.normalization, eps=case.eps,
                     zero_centered_gamma=case.zero_centered_gamma,
                     activation=case.activation if case.mlp else None, steps=steps,
                     dz_out=f.get("dz_out"))


_SOURCES = {"input1": "z", "weight1": "w1", "grad1": "dh", "input2": "a", "weight2": "w2",
            "grad2": "dy"}


def _delayed_scales(case: ModuleCase, f: dict) -> torch.Tensor:
    """2^floor(log2(fmax / amax)) of each cast's tensor in an unquantized float64 pass."""
    plain = _reference(case, f, {})
    plain.update(w1=f["w1"], w2=f.get("w2"), dy=f["dy"])
    fmax = ref.rq.fmt_max(RECIPES["delayed"].fmt)
    scales = []
    for name in CASTS:
        src = plain.get(_SOURCES[name])
        amax = 1.0 if src is None or not np.abs(src).max() else float(np.abs(src).max())
        scales.append(2.0 ** math.floor(math.log2(fmax / amax)))
    return torch.tensor(scales, dtype=torch.float32)


def quant_steps(case: ModuleCase, f: dict) -> dict:
    """Each cast's reference QuantStep (``f``: the float64 inputs)."""
    recipe = RECIPES[case.recipe]
    if recipe is None:
        return {}
    if recipe.kind == "delayed":
        return {n: ref.QuantStep("delayed", recipe.fmt, scale=float(f["scales"][i]))
                for i, n in enumerate(CASTS)}
    return {n: ref.QuantStep(recipe.kind, recipe.fmt) for n in CASTS}


def expected(case: ModuleCase, f: dict, numerics: ModuleNumerics | None = None):
    """(the reference's outputs, their bounds) by output name; ``f``: float64 inputs."""
    steps = quant_steps(case, f)
    r = _reference(case, f, steps)
    num = numerics or ModuleNumerics(case.torch_dtype)
    tol = bounds(r, f, normalization=case.normalization, eps=case.eps,
                 zero_centered_gamma=case.zero_centered_gamma,
                 activation=case.activation if case.mlp else None, steps=steps, num=num)
    return r, tol


def check_module(outputs: dict, case: ModuleCase, inputs: dict,
                 numerics: ModuleNumerics | None = None) -> dict[str, Metrics]:
    """Each output's Metrics under the propagated bound (tier ``module-chain``)."""
    r, tol = expected(case, {k: to_f64(v) for k, v in inputs.items()}, numerics)
    return {name: bounded.judge(got, r[name], tol[name], case.torch_dtype, Tier.MODULE_CHAIN)
            for name, got in outputs.items()}


def run_and_check(case: ModuleCase, backends: ModuleBackends,
                  numerics: ModuleNumerics | None = None) -> dict[str, Metrics]:
    inputs = make_inputs(case)
    outputs = run_module(make_module(case, inputs, backends), inputs)
    return check_module(outputs, case, inputs, numerics)
