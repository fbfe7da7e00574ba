"""Probes of Triton's CPU interpreter (TRITON_INTERPRET=1) in this environment.

The interpreter's behaviour depends on the Triton *and* numpy versions installed, so it is
probed, not assumed.  Measured on the device image (triton 3.6.0, numpy 2.5.2, 2026-11-25):
a loop bounded by a runtime scalar, ``for i in range(0, tl.cdiv(n, BLOCK))``, raises
``TypeError: only 0-dimensional arrays can be converted to Python scalars`` (the
interpreter's ``__index__`` calls ``int()`` on a 1-element array, which numpy 2.5 refuses);
triton 3.9 with numpy 2.4 runs it.  Every GEMM / reduction kernel has such a loop.

The backends read the probes' findings through :data:`INTERPRETER` (:func:`runtime_loop_gap`);
a test simulates another Triton / numpy for a block with ``INTERPRETER.override(...)``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from tealite.scoped import Scoped


@dataclass(frozen=True)
class Interpreter:
    """What the probes found about Triton's interpreter in this environment."""

    runtime_loop_gap: str | None  # why it cannot run a runtime-bounded loop (None: it can)


INTERPRETER: Scoped[Interpreter] = Scoped(
    "triton_interpreter.INTERPRETER",
    lambda: Interpreter(runtime_loop_gap=_probe_runtime_loop_gap()))


def runtime_loop_gap() -> str | None:
    """None when the interpreter runs a runtime-bounded loop; else why not (one line)."""
    return INTERPRETER.get().runtime_loop_gap


@functools.lru_cache(maxsize=None)
def _probe_runtime_loop_gap() -> str | None:
    import numpy
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _count(out_ptr, n, BLOCK: tl.constexpr):
        acc = 0
        for _ in range(0, tl.cdiv(n, BLOCK)):
            acc += 1
        tl.store(out_ptr, acc)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count[(1,)](out, 5, BLOCK=2)
    except Exception as exc:  # the reason is the finding
        return (f"Triton {triton.__version__}'s interpreter cannot run a loop bounded by a "
                f"runtime scalar under numpy {numpy.__version__} "
                f"({type(exc).__name__}: {str(exc)[:120]})")
    if int(out[0]) != 3:
        return (f"Triton {triton.__version__}'s interpreter ran a runtime-bounded loop "
                f"{int(out[0])} times, not 3")
    return None
