"""The mutation operator type, the library's registry, and the small perturbation helpers the
operator modules share.

A :class:`Mutation` names one deliberate bug in one op: ``wrap(torch_fn)`` returns a function
with the torch backend implementation's signature that computes the op through ``torch_fn``
(the correct part) with the bug applied to its inputs, its parameters, one of the torch
backend's internal helpers (:func:`patched`), or its outputs.
"""
from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass
from typing import Callable

import torch

# Operator classes (the list); a Mutation's ``kind`` is one of them.
KINDS = ("rounding-mode", "scale-exponent", "k-ulp", "operand", "epilogue", "precision",
         "tail", "layout", "reduction", "axis", "format", "saturation", "parameter",
         "formula")

_OPERATOR_MODULES = ("operators_gemm", "operators_norms", "operators_act", "operators_quant",
                     "operators_fused", "operators_layouts", "operators_rope",
                     "operators_softmax", "operators_attention", "operators_grouped",
                     "operators_router", "operators_permute",
                     "operators_grouped_quant", "operators_scaling_bulk",
                     "operators_multi_tensor", "operators_dropout")


@dataclass(frozen=True)
class Mutation:
    """One mutation operator.

    ``must_kill``: the CI-profile suite is expected to kill it (CI asserts it).  When False,
    ``why_not`` says why it may survive (inside the declared tolerance by design, or only wrong
    on inputs the suite does not promise to contain).
    """

    name: str
    op: str
    kind: str
    description: str
    wrap: Callable[[Callable], Callable]
    must_kill: bool = True
    why_not: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"mutation {self.name!r}: kind {self.kind!r} not in {KINDS}")
        if not self.name.startswith(self.op + "."):
            raise ValueError(f"mutation {self.name!r}: name must start with its op {self.op!r}.")
        if not self.must_kill and not self.why_not:
            raise ValueError(f"mutation {self.name!r}: must_kill=False needs why_not")


_LIBRARY: dict[str, Mutation] = {}


def register(m: Mutation) -> Mutation:
    if m.name in _LIBRARY and _LIBRARY[m.name] is not m:
        raise ValueError(f"a mutation named {m.name!r} is already registered")
    _LIBRARY[m.name] = m
    return m


def library() -> dict[str, Mutation]:
    """Every mutation operator, by name (imports the operator modules on first use)."""
    for mod in _OPERATOR_MODULES:
        importlib.import_module(f"tealite_verify.mutate.{mod}")
    return dict(sorted(_LIBRARY.items()))


def get_mutation(name: str) -> Mutation:
    lib = library()
    try:
        return lib[name]
    except KeyError:
        raise KeyError(f"no mutation operator named {name!r}; known: {sorted(lib)}") from None


# ---- wrapping helpers ------------------------------------------------------------------------

def with_params(change: Callable[[dict], dict]) -> Callable[[Callable], Callable]:
    """A bug in the parameters: ``change(kwargs) -> kwargs`` before the correct call."""
    def wrap(fn):
        def mutated(*args, **kwargs):
            return fn(*args, **change(dict(kwargs)))
        return mutated
    return wrap


def with_args(change: Callable[[tuple, dict], tuple]) -> Callable[[Callable], Callable]:
    """A bug in the inputs: ``change(args, kwargs) -> (args, kwargs)`` before the call."""
    def wrap(fn):
        def mutated(*args, **kwargs):
            new_args, new_kwargs = change(tuple(args), dict(kwargs))
            return fn(*new_args, **new_kwargs)
        return mutated
    return wrap


def on_output(change: Callable, index: int | None = None) -> Callable[[Callable], Callable]:
    """A bug in the result: ``change(output, args, kwargs)`` replaces the whole result, or with
    ``index`` the result tuple's element ``index``."""
    def wrap(fn):
        def mutated(*args, **kwargs):
            out = fn(*args, **kwargs)
            if index is None:
                return change(out, args, kwargs)
            items = list(out)
            items[index] = change(items[index], args, kwargs)
            return type(out)(items) if isinstance(out, tuple) else items
        return mutated
    return wrap


def with_patches(*patches: tuple) -> Callable[[Callable], Callable]:
    """A bug inside the torch backend: ``(module, attribute, make_replacement)`` triples, each
    ``make_replacement(original)`` swapped in while the mutant runs (see :func:`patched`).  The
    attribute is one of the backend's public building blocks, never a ``_``-prefixed name
    (tests/test_architecture.py checks)."""
    def wrap(fn):
        def mutated(*args, **kwargs):
            with contextlib.ExitStack() as stack:
                for module, name, make in patches:
                    stack.enter_context(patched(module, name, make))
                return fn(*args, **kwargs)
        return mutated
    return wrap


@contextlib.contextmanager
def patched(module, name: str, make: Callable[[Callable], Callable]):
    """Replace ``module.name`` by ``make(original)`` for the calling thread only.

    The fuzzer builds the next case's inputs on another thread while a case runs, and some
    inputs (fused / qgemm specs) may go through the same torch helpers: that thread must keep
    seeing the correct function, so the patch is a gate keyed on the thread that entered it.
    """
    original = getattr(module, name)
    replacement = make(original)
    owner = threading.get_ident()

    def gate(*args, **kwargs):
        if threading.get_ident() == owner:
            return replacement(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(module, name, gate)
    try:
        yield
    finally:
        setattr(module, name, original)


# ---- perturbation primitives -----------------------------------------------------------------

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def max_finite_magnitude_bits(dtype: torch.dtype) -> int:
    top = torch.tensor(torch.finfo(dtype).max, dtype=torch.float32).to(dtype)
    return int(top.view(INT_VIEW[top.element_size()]).item())


def bump_ulps(t: torch.Tensor, k: int, flat_index: int) -> torch.Tensor:
    """A copy of float tensor ``t`` with the element at ``flat_index`` moved ``k`` ulps of its
    dtype away from zero (its magnitude bits + k), clamped to the largest finite magnitude so
    the error stays a finite value error, never a NaN / Inf."""
    out = t.detach().clone().contiguous()
    flat = out.view(-1)
    if flat.numel() == 0 or k == 0:
        return out
    bits = flat.view(INT_VIEW[flat.element_size()])
    width = 8 * flat.element_size()
    sign_mask = 1 << (width - 1)
    word = int(bits[flat_index].item()) & ((1 << width) - 1)
    sign, mag = word & sign_mask, word & (sign_mask - 1)
    top = max_finite_magnitude_bits(t.dtype)
    if mag > top:  # NaN / Inf: leave it (a value error needs a finite value)
        return out
    new = sign | min(mag + k, top)
    if new >= sign_mask:  # back to the signed view
        new -= 1 << width
    bits[flat_index] = new
    return out


def stale_last_row(t: torch.Tensor) -> torch.Tensor:
    """Tail garbage: the last row along dim 0 (of a 2-D view) holds the first row's values,
    as when a kernel skips its last tile and the buffer keeps a stale row."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    rows = t.reshape(-1, t.shape[-1]).clone()
    if rows.shape[0] < 2:
        return t
    rows[-1] = rows[0]
    return rows.reshape(t.shape)


def largest_finite_index(t: torch.Tensor) -> int | None:
    """Flat index of the finite element of largest magnitude (None if there is none)."""
    if t.numel() == 0:
        return None
    v = t.detach().float().reshape(-1).abs()
    finite = torch.isfinite(v)
    if not bool(finite.any()):
        return None
    return int(torch.where(finite, v, torch.full_like(v, -1.0)).argmax().item())
