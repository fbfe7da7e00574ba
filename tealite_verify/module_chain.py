"""The compound-module check (issue 17 part 5): a LayerNormLinear or LayerNormMLP of
tealite.modules, run forward and backward (autograd) with every sub-op on the backends a
``ModuleBackends`` names, judged against the float64 composition (references/modules.py) under
the propagated bound (tiers/modules.py, the derivation).

:class:`ModuleCase` describes one case; :func:`make_module` / :func:`make_inputs` build it,
:func:`run_module` runs it and :func:`check_module` judges its outputs.  Delayed scaling's
scales are set from the amaxes of an unquantized float64 pass (a history that saw this step),
rounded down to a power of two, as a recipe's margin would leave them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import tealite.recipes as R
from tealite.modules import LayerNormLinear, LayerNormMLP, ModuleBackends
from tealite.modules.layernorm_mlp import CASTS
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


def make_module(case: ModuleCase, backends: ModuleBackends, device: str = "cpu"):
    """The module with seeded parameters (gamma and biases drawn, not the init values)."""
    kw = dict(normalization=case.normalization, zero_centered_gamma=case.zero_centered_gamma,
              return_layernorm_output=case.return_layernorm_output, bias=case.bias,
              recipe=RECIPES[case.recipe], backends=backends, dtype=case.torch_dtype,
              device=device, eps=case.eps)
    if case.mlp:
        mod = LayerNormMLP(case.hidden, case.ffn, activation=case.activation, **kw)
    else:
        mod = LayerNormLinear(case.hidden, case.ffn, **kw)
    g = torch.Generator().manual_seed(case.seed + 1)
    with torch.no_grad():
        for p in mod.parameters():
            fan_in = p.shape[1] if p.dim() == 2 else 4.0
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        if not case.zero_centered_gamma:
            mod.layer_norm_weight.add_(1.0)
    return mod


def make_inputs(case: ModuleCase, device: str = "cpu") -> dict:
    g = torch.Generator().manual_seed(case.seed)
    dt = case.torch_dtype
    out = {"x": (torch.randn(case.tokens, case.hidden, generator=g) * 2 + 0.5).to(dt),
           "dy": torch.randn(case.tokens, case.hidden if case.mlp else case.ffn,
                             generator=g).to(dt)}
    if case.return_layernorm_output:
        out["dz_out"] = torch.randn(case.tokens, case.hidden, generator=g).to(dt)
    return {k: v.to(device) for k, v in out.items()}


def _params(mod) -> dict:
    if isinstance(mod, LayerNormMLP):
        return {"w1": mod.fc1_weight, "b1": mod.fc1_bias, "w2": mod.fc2_weight,
                "b2": mod.fc2_bias}
    return {"w1": mod.weight, "b1": mod.bias}


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
    for name, p in _params(mod).items():
        if p is not None:
            out["d" + name] = p.grad
    return out


def _f64_inputs(mod, inputs: dict) -> dict:
    f = {k: to_f64(v) for k, v in inputs.items()}
    f["gamma"] = to_f64(mod.layer_norm_weight)
    f["beta"] = None if mod.layer_norm_bias is None else to_f64(mod.layer_norm_bias)
    for name, p in _params(mod).items():
        f[name] = None if p is None else to_f64(p)
    return f


def _reference(case: ModuleCase, f: dict, steps: dict) -> dict:
    return ref.layer(f["x"], f["gamma"], f["beta"], f["w1"], f.get("b1"), f.get("w2"),
                     f.get("b2"), f["dy"], normalization=case.normalization, eps=case.eps,
                     zero_centered_gamma=case.zero_centered_gamma,
                     activation=case.activation if case.mlp else None, steps=steps,
                     dz_out=f.get("dz_out"))


_SOURCES = {"input1": "z", "weight1": "w1", "grad1": "dh", "input2": "a", "weight2": "w2",
            "grad2": "dy"}


def quant_steps(mod, case: ModuleCase, inputs: dict) -> dict:
    """Each cast's reference QuantStep; for delayed scaling, sets the module's scales first
    (2^floor(log2(fmax / amax)) of the unquantized float64 pass)."""
    recipe = RECIPES[case.recipe]
    if recipe is None:
        return {}
    if recipe.kind == "mx":
        return {n: ref.QuantStep("mx", recipe.fmt) for n in CASTS}
    if recipe.kind == "current":
        return {n: ref.QuantStep("current", recipe.fmt) for n in CASTS}
    f = _f64_inputs(mod, inputs)
    plain = _reference(case, f, {})
    plain.update(w1=f["w1"], w2=f.get("w2"), dy=f["dy"])
    fmax = ref.rq.fmt_max(recipe.fmt)
    steps = {}
    for name in CASTS:
        src = plain.get(_SOURCES[name])
        amax = 1.0 if src is None or not np.abs(src).max() else float(np.abs(src).max())
        scale = 2.0 ** math.floor(math.log2(fmax / amax))
        getattr(mod, f"fp8_scale_{name}").fill_(scale)
        steps[name] = ref.QuantStep("delayed", recipe.fmt, scale=scale)
    return steps


def expected(mod, case: ModuleCase, inputs: dict, steps: dict,
             numerics: ModuleNumerics | None = None) -> tuple[dict, dict]:
    """(the reference's outputs, their bounds) by output name."""
    f = _f64_inputs(mod, inputs)
    r = _reference(case, f, steps)
    num = numerics or ModuleNumerics(case.torch_dtype)
    tol = bounds(r, f, normalization=case.normalization, eps=case.eps,
                 zero_centered_gamma=case.zero_centered_gamma,
                 activation=case.activation if case.mlp else None, steps=steps, num=num)
    return r, tol


def check_module(outputs: dict, mod, case: ModuleCase, inputs: dict, steps: dict,
                 numerics: ModuleNumerics | None = None) -> dict[str, Metrics]:
    """Each output's Metrics under the propagated bound (tier ``module-chain``)."""
    r, tol = expected(mod, case, inputs, steps, numerics)
    return {name: bounded.judge(got, r[name], tol[name], case.torch_dtype, Tier.MODULE_CHAIN)
            for name, got in outputs.items()}


def run_and_check(case: ModuleCase, backends: ModuleBackends,
                  numerics: ModuleNumerics | None = None) -> dict[str, Metrics]:
    mod = make_module(case, backends)
    inputs = make_inputs(case)
    steps = quant_steps(mod, case, inputs)
    return check_module(run_module(mod, inputs), mod, case, inputs, steps, numerics)
