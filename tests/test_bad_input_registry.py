"""The argument-error type, validation before dispatch, and the backend registry's errors: an
unknown, unavailable or incapable backend is reported with its reason.

Every check here runs in the op front-ends before any backend is chosen, so these tests run
on the CPU only.  A tensor on the ``meta`` device stands in for "a second device".
"""
from __future__ import annotations

import pytest

import tealite
from tealite import registry
from tealite.errors import BackendUnavailable, TealiteArgumentError, UnsupportedCase
from tealite.types import Op

from _helpers_bad_input import (BF16, F16, F32, H, K, M, N, X_SHAPE, ln_bwd, ln_fwd, raises,
                                rms_bwd, rms_fwd, stored, t)

def test_argument_error_is_a_value_error():
    assert issubclass(TealiteArgumentError, ValueError)
    assert tealite.TealiteArgumentError is TealiteArgumentError


# ---- validation precedes dispatch -----------------------------------------------------------

def test_argument_errors_win_over_backend_errors():
    # A bad argument is reported as such even when the backend name is bogus too.
    with raises("layout must be one of"):
        tealite.gemm(t(N, K), t(M, K), layout="XX", backend="no-such-backend")
    with raises("eps must be > 0"):
        rms_fwd(eps=0.0, backend="no-such-backend")
    with raises("kind must be one of"):
        tealite.act_fwd(t(3, 8), "nope", backend="no-such-backend")


# ---- backend registry -----------------------------------------------------------------------

def _all_op_calls(dtype=F32, layout="TN"):
    """One valid call per front-end, as (op name, callable taking backend=)."""
    a, b = stored(layout, dtype=dtype)
    x = t(*X_SHAPE, dtype=dtype)
    return {
        "gemm": lambda be: tealite.gemm(a, b, layout=layout, backend=be),
        "layernorm_fwd": lambda be: ln_fwd(x=x, gamma=t(H, dtype=dtype),
                                           beta=t(H, dtype=dtype), backend=be),
        "layernorm_bwd": lambda be: ln_bwd(x=x, backend=be),
        "rmsnorm_fwd": lambda be: rms_fwd(x=x, backend=be),
        "rmsnorm_bwd": lambda be: rms_bwd(x=x, backend=be),
        "act_fwd": lambda be: tealite.act_fwd(t(3, 8, dtype=dtype), "gelu", backend=be),
        "act_bwd": lambda be: tealite.act_bwd(t(3, 8, dtype=dtype), t(3, 8, dtype=dtype),
                                              "gelu", backend=be),
        "dbias_dact": lambda be: tealite.dbias_dact(t(3, 8, dtype=dtype),
                                                    t(3, 8, dtype=dtype), "gelu", backend=be),
    }


OPS = list(_all_op_calls())


@pytest.fixture
def temp_backend():
    """Register temporary backends; always unregister them afterwards."""
    registry.load_plugins()
    names: list[str] = []

    def make(name, **kw) -> registry.Backend:
        backend = registry.Backend(name=name, **kw)
        registry.register_backend(backend)
        names.append(name)
        return backend

    try:
        yield make
    finally:
        for name in names:
            registry.unregister_backend(name)
        assert not set(names) & set(registry.backends())


def _delegate(op):
    """An implementation that forwards to the torch backend (so it returns real outputs)."""
    torch_impl = registry.get_backend("torch").impls[op]
    calls = []

    def fn(*args, **kwargs):
        calls.append(op)
        return torch_impl.fn(*args, **kwargs)

    return fn, calls


@pytest.mark.parametrize("op", OPS)
def test_unknown_backend_name(op):
    with pytest.raises(KeyError, match=r"no backend named 'no-such-backend'; registered: "
                                       r"\[.*'torch'.*\]"):
        _all_op_calls()[op]("no-such-backend")


@pytest.mark.parametrize("op", OPS)
def test_unavailable_backend_carries_probe_reason(temp_backend, op):
    backend = temp_backend("_t_unavailable", probe=lambda: "needs a frobnicator (none found)")
    fn, calls = _delegate(op)
    backend.implements(op)(fn)
    with pytest.raises(BackendUnavailable, match=r"backend '_t_unavailable' is unavailable: "
                                                 r"needs a frobnicator \(none found\)"):
        _all_op_calls()[op]("_t_unavailable")
    assert not calls
    # With backend=None the unavailable backend is skipped, not fatal.
    _all_op_calls()[op](None)
    assert not calls


def test_crashing_probe_is_a_reason(temp_backend):
    def probe():
        raise RuntimeError("driver exploded")

    backend = temp_backend("_t_crashing", probe=probe)
    backend.implements("gemm")(_delegate("gemm")[0])
    with pytest.raises(BackendUnavailable,
                       match=r"availability probe raised RuntimeError: driver exploded"):
        _all_op_calls()["gemm"]("_t_crashing")


@pytest.mark.parametrize("op", OPS)
def test_unsupported_dtype_carries_reason(temp_backend, op):
    backend = temp_backend("_t_fp32_only")
    fn, calls = _delegate(op)
    backend.implements(op, dtypes=[F32])(fn)
    with pytest.raises(UnsupportedCase, match=r"backend '_t_fp32_only' does not support "
                                              rf"{op} here: dtype bfloat16 not in \['float32'\]"):
        _all_op_calls(dtype=BF16)[op]("_t_fp32_only")
    assert not calls
    # The supported dtype really dispatches to it.
    with registry.trace() as records:
        _all_op_calls(dtype=F32)[op]("_t_fp32_only")
    assert calls == [op]
    assert [(r.backend, r.op) for r in records] == [("_t_fp32_only", op)]


def test_unsupported_layout_device_check_and_missing_op(temp_backend):
    backend = temp_backend("_t_picky")
    fn, _ = _delegate("gemm")
    backend.implements("gemm", layouts=["TN"],
                       check=lambda p: "K must be a multiple of 16" if p["k"] % 16 else None)(fn)
    calls = _all_op_calls(layout="NN")
    with pytest.raises(UnsupportedCase, match=r"layout NN not in \['TN'\]"):
        calls["gemm"]("_t_picky")
    with pytest.raises(UnsupportedCase, match=r"K must be a multiple of 16"):
        _all_op_calls(layout="TN")["gemm"]("_t_picky")  # K = 8
    with pytest.raises(UnsupportedCase, match=r"op act_fwd not implemented"):
        calls["act_fwd"]("_t_picky")

    gpu_only = temp_backend("_t_gpu_only")
    gpu_only.implements("act_fwd", devices=("cuda",))(_delegate("act_fwd")[0])
    with pytest.raises(UnsupportedCase, match=r"device cpu not in \['cuda'\]"):
        calls["act_fwd"]("_t_gpu_only")


def test_default_dispatch_reports_every_reason(temp_backend, monkeypatch):
    # Hide every real backend: with nothing capable, the error lists each candidate's reason.
    fn, _ = _delegate("gemm")
    monkeypatch.setattr(registry, "_BACKENDS", {})
    temp_backend("_t_a", probe=lambda: "no device")
    temp_backend("_t_b").implements("gemm", dtypes=[F16])(fn)
    with pytest.raises(UnsupportedCase, match=r"no backend supports gemm for this case: "
                                              r"_t_a: backend unavailable: no device; "
                                              r"_t_b: dtype float32 not in \['float16'\]"):
        _all_op_calls()["gemm"](None)


def test_register_backend_rejects_duplicates_and_non_backends(temp_backend):
    temp_backend("_t_dup")
    with pytest.raises(ValueError, match=r"a backend named '_t_dup' is already registered"):
        registry.register_backend(registry.Backend(name="_t_dup"))
    with pytest.raises(TypeError, match=r"backend must be a tealite.registry.Backend, got dict"):
        registry.register_backend({"name": "x"})


def test_implements_rejects_an_unknown_op_naming_the_valid_ones(temp_backend):
    """A plug-in's misspelled op is an error at registration, not an implementation nothing
    ever dispatches to; a misspelled constant in our code fails at import."""
    backend = temp_backend("_t_typo")
    with pytest.raises(ValueError, match=r"_t_typo.implements\(op\) must be one of tealite's "
                                         r"ops \[.*'gemm'.*'qgemm'.*\], got 'gemn'"):
        backend.implements("gemn")
    assert not backend.impls
    with pytest.raises(AttributeError):
        Op.GEMN  # noqa: B018
    # The constant and its plain name register the same implementation, stored by its name.
    backend.implements(Op.GEMM)(_delegate("gemm")[0])
    backend.implements("act_fwd")(_delegate("act_fwd")[0])
    assert sorted(backend.impls) == ["act_fwd", "gemm"]
    assert all(type(k) is str and type(i.op) is str for k, i in backend.impls.items())
    assert f"{Op.GEMM}" == str(Op.GEMM) == "gemm"  # messages read as with plain names
