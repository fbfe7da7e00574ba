"""Triton norm backward and activation kernels: the correct kernels pass fixed hard cases
(in the interpreter, or on a GPU without TRITON_INTERPRET), and, under the interpreter, the
harness catches seeded kernel bugs (a wrong formula constant, the zero-centered +1 dropped,
the gate halves swapped, a dropped partial in the two-stage dgamma / dbeta / dbias
reduction) while NVIDIA's approximate exp, swapped in as an error model, stays inside the
declared fp32 numerics.

Each seeded variant is the real kernel launched with one thing changed, registered as its own
backend (``make_backend``, conftest.py) so the real ``triton`` backend is untouched.  In the
interpreter a kernel reads module globals (constants, @triton.jit helpers) when it runs, so
monkeypatching one of them changes the kernel.  The broader property checks are the
differential suite (tests/test_differential.py -k "triton and (norm or act or dbias)").
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tealite import registry
from tealite.backends.triton import INTERPRET
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
# Seeded variants patch module globals at run time, which only the interpreter reads then
# (a compiled kernel captured them when it was compiled).
interpreter_only = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
DEVICE = "cpu" if INTERPRET else "cuda"

NORMAL2 = {"kind": "normal", "scale": 2.0}
NORMAL1 = {"kind": "normal", "scale": 1.0}


def _act_case(kind, shape=(16, 64), dtype="float32", dist=NORMAL2):
    return {"kind": kind, "shape": list(shape), "dtype": dtype, "dist": dist, "seed": 5,
            "dist_dy": NORMAL1}


def _norm_case(shape=(9, 3, 40), dtype="float32", zero_centered=False, offset=0.0):
    return {"shape": list(shape), "dtype": dtype, "weight_dtype": dtype,
            "zero_centered_gamma": zero_centered, "eps": 1e-5, "dist": NORMAL1, "seed": 9,
            "offset": offset, "dist_dy": NORMAL1}


def _seeded(make_backend, monkeypatch, op, module, patches):
    """A backend running the triton implementation of ``op`` with ``module``'s attributes
    replaced by ``patches`` (name -> value) for the duration of each call."""
    good = TRITON.impls[op].fn
    b = make_backend("triton_seeded")

    def fn(*args, **kwargs):
        with monkeypatch.context() as m:
            for name, value in patches.items():
                m.setattr(module, name, value)
            return good(*args, **kwargs)

    b.implements(op, devices=TRITON.impls[op].support.devices,
                 numerics=TRITON.impls[op].numerics)(fn)
    return b.name


def _bad_outputs(op, case, backend):
    report = run_case(get_spec(op), case, backends=["torch", backend], device=DEVICE)
    assert report.outcomes[backend].status == "ok", report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    return {c.output for c in report.failures if c.lhs == backend and c.rhs == "reference"}, \
        report


def _assert_passes(op, case):
    report = run_case(get_spec(op), case, backends=["triton", "torch"], device=DEVICE)
    assert report.verdict == "pass", report.describe()
    assert report.outcomes["triton"].status == "ok"


# ---- the correct kernels on the cases the seeded tests use (no false alarm) -------------

ACT_CASES = [("act_fwd", _act_case(k)) for k in ("gelu", "gelu_tanh", "qgelu", "swiglu")] + [
    ("act_bwd", _act_case(k)) for k in ("gelu", "gelu_tanh", "qgelu", "geglu", "sreglu")] + [
    ("dbias_dact", _act_case(k, shape=(37, 24))) for k in ("silu", "srelu")] + [
    # Hostile values: |x| up to 2^58 (exp of -|x| underflows, x^3 overflows fp32).
    (op, _act_case(k, dtype="bfloat16", dist={"kind": "wide", "log2_lo": -24, "log2_hi": 58}))
    for op in ("act_fwd", "act_bwd") for k in ("gelu_tanh", "silu", "qgeglu")]


@pytest.mark.parametrize("op,case", ACT_CASES,
                         ids=[f"{op}-{c['kind']}-{c['dtype']}" for op, c in ACT_CASES])
def test_activation_kernels_pass(op, case):
    _assert_passes(op, case)


NORM_CASES = [(op, _norm_case(dtype=dt, zero_centered=zc, offset=off))
              for op in ("layernorm_bwd", "rmsnorm_bwd")
              for dt, zc, off in (("float32", True, 0.0), ("bfloat16", False, 100.0),
                                  ("float16", True, 3.0))]


@pytest.mark.parametrize("op,case", NORM_CASES,
                         ids=[f"{op}-{c['dtype']}-zc{int(c['zero_centered_gamma'])}"
                              for op, c in NORM_CASES])
def test_norm_backward_kernels_pass(op, case):
    if op.startswith("rms"):
        case = {k: v for k, v in case.items() if k != "offset"}
    _assert_passes(op, case)


def test_norm_backward_is_deterministic_and_handles_empty_rows():
    import tealite
    gen = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(64, 40, generator=gen).to(DEVICE) for _ in range(2))
    g = torch.randn(40, generator=gen).to(DEVICE)
    f = tealite.layernorm_fwd(x, g, torch.zeros_like(g), backend="torch")
    a = tealite.layernorm_bwd(dy, x, f.mean, f.rsigma, g, backend="triton")
    b = tealite.layernorm_bwd(dy, x, f.mean, f.rsigma, g, backend="triton")
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    z = torch.zeros(0, 40, device=DEVICE)
    e = tealite.rmsnorm_bwd(z, z, torch.zeros(0, device=DEVICE), g, backend="triton")
    assert e.dx.shape == (0, 40) and torch.equal(e.dgamma, torch.zeros_like(g))


# ---- seeded bugs ----------------------------------------------------------------------

CONSTANT_SEEDS = [
    # (module attribute, wrong value, op, kind, outputs that must fail)
    ("GELU_TANH_C", 0.0447, "act_fwd", "gelu_tanh", {"y"}),
    ("GELU_TANH_C", 0.0447, "act_bwd", "gelu_tanh", {"dx"}),
    ("QGELU_ALPHA", 1.7, "act_fwd", "qgeglu", {"y"}),
    ("INV_SQRT2", 0.7071, "act_fwd", "gelu", {"y"}),
    ("INV_SQRT_2PI", 0.3989, "act_bwd", "gelu", {"dx"}),
    ("INV_SQRT_2PI", 0.3989, "dbias_dact", "gelu", {"dx", "dbias"}),
]


@interpreter_only
@pytest.mark.parametrize("name,value,op,kind,outputs", CONSTANT_SEEDS,
                         ids=[f"{s[0]}={s[1]}-{s[2]}-{s[3]}" for s in CONSTANT_SEEDS])
def test_seeded_activation_constant_is_caught(make_backend, monkeypatch, name, value, op, kind,
                                              outputs):
    from tealite.backends.triton import activations as ta
    case = _act_case(kind, shape=(37, 24) if op == "dbias_dact" else (16, 64))
    _assert_passes(op, case)
    seeded = _seeded(make_backend, monkeypatch, op, ta, {name: tl.constexpr(value)})
    bad, report = _bad_outputs(op, case, seeded)
    assert outputs <= bad, report.describe()


@interpreter_only
def test_seeded_swapped_gate_halves_are_caught(make_backend, monkeypatch):
    """The gated kernel reading the gate as the activated half (and vice versa)."""
    from tealite.backends.triton import activations as ta
    good = ta._gated_kernel

    class Swapped:
        def __getitem__(self, grid):
            def launch(x, dy, out, rows, n, **kw):
                # Swap [a | b] -> [b | a] in a copy, as a kernel with the offsets swapped reads.
                xs = x.view(rows, 2, n).flip(1).contiguous().view(x.shape)
                return good[grid](xs, dy, out, rows, n, **kw)
            return launch

    case = _act_case("swiglu")
    seeded = _seeded(make_backend, monkeypatch, "act_fwd", ta, {"_gated_kernel": Swapped()})
    bad, report = _bad_outputs("act_fwd", case, seeded)
    assert bad == {"y"}, report.describe()


@interpreter_only
@pytest.mark.parametrize("op", ["layernorm_bwd", "rmsnorm_bwd"])
def test_seeded_dropped_zero_centered_one_is_caught(make_backend, monkeypatch, op):
    """effective_weight ignoring ZERO_CENTERED (g = gamma instead of 1 + gamma)."""
    from tealite.backends.triton import norms as tn

    @triton.jit
    def weight_without_one(g, ZERO_CENTERED: tl.constexpr):
        return g

    case = _norm_case(zero_centered=True)
    if op == "rmsnorm_bwd":
        case.pop("offset")
    seeded = _seeded(make_backend, monkeypatch, op, tn, {"effective_weight": weight_without_one})
    bad, report = _bad_outputs(op, case, seeded)
    assert bad == {"dx"}, report.describe()  # dgamma/dbeta do not depend on gamma


def _drop_last_partial(good):
    def sum_partials(partials, out_dtype):
        assert partials.shape[0] >= 2, "the seeded case must use several partials"
        return good(partials[:-1], out_dtype)
    return sum_partials


@interpreter_only
@pytest.mark.parametrize("op,outputs", [("layernorm_bwd", {"dgamma", "dbeta"}),
                                        ("rmsnorm_bwd", {"dgamma"})])
def test_seeded_dropped_norm_partial_is_caught(make_backend, monkeypatch, op, outputs):
    from tealite.backends.triton import norms as tn
    case = _norm_case()
    if op == "rmsnorm_bwd":
        case.pop("offset")
    seeded = _seeded(make_backend, monkeypatch, op, tn,
                     {"sum_partials": _drop_last_partial(tn.sum_partials)})
    bad, report = _bad_outputs(op, case, seeded)
    assert bad == outputs, report.describe()


@interpreter_only
def test_seeded_dropped_dbias_partial_is_caught(make_backend, monkeypatch):
    from tealite.backends.triton import activations as ta
    case = _act_case("gelu", shape=(37, 24))
    seeded = _seeded(make_backend, monkeypatch, "dbias_dact", ta,
                     {"sum_partials": _drop_last_partial(ta.sum_partials)})
    bad, report = _bad_outputs("dbias_dact", case, seeded)
    assert bad == {"dbias"}, report.describe()


# ---- the GPU's approximate exp is inside the spec's model ------------------------------

@triton.jit
def _exp_like_nvidia_plus(x):
    # ex2.approx.f32(fl(x * log2e)) as Triton lowers tl.exp on NVIDIA: the argument rounded
    # to fp32 as on the GPU, then the instruction's maximum error (2 ulp, at most 2^-22
    # relative) applied as a one-sided bias.
    return tl.exp2(x * 1.4426950408889634) * (1.0 + 2.384185791015625e-07)


@triton.jit
def _exp_like_nvidia_minus(x):
    return tl.exp2(x * 1.4426950408889634) * (1.0 - 2.384185791015625e-07)


@interpreter_only
@pytest.mark.parametrize("op", ["act_fwd", "act_bwd", "dbias_dact"])
@pytest.mark.parametrize("model", [_exp_like_nvidia_plus, _exp_like_nvidia_minus],
                         ids=["bias+", "bias-"])
def test_nvidia_approximate_exp_is_inside_the_declared_numerics(make_backend, monkeypatch, op,
                                                                 model):
    """The triton backend declares plain fp32 compute for activations although tl.exp is
    approximate on NVIDIA: with that error model swapped in, fp32 cases still pass."""
    from hypothesis import given, settings

    from tealite.backends.triton import activations as ta
    from tealite_verify import profiles
    spec = get_spec(op)
    modelled = _seeded(make_backend, monkeypatch, op, ta, {"exp_f32": model})

    @given(case=spec.cases("float32", profiles.shape_size()))
    @settings(settings())
    def check(case):
        report = run_case(spec, case, backends=[modelled], pairwise=False, device=DEVICE)
        assert report.verdict == "pass", report.describe()

    check()
