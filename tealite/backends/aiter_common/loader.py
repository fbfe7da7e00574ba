"""Load AITER's Triton kernels (``aiter/ops/triton``) without ROCm, from any AITER release.

    from tealite.backends.aiter_common import loader
    at = loader.load()                   # or load("/path/to/amd_aiter-...whl" | unpacked dir)
    y = at.rms_norm(x, w, 1e-6)
    at.locations["rms_norm"]              # "aiter.ops.triton.normalization.rmsnorm:rms_norm"
    at.missing, at.missing_kind           # {entry point: why}, {entry point: kind}

Where AITER comes from (first that is given): the ``path`` argument, ``$TEALITE_AITER_PATH``,
an installed ``aiter`` package.  A path may be an amd-aiter wheel (its ``aiter/`` tree is
unpacked once under the temp dir), an unpacked wheel, a source export (``ci/aiter_source.sh``:
the directory holding ``aiter/`` and ``AITER_SOURCE``) or the ``aiter`` package directory.  A
path that is none of these raises :class:`AiterNotFound` naming it.  For an AITER tree,
:func:`load` does not raise: what fails is recorded (``load_errors``, ``missing``).

Entry points are resolved through a declared candidate table
(:mod:`tealite.backends.aiter_common._loader_candidates`): per entry point, the modules that
define it and the AITER versions for which each does.  The version comes from the tree's
``AITER_SOURCE`` (``version=``), else the wheel's METADATA, else ``aiter/_version.py``.  Each
entry point that does not load is classified ``removed`` / ``moved-unknown`` /
``import-error`` (``missing_kind``).

Why each step (measured facts in NUMERICS.md; AITER versions named where behaviour changed):

1. ``aiter/__init__.py`` loads HIP extensions and needs ROCm.  The loader registers a synthetic
   parent package ``aiter`` whose ``__path__`` is the source's ``aiter/`` directory, so the
   absolute imports inside ``aiter/ops/triton`` resolve to the files without running that
   init.  It stays in ``sys.modules`` (AITER modules import lazily through it), so a later
   ``import aiter`` in the same process gets the shell; one process holds one AITER copy.
2. Under that parent, the ROCm-only modules AITER's Triton code imports are stand-ins built by
   :mod:`tealite.backends.aiter_common._loader_stubs` (not AITER's files): ``aiter.dtypes`` /
   ``aiter.utility.dtypes`` *built* from the arch AITER sees (fp8 = float8_e4m3fn on gfx950,
   float8_e4m3fnuz on gfx942, fp8_e8m0, fp4x2, bf16, ...: AITER's real dtypes.py imports
   ``aiter.ops.enum`` (HIP) from v0.1.9.post1 on), ``aiter.jit.utils.chip_info`` (rocminfo)
   and ``aiter.jit.utils.torch_guard`` (from v0.1.9.post1 it registers every wrapper as a
   torch custom op named ``aiter::aiter::name``, which makes torch's exit-time cleanup raise).
   They are installed *before* ``aiter.ops.triton`` imports (v0.1.10's package init imports
   modules that read ``aiter.dtypes.fp8`` at import).
3. Arch: off ROCm AITER sees gfx950 (OCP FP8 like NVIDIA, MX formats, the MI350 tuned configs)
   unless ``arch`` or ``$TEALITE_AITER_ARCH`` says gfx942 (FNUZ FP8, which NVIDIA Triton
   cannot compile).  While AITER imports, Triton's active driver is a stand-in whose target
   is ``hip`` / that arch (v0.1.14's ``arch_info`` caches the driver's arch at import, and
   imports jax when there is no driver); afterwards ``arch_info.get_arch`` is replaced by the
   pinned answer wherever AITER bound it (earlier versions ask the driver on every call).
4. ``device_info.get_num_sms()`` queries ``torch.cuda``; with no GPU (interpreter) it returns
   :data:`INTERPRETER_NUM_SMS` (it only sizes persistent grids that loop over rows).
5. AITER's tuned configs and some launch sites pass AMD-only launch options; off ROCm every
   AITER kernel's ``run`` is wrapped to drop them.  Under ``TRITON_INTERPRET=1`` the kernels'
   ``tl.assume`` hints are not checked and list grids become tuples
   (:mod:`tealite.backends.aiter_common._loader_launch`).
6. With no GPU, ``_rmsnorm_backward`` allocates its dgamma workspace with ``device="cuda"``
   written out: in that module only, ``torch.empty(..., device="cuda")`` allocates on the CPU.
   Likewise ``flash_attn_fused_backward`` reads the SM count from
   ``torch.cuda.get_device_properties`` itself (a launch constant its kernels do not use):
   in that module only, the call answers :data:`INTERPRETER_NUM_SMS`.
7. Autotune keys that name no kernel argument are dropped while AITER imports
   (:func:`~tealite.backends.aiter_common._loader_stubs.lenient_autotune_keys`): Triton 3.9
   rejects them, earlier Triton ignored them; AITER 0.1.7's flash-attention modules have some.

On ROCm with the real package importable, none of the stand-ins is used: AITER's own init
binds dtypes and its arch is the device's.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tealite.backends.aiter_common import _loader_stubs as stubs
from tealite.backends.aiter_common._loader_source import (  # noqa: F401  (re-exported)
    ENV_PATH, PACKAGE, SOURCE_FILE, SYNTHETIC, AiterNotFound, _unpack_wheel, _version,
    error_text, find_source, why_unavailable)
from tealite.backends.aiter_common._loader_candidates import (
    CANDIDATES, ENTRY_POINTS, OPS, Attempt, Candidate, admitted, classify, module_file,
    version_key)
from tealite.backends.aiter_common._loader_launch import (  # noqa: F401  (re-exported)
    AMD_ONLY_LAUNCH_OPTIONS, Launch, dry_run, innermost_kernel, interpreter_has_assume_hook,
    wrap_all_kernels, wrap_launch)

__all__ = ["AiterNotFound", "AiterTriton", "CANDIDATES", "Candidate", "ENTRY_POINTS",
           "MISSING_KINDS", "dry_run", "find_source", "load", "why_unavailable"]

ENV_ARCH = "TEALITE_AITER_ARCH"
ARCHES = {"gfx942": "MI300X", "gfx950": "MI350X"}
DEFAULT_ARCH = "gfx950"
INTERPRETER_NUM_SMS = 4
MISSING_KINDS = ("removed", "moved-unknown", "import-error")
_SYNTHETIC = SYNTHETIC
_ARCH_INFO = "utils._triton.arch_info"
_DEVICE_INFO = "utils.device_info"
_CHIP_INFO = f"{PACKAGE}.jit.utils.chip_info"
_TORCH_GUARD = f"{PACKAGE}.jit.utils.torch_guard"
_DTYPES = f"{PACKAGE}.utility.dtypes"
# Entry points whose module allocates with device="cuda" written out (step 6).
_CUDA_BY_NAME = ("_rmsnorm_backward",)
# Entry points whose module asks torch.cuda for the SM count itself (step 6).
_SMS_BY_NAME = ("flash_attn_fused_backward",)

# Kept for callers and tests of the earlier single-module loader.
_innermost_kernel = innermost_kernel
_wrap_launch = wrap_launch
_interpreter_has_assume_hook = interpreter_has_assume_hook
_TorchAllocatingOnCpu = stubs.TorchAllocatingOnCpu


@dataclass
class AiterTriton:
    """AITER's Triton entry points, loaded by :func:`load`; each is an attribute.

    ``functions``: entry point -> callable.  ``locations``: entry point ->
    ``"module:name"`` where it was found (the module's real name).  ``signatures``: entry
    point -> ``str(inspect.signature(fn))`` ("" when not introspectable).  ``missing``: entry
    point -> why it could not be loaded; ``missing_kind``: entry point -> one of
    :data:`MISSING_KINDS`.  ``load_errors``: failures of the load itself (importing
    ``aiter.ops.triton``, binding stand-ins, pinning the arch), as "what: Type: message".
    """

    root: str
    found_via: str
    version: str | None
    arch: str
    arch_pinned: bool
    dropped_launch_options: tuple[str, ...]
    functions: dict[str, Callable] = field(default_factory=dict)
    locations: dict[str, str] = field(default_factory=dict)
    signatures: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    missing_kind: dict[str, str] = field(default_factory=dict)
    load_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        # Only reached for names that are not dataclass fields.
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        missing = self.__dict__.get("missing", {})
        if name in missing:
            raise AttributeError(f"AITER entry point {name} is not available: {missing[name]}")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}; entry points: "
                             f"{sorted(functions)}")

    def has(self, name: str) -> bool:
        return name in self.functions

    def module_of(self, name: str) -> types.ModuleType:
        """The AITER module the entry point was loaded from (KeyError when not loaded)."""
        return sys.modules[self.locations[name].rsplit(":", 1)[0]]

    @property
    def fp8_dtype(self):
        """The E4M3 torch dtype AITER's FP8 kernels expect on the pinned arch."""
        import torch
        return torch.float8_e4m3fnuz if self.arch.startswith("gfx942") else torch.float8_e4m3fn

    def describe(self) -> str:
        pin = "pinned" if self.arch_pinned else "native"
        errors = f", {len(self.load_errors)} load errors" if self.load_errors else ""
        return (f"amd-aiter {self.version or '(version unknown)'} from {self.root} "
                f"({self.found_via}), arch {self.arch} ({pin}), {len(self.functions)} entry "
                f"points, {len(self.missing)} missing{errors}")


_loaded: dict[tuple[str, str], AiterTriton] = {}


def _on_rocm() -> bool:
    import torch
    return torch.version.hip is not None and torch.cuda.is_available()


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


_error = error_text


# ---- importing without aiter/__init__.py ---------------------------------------------------

def _install_parent_package(root: Path) -> bool:
    """Make ``aiter`` importable without its init; False when a real aiter is imported."""
    existing = sys.modules.get(PACKAGE)
    if existing is not None:
        held = getattr(existing, _SYNTHETIC, None)
        if held is None:
            return False  # the real package (ROCm): its submodules import normally
        if Path(held) != root:
            raise RuntimeError(f"AITER's Triton kernels are already loaded from {held}; one "
                               f"process holds one copy (asked for {root})")
        return True
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(root / "aiter")]
    shell = importlib.util.module_from_spec(spec)
    shell.__doc__ = "tealite's synthetic parent of AITER's Triton kernels (aiter/__init__.py " \
                    "needs ROCm and was not run)"
    setattr(shell, _SYNTHETIC, str(root))
    sys.modules[PACKAGE] = shell
    return True


def _import_real_package_on_rocm(rocm: bool, how: str) -> str | None:
    """On ROCm, import the installed package itself first, so its init runs and the ``aiter``
    backend (HIP ops) sees the real package rather than this loader's shell.  Returns the
    import error, if any (the shell is used then)."""
    if not rocm or how != "installed package" or PACKAGE in sys.modules:
        return None
    try:
        importlib.import_module(PACKAGE)
    except Exception as exc:  # reported in notes; the Triton kernels may still load
        sys.modules.pop(PACKAGE, None)
        return _error(exc)
    return None


def _import(rel: str) -> types.ModuleType:
    return importlib.import_module(f"{OPS}.{rel}")


def _aiter_modules() -> list[types.ModuleType]:
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))]


def _rebind(original, replacement) -> None:
    """Replace ``original`` wherever an AITER module bound it (``from x import f`` copies)."""
    for mod in _aiter_modules():
        for name, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, name, replacement)


def _native_arch() -> str:
    """The device's arch as AITER's arch_info asks it (ROCm with the shell only)."""
    try:
        import triton
        return str(triton.runtime.driver.active.get_current_target().arch)
    except Exception:  # no driver: AITER's dtypes rule then falls back to uint8 FP8
        return "unknown"


def _cu_num() -> int:
    """chip_info.get_cu_num's answer: the device's SM / CU count, or the interpreter's."""
    import torch
    if not torch.cuda.is_available():
        return INTERPRETER_NUM_SMS
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _install_stand_ins(arch: str) -> list[str]:
    """Register the stand-ins of step 2 and bind ``aiter.dtypes``; returns the notes."""
    dtypes = sys.modules.get(_DTYPES) or stubs.dtypes_module(arch, _DTYPES)
    installed = stubs.install({
        _CHIP_INFO: stubs.chip_info_module(arch, _CHIP_INFO, _cu_num),
        _TORCH_GUARD: stubs.torch_guard_module(_TORCH_GUARD),
        _DTYPES: dtypes,
    })
    sys.modules[PACKAGE].dtypes = dtypes
    notes = [f"aiter.dtypes is tealite's stand-in built for {arch} (dtypes.fp8 = {dtypes.fp8}; "
             "AITER's dtypes.py imports ROCm-only modules)"] if _DTYPES in installed else []
    if _TORCH_GUARD in installed:
        notes.append("torch_compile_guard is a no-op stand-in: AITER's wrappers are plain "
                     "functions, not torch custom ops")
    return notes


def _pin_arch(arch: str) -> None:
    info = _import(_ARCH_INFO)
    original = info.get_arch

    def get_arch() -> str:
        return arch

    get_arch.__doc__ = f"pinned to {arch} by tealite's AITER loader (not on ROCm)"
    info.get_arch = get_arch
    if hasattr(info, "_CACHED_ARCH"):  # v0.1.14+: the arch cached at import
        info._CACHED_ARCH = arch
    _rebind(original, get_arch)


def _stub_num_sms() -> None:
    info = _import(_DEVICE_INFO)
    original = info.get_num_sms

    def get_num_sms() -> int:
        return INTERPRETER_NUM_SMS

    info.get_num_sms = get_num_sms
    _rebind(original, get_num_sms)


def _allocate_on_cpu(result: AiterTriton) -> list[str]:
    """Patch the modules of the :data:`_CUDA_BY_NAME` and :data:`_SMS_BY_NAME` entry points
    (step 6); returns those patched."""
    import torch
    patched = []
    for name in _CUDA_BY_NAME:
        namespace = getattr(result.functions.get(name), "__globals__", {})
        if namespace.get("torch") is torch:
            namespace["torch"] = stubs.TorchAllocatingOnCpu(torch)
            patched.append(name)
    for name in _SMS_BY_NAME:
        namespace = getattr(result.functions.get(name), "__globals__", {})
        if namespace.get("torch") is torch:
            namespace["torch"] = stubs.TorchReportingSms(torch, INTERPRETER_NUM_SMS)
            patched.append(name)
    return patched


# ---- entry points ---------------------------------------------------------------------------

def _signature(fn) -> str:
    """The wrapper's parameters (names, kinds, defaults), annotations left out: AITER
    re-annotates wrappers between releases (v0.1.19.post1) without changing how they are
    called, and the gate reports a signature change only where a call could break."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    empty = inspect.Parameter.empty
    bare = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=empty))


def _absent(root: Path, candidate: Candidate, exc: BaseException) -> bool:
    """The candidate module is simply not there (not a failure inside an existing module)."""
    if module_file(root, candidate.module) is not None:
        return False
    name = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    return name is not None and (candidate.qualified == name or
                                 candidate.qualified.startswith(name + "."))


def _try(root: Path, candidate: Candidate) -> tuple[Callable | None, types.ModuleType | None,
                                                     Attempt]:
    try:
        module = _import(candidate.module)
        fn = getattr(module, candidate.name, None)
    except Exception as exc:  # classified below: absent module vs import error
        return None, None, Attempt(candidate, _error(exc), _absent(root, candidate, exc))
    absent = fn is None and module_file(root, candidate.module) is None
    return fn, module, Attempt(candidate, None, absent)


def _load_entry_points(result: AiterTriton, root: Path, ops_error: str | None) -> None:
    for name in ENTRY_POINTS:
        if ops_error is not None:  # every import would re-run the failing package init
            result.missing[name] = f"{OPS} failed to import: {ops_error}"
            result.missing_kind[name] = "import-error"
            continue
        tried, excluded = admitted(name, result.version)
        attempts = []
        for candidate in tried:
            fn, module, attempt = _try(root, candidate)
            if fn is not None:
                result.functions[name] = fn
                result.locations[name] = f"{module.__name__}:{name}"
                result.signatures[name] = _signature(fn)
                break
            attempts.append(attempt)
        else:
            kind, why = classify(name, root, attempts, excluded, result.version)
            result.missing[name], result.missing_kind[name] = why, kind


# ---- the API -------------------------------------------------------------------------------

def _choose_arch(arch: str | None, rocm: bool) -> tuple[str, bool]:
    arch = arch or os.environ.get(ENV_ARCH) or None
    if arch is not None and arch not in ARCHES:
        raise ValueError(f"arch must be one of {sorted(ARCHES)}, got {arch!r}")
    if rocm and arch is None:
        return "native", False
    return arch or DEFAULT_ARCH, True


def _import_ops(result: AiterTriton, pinned: bool) -> str | None:
    """Import ``aiter.ops.triton`` and fix the arch; returns the import error, if any."""
    try:
        importlib.import_module(OPS)
    except Exception as exc:  # recorded; every entry point is then an import error
        why = _error(exc)
        result.load_errors.append(f"importing {OPS}: {why}")
        return why
    try:
        if pinned:
            _pin_arch(result.arch)
        else:  # ROCm: AITER asks the driver; record what it sees (FNUZ FP8 on gfx942)
            result.arch = str(_import(_ARCH_INFO).get_arch())
    except Exception as exc:  # the entry points may still load; the arch is the asked one
        result.load_errors.append(f"{'pinning' if pinned else 'reading'} the arch in "
                                  f"{OPS}.{_ARCH_INFO}: {_error(exc)}")
    return None


def _post_load(result: AiterTriton, shell: bool, rocm: bool) -> None:
    """Steps 4-6: SM count, CPU allocations, launch wrappers (failures -> load_errors)."""
    gpu = _has_gpu()
    if not gpu:
        try:
            _stub_num_sms()
        except Exception as exc:  # recorded, never raised
            result.load_errors.append(f"stubbing {OPS}.{_DEVICE_INFO}.get_num_sms: "
                                      f"{_error(exc)}")
        else:
            result.notes.append(f"no GPU: get_num_sms() returns {INTERPRETER_NUM_SMS}")
    if shell and not gpu:
        for name in _allocate_on_cpu(result):
            result.notes.append(f"no GPU: {name}'s device='cuda' allocations go to the CPU"
                                if name in _CUDA_BY_NAME else
                                f"no GPU: {name}'s torch.cuda SM count is "
                                f"{INTERPRETER_NUM_SMS}")
    drop = () if rocm else AMD_ONLY_LAUNCH_OPTIONS
    try:
        wrapped, interpreted = wrap_all_kernels(_aiter_modules(), drop)
    except Exception as exc:  # recorded, never raised
        result.load_errors.append(f"wrapping kernel launches: {_error(exc)}")
        return
    result.dropped_launch_options = drop
    if drop:
        result.notes.append(f"AMD-only launch options {list(drop)} dropped at launch of "
                            f"{wrapped} kernels")
    if interpreted:
        result.notes.append("interpreter: tl.assume is not checked inside AITER kernels "
                            "(their FP8 quant kernels hint pid > 0, false for program 0)")


def load(path: str | os.PathLike | None = None, *, arch: str | None = None) -> AiterTriton:
    """Load AITER's Triton entry points (see the module docstring for what is patched).

    Raises :class:`AiterNotFound` only when ``path`` (or the environment) names no AITER tree;
    RuntimeError when another AITER copy or arch is already loaded in this process."""
    root, how = find_source(path)
    rocm = _on_rocm()
    arch, pinned = _choose_arch(arch, rocm)
    key = (str(root), arch)
    if key in _loaded:
        return _loaded[key]
    if any(k[0] == str(root) for k in _loaded):
        raise RuntimeError(f"AITER from {root} is already loaded with arch "
                           f"{[k[1] for k in _loaded]}; one process pins one arch")
    init_error = _import_real_package_on_rocm(rocm, how)
    shell = _install_parent_package(root)
    result = AiterTriton(root=str(root), found_via=how, version=_version(root), arch=arch,
                         arch_pinned=pinned, dropped_launch_options=())
    if init_error:
        result.notes.append(f"import aiter failed on ROCm ({init_error}); using the Triton "
                            "kernels without its init")
    if not shell:
        result.notes.append("the real aiter package is imported; its own init ran")
    if result.version is not None and version_key(result.version) is None:
        result.notes.append(f"version {result.version!r} is not PEP 440: every candidate is "
                            "tried")
    seen = arch if pinned else _native_arch()
    if shell:
        try:
            result.notes.extend(_install_stand_ins(seen))
        except Exception as exc:  # modules that read aiter.dtypes then land in `missing`
            result.load_errors.append(f"installing stand-ins (aiter.dtypes, chip_info, "
                                      f"torch_guard): {_error(exc)}")
    dropped_keys: list[str] = []
    with stubs.pinned_driver(seen) if pinned else contextlib.nullcontext(), \
            stubs.lenient_autotune_keys(dropped_keys):
        ops_error = _import_ops(result, pinned)
        _load_entry_points(result, root, ops_error)
    if dropped_keys:
        result.notes.append("autotune keys naming no kernel argument dropped at import (Triton "
                            "3.9 rejects them; earlier Triton ignored them): "
                            + "; ".join(dropped_keys))
    if pinned:
        result.notes.append(f"Triton's driver answered {seen} while AITER imported")
    _post_load(result, shell, rocm)
    _loaded[key] = result
    return result
