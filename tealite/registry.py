"""Backend registry.

A backend is a name, an availability probe that says *why* it cannot run, and per-op
implementations each with a declared :class:`Support` (dtypes, devices, layouts, extra shape
constraints) and declared numerics (what the harness's tolerance model may assume about how
the kernel rounds).

Backends register themselves when their module is imported.  :func:`load_plugins` imports,
in one loop, the modules named by three sources (see README):

* :data:`IN_TREE_BACKENDS`: tealite's own backends (declared here by name, so the registry
  has no static import of a backend: layers import downward only);
* the ``tealite.backends`` entry-point group of installed distributions;
* the ``TEALITE_BACKEND_MODULES`` environment variable (comma-separated import paths).

A backend may also call :func:`register_backend` from any module imported some other way.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping

import torch

from tealite.errors import BackendUnavailable, DryRunStop, UnsupportedCase
from tealite.numerics import Numerics
from tealite.types import Op

# The three sources of backend modules, imported in this order by load_plugins().
IN_TREE_BACKENDS = ("tealite.backends.scaled_mm", "tealite.backends.torch",
                    "tealite.backends.triton", "tealite.backends.aiter",
                    "tealite.backends.aiter_triton", "tealite.backends.sdpa")
ENTRY_POINT_GROUP = "tealite.backends"
PLUGIN_ENV_VAR = "TEALITE_BACKEND_MODULES"

# Default dispatch order when an op is called with backend=None: the fast paths first,
# the PyTorch fallback last.  Unknown names are ignored.
DEFAULT_PRIORITY = ("aiter", "triton", "scaled_mm", "torch")


@dataclass(frozen=True)
class Support:
    """What one backend implementation of one op accepts.

    ``dtypes``/``layouts`` of None mean "any the op itself accepts".  ``check`` receives the
    op's normalized parameters and returns a reason string when the case is unsupported.
    """

    dtypes: frozenset | None = None
    devices: frozenset = frozenset({"cpu", "cuda"})
    layouts: frozenset | None = None
    check: Callable[[Mapping[str, Any]], str | None] | None = None

    def why_not(self, params: Mapping[str, Any]) -> str | None:
        device = params.get("device", "cpu")
        if device not in self.devices:
            return f"device {device} not in {sorted(self.devices)}"
        dtype = params.get("dtype")
        if self.dtypes is not None and dtype is not None and dtype not in self.dtypes:
            names = sorted(str(d).removeprefix("torch.") for d in self.dtypes)
            return f"dtype {str(dtype).removeprefix('torch.')} not in {names}"
        layout = params.get("layout")
        if self.layouts is not None and layout is not None and layout not in self.layouts:
            return f"layout {layout} not in {sorted(self.layouts)}"
        if self.check is not None:
            return self.check(params)
        return None


@dataclass
class Impl:
    backend: str
    op: str
    fn: Callable
    support: Support
    # Declared numerics (tealite/numerics.py), read by tealite_verify's tolerance tiers:
    # a function of the case's params.
    numerics: Callable[[Mapping[str, Any]], Numerics]


def _numerics_callable(numerics, where: str) -> Callable[[Mapping[str, Any]], Numerics]:
    """A numerics declaration (None, a Numerics or mapping, or a callable of the op params
    returning one) as a callable returning a validated Numerics.  A fixed declaration is
    validated here, at registration; a callable's result each time it is evaluated."""
    if callable(numerics) and not isinstance(numerics, (Numerics, Mapping)):
        return lambda params: Numerics.of(numerics(params), where=where)
    fixed = Numerics.of(numerics, where=where)
    return lambda params: fixed


def _declared_like(op: str, like: str, *, devices, **given) -> tuple[Support, Callable]:
    """Backend ``like``'s Support and numerics callable for ``op`` (shared, not copied: a
    device-dependent or probed declaration stays evaluated per call)."""
    named = sorted(k for k, v in given.items() if v is not None)
    if named or devices != ("cpu", "cuda"):
        raise TypeError(f"implements({op!r}, like={like!r}) copies support and numerics; "
                        f"do not also pass {', '.join(named) or 'devices'}")
    model = get_backend(like).impls.get(op)
    if model is None:
        raise ValueError(f"like={like!r}: backend {like!r} does not implement {op!r}")
    return model.support, model.numerics


@dataclass
class Backend:
    name: str
    probe: Callable[[], str | None] = lambda: None
    description: str = ""
    impls: dict[str, Impl] = field(default_factory=dict)
    # False keeps the backend out of backend=None dispatch (it still runs when named, and the
    # harness still verifies it): e.g. Triton kernels running in the slow CPU interpreter.
    auto_dispatch: bool = True
    # The module whose code called register_backend (set there when left empty): a repro
    # command run in a fresh process must import it, or install the distribution whose
    # entry point names it, for this backend to exist there (tealite_verify.runner).
    origin: str = ""

    def implements(self, op: Op | str, *, dtypes=None, devices=("cpu", "cuda"), layouts=None,
                   check=None, numerics=None, like: str | None = None):
        """Decorator registering ``fn`` as this backend's implementation of ``op``.

        ``op`` is a :class:`~tealite.types.Op` or its plain name; any other name is a
        ValueError naming the valid ones (a misspelled op would otherwise register an
        implementation nothing ever dispatches to).

        ``numerics`` is a :class:`~tealite.numerics.Numerics` or a mapping of its fields, or a
        callable taking the op params and returning either.
        ``like="torch"``: the same :class:`Support` and declared numerics as that backend's
        implementation of ``op`` (device-dependent and probed declarations included, since
        its numerics callable is shared); give no other support or numerics argument then.
        """
        # Stored by its plain name: Impl.op and dispatch records read as they always did.
        op = Op.named(op, argument=f"{self.name}.implements(op)").value
        if like is not None:
            support, numerics_fn = _declared_like(op, like, dtypes=dtypes, layouts=layouts,
                                                  check=check, numerics=numerics,
                                                  devices=devices)
        else:
            support = Support(
                dtypes=frozenset(dtypes) if dtypes is not None else None,
                devices=frozenset(devices),
                layouts=frozenset(layouts) if layouts is not None else None,
                check=check,
            )
            numerics_fn = _numerics_callable(
                numerics, f"{self.name}.implements({op!r}, numerics=...)")

        def deco(fn):
            self.impls[op] = Impl(backend=self.name, op=op, fn=fn, support=support,
                                  numerics=numerics_fn)
            return fn

        return deco

    def unavailable_reason(self) -> str | None:
        try:
            return self.probe()
        except Exception as exc:  # a probe that crashes is itself a reason
            return f"availability probe raised {type(exc).__name__}: {exc}"

    def why_unsupported(self, op: str, params: Mapping[str, Any]) -> str | None:
        """None when this backend can run ``op`` on ``params``; otherwise the reason."""
        reason = self.unavailable_reason()
        if reason is not None:
            return f"backend unavailable: {reason}"
        return self.why_case_unsupported(op, params)

    def why_case_unsupported(self, op: str, params: Mapping[str, Any]) -> str | None:
        """``why_unsupported`` once the backend is known to be available (its probe is not
        run again: dispatch calls this on every op call)."""
        impl = self.impls.get(op)
        if impl is None:
            return f"op {op} not implemented"
        return impl.support.why_not(params)


_BACKENDS: dict[str, Backend] = {}
_plugins_loaded = False


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a tealite.registry.Backend, got {type(backend).__name__}")
    if backend.name in _BACKENDS and not replace and _BACKENDS[backend.name] is not backend:
        raise ValueError(f"a backend named {backend.name!r} is already registered "
                         "(pass replace=True to override it)")
    if not backend.origin:
        backend.origin = sys._getframe(1).f_globals.get("__name__", "")
    _BACKENDS[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)


def load_plugins(*, force: bool = False) -> list[str]:
    """Import the in-tree backends, entry-point backends and $TEALITE_BACKEND_MODULES.

    Returns a list of load errors (module name and exception); a broken third-party plugin
    must not take down the whole harness, but its failure is reported, not swallowed.  An
    in-tree backend that fails to import is our bug: that error propagates.
    """
    global _plugins_loaded
    errors: list[str] = []
    if _plugins_loaded and not force:
        return errors
    _plugins_loaded = True
    for module, in_tree in _backend_modules():
        try:
            importlib.import_module(module.split(":")[0])
        except Exception as exc:
            if in_tree:
                raise
            errors.append(f"{module}: {type(exc).__name__}: {exc}")
    _load_errors.extend(errors)
    return errors


_load_errors: list[str] = []


def _backend_modules() -> list[tuple[str, bool]]:
    """(module, is in-tree) for every backend module to import, in-tree ones first."""
    plugins = [ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    plugins += [m.strip() for m in os.environ.get(PLUGIN_ENV_VAR, "").split(",") if m.strip()]
    return [(m, True) for m in IN_TREE_BACKENDS] + [(m, False) for m in plugins]


def plugin_load_errors() -> list[str]:
    return list(_load_errors)


def backends() -> dict[str, Backend]:
    load_plugins()
    return dict(_BACKENDS)


def get_backend(name: str) -> Backend:
    load_plugins()
    try:
        return _BACKENDS[name]
    except KeyError:
        raise KeyError(f"no backend named {name!r}; registered: {sorted(_BACKENDS)}") from None


def device_kind(device: torch.device | str) -> str:
    return torch.device(device).type


@dataclass(frozen=True)
class DispatchRecord:
    backend: str
    op: str
    params: Mapping[str, Any]
    numerics: Numerics


_trace: contextvars.ContextVar[list | None] = contextvars.ContextVar("tealite_trace", default=None)


@contextlib.contextmanager
def trace():
    """Record every dispatch made inside the block (used by the harness to learn which
    implementation ran and what numerics it declared for the exact case).  A nested block's
    records reach the enclosing block's list too (after the nested block ends)."""
    outer = _trace.get()
    records: list[DispatchRecord] = []
    token = _trace.set(records)
    try:
        yield records
    finally:
        _trace.reset(token)
        if outer is not None:
            outer.extend(records)


_dry_run_op: contextvars.ContextVar[str | None] = contextvars.ContextVar("tealite_dry_run",
                                                                         default=None)


@contextlib.contextmanager
def dry_run(op: str):
    """Inside the block, a dispatch of ``op`` that a backend accepts raises
    :class:`~tealite.errors.DryRunStop` instead of running it (other ops run normally): the
    harness learns that a case passes the front-end's validation and the backend's declared
    support without paying for the kernel."""
    token = _dry_run_op.set(op)
    try:
        yield
    finally:
        _dry_run_op.reset(token)


def _chosen(impl: Impl, params: Mapping[str, Any]) -> Impl:
    if _dry_run_op.get() == impl.op:
        raise DryRunStop(f"{impl.backend} accepts this {impl.op} case")
    records = _trace.get()
    if records is not None:
        records.append(DispatchRecord(impl.backend, impl.op, dict(params),
                                      impl.numerics(params)))
    return impl


def dispatch(op: str, params: Mapping[str, Any], backend: str | None) -> Impl:
    """Pick the implementation for ``op``.

    With an explicit ``backend`` the call fails loudly (with the reason) when that backend
    cannot run the case; with ``backend=None`` the first capable backend in
    :data:`DEFAULT_PRIORITY` (then any other registered backend) is used.
    """
    load_plugins()
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a backend name (str) or None, got "
                            f"{type(backend).__name__}")
        b = get_backend(backend)
        reason = b.unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"backend {backend!r} is unavailable: {reason}")
        reason = b.why_case_unsupported(op, params)
        if reason is not None:
            raise UnsupportedCase(f"backend {backend!r} does not support {op} here: {reason}")
        return _chosen(b.impls[op], params)
    order = [n for n in DEFAULT_PRIORITY if n in _BACKENDS]
    order += [n for n in _BACKENDS if n not in order]
    order = [n for n in order if _BACKENDS[n].auto_dispatch]
    reasons = []
    for name in order:
        reason = _BACKENDS[name].why_unsupported(op, params)
        if reason is None:
            return _chosen(_BACKENDS[name].impls[op], params)
        reasons.append(f"{name}: {reason}")
    raise UnsupportedCase(f"no backend supports {op} for this case: " + "; ".join(reasons))
