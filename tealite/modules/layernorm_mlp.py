"""Compound modules with TransformerEngine's semantics: ``LayerNormLinear`` and
``LayerNormMLP`` (issue 17 part 5), forward and backward through tealite's verified ops.

    LayerNormLinear:  z = norm(x);                    y = z W^T + b
    LayerNormMLP:     z = norm(x); h = z W1^T + b1;   a = act(h);  y = a W2^T + b2

``norm`` is LayerNorm or RMSNorm (``normalization``), with TE's ``zero_centered_gamma``
(effective weight 1 + gamma).  Every step is one of tealite's ops, each dispatched to the
backend a :class:`ModuleBackends` names: ``layernorm_fwd/bwd`` / ``rmsnorm_fwd/bwd``,
``gemm`` in TE's layouts (fprop TN: A = weight, B = input; dgrad NN: A = weight, B = dY;
wgrad NT: A = input, B = dY), ``act_fwd/bwd``.

Under a recipe (``Float8CurrentScaling``, ``DelayedScaling``, ``MXBlockScaling``) every GEMM
operand is quantized first, as TE's modules do: the norm output and the activation output
(input role), the weights (weight role) and the incoming gradients dY (grad-output role), each
with rowwise and columnwise data so that fprop, dgrad and wgrad read the K-last layout they
need, and the GEMMs run as ``qgemm`` with a high-precision output in x's dtype.  Activation,
its backward and the norm backward stay in high precision (TE's unfused path).  Delayed
scaling takes each tensor's scale from the module's ``fp8_scale`` buffers (set by the amax
history update, which is not this module's job) and records each cast's amax in ``fp8_amax``.

``return_layernorm_output=True`` returns ``(y, z)``; the gradient reaching ``z`` is added to
the GEMM's dgrad before the norm backward.  Biases' gradients are dY summed over rows in fp32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import tealite.recipes as R
from tealite._checks import require
from tealite.ops.activations import act_bwd, act_fwd, output_shape
from tealite.ops.gemm import gemm
from tealite.ops.norms import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
from tealite.ops.qgemm import qgemm
from tealite.ops.quantize import quantize
from tealite.types import ACTIVATION_KINDS, GATED

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
MODULE_RECIPES = (R.Float8CurrentScaling, R.DelayedScaling, R.MXBlockScaling)
# The quantized tensors of one step, in TE's roles; a LayerNormLinear uses the first three.
CASTS = ("input1", "weight1", "grad1", "input2", "weight2", "grad2")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ModuleBackends:
    """Which backend runs each kind of sub-op (None: the registry's choice)."""

    norm: str | None = None
    gemm: str | None = None
    act: str | None = None
    quantize: str | None = None
    qgemm: str | None = None

    @classmethod
    def every(cls, name: str | None) -> "ModuleBackends":
        return cls(name, name, name, name, name)


@dataclass(frozen=True)
class _Config:
    normalization: str
    eps: float
    zero_centered_gamma: bool
    activation: str | None  # None: LayerNormLinear
    recipe: object | None
    backends: ModuleBackends


# --- the steps, small pure functions over tealite's ops -------------------------------------

def _norm_fwd(x, gamma, beta, cfg: _Config):
    kw = dict(eps=cfg.eps, zero_centered_gamma=cfg.zero_centered_gamma, backend=cfg.backends.norm)
    if cfg.normalization == "LayerNorm":
        r = layernorm_fwd(x, gamma, beta, **kw)
        return r.y, (r.mean, r.rsigma)
    r = rmsnorm_fwd(x, gamma, **kw)
    return r.y, (r.rsigma,)


def _norm_bwd(dz, x, stats, gamma, cfg: _Config):
    kw = dict(zero_centered_gamma=cfg.zero_centered_gamma, backend=cfg.backends.norm)
    if cfg.normalization == "LayerNorm":
        return tuple(layernorm_bwd(dz, x, *stats, gamma, **kw))
    dx, dgamma = rmsnorm_bwd(dz, x, *stats, gamma, **kw)
    return dx, dgamma, None


def _cast(t, cfg: _Config, scales: dict, amaxes: dict, name: str):
    """The GEMM operand ``t``: itself without a recipe, else quantized row- and columnwise."""
    if cfg.recipe is None:
        return t
    scale = scales[name] if cfg.recipe.scale_given else None
    q = quantize(t, cfg.recipe, rowwise=True, columnwise=True, scale=scale,
                 backend=cfg.backends.quantize)
    if q.amax is not None and name in amaxes:
        amaxes[name].copy_(q.amax.reshape(-1)[:1])
    return q


def _mm(a, b, layout: str, cfg: _Config, out_dtype, bias=None):
    """One GEMM in TE's ``layout`` on plain or quantized operands."""
    if cfg.recipe is None:
        return gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias,
                    backend=cfg.backends.gemm).out
    return qgemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias,
                 backend=cfg.backends.qgemm).out


def _dbias(dy, dtype):
    """A bias's gradient: dY summed over rows in fp32, one rounding to the bias's dtype."""
    return dy.float().sum(dim=0).to(dtype)


class _LayerNormChain(torch.autograd.Function):
    """norm -> GEMM (fc1) [-> activation -> GEMM (fc2)] on 2-D x; returns (y, z)."""

    @staticmethod
    def forward(ctx, x, gamma, beta, w1, b1, w2, b2, cfg, scales, amaxes):
        dt = x.dtype
        z, stats = _norm_fwd(x, gamma, beta, cfg)
        z_in = _cast(z, cfg, scales, amaxes, "input1")
        w1_in = _cast(w1, cfg, scales, amaxes, "weight1")
        h = _mm(w1_in, z_in, "TN", cfg, dt, b1)
        saved = [x, gamma, h]
        ctx.q = [z_in, w1_in]
        if cfg.activation is None:
            y = h
        else:
            a = act_fwd(h, cfg.activation, backend=cfg.backends.act)
            a_in = _cast(a, cfg, scales, amaxes, "input2")
            w2_in = _cast(w2, cfg, scales, amaxes, "weight2")
            y = _mm(w2_in, a_in, "TN", cfg, dt, b2)
            ctx.q += [a_in, w2_in]
        ctx.save_for_backward(*saved, *stats)
        ctx.cfg, ctx.scales, ctx.amaxes = cfg, scales, amaxes
        ctx.has_beta, ctx.has_b1, ctx.has_b2 = beta is not None, b1 is not None, b2 is not None
        return y, z

    @staticmethod
    def backward(ctx, dy, dz_out):
        cfg, scales, amaxes = ctx.cfg, ctx.scales, ctx.amaxes
        x, gamma, h, *stats = ctx.saved_tensors
        dt = x.dtype
        dy = dy.contiguous()
        dw2 = db2 = None
        if cfg.activation is not None:
            a_in, w2_in = ctx.q[2], ctx.q[3]
            dy_in = _cast(dy, cfg, scales, amaxes, "grad2")
            da = _mm(w2_in, dy_in, "NN", cfg, dt)
            dw2 = _mm(a_in, dy_in, "NT", cfg, dt)
            db2 = _dbias(dy, dt) if ctx.has_b2 else None
            dh = act_bwd(da, h, cfg.activation, backend=cfg.backends.act)
        else:
            dh = dy
        z_in, w1_in = ctx.q[0], ctx.q[1]
        dh_in = _cast(dh, cfg, scales, amaxes, "grad1")
        dz = _mm(w1_in, dh_in, "NN", cfg, dt)
        dw1 = _mm(z_in, dh_in, "NT", cfg, dt)
        db1 = _dbias(dh, dt) if ctx.has_b1 else None
        if dz_out is not None:
            dz = (dz.float() + dz_out.float()).to(dt)  # the returned norm output's gradient
        dx, dgamma, dbeta = _norm_bwd(dz, x, stats, gamma, cfg)
        ctx.q = None
        return (dx, dgamma, dbeta if ctx.has_beta else None, dw1, db1, dw2, db2,
                None, None, None)


# --- the modules ------------------------------------------------------------------------

def _check_recipe(recipe) -> None:
    require(recipe is None or isinstance(recipe, MODULE_RECIPES),
            f"recipe must be None (high precision) or one of "
            f"{[t.__name__ for t in MODULE_RECIPES]}, got {type(recipe).__name__}")


def _check_mx_dims(tokens: int, dims: dict) -> None:
    """MX blocks of 32 run along K of every GEMM: fprop's features, wgrad's tokens."""
    for name, size in {"tokens (x's leading dims)": tokens, **dims}.items():
        require(size % 32 == 0, f"{name} must be a multiple of 32 under an MX recipe "
                                f"(its blocks of 32 run along every GEMM's K), got {size}")


class _LayerNormBase(torch.nn.Module):
    def __init__(self, hidden_size: int, *, eps: float, normalization: str,
                 zero_centered_gamma: bool, return_layernorm_output: bool, recipe,
                 backends: ModuleBackends | None, dtype: torch.dtype, device):
        super().__init__()
        require(isinstance(hidden_size, int) and hidden_size > 0,
                f"hidden_size must be a positive int, got {hidden_size!r}")
        require(normalization in NORMALIZATIONS,
                f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        require(dtype in _DTYPES, f"dtype must be one of {_DTYPES}, got {dtype}")
        require(isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0,
                f"eps must be a finite number > 0, got {eps!r}")
        require(backends is None or isinstance(backends, ModuleBackends),
                f"backends must be a ModuleBackends, got {type(backends).__name__}")
        _check_recipe(recipe)
        self.hidden_size, self.eps, self.normalization = hidden_size, float(eps), normalization
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.recipe, self.backends = recipe, backends or ModuleBackends()
        init = 0.0 if zero_centered_gamma else 1.0
        kw = dict(dtype=dtype, device=device)
        self.layer_norm_weight = torch.nn.Parameter(torch.full((hidden_size,), init, **kw))
        self.layer_norm_bias = (torch.nn.Parameter(torch.zeros(hidden_size, **kw))
                                if normalization == "LayerNorm" else None)
        # Delayed scaling's per-tensor state (TE's fp8_meta): scales in, amaxes out.
        for name in CASTS:
            self.register_buffer(f"fp8_scale_{name}", torch.ones(1, device=device))
            self.register_buffer(f"fp8_amax_{name}", torch.zeros(1, device=device))

    @staticmethod
    def _linear_params(out_f: int, in_f: int, bias: bool, kw):
        w = torch.nn.Parameter(torch.randn(out_f, in_f, **kw) / math.sqrt(in_f))
        return w, (torch.nn.Parameter(torch.zeros(out_f, **kw)) if bias else None)

    def _run(self, x, w1, b1, w2, b2, activation):
        require(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x).__name__}")
        require(x.dim() >= 1 and x.shape[-1] == self.hidden_size,
                f"x's last dim must be hidden_size={self.hidden_size}, got shape "
                f"{tuple(x.shape)}")
        require(x.dtype == self.layer_norm_weight.dtype,
                f"x dtype {x.dtype} must equal the module's {self.layer_norm_weight.dtype}")
        if isinstance(self.recipe, R.MXBlockScaling):
            _check_mx_dims(x.numel() // self.hidden_size, self._gemm_dims())
        cfg = _Config(self.normalization, self.eps, self.zero_centered_gamma, activation,
                      self.recipe, self.backends)
        scales = {n: getattr(self, f"fp8_scale_{n}") for n in CASTS}
        amaxes = {n: getattr(self, f"fp8_amax_{n}") for n in CASTS}
        x2 = x.reshape(-1, self.hidden_size).contiguous()
        y, z = _LayerNormChain.apply(x2, self.layer_norm_weight, self.layer_norm_bias, w1, b1,
                                     w2, b2, cfg, scales, amaxes)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if self.return_layernorm_output:
            return y, z.reshape(x.shape)
        return y


class LayerNormLinear(_LayerNormBase):
    """TE's LayerNormLinear: y = norm(x) W^T + b, W of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, *, eps: float = 1e-5,
                 bias: bool = True, normalization: str = "LayerNorm",
                 zero_centered_gamma: bool = False, return_layernorm_output: bool = False,
                 recipe=None, backends: ModuleBackends | None = None,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(in_features, eps=eps, normalization=normalization,
                         zero_centered_gamma=zero_centered_gamma,
                         return_layernorm_output=return_layernorm_output, recipe=recipe,
                         backends=backends, dtype=dtype, device=device)
        require(isinstance(out_features, int) and out_features > 0,
                f"out_features must be a positive int, got {out_features!r}")
        self.weight, self.bias = self._linear_params(out_features, in_features, bias,
                                                     dict(dtype=dtype, device=device))

    def _gemm_dims(self) -> dict:
        return {"in_features": self.hidden_size, "out_features": self.weight.shape[0]}

    def forward(self, x):
        return self._run(x, self.weight, self.bias, None, None, None)


class LayerNormMLP(_LayerNormBase):
    """TE's LayerNormMLP: y = act(norm(x) W1^T + b1) W2^T + b2.  For a gated ``activation``
    (swiglu, geglu, ...) fc1 has 2 * ffn_hidden_size outputs, TE's layout (activated half
    first)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, *, eps: float = 1e-5,
                 bias: bool = True, normalization: str = "LayerNorm", activation: str = "gelu",
                 zero_centered_gamma: bool = False, return_layernorm_output: bool = False,
                 recipe=None, backends: ModuleBackends | None = None,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(hidden_size, eps=eps, normalization=normalization,
                         zero_centered_gamma=zero_centered_gamma,
                         return_layernorm_output=return_layernorm_output, recipe=recipe,
                         backends=backends, dtype=dtype, device=device)
        require(isinstance(ffn_hidden_size, int) and ffn_hidden_size > 0,
                f"ffn_hidden_size must be a positive int, got {ffn_hidden_size!r}")
        require(activation in ACTIVATION_KINDS,
                f"activation must be one of {sorted(ACTIVATION_KINDS)}, got {activation!r}")
        self.activation = activation
        fc1_out = 2 * ffn_hidden_size if activation in GATED else ffn_hidden_size
        assert output_shape((1, fc1_out), activation)[-1] == ffn_hidden_size
        kw = dict(dtype=dtype, device=device)
        self.fc1_weight, self.fc1_bias = self._linear_params(fc1_out, hidden_size, bias, kw)
        self.fc2_weight, self.fc2_bias = self._linear_params(hidden_size, ffn_hidden_size,
                                                             bias, kw)

    def _gemm_dims(self) -> dict:
        return {"hidden_size": self.hidden_size, "fc1 outputs": self.fc1_weight.shape[0],
                "ffn_hidden_size": self.fc2_weight.shape[1]}

    def forward(self, x):
        return self._run(x, self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias,
                         self.activation)


__all__ = ["LayerNormLinear", "LayerNormMLP", "ModuleBackends", "NORMALIZATIONS"]
