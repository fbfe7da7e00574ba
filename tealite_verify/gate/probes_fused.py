"""How the probes reach each entry point: the tealite op and recipe that route to it, and,
for a fused op, the inputs that make its fp32 intermediate exactly the probe's ``y``.

Constructions (each checked in numpy float32 before the call, and against the references
in tests/test_gate_observe.py; a probe a construction cannot produce exactly is unprobed):

* RMSNorm: each row of y must be g, -g or 0 for one row g.  x = +1 / -1 / 0 per row, gamma
  = g, eps = 2^-40: mean(x^2) = 1 and 1 + 2^-40 rounds to 1, so rsigma = 1 and y = x*gamma
  exactly; a zero row has rsigma = 2^20 and y = 0.
* LayerNorm: x = c * (+1, -1, +1, ...) with c = 1 / -1 / 0 per row (mean 0, variance 1, so
  rsigma = 1), gamma = (+1, -1, ...) * g, beta = 0: y = c * g.
* Gated activation (swiglu: silu(a) * b): a = 32, where silu(32) = 32 / (1 + e^-32) = 32
  in fp32 (e^-32 is below half an ulp of 1), b = y / 32 (exact: the probes' values are
  multiples of 2^-144), so y = 32 * b exactly.  gelu and relu also give 32 there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

import tealite
from tealite import recipes as R
from tealite.backends.aiter_common.contracts import Contract
from tealite.errors import UnsupportedCase
from tealite.formats import ElementRounding, FP8ScaleRule, Saturation, ScaleRounding
from tealite_verify.gate import probes_common as pc
from tealite_verify.gate.probes_fp8 import Fp8Spec
from tealite_verify.references import quantize as qref

F32 = np.float32
EPS = 2.0 ** -40
ACT_KIND, ACT_A = "swiglu", 32.0
QUANTIZING_OPS = ("quantize", "rmsnorm_fwd_quantize", "layernorm_fwd_quantize",
                  "act_fwd_quantize")
MX_FAMILIES, FP8_FAMILIES = ("mxfp4", "mxfp8"), ("fp8-current", "fp8-given")
HOW = {
    "quantize": "y as x",
    "direct": "y as x, AITER entry point called directly (tealite does not wire it)",
    "rmsnorm_fwd_quantize": "x = +-1/0 per row, gamma = y row, eps 2^-40",
    "layernorm_fwd_quantize": "x = +-(1,-1,..)/0 per row, gamma = (1,-1,..)*y row, beta 0, "
                              "eps 2^-40",
    "act_fwd_quantize": f"{ACT_KIND}: act half {ACT_A:g}, gate half y/{ACT_A:g}",
}


@dataclass(frozen=True)
class Route:
    """The call that reaches one entry point with a probe's intermediates."""

    backend: str
    entry_point: str
    op: str                  # tealite op, or "direct"
    family: str              # "mx" | "fp8"
    fmt: str
    recipe: object | None
    fp8: Fp8Spec | None
    why_not: str | None      # set when no tealite call reaches it (every field unprobed)

    def describe(self) -> str:
        what = f"{self.family} {self.fmt}"
        if self.fp8 is not None:
            what += f" {self.fp8.granularity}" + (" given-scale" if self.fp8.given_scale else "")
        return f"{what} via {self.op} ({HOW[self.op]})"


def _fp8_fmt(c: Contract) -> str:
    if "fmt" in c.extra:
        return c.extra["fmt"]
    if c.backend == "aiter_triton":
        from tealite.backends.aiter_triton import kernels
        from tealite.backends.aiter_triton.quantize import fp8_name
        return fp8_name(kernels())  # OCP with gfx950 pinned, FNUZ on gfx942
    return "e4m3"


def _mx_recipe(c: Contract, fmt: str):
    try:
        return R.MXBlockScaling(fmt, ScaleRounding((c.scale_rule or "").removeprefix("e8m0-")),
                                ElementRounding((c.element_rounding or "").replace("-", "_")))
    except ValueError:
        return (f"no tealite MX recipe routes to it (declared scale_rule {c.scale_rule!r}, "
                f"element_rounding {c.element_rounding!r})")


def _fp8_recipe(c: Contract, fmt: str, granularity: str):
    if c.family == "fp8-given":
        return R.DelayedScaling(fmt, saturation=Saturation.SATURATE)
    try:
        return R.Float8CurrentScaling(fmt, granularity, scale_rule=FP8ScaleRule(c.scale_rule))
    except ValueError:
        return f"no tealite FP8 recipe routes to it (declared scale_rule {c.scale_rule!r})"


def route_for(c: Contract) -> Route | None:
    """The probe route of a declared contract; None when it has no quantizing output."""
    if c.op not in QUANTIZING_OPS or c.family not in MX_FAMILIES + FP8_FAMILIES:
        return None
    op = c.op
    if c.family in MX_FAMILIES:
        fmt = "e2m1" if c.family == "mxfp4" else c.extra.get("fmt", "e4m3")
        recipe, spec = _mx_recipe(c, fmt), None
    else:
        fmt = _fp8_fmt(c)
        given = c.family == "fp8-given"
        if given or op != "quantize":
            granularity = "tensor" if given else "row"
        else:
            granularity = c.extra.get("granularity") or \
                ("tensor" if "tensor" in c.entry_point else "row")
        spec = Fp8Spec(fmt, granularity, given)
        recipe = _fp8_recipe(c, fmt, granularity)
        if given and op == "quantize" and c.backend == "aiter_triton" and \
                c.extra.get("wired") is False:
            op = "direct"
    why = recipe if isinstance(recipe, str) else None
    return Route(c.backend, c.entry_point, op, "mx" if spec is None else "fp8", fmt,
                 None if why else recipe, spec, why)


# ---- constructions -----------------------------------------------------------------------------

def _row_signs(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g, c): every row of y is c_r * g with c_r in {1, -1, 0}."""
    nonzero = [r for r in y if np.any(r.view(np.uint32) != 0)]  # -0 counts: its sign matters
    g = nonzero[0] if nonzero else np.ones(y.shape[1], F32)
    c = []
    for r in y:
        if np.array_equal(r, g, equal_nan=True):
            c.append(1.0)
        elif np.array_equal(r, -g, equal_nan=True) and not np.isnan(r).any():
            c.append(-1.0)  # -NaN from a product has no reliable sign: only finite/inf rows
        elif not np.any(r.view(np.uint32) != 0):
            c.append(0.0)
        else:
            raise pc.NotConstructible("a norm's rows share gamma: each row must be g, -g or 0")
    return g.astype(F32), np.array(c, F32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and \
        np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _checked(name: str, got: np.ndarray, y: np.ndarray) -> None:
    if not _same_bits(got.astype(F32), y.astype(F32)):
        raise pc.NotConstructible(f"the {name} construction does not give these values exactly")


def rmsnorm_inputs(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    g, c = _row_signs(y)
    x = np.repeat(c[:, None], y.shape[1], axis=1).astype(F32)
    ms = ((x * x).sum(axis=1, dtype=F32) / F32(x.shape[1])).astype(F32)
    rs = (F32(1) / np.sqrt(ms + F32(EPS))).astype(F32)
    _checked("rmsnorm", ((x * rs[:, None]) * g).astype(F32), y)
    return x, g


def layernorm_inputs(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if y.shape[1] % 2:
        raise pc.NotConstructible("the layernorm construction needs an even row length")
    g, c = _row_signs(y)
    alt = np.resize(np.array([1.0, -1.0], F32), y.shape[1])
    x = (c[:, None] * alt).astype(F32)
    gamma = (alt * g).astype(F32)
    beta = np.zeros_like(gamma)
    d = (x - (x.sum(axis=1, dtype=F32) / F32(x.shape[1]))[:, None]).astype(F32)
    rs = (F32(1) / np.sqrt((d * d).sum(axis=1, dtype=F32) / F32(x.shape[1]) + F32(EPS)))
    _checked("layernorm", ((d * rs.astype(F32)[:, None]) * gamma + beta).astype(F32), y)
    return x, gamma, beta


def act_inputs(y: np.ndarray) -> np.ndarray:
    b = (y / F32(ACT_A)).astype(F32)
    a = np.full(y.shape, F32(ACT_A))
    silu = (a / (F32(1) + np.exp(-a))).astype(F32)
    _checked("gated activation", (silu * b).astype(F32), y)
    return np.concatenate([a, b], axis=1)


# ---- running ------------------------------------------------------------------------------------

@contextlib.contextmanager
def probe_switches():
    """Let AITER's MXFP4 (on NVIDIA) and FP8 (in the interpreter) entry points run: a probe
    records what runs, platform divergences included."""
    from tealite.backends import aiter_triton
    with aiter_triton.lift_platform_rejections(fp8_in_interpreter=True, mxfp4_on_nvidia=True):
        yield


def _direct_static(route: Route, x: torch.Tensor, given: float):
    from tealite.backends import aiter_triton
    why = aiter_triton.why_missing(route.entry_point)
    if why:
        raise UnsupportedCase(why)
    at = aiter_triton.kernels()
    scale_inv = torch.reciprocal(torch.tensor([given], dtype=torch.float32, device=x.device))
    qx = torch.empty(x.shape, dtype=at.fp8_dtype, device=x.device)
    out = getattr(at, route.entry_point)(qx, x, scale_inv)
    return (out[0] if isinstance(out, tuple) else out), scale_inv


def _call(route: Route, y: np.ndarray, given, device: str):
    """(codes tensor, scales tensor) of the entry point on intermediates y."""
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, F32)).to(device)  # noqa: E731
    scale = None if given is None else torch.tensor([given], dtype=torch.float32, device=device)
    kw = dict(scale=scale, return_amax=False, backend=route.backend)
    if route.op == "direct":
        return _direct_static(route, t(y), given)
    if route.op == "quantize":
        q = tealite.quantize(t(y), route.recipe, scale=scale, backend=route.backend)
    elif route.op == "rmsnorm_fwd_quantize":
        x, g = rmsnorm_inputs(y)
        q = tealite.rmsnorm_fwd_quantize(t(x), t(g), route.recipe, eps=EPS, return_stats=False,
                                         **kw).out
    elif route.op == "layernorm_fwd_quantize":
        x, g, b = layernorm_inputs(y)
        q = tealite.layernorm_fwd_quantize(t(x), t(g), t(b), route.recipe, eps=EPS,
                                           return_stats=False, **kw).out
    else:
        q = tealite.act_fwd_quantize(t(act_inputs(y)), ACT_KIND, route.recipe, **kw)
    return q.data, q.scale_inv


def make_runner(route: Route, device: str) -> pc.Runner:
    def run(y: np.ndarray, given: float | None) -> pc.RunOutput:
        with probe_switches():
            data, scales = _call(route, np.asarray(y, F32), given, device)
        bits = data.contiguous().view(torch.uint8).cpu().numpy()
        if route.fmt == "e2m1":
            bits = qref.unpack_e2m1(bits, y.shape[1])
        if route.family == "mx":
            s = scales.contiguous().view(torch.uint8).cpu().numpy()
        else:
            s = scales.float().cpu().numpy().reshape(-1)
        return pc.RunOutput(codes=bits.reshape(y.shape), scales=s)
    return run
