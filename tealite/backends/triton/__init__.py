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
from dataclasses import dataclass

from tealite.registry import Backend, register_backend
from tealite.scoped import Scoped

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


@dataclass(frozen=True)
class Platform:
    """Facts about the GPU the kernels compile for that change a family module's configs or
    declared numerics, read through ``PLATFORM.get()``; a test simulates another GPU for a
    block with ``PLATFORM.override(...)``.  How kernels launch (:data:`INTERPRET`,
    :data:`DEVICES`) is fixed at import and is not one of them."""

    rocm: bool  # torch is a ROCm build (torch.version.hip): a "cuda" device is AMD's
    # The FP8 formats a CUDA device's tensor cores multiply natively; None: ask the device
    # (_qgemm_operands._native_fp8_formats).
    native_fp8_formats: frozenset[str] | None = None
    # The longest row one program holds in registers: longer rows take quantize's tiled
    # per-row path, and fused norm -> quantize rejects them.  A test lowers it to reach the
    # tiled path with small shapes.
    max_row_in_registers: int = 65536


def _detect_platform() -> Platform:
    import torch
    return Platform(rocm=torch.version.hip is not None)


PLATFORM: Scoped[Platform] = Scoped("triton.PLATFORM", _detect_platform)

BACKEND = register_backend(Backend(
    name="triton", probe=_probe, auto_dispatch=not INTERPRET,
    description="tealite Triton kernels (GPU, or the CPU interpreter with TRITON_INTERPRET=1)"))

# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("activations", "attention", "dequantize", "fused", "gemm", "grouped_gemm", "norms",
            "qgemm", "quantize", "rope", "softmax", "router", "permute",
            "grouped_quantize", "scaling", "transpose", "multi_tensor", "dropout",
            "router_aux_loss")
if HAVE_TRITON:
    for _family in FAMILIES:
        importlib.import_module(f"{__name__}.{_family}")
