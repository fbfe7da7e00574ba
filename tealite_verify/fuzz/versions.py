"""Versions recorded with every finding and report: Python, torch, triton, AITER, numpy,
hypothesis, the GPU (name, capability, driver / runtime) and the platform.

Everything is best effort: a missing package is recorded as ``None`` (or the reason), never
an exception.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from tealite import registry


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _aiter() -> str | None:
    for dist in ("amd-aiter", "aiter"):
        v = _dist_version(dist)
        if v:
            return v
    try:
        from tealite.backends.aiter_common.loader import AiterNotFound, find_source
    except ImportError:
        return None
    try:
        root, how = find_source()
    except AiterNotFound:
        return None
    except Exception as exc:  # a broken AITER install is worth recording, not fatal
        return f"unknown ({type(exc).__name__})"
    return f"source at {root} ({how})"


def _gpu(with_cuda: bool) -> dict:
    import torch
    out: dict = {"cuda_runtime": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    if not with_cuda:
        return out
    try:
        if torch.cuda.is_available():
            i = torch.cuda.current_device()
            out["gpu"] = torch.cuda.get_device_name(i)
            out["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(i)))
            out["gpu_arch"] = getattr(torch.cuda.get_device_properties(i), "gcnArchName", None)
            out["cuda_driver"] = _driver_version()
    except Exception as exc:
        out["gpu"] = f"unknown ({type(exc).__name__}: {exc})"
    return out


def _driver_version() -> str | None:
    try:
        import pynvml  # optional (nvidia-ml-py)
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip()
    except OSError:
        return None


def collect(*, with_cuda: bool = True) -> dict:
    """The version dict.  ``with_cuda=False`` avoids touching the CUDA runtime."""
    import numpy
    import torch
    d = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _dist_version("triton"),
        "aiter": _aiter(),
        "numpy": numpy.__version__,
        "hypothesis": _dist_version("hypothesis"),
        "ml_dtypes": _dist_version("ml_dtypes"),
        "platform": platform.platform(),
        "executable": sys.executable,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "backend_modules": os.environ.get(registry.PLUGIN_ENV_VAR, ""),
    }
    d.update(_gpu(with_cuda))
    return d
