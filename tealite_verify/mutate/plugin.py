"""The ``mutant`` backend: the torch backend with one mutation operator applied.

Imported with ``TEALITE_MUTANT=<operator name>`` (e.g. through
``TEALITE_BACKEND_MODULES=tealite_verify.mutate.plugin``, which is how ``mutate`` runs the
fuzzer on a mutant), it registers a backend named ``mutant`` that implements every op the torch
backend implements, each declared ``like="torch"`` (same support, same declared numerics, so
the tiers judge it exactly as they judge torch): the mutated op through the mutation's wrapper,
every other op as torch's own function (specs that build inputs through other ops, e.g. a
quantize before a dequantize, then run on correct ones).

Without the variable nothing is registered.  In-process users (``mutate``'s suite score, the
thresholds) use :func:`registered`, which removes the backend again on exit so that no other
test or run ever sees it.
"""
from __future__ import annotations

import contextlib
import os

from tealite import registry
from tealite_verify.mutate.base import Mutation, get_mutation

NAME = "mutant"
ENV_VAR = "TEALITE_MUTANT"


def build(mutation: Mutation, name: str = NAME) -> registry.Backend:
    """A Backend (not registered) running ``mutation`` on torch's implementations."""
    torch_backend = registry.get_backend("torch")
    if mutation.op not in torch_backend.impls:
        raise ValueError(f"mutation {mutation.name!r}: the torch backend does not implement "
                         f"op {mutation.op!r}")
    backend = registry.Backend(
        name=name, description=f"torch with mutation {mutation.name}: {mutation.description}",
        # Never picked by backend=None dispatch: it runs only where it is named.
        auto_dispatch=False)
    for op, impl in torch_backend.impls.items():
        fn = mutation.wrap(impl.fn) if op == mutation.op else impl.fn
        backend.implements(op, like="torch")(fn)
    return backend


@contextlib.contextmanager
def registered(mutation: Mutation, name: str = NAME):
    """Register the mutant backend for the duration of the block."""
    if name in registry.backends():
        raise ValueError(f"a backend named {name!r} is already registered; the mutant needs "
                         "that name to itself")
    backend = registry.register_backend(build(mutation, name))
    try:
        yield backend
    finally:
        registry.unregister_backend(name)


def _register_from_environment() -> None:
    wanted = os.environ.get(ENV_VAR, "").strip()
    if not wanted:
        return
    try:
        mutation = get_mutation(wanted)
    except KeyError as exc:
        raise ValueError(f"{ENV_VAR}={wanted!r}: {exc.args[0]}") from None
    registry.register_backend(build(mutation), replace=True)


_register_from_environment()
