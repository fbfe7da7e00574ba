"""Load AITER's Triton kernels (``aiter/ops/triton``) without ROCm.

    from tealite.backends.aiter import _triton_loader
    at = _triton_loader.load()            # or load("/path/to/amd_aiter-...whl" | unpacked dir)
    y = at.rms_norm(x, w, 1e-6)
    at.missing                            # {entry point: why it could not be loaded}

Where AITER comes from (first that is given): the ``path`` argument, ``$TEALITE_AITER_PATH``,
an installed ``aiter`` package.  A path may be an amd-aiter wheel (its ``aiter/`` tree is
unpacked once under the temp dir), an unpacked wheel or source checkout (the directory holding
``aiter/``), or the ``aiter`` package directory itself.  Nothing found raises
:class:`AiterNotFound` naming what was tried; an entry point that does not import is listed in
``missing`` with the error, never dropped silently.

Why each step (amd-aiter 0.1.7.post2; measured facts in NUMERICS.md):

1. ``aiter/__init__.py`` loads HIP extensions and needs ROCm.  The loader registers a synthetic
   parent package ``aiter`` whose ``__path__`` is the source's ``aiter/`` directory, so the
   absolute imports inside ``aiter/ops/triton`` resolve to the files without running that
   init.  It stays in ``sys.modules`` (AITER modules import lazily through it), so a later
   ``import aiter`` in the same process gets the shell; one process holds one AITER copy.
2. ``arch_info.get_arch()`` asks Triton's driver for a gfx name: on CUDA it gets an SM number
   and the config lookups fail, on a CPU there is no driver.  Off ROCm it is pinned to gfx950
   (OCP FP8 like NVIDIA, MX formats, the MI350 tuned configs) unless ``arch`` or
   ``$TEALITE_AITER_ARCH`` says gfx942 (FNUZ FP8, which NVIDIA Triton cannot compile).
3. ``device_info.get_num_sms()`` queries ``torch.cuda``; with no GPU (interpreter) it returns
   :data:`INTERPRETER_NUM_SMS` (it only sizes persistent grids that loop over rows).
4. AITER's tuned configs and some launch sites pass AMD-only launch options (``waves_per_eu``,
   ``matrix_instr_nonkdim``, ``kpack``); Triton's CUDA backend raises KeyError on unknown
   options.  Off ROCm every AITER kernel's ``run`` is wrapped to drop them.
5. Under ``TRITON_INTERPRET=1``, AITER's FP8 quant kernels hint ``tl.assume(pid > 0)``, false
   for program 0: a compiler merely trusts the hint, the interpreter asserts it.  While an
   AITER kernel runs in the interpreter its assume check is a no-op (and ``notes`` says so).
   Some AITER launch grids are lists (``lambda meta: [n]``), which the interpreter cannot
   extend with a tuple: an interpreted AITER kernel's grid is passed as a tuple.
6. ``aiter/__init__.py`` also binds ``aiter.dtypes`` (``from .utility import dtypes``), which
   ``fused_fp8_quant.py`` and ``activation.py`` read at import (``aiter.dtypes.fp8``, their
   default FP8 output dtype).  ``aiter/utility/dtypes.py`` picks that dtype from
   ``aiter.jit.utils.chip_info.get_gfx()`` (rocminfo; gfx942 -> FNUZ, gfx950 -> OCP, any
   other arch -> uint8).  Under the synthetic parent the loader registers a ``chip_info`` whose
   ``get_gfx()`` returns the arch AITER's Triton code sees (the pinned one, or on ROCm the
   native one), imports the real ``dtypes.py`` and binds it as ``aiter.dtypes``.
7. With no GPU, ``_rmsnorm_backward`` allocates its dgamma workspace with ``device="cuda"``
   written out: in that module only, ``torch.empty(..., device="cuda")`` allocates on the CPU.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ENV_PATH = "TEALITE_AITER_PATH"
ENV_ARCH = "TEALITE_AITER_ARCH"
ARCHES = {"gfx942": "MI300X", "gfx950": "MI350X"}
DEFAULT_ARCH = "gfx950"
AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
INTERPRETER_NUM_SMS = 4
PACKAGE = "aiter"
OPS = "aiter.ops.triton"
_SYNTHETIC = "__tealite_synthetic_root__"

# entry point -> candidate modules under aiter.ops.triton: the 0.1.7 flat layout first, then
# the later one (AITER moved its Triton modules into gemm/basic, quant, normalization).
ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "gemm_a16w16": ("gemm_a16w16", "gemm.basic.gemm_a16w16"),
    "gemm_a8w8": ("gemm_a8w8", "gemm.basic.gemm_a8w8"),
    "gemm_a8w8_per_token_scale": ("gemm_a8w8_per_token_scale",
                                  "gemm.basic.gemm_a8w8_per_token_scale"),
    "gemm_a8w8_blockscale": ("gemm_a8w8_blockscale", "gemm.basic.gemm_a8w8_blockscale"),
    "gemm_afp4wfp4": ("gemm_afp4wfp4", "gemm.basic.gemm_afp4wfp4"),
    "dynamic_mxfp4_quant": ("quant", "quant.quant"),
    "dynamic_per_tensor_quant_fp8_i8": ("quant", "quant.quant"),
    "dynamic_per_token_quant_fp8_i8": ("quant", "quant.quant"),
    "static_per_tensor_quant_fp8_i8": ("quant", "quant.quant"),
    "gemm_afp4wfp4_preshuffled_scales": ("gemm_afp4wfp4", "gemm.basic.gemm_afp4wfp4"),
    "gemm_afp4wfp4_preshuffled_weight_scales": ("gemm_afp4wfp4", "gemm.basic.gemm_afp4wfp4"),
    "rms_norm": ("rmsnorm", "normalization.rmsnorm"),
    "layer_norm": ("norm", "normalization.norm"),
    "rmsnorm2d_fwd_with_dynamicquant": ("rmsnorm", "normalization.rmsnorm"),
    "layernorm2d_fwd_with_dynamicquant": ("norm", "normalization.norm"),
    # Private helpers behind the autograd Functions: the only way to AITER's backward kernels.
    "_rmsnorm_forward": ("rmsnorm", "normalization.rmsnorm"),
    "_rmsnorm_backward": ("rmsnorm", "normalization.rmsnorm"),
    "_layernorm_forward": ("norm", "normalization.norm"),
    "_layernorm_backward": ("norm", "normalization.norm"),
    "fused_rms_fp8_per_tensor_static_quant": ("fused_fp8_quant", "quant.fused_fp8_quant"),
    "fused_rms_mxfp4_quant": ("fused_mxfp4_quant", "quant.fused_mxfp4_quant"),
    "act_mul_and_mxfp4_quant": ("activation", "activation.activation"),
    "act_mul_and_fp8_group_quant": ("activation", "activation.activation"),
}
_ARCH_INFO = "utils._triton.arch_info"
_DEVICE_INFO = "utils.device_info"
_CHIP_INFO = f"{PACKAGE}.jit.utils.chip_info"
_DTYPES = f"{PACKAGE}.utility.dtypes"
# Entry points whose module allocates with device="cuda" written out (step 7).
_CUDA_BY_NAME = ("_rmsnorm_backward",)


class AiterNotFound(ImportError):
    """No AITER source could be found or used; the message says what was tried."""


@dataclass
class AiterTriton:
    """AITER's Triton entry points, loaded by :func:`load`; each is an attribute."""

    root: str
    found_via: str
    version: str | None
    arch: str
    arch_pinned: bool
    dropped_launch_options: tuple[str, ...]
    functions: dict[str, Callable] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
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

    @property
    def fp8_dtype(self):
        """The E4M3 torch dtype AITER's FP8 kernels expect on the pinned arch."""
        import torch
        return torch.float8_e4m3fnuz if self.arch.startswith("gfx942") else torch.float8_e4m3fn

    def describe(self) -> str:
        pin = "pinned" if self.arch_pinned else "native"
        return (f"amd-aiter {self.version or '(version unknown)'} from {self.root} "
                f"({self.found_via}), arch {self.arch} ({pin}), {len(self.functions)} entry "
                f"points, {len(self.missing)} missing")


_loaded: dict[tuple[str, str], AiterTriton] = {}


def _on_rocm() -> bool:
    import torch
    return torch.version.hip is not None and torch.cuda.is_available()


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


# ---- finding the source --------------------------------------------------------------------

def _unpack_wheel(wheel: Path) -> Path:
    """Unpack the wheel's ``aiter/`` tree (and its METADATA) once; return the directory."""
    st = wheel.stat()
    dest = Path(tempfile.gettempdir()) / "tealite-aiter" / \
        f"{wheel.stem}-{st.st_size}-{int(st.st_mtime)}"
    if (dest / "aiter" / "ops" / "triton").is_dir():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist()
                   if n.startswith("aiter/") or re.match(r"[^/]+\.dist-info/METADATA$", n)]
        if not any(n.startswith("aiter/ops/triton/") for n in members):
            raise AiterNotFound(f"{wheel}: the archive has no aiter/ops/triton")
        zf.extractall(tmp, members)
    try:
        os.replace(tmp, dest)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _root_of(path: Path) -> Path:
    if path.is_file() and zipfile.is_zipfile(path):
        return _unpack_wheel(path)
    if (path / "aiter" / "ops" / "triton").is_dir():
        return path
    if path.name == "aiter" and (path / "ops" / "triton").is_dir():
        return path.parent
    raise AiterNotFound(f"{path}: expected an amd-aiter wheel, a directory holding aiter/ops/"
                        "triton (unpacked wheel, source checkout) or the aiter package dir")


def find_source(path: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(directory holding ``aiter/``, how it was found); raises :class:`AiterNotFound`."""
    if path is not None:
        return _root_of(Path(path).expanduser().resolve()), "path argument"
    env = os.environ.get(ENV_PATH)
    if env:
        return _root_of(Path(env).expanduser().resolve()), f"${ENV_PATH}"
    shell = sys.modules.get(PACKAGE)
    if shell is not None and getattr(shell, _SYNTHETIC, None):
        return Path(getattr(shell, _SYNTHETIC)), "already loaded"
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError) as exc:
        spec, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "no importable aiter package"
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if (Path(loc) / "ops" / "triton").is_dir():
                return Path(loc).parent, "installed package"
        why = f"installed aiter at {list(spec.submodule_search_locations)} has no ops/triton"
    raise AiterNotFound(f"AITER not found: no path given, ${ENV_PATH} unset, {why} "
                        "(pip install amd-aiter, or point $TEALITE_AITER_PATH at the wheel)")


def why_unavailable(path: str | os.PathLike | None = None) -> str | None:
    """None when :func:`find_source` finds AITER, else the reason (for skips)."""
    try:
        find_source(path)
    except AiterNotFound as exc:
        return str(exc)
    return None


def _version(root: Path) -> str | None:
    for meta in sorted(root.glob("amd_aiter-*.dist-info/METADATA")):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    vfile = root / "aiter" / "_version.py"
    if vfile.is_file():
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", vfile.read_text(errors="replace"))
        if m:
            return m.group(1)
    return None


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
        return f"{type(exc).__name__}: {exc}"
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


def _pin_arch(arch: str) -> None:
    info = _import(_ARCH_INFO)
    original = info.get_arch

    def get_arch() -> str:
        return arch

    get_arch.__doc__ = f"pinned to {arch} by tealite's AITER loader (not on ROCm)"
    info.get_arch = get_arch
    _rebind(original, get_arch)


def _stub_num_sms() -> None:
    info = _import(_DEVICE_INFO)
    original = info.get_num_sms

    def get_num_sms() -> int:
        return INTERPRETER_NUM_SMS

    info.get_num_sms = get_num_sms
    _rebind(original, get_num_sms)


def _bind_dtypes(arch: str) -> types.ModuleType:
    """Import ``aiter/utility/dtypes.py`` with ``get_gfx() == arch`` and bind ``aiter.dtypes``
    (what ``aiter/__init__.py`` does; its own ``chip_info`` needs rocminfo and jit helpers on
    ``sys.path``)."""
    if _DTYPES not in sys.modules:
        chip = sys.modules.get(_CHIP_INFO)
        if chip is None:
            chip = types.ModuleType(_CHIP_INFO, f"tealite's stand-in for AITER's chip_info: "
                                                f"get_gfx() is {arch} (AITER's Triton arch)")

            def get_gfx() -> str:
                return arch

            chip.get_gfx = get_gfx
            sys.modules[_CHIP_INFO] = chip
    dtypes = importlib.import_module(_DTYPES)
    sys.modules[PACKAGE].dtypes = dtypes
    return dtypes


class _TorchAllocatingOnCpu:
    """``torch`` for a module that writes ``device="cuda"``: allocations land on the CPU."""

    def __init__(self, torch_module):
        self._torch = torch_module

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def empty(self, *args, **kwargs):
        if str(kwargs.get("device", "")) == "cuda":
            kwargs["device"] = "cpu"
        return self._torch.empty(*args, **kwargs)


def _allocate_on_cpu(result: AiterTriton) -> list[str]:
    """Patch the modules of :data:`_CUDA_BY_NAME` entry points; returns those patched."""
    import torch
    patched = []
    for name in _CUDA_BY_NAME:
        fn = result.functions.get(name)
        if fn is not None and fn.__globals__.get("torch") is torch:
            fn.__globals__["torch"] = _TorchAllocatingOnCpu(torch)
            patched.append(name)
    return patched


# ---- launch-time patches -------------------------------------------------------------------

@contextlib.contextmanager
def _interpreter_assume_unchecked():
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


def _innermost_kernel(obj):
    from triton.runtime.jit import KernelInterface
    while isinstance(getattr(obj, "fn", None), KernelInterface):
        obj = obj.fn  # Heuristics / Autotuner wrap the JIT (or interpreted) function
    return obj


def _grid_as_tuple(grid):
    """AITER writes some grids as lists (``lambda meta: [n]``); the GPU launcher indexes them,
    the interpreter concatenates them with a tuple and raises TypeError."""
    if callable(grid):
        return lambda meta: _grid_as_tuple(grid(meta))
    return tuple(grid) if isinstance(grid, list) else grid


def _wrap_launch(kernel, drop: tuple[str, ...], unchecked_assume: bool, *,
                 interpreted: bool = False) -> bool:
    if getattr(kernel, "_tealite_launch_wrapped", False):
        return False
    launch = kernel.run
    # A kernel that declares one of these names as a parameter keeps it.
    drop = tuple(name for name in drop if name not in (getattr(kernel, "arg_names", None) or ()))

    def run(*args, **kwargs):
        for name in drop:
            kwargs.pop(name, None)
        if interpreted and "grid" in kwargs:
            kwargs["grid"] = _grid_as_tuple(kwargs["grid"])
        if unchecked_assume:
            with _interpreter_assume_unchecked():
                return launch(*args, **kwargs)
        return launch(*args, **kwargs)

    kernel.run = run  # an instance attribute: kernel[grid](...) and Heuristics.run call it
    kernel._tealite_launch_wrapped = True
    return True


def _is_interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"  # triton.jit under TRITON_INTERPRET


def _wrap_all_kernels(drop: tuple[str, ...]) -> tuple[int, int]:
    """Wrap every AITER kernel's launch; returns (kernels wrapped, of them interpreted)."""
    from triton.runtime.jit import KernelInterface
    assume_hook = _interpreter_has_assume_hook()
    wrapped = interpreted = 0
    for mod in _aiter_modules():
        for value in list(vars(mod).values()):
            if isinstance(value, KernelInterface):
                kernel = _innermost_kernel(value)
                unchecked = assume_hook and _is_interpreted(kernel)
                if _wrap_launch(kernel, drop, unchecked, interpreted=_is_interpreted(kernel)):
                    wrapped += 1
                    interpreted += unchecked
    return wrapped, interpreted


# ---- the API -------------------------------------------------------------------------------

def _choose_arch(arch: str | None, rocm: bool) -> tuple[str, bool]:
    arch = arch or os.environ.get(ENV_ARCH) or None
    if arch is not None and arch not in ARCHES:
        raise ValueError(f"arch must be one of {sorted(ARCHES)}, got {arch!r}")
    if rocm and arch is None:
        return "native", False
    return arch or DEFAULT_ARCH, True


def _load_entry_points(result: AiterTriton) -> None:
    for name, candidates in ENTRY_POINTS.items():
        errors = []
        for rel in candidates:
            try:
                fn = getattr(_import(rel), name)
            except Exception as exc:  # any failure is reported in `missing`, per candidate
                errors.append(f"{OPS}.{rel}: {type(exc).__name__}: {exc}")
                continue
            result.functions[name] = fn
            break
        else:
            result.missing[name] = "; ".join(errors)


def load(path: str | os.PathLike | None = None, *, arch: str | None = None) -> AiterTriton:
    """Load AITER's Triton entry points (see the module docstring for what is patched)."""
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
    try:
        importlib.import_module(OPS)
        if pinned:
            _pin_arch(arch)
        else:  # ROCm: AITER asks the driver; record what it sees (FNUZ FP8 on gfx942)
            result.arch = _import(_ARCH_INFO).get_arch()
        if shell:
            try:
                fp8 = _bind_dtypes(result.arch).fp8
            except Exception as exc:  # modules that read aiter.dtypes then land in `missing`
                result.notes.append(f"aiter.dtypes not bound: {type(exc).__name__}: {exc}")
            else:
                result.notes.append(f"aiter.dtypes bound with get_gfx() = {result.arch} "
                                    f"(dtypes.fp8 = {fp8})")
        if not _has_gpu():
            _stub_num_sms()
            result.notes.append(f"no GPU: get_num_sms() returns {INTERPRETER_NUM_SMS}")
    except Exception as exc:
        raise AiterNotFound(f"{root}: importing {OPS} failed: {type(exc).__name__}: {exc}") \
            from exc
    _load_entry_points(result)
    if shell and not _has_gpu():
        for name in _allocate_on_cpu(result):
            result.notes.append(f"no GPU: {name}'s device='cuda' allocations go to the CPU")
    drop = () if rocm else AMD_ONLY_LAUNCH_OPTIONS
    wrapped, interpreted = _wrap_all_kernels(drop)
    result.dropped_launch_options = drop
    if drop:
        result.notes.append(f"AMD-only launch options {list(drop)} dropped at launch of "
                            f"{wrapped} kernels")
    if interpreted:
        result.notes.append("interpreter: tl.assume is not checked inside AITER kernels "
                            "(their FP8 quant kernels hint pid > 0, false for program 0)")
    _loaded[key] = result
    return result


def _interpreter_has_assume_hook() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return hasattr(getattr(interpreter, "interpreter_builder", None), "create_assume")
