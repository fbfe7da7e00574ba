"""AITER's Triton kernels as a tealite backend (``aiter_triton``).

The kernels are AMD's own code (``aiter/ops/triton``), loaded by
:mod:`tealite.backends.aiter_common.loader`: on ROCm from the real package, elsewhere without
ROCm (arch pinned, AMD-only launch options dropped), on an NVIDIA GPU natively or on the CPU
in Triton's interpreter (``TRITON_INTERPRET=1``).  So CI exercises AITER's real kernel code.

Nothing is imported from AITER until a kernel is first called (:func:`kernels`); the probe
only looks for a source.  Each family module declares, per AITER entry point, the contract it
follows (:mod:`tealite.backends.aiter_common.contracts`) and reports the entry point it ran in the
case's numerics (``"entry_point"``).  An entry point that the installed AITER lacks (modules
move between versions) makes the case unsupported with the loader's reason: never a silent
fallback to another path (:func:`why_missing`).  Where AITER's private API drifted between
versions the adapters dispatch on what the loaded code shows (a ``_get_config`` result's type,
a wrapper's parameters, the config its wrapper launches with in a dry run), not on the
version string; a drift they cannot adapt makes the case unsupported with a reason starting
"adapter:".
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass

from tealite.backends.aiter_common import loader
from tealite.registry import Backend, register_backend
from tealite.scoped import Scoped

NAME = "aiter_triton"
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _probe() -> str | None:
    if not HAVE_TRITON:
        return "triton is not installed"
    why = loader.why_unavailable()
    if why is not None:
        return why
    if INTERPRET:
        from tealite.backends._triton_interpreter import runtime_loop_gap
        return runtime_loop_gap()
    import torch
    if not torch.cuda.is_available():
        return "no GPU (set TRITON_INTERPRET=1 to run AITER's kernels in Triton's interpreter)"
    return None


DEVICES = ("cpu",) if INTERPRET else ("cuda",)

BACKEND = register_backend(Backend(
    name=NAME, probe=_probe, auto_dispatch=False,
    description="AITER's Triton kernels (aiter/ops/triton), loaded without ROCm where needed"))


# AITER's Triton MXFP4 quantizer (_mxfp4_quant_op, shared by dynamic_mxfp4_quant,
# fused_rms_mxfp4_quant and act_mul_and_mxfp4_quant) forms the E8M0 byte as
# ``unbiased_exponent.to(tl.uint8) + 127``: a float -> uint8 conversion of a negative number,
# poison in LLVM.  The interpreter (numpy) wraps it, giving the intended byte; on NVIDIA the
# conversion saturates to 0, so every block with amax < 4 gets scale byte 127 (measured on an
# H100: docs/device-runs.md).  AITER's results on AMD imply its lowering wraps there.  Also
# measured there: a -Inf element of an Inf block is encoded +6 (0x7), not -6 (its multiplier
# exp2(-127) is subnormal, presumably flushed to zero, and -Inf * 0 is a positive NaN).
# Until AITER clamps before the cast, its MXFP4 entry points are rejected on NVIDIA (tests lift
# the rejection, lift_platform_rejections, to show both divergences as strict expected failures).
NVIDIA_MXFP4_SCALE_CAST = (
    "AITER's MXFP4 quantizer converts a negative float exponent to uint8 "
    "(.to(tl.uint8), undefined in LLVM): NVIDIA saturates it to 0, giving scale byte 127 for "
    "every block with amax < 4 (it wraps under AMD's lowering and in the interpreter); -Inf "
    "in an Inf block also comes out +6 there")


def mxfp4_platform_reason() -> str | None:
    """Why AITER's MXFP4 quantizers cannot run correctly here (None: they can)."""
    if not PLATFORM.get().nvidia or not REJECTIONS.get().mxfp4_on_nvidia:
        return None
    return NVIDIA_MXFP4_SCALE_CAST


# Platform facts shared by every family module.
# Triton's fp32 '/' compiles to CUDA's div.full.f32 (<= 2 ulp) on NVIDIA; 2 is declared on every
# GPU (it covers an exact division too), 0 in the interpreter (numpy: IEEE).
GPU_FP32_DIV_ULPS = 2
INTERPRETER_FP8_CAST = (
    "the Triton interpreter's fp32 -> fp8 .to() is wrong (ties round away, values rounding up "
    "into the next binade collapse, NaN becomes a finite code; NUMERICS.md) and AITER's FP8 "
    "kernels cast with .to(): their codes here would be the interpreter's, not AITER's "
    "(strict xfails with the proof in tests/test_aiter_quantize.py and test_aiter_fused.py)")


@dataclass(frozen=True)
class PlatformRejections:
    """Which known platform divergences make a case unsupported (each True by default)."""

    fp8_in_interpreter: bool = True   # INTERPRETER_FP8_CAST
    mxfp4_on_nvidia: bool = True      # NVIDIA_MXFP4_SCALE_CAST
    bf16_in_interpreter: bool = True  # norms.interpreter_bf16_reason (norms, fused norms)


# Scoped, not a module global: lifting a rejection lasts for a block (and the thread running
# it), so a test or a gate probe cannot leak it into later cases.
REJECTIONS: Scoped[PlatformRejections] = Scoped("aiter_triton.REJECTIONS", PlatformRejections)


def lift_platform_rejections(*, fp8_in_interpreter: bool = False,
                             mxfp4_on_nvidia: bool = False, bf16_in_interpreter: bool = False):
    """A context manager: inside the block, the named rejections are lifted (the others stay
    as they are): the entry points run and their platform's results are judged.  For the tests
    that show each divergence as a strict expected failure and for the gate's probes, which
    record what runs; never for verdicts."""
    lifted = {"fp8_in_interpreter": fp8_in_interpreter, "mxfp4_on_nvidia": mxfp4_on_nvidia,
              "bf16_in_interpreter": bf16_in_interpreter}
    return REJECTIONS.override(**{name: False for name, lift in lifted.items() if lift})


@dataclass(frozen=True)
class Platform:
    """Facts about where the kernels run that change what a family module does, read through
    ``PLATFORM.get()``.  A test simulates another platform with ``PLATFORM.override(...)``
    to prove a rejection or an adapter there.  How kernels launch (:data:`INTERPRET`,
    :data:`DEVICES`) is fixed at import and is not one of them."""

    # A CUDA device here is NVIDIA's and the kernels are compiled for it (not the
    # interpreter, not a ROCm build): NVIDIA-only numerics declarations and rejections apply.
    nvidia: bool
    # tl.load(bf16).to(tl.float32) misreads bf16 subnormals (the interpreter; NUMERICS.md):
    # bf16 x goes to AITER's MXFP4 kernels as its exact fp32 copy instead.
    misreads_bf16_subnormals: bool


def _detect_platform() -> Platform:
    import torch
    return Platform(nvidia=not INTERPRET and torch.version.hip is None,
                    misreads_bf16_subnormals=INTERPRET)


PLATFORM: Scoped[Platform] = Scoped("aiter_triton.PLATFORM", _detect_platform)


def fp32_div_ulps() -> int:
    return 0 if INTERPRET else GPU_FP32_DIV_ULPS


def fp8_platform_reason() -> str | None:
    """Why AITER's FP8-casting kernels cannot be judged here (None: they can)."""
    return INTERPRETER_FP8_CAST if INTERPRET and REJECTIONS.get().fp8_in_interpreter else None


def kernels() -> loader.AiterTriton:
    """The loaded AITER Triton entry points (loads on first use)."""
    return loader.load()


# Loader classifications that mean our loader / candidate table, not AITER, needs work.
ADAPTER_MISSING_KINDS = ("import-error", "moved-unknown")


def why_missing(*entry_points: str) -> str | None:
    """None when the installed AITER has every named entry point, else which and why not;
    prefixed "adapter:" when the loader classified one as its own problem (an existing module
    that failed to import, or a definition in a module no candidate names)."""
    at = kernels()
    absent = [e for e in entry_points if not at.has(e)]
    if not absent:
        return None
    gone = [f"{e}: {at.missing.get(e, 'not in the loader table')}" for e in absent]
    ours = any(at.missing_kind.get(e) in ADAPTER_MISSING_KINDS for e in absent)
    return ("adapter: " if ours else "") + \
        f"AITER {at.version or '(unknown version)'} lacks " + "; ".join(gone)


# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("attention", "fused", "gemm", "grouped_gemm", "moe", "norms", "qgemm", "quantize",
            "rope", "softmax", "router", "permute")
if HAVE_TRITON:
    for _family in FAMILIES:
        importlib.import_module(f"{__name__}.{_family}")
