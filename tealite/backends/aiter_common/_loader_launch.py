"""Launch-time patches of AITER's Triton kernels (see the loader's docstring, steps 4-5).

* Off ROCm every AITER kernel's ``run`` drops the AMD-only launch options its tuned configs
  carry (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``: Triton's CUDA backend raises
  KeyError on them; the interpreter ignores them).
* Under the interpreter, ``tl.assume`` is not checked while an AITER kernel runs (AITER's FP8
  quant kernels hint ``pid > 0``, false for program 0), and a launch grid written as a list
  (``lambda meta: [n]``) is passed as a tuple (the interpreter concatenates it with a tuple).
* Under the interpreter, the kernels named in :data:`TENSOR_LOOP_KERNELS` see their ``for``
  loop variables as int32 tensors, as compiled Triton makes them (the interpreter runs
  Python's ``range``, whose ints have no ``.to``): AITER's gmm kernels call
  ``g.to(tl.int64)`` on ``for g in range(G)`` (:func:`interpreter_tensor_loops`).
* Inside :func:`dry_run`, a wrapped kernel's launch is recorded (:class:`Launch`: its name
  and keyword arguments, i.e. the config AITER's host code settled on) and not executed: the
  adapters ask AITER's own wrapper which config it launches with instead of replaying its
  host-side adjustments, which change between AITER versions.
"""
from __future__ import annotations

import contextlib
import threading
import types
from dataclasses import dataclass
from typing import Iterable

AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def interpreter_has_assume_hook() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return hasattr(getattr(interpreter, "interpreter_builder", None), "create_assume")


@contextlib.contextmanager
def interpreter_assume_unchecked():
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    saved = builder.__dict__.get("create_assume")
    builder.create_assume = lambda condition: None
    try:
        yield
    finally:
        if saved is None:
            del builder.create_assume
        else:
            builder.create_assume = saved


# AITER kernels that use a loop variable as a tensor (read in AITER 0.1.7's
# _triton_kernels/gmm.py: ``g.to(tl.int64)`` with ``for g in range(G)``).
TENSOR_LOOP_KERNELS = frozenset({"gmm_kernel", "tgmm_persistent_kernel",
                                 "tgmm_non_persistent_kernel"})


@contextlib.contextmanager
def interpreter_tensor_loops(fn):
    """While the block runs, ``range`` in ``fn``'s module yields int32 interpreter tensors
    (the interpreter's own scalar wrapping, ``_implicit_cvt``): the loop variables' compiled
    type.  The module's own ``range``, if it had one, is restored afterwards."""
    import builtins

    from triton.runtime.interpreter import _implicit_cvt

    def tensor_range(*args):
        for i in builtins.range(*args):
            yield _implicit_cvt(i)

    scope = fn.__globals__
    missing = object()
    saved = scope.get("range", missing)
    scope["range"] = tensor_range
    try:
        yield
    finally:
        if saved is missing:
            del scope["range"]
        else:
            scope["range"] = saved


@dataclass(frozen=True)
class Launch:
    """One kernel launch seen in a dry run: the kernel's name and its keyword arguments."""

    kernel: str
    kwargs: dict


_recording = threading.local()


@contextlib.contextmanager
def dry_run():
    """Within the block, wrapped AITER kernel launches append a :class:`Launch` to the yielded
    list and return None instead of running (nests; per thread)."""
    launches: list[Launch] = []
    saved = getattr(_recording, "launches", None)
    _recording.launches = launches
    try:
        yield launches
    finally:
        _recording.launches = saved


def innermost_kernel(obj):
    from triton.runtime.jit import KernelInterface
    while isinstance(getattr(obj, "fn", None), KernelInterface):
        obj = obj.fn  # Heuristics / Autotuner wrap the JIT (or interpreted) function
    return obj


def grid_as_tuple(grid):
    """AITER writes some grids as lists (``lambda meta: [n]``); the GPU launcher indexes them,
    the interpreter concatenates them with a tuple and raises TypeError."""
    if callable(grid):
        return lambda meta: grid_as_tuple(grid(meta))
    return tuple(grid) if isinstance(grid, list) else grid


def wrap_launch(kernel, drop: tuple[str, ...], unchecked_assume: bool, *,
                interpreted: bool = False) -> bool:
    if getattr(kernel, "_tealite_launch_wrapped", False):
        return False
    launch = kernel.run
    # A kernel that declares one of these names as a parameter keeps it.
    drop = tuple(name for name in drop if name not in (getattr(kernel, "arg_names", None) or ()))

    name = getattr(getattr(kernel, "fn", None), "__name__", None) or repr(kernel)

    def run(*args, **kwargs):
        for option in drop:
            kwargs.pop(option, None)
        launches = getattr(_recording, "launches", None)
        if launches is not None:
            launches.append(Launch(name, dict(kwargs)))
            return None
        if interpreted and "grid" in kwargs:
            kwargs["grid"] = grid_as_tuple(kwargs["grid"])
        if interpreted and name in TENSOR_LOOP_KERNELS:
            with interpreter_tensor_loops(kernel.fn), interpreter_assume_unchecked():
                return launch(*args, **kwargs)
        if unchecked_assume:
            with interpreter_assume_unchecked():
                return launch(*args, **kwargs)
        return launch(*args, **kwargs)

    kernel.run = run  # an instance attribute: kernel[grid](...) and Heuristics.run call it
    kernel._tealite_launch_wrapped = True
    return True


def is_interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"  # triton.jit under TRITON_INTERPRET


def wrap_all_kernels(modules: Iterable[types.ModuleType],
                     drop: tuple[str, ...]) -> tuple[int, int]:
    """Wrap every kernel bound in ``modules``; returns (kernels wrapped, of them interpreted)."""
    from triton.runtime.jit import KernelInterface
    assume_hook = interpreter_has_assume_hook()
    wrapped = interpreted = 0
    for mod in modules:
        for value in list(vars(mod).values()):
            if isinstance(value, KernelInterface):
                kernel = innermost_kernel(value)
                unchecked = assume_hook and is_interpreted(kernel)
                if wrap_launch(kernel, drop, unchecked, interpreted=is_interpreted(kernel)):
                    wrapped += 1
                    interpreted += unchecked
    return wrapped, interpreted
