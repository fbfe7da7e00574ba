"""The ``aiter`` backend: AMD's real AITER package on ROCm (its CK / ASM / HIP ops).

**This backend has never run on AMD hardware.**  It was written from the amd-aiter
0.1.7.post2 sources (the Python wrappers in ``aiter/ops/*.py`` and the C++ behind them in
``aiter_meta/csrc``) and tested on a CPU against a *fake* ``aiter`` module whose functions
compute the documented result with torch (tests/test_aiter_rocm_backend.py).  Those tests prove
the adapters (argument order, scale shapes, shuffled layouts, padding) and the rejection
logic; they cannot prove AITER's numerics.  It is kept out of ``backend=None`` dispatch until
an MI300 (gfx942, FNUZ FP8) / MI350 (gfx950, OCP FP8) run has verified it: name it
(``backend="aiter"``); turn ``auto_dispatch`` on here once such a run passes.

A second backend, ``aiter_bpreshuffle``, is the same package with pre-shuffled weights (the
``*_bpreshuffle`` GEMMs, :mod:`.qgemm`): a backend of its own, so both weight layouts are
verified side by side by the differential harness, with no global switch.

Availability (the probe): a ROCm build of torch (``torch.version.hip``), a visible GPU, and an
importable ``aiter`` -- the import error is the reason otherwise.  The synthetic ``aiter``
shell that :mod:`tealite.backends.aiter_common.loader` installs for the ``aiter_triton``
backend does not count (it has no HIP ops).

Version awareness: on first use every entry point in :data:`ENTRY_POINTS` is looked up on the
imported package; one that is absent is listed in ``runtime().missing`` with the reason, and
every case that needs it is rejected with that reason (:func:`why_missing`), never routed to
another path.  Each family module (qgemm, quantize, norms, fused, activations, attention, moe,
grouped_gemm) declares the
contract of every entry point it calls (:mod:`tealite.backends.aiter_common.contracts`) and
reports the entry point in the numerics of each case (``"entry_point"``).  Importing this
package never imports AITER.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from tealite.backends.aiter_common.loader import SYNTHETIC  # the attribute marking its shell
from tealite.formats import ScaleRounding
from tealite.registry import Backend, register_backend
from tealite.scoped import Scoped

NAME = "aiter"

# Entry point -> where amd-aiter 0.1.7.post2 defines it (all are re-exported by
# aiter/__init__.py's star imports, which is how they are looked up).
ENTRY_POINTS: dict[str, str] = {
    "gemm_a8w8": "aiter/ops/gemm_op_a8w8.py",
    "gemm_a8w8_bpreshuffle": "aiter/ops/gemm_op_a8w8.py",
    "gemm_a8w8_blockscale": "aiter/ops/gemm_op_a8w8.py",
    "gemm_a8w8_blockscale_bpreshuffle": "aiter/ops/gemm_op_a8w8.py",
    "gemm_a4w4": "aiter/ops/gemm_op_a4w4.py",
    "per_1x32_f4_quant_hip": "aiter/ops/quant.py",
    "dynamic_per_tensor_quant": "aiter/ops/quant.py",
    "dynamic_per_token_scaled_quant": "aiter/ops/quant.py",
    "static_per_tensor_quant": "aiter/ops/quant.py",
    "rmsnorm2d_fwd": "aiter/ops/rmsnorm.py",
    "rmsnorm2d_fwd_with_dynamicquant": "aiter/ops/rmsnorm.py",
    "layernorm2d_fwd": "aiter/ops/norm.py",
    # Commented out in 0.1.7 (aiter/ops/norm.py): reported missing there.
    "layernorm2d_fwd_with_dynamicquant": "aiter/ops/norm.py",
    "silu_and_mul": "aiter/ops/activation.py",
    "gelu_and_mul": "aiter/ops/activation.py",
    "scaled_silu_and_mul": "aiter/ops/activation.py",
    "mha_fwd": "aiter/ops/mha.py",
    "mha_bwd": "aiter/ops/mha.py",
    "mha_varlen_fwd": "aiter/ops/mha.py",
    "mha_varlen_bwd": "aiter/ops/mha.py",
    "fused_moe": "aiter/fused_moe.py",
    "moe_sorting_fwd": "aiter/ops/moe_sorting.py",  # issue 16: CK grouped GEMM (stage 2)
    "ck_moe_stage2_fwd": "aiter/ops/moe_op.py",
    "partial_transpose": "aiter/ops/quant.py",  # issue 17: transpose
}

# E4M3 format AITER computes in, per arch (aiter/utility/dtypes.py: gfx942 -> FNUZ, gfx950 ->
# OCP; any other arch silently gets uint8 there, so it gets no FP8 here).
_ARCH_E4M3 = {"gfx942": "e4m3fnuz", "gfx950": "e4m3"}
# Test doubles (a fake ``aiter`` module) may declare these; the real package never does.
FAKE_DEVICES_ATTR = "__tealite_fake_devices__"
FAKE_ARCH_ATTR = "__tealite_fake_arch__"


@dataclass
class Runtime:
    """The imported AITER: its entry points, the arch and the dtypes it computes in."""

    module: Any
    version: str | None
    arch: str
    devices: tuple[str, ...]
    functions: dict[str, Callable] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def e4m3_format(self) -> str | None:
        """tealite's name of the E4M3 format AITER's FP8 ops take here (None: none)."""
        return _ARCH_E4M3.get(self.arch)

    def dtype(self, name: str) -> torch.dtype:
        """``aiter.dtypes.<name>`` (fp8, fp4x2, fp8_e8m0): the dtype AITER's wrappers expect."""
        return getattr(self.module.dtypes, name)


_cache: dict[str, Any] = {"module": None, "runtime": None, "import_error": None}


def reset() -> None:
    """Forget the imported AITER (tests swap ``sys.modules["aiter"]``)."""
    _cache.update(module=None, runtime=None, import_error=None)


def _device_arch() -> str:
    name = torch.cuda.get_device_properties(0).gcnArchName
    return name.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"


def _version(module) -> str | None:
    v = getattr(module, "__version__", None)
    if v:
        return str(v)
    try:
        from importlib import metadata
        return metadata.version("amd-aiter")
    except Exception:
        return None


def _import_aiter():
    """The ``aiter`` module, or raise ImportError with the reason."""
    held = sys.modules.get("aiter")
    if held is not None and held is _cache["module"]:
        return held
    if held is None and _cache["import_error"] is not None:
        raise ImportError(_cache["import_error"])
    try:
        module = importlib.import_module("aiter")
    except Exception as exc:  # any failure of AITER's init (no hipconfig, JIT, ...) is the reason
        _cache["import_error"] = f"import aiter failed: {type(exc).__name__}: {exc}"
        raise ImportError(_cache["import_error"]) from exc
    if getattr(module, SYNTHETIC, None):
        raise ImportError("sys.modules['aiter'] is tealite's synthetic Triton-only shell (the "
                          "aiter_triton loader ran first in this process); AITER's HIP/CK ops "
                          "are not loaded -- import aiter before loading AITER's Triton kernels")
    return module


def _build_runtime(module) -> Runtime:
    arch = getattr(module, FAKE_ARCH_ATTR, None) or _device_arch()
    devices = tuple(getattr(module, FAKE_DEVICES_ATTR, None) or ("cuda",))
    rt = Runtime(module=module, version=_version(module), arch=arch, devices=devices)
    for name, where in ENTRY_POINTS.items():
        fn = getattr(module, name, None)
        if callable(fn):
            rt.functions[name] = fn
        else:
            rt.missing[name] = (f"aiter {rt.version or '(unknown version)'} has no "
                                f"aiter.{name} (0.1.7.post2 defines it in {where})")
    return rt


def runtime() -> Runtime:
    """The imported AITER (imports it on first use); raises ImportError with the reason."""
    module = _import_aiter()
    if _cache["runtime"] is None or _cache["module"] is not module:
        _cache.update(module=module, runtime=_build_runtime(module), import_error=None)
    return _cache["runtime"]


@dataclass(frozen=True)
class Platform:
    """Facts about the platform and AITER's HIP kernels here that decide availability and what
    the family modules accept, read through ``PLATFORM.get()``; a test simulates another
    platform for a block with ``PLATFORM.override(...)`` (a ROCm GPU around a fake AITER, or
    an adapter that no real case reaches yet)."""

    rocm: bool         # torch is a ROCm build (torch.version.hip)
    gpu_visible: bool  # torch sees a GPU (torch.cuda.is_available())
    # The tealite ScaleRounding equal to per_1x32_f4_quant_hip's scale rule (gfx950's
    # v_cvt_scalef32_pk_fp4).  None: no tealite mode is that rule (quantize.py's docstring),
    # so every MXFP4 quantize recipe is rejected.
    mxfp4_scale_rounding: ScaleRounding | None = None


def _detect_platform() -> Platform:
    return Platform(rocm=torch.version.hip is not None, gpu_visible=torch.cuda.is_available())


PLATFORM: Scoped[Platform] = Scoped("aiter.PLATFORM", _detect_platform)


def _probe() -> str | None:
    if not PLATFORM.get().rocm:
        return ("torch is not a ROCm build (torch.version.hip is None): AITER's CK/ASM/HIP ops "
                "need ROCm and an AMD GPU (MI300 gfx942 / MI350 gfx950)")
    if not PLATFORM.get().gpu_visible:
        return "ROCm torch sees no GPU"
    try:
        runtime()
    except ImportError as exc:
        return str(exc)
    return None


def why_missing(*entry_points: str) -> str | None:
    """None when the imported AITER has every named entry point, else which and why not."""
    rt = runtime()
    gone = [rt.missing.get(e, f"{e}: not in tealite's AITER entry-point table")
            for e in entry_points if e not in rt.functions]
    return "; ".join(gone) if gone else None


def common_why_not(params: Mapping[str, Any], *entry_points: str) -> str | None:
    """Reasons shared by every implementation: the device AITER runs on, missing entry
    points.  (Called from ``check=`` after the probe passed.)"""
    rt = runtime()
    device = params.get("device", "cpu")
    if device not in rt.devices:
        return f"AITER runs on {list(rt.devices)}, not {device}"
    return why_missing(*entry_points)


def rejecting(entry_point: str, reason: str):
    """(check, numerics) for an entry point tealite registers only to reject, with ``reason``
    (why its outputs or conventions cannot serve the op), after the shared reasons."""
    def why_not(params) -> str | None:
        return common_why_not(params, entry_point) or reason

    def numerics(params) -> dict:
        return {"entry_point": entry_point, "compute_dtype": torch.float32}

    return why_not, numerics


BACKEND = register_backend(Backend(
    name=NAME, probe=_probe, auto_dispatch=False,
    description="AITER on ROCm: CK/ASM/HIP ops (never run on AMD hardware yet; see "
                "tealite/backends/aiter/__init__.py)"))
BACKEND_BPRESHUFFLE = register_backend(Backend(
    name=NAME + "_bpreshuffle", probe=_probe, auto_dispatch=False,
    description="AITER on ROCm with pre-shuffled weights (the *_bpreshuffle CK GEMMs; never "
                "run on AMD hardware yet)"))

# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("activations", "attention", "fused", "grouped_gemm", "moe", "norms", "qgemm",
            "quantize", "transpose")
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
