"""tealite's own Triton kernels.

On a GPU (CUDA or ROCm) they run natively.  Without one they run in Triton's interpreter when
``TRITON_INTERPRET=1`` is set before import (CI does this); then the backend runs on CPU
tensors only and is left out of automatic dispatch (it is slow), but is verified like any
other backend.  Interpreter numerics bugs (NUMERICS.md: fp32 -> fp8 casts, bf16 ``tl.dot``)
are avoided by construction: FP8 codes are built from fp32 bits with integer arithmetic, the
same source on every target.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

from tealite.registry import Backend, register_backend

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _probe() -> str | None:
    if not HAVE_TRITON:
        return "triton is not installed"
    if INTERPRET:
        from tealite.backends._triton_interpreter import runtime_loop_gap
        return runtime_loop_gap()
    import torch
    if not torch.cuda.is_available():
        return "no GPU (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
    return None


DEVICES = ("cpu",) if INTERPRET else ("cuda",)

BACKEND = register_backend(Backend(
    name="triton", probe=_probe, auto_dispatch=not INTERPRET,
    description="tealite Triton kernels (GPU, or the CPU interpreter with TRITON_INTERPRET=1)"))

# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("activations", "dequantize", "fused", "gemm", "norms", "qgemm", "quantize")
if HAVE_TRITON:
    for _family in FAMILIES:
        importlib.import_module(f"{__name__}.{_family}")
