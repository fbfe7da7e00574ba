"""Stand-ins for the ROCm-only parts of AITER that its Triton modules import (used only under
the loader's synthetic ``aiter`` parent; on ROCm the real package provides them).

* ``aiter.utility.dtypes`` (bound as ``aiter.dtypes``): AITER's own file imports
  ``aiter.ops.enum`` from v0.1.9.post1 on (HIP enums through ``aiter.jit.core``, which needs a
  ROCm install) and ``aiter.utility.aiter_types`` from v0.1.14 on (parses a C header that a
  Python-only tree lacks).  The stand-in is *built* here, not imported: the dtypes the Triton
  modules read (``grep 'dtypes\\.' aiter/ops/triton``: fp8, fp8_e8m0, fp4x2, bf16, fp16, fp32)
  plus the other names every tag's dtypes.py defines, with AITER's rule for fp8 (gfx942 ->
  FNUZ, gfx950 and later -> OCP, any other arch -> uint8).
* ``aiter.jit.utils.chip_info``: the real one runs rocminfo; ``get_gfx`` / ``get_gfx_runtime``
  (v0.1.20 renamed the dtypes lookup) answer the arch AITER's Triton code sees, ``get_cu_num``
  the SM count (the interpreter's stand-in count without a GPU).
* ``aiter.jit.utils.torch_guard``: from v0.1.9.post1 AITER registers its Triton wrappers as
  torch custom ops through ``torch_compile_guard``, whose ``Library.define`` gets a schema that
  already carries the ``aiter::`` namespace: torch records the op as ``aiter::aiter::name`` and
  its exit-time cleanup (``torch.library._clear_torch_ops_cache``, ``qualname.split("::")``)
  raises ValueError for every such op.  The custom op only matters for torch.compile graph
  capture; the stand-in decorator returns the function itself (same eager result).
* the Triton driver while AITER imports: from v0.1.14 ``arch_info`` caches
  ``triton.runtime.driver.active.get_current_target().arch`` at import and falls back to jax
  when there is no driver.  While the loader imports AITER the active driver is a stand-in whose
  target is ``hip`` / the pinned arch; afterwards the previous driver is restored.
* ``triton.autotune`` while AITER imports: Triton 3.9 raises ValueError for an autotune
  ``key`` naming no kernel argument, where earlier Triton dropped such a name from the tuning
  key at run time.  AITER 0.1.7's ``flash_attn_triton_amd/bwd.py`` keys three kernels on
  ``ACTUAL_HEAD_DIM`` (not one of their arguments), and ``mha.py`` imports that package: under
  3.9 no flash-attention entry point would import.  While the loader imports AITER,
  ``triton.autotune`` drops such names up front (what earlier Triton did later), and records
  each kernel and name dropped.
"""
from __future__ import annotations

import contextlib
import sys
import types

# AITER's dtypes.py rule (defaultDtypes): which E4M3 flavour each arch's FP8 kernels use.
_FP8_BY_ARCH_PREFIX = (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn"),
                       ("gfx12", "float8_e4m3fn"), ("gfx11", "float8_e4m3fn"))
_FALLBACK_8BIT = "uint8"  # AITER's _8bit_fallback for an arch it does not know


def fp8_dtype_name(arch: str) -> str:
    for prefix, name in _FP8_BY_ARCH_PREFIX:
        if arch.startswith(prefix):
            return name
    return _FALLBACK_8BIT


def dtypes_module(arch: str, name: str) -> types.ModuleType:
    """A module with the names of AITER's ``aiter/utility/dtypes.py`` for ``arch``."""
    import torch
    mod = types.ModuleType(name, f"tealite's stand-in for AITER's dtypes (arch {arch}; the real "
                                 "file imports ROCm-only modules)")
    fallback = getattr(torch, _FALLBACK_8BIT)
    values = {
        "fp8": getattr(torch, fp8_dtype_name(arch)),
        "fp8_e8m0": getattr(torch, "float8_e8m0fnu", fallback),
        "fp4x2": getattr(torch, "float4_e2m1fn_x2", fallback),
        "i4x2": getattr(torch, "int4", fallback),
        "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
        "u32": torch.uint32, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
        "u8": torch.uint8, "i64": torch.int64, "u64": torch.uint64,
    }
    vars(mod).update(values)
    mod.d_dtypes = dict(values)
    mod.get_dtype_fp8 = lambda: values["fp8"]
    mod.__tealite_stand_in__ = True
    return mod


def chip_info_module(arch: str, name: str, cu_num) -> types.ModuleType:
    mod = types.ModuleType(name, f"tealite's stand-in for AITER's chip_info: get_gfx() is {arch} "
                                 "(the arch AITER's Triton code sees); no rocminfo")
    mod.get_gfx = lambda: arch
    mod.get_gfx_runtime = lambda: arch
    mod.get_cu_num = cu_num
    mod.__tealite_stand_in__ = True
    return mod


def torch_guard_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, "tealite's stand-in for AITER's torch_guard: no torch custom-op "
                                 "registration (its aiter::aiter::name ops break torch's exit)")

    def torch_compile_guard(*args, **kwargs):
        def decorator(func):
            return func
        return decorator

    mod.torch_compile_guard = torch_compile_guard
    mod.__tealite_stand_in__ = True
    return mod


def install(modules: dict[str, types.ModuleType]) -> list[str]:
    """Register each stand-in unless the name is already imported; returns those installed."""
    installed = []
    for name, mod in modules.items():
        if name not in sys.modules:
            sys.modules[name] = mod
            installed.append(name)
    return installed


class PinnedDriver:
    """Triton's active driver while AITER imports: a ``hip`` target of the pinned arch; any
    other query raises RuntimeError (what AITER's code expects when no driver is present)."""

    def __init__(self, arch: str):
        self.arch = arch

    def get_current_target(self):
        try:
            from triton.backends.compiler import GPUTarget
        except ImportError:  # very old Triton: a plain record with the same fields
            return types.SimpleNamespace(backend="hip", arch=self.arch, warp_size=64)
        return GPUTarget("hip", self.arch, 64)

    def __getattr__(self, name):
        raise RuntimeError(f"tealite's AITER loader: the Triton driver is not queried while "
                           f"AITER imports ({name}; arch pinned to {self.arch})")


@contextlib.contextmanager
def pinned_driver(arch: str):
    """Triton's active driver answers ``arch`` for the duration (restored afterwards).  Without
    Triton there is nothing to pin (AITER's import then fails and is recorded)."""
    try:
        from triton.runtime import driver as config
    except ImportError:
        yield
        return
    saved = config.__dict__.get("_active")
    config._active = PinnedDriver(arch)
    try:
        yield
    finally:
        config._active = saved


class TorchAllocatingOnCpu:
    """``torch`` for a module that writes ``device="cuda"``: allocations land on the CPU."""

    def __init__(self, torch_module):
        self._torch = torch_module

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, *args, **kwargs):
        if str(kwargs.get("device", "")) == "cuda":
            kwargs["device"] = "cpu"
        return self._torch.empty(*args, **kwargs)


class TorchReportingSms:
    """``torch`` for a module that reads the SM count itself
    (``torch.cuda.get_device_properties("cuda").multi_processor_count``): with no GPU, that
    call answers ``num_sms`` (every other attribute is torch's)."""

    def __init__(self, torch_module, num_sms: int):
        self._torch = torch_module
        self.cuda = types.SimpleNamespace(get_device_properties=lambda *_a, **_k:
                                          types.SimpleNamespace(multi_processor_count=num_sms))

    def __getattr__(self, name):
        return getattr(self._torch, name)


@contextlib.contextmanager
def lenient_autotune_keys(dropped: list[str]):
    """``triton.autotune`` drops ``key`` names that are not arguments of the kernel for the
    duration (see the module docstring); appends "kernel: names" to ``dropped``."""
    try:
        import triton
    except ImportError:
        yield
        return
    original = triton.autotune

    def autotune(*args, **kwargs):
        def decorator(fn):
            key = kwargs.get("key", args[1] if len(args) > 1 else ())
            names = getattr(fn, "arg_names", None)
            unknown = [k for k in key if names is not None and k not in names]
            if not unknown:
                return original(*args, **kwargs)(fn)
            dropped.append(f"{getattr(fn, '__name__', fn)}: {', '.join(unknown)}")
            kept = [k for k in key if k not in unknown]
            if len(args) > 1:
                return original(args[0], kept, *args[2:], **kwargs)(fn)
            return original(*args, **{**kwargs, "key": kept})(fn)

        return decorator

    triton.autotune = autotune
    try:
        yield
    finally:
        triton.autotune = original
