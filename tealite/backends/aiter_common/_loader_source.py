"""Where the AITER source is, and which version it is (for :mod:`.loader`).

A source is an amd-aiter wheel (its ``aiter/`` tree unpacked once under the temp dir), an
unpacked wheel, a source export made by ``ci/aiter_source.sh`` (``aiter/`` plus an
``AITER_SOURCE`` file with ``tag=``, ``commit=``, ``version=``, ``date=`` lines: a git export
has no generated ``_version.py``), or the ``aiter`` package directory.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ENV_PATH = "TEALITE_AITER_PATH"
PACKAGE = "aiter"
SOURCE_FILE = "AITER_SOURCE"  # written by ci/aiter_source.sh next to the exported aiter/
SYNTHETIC = "__tealite_synthetic_root__"  # attribute of the loader's synthetic parent


class AiterNotFound(ImportError):
    """No AITER source at the given place (not an AITER tree, or an unreadable wheel)."""


def error_text(exc: BaseException) -> str:
    """An exception as "Type: message" (one line, no traceback)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _unpack_wheel(wheel: Path) -> Path:
    """Unpack the wheel's ``aiter/`` tree (and its METADATA) once; return the directory."""
    st = wheel.stat()
    dest = Path(tempfile.gettempdir()) / "tealite-aiter" / \
        f"{wheel.stem}-{st.st_size}-{int(st.st_mtime)}"
    if (dest / "aiter" / "ops" / "triton").is_dir():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith("aiter/") or
                       re.match(r"[^/]+\.dist-info/METADATA$", n)]
            if not any(n.startswith("aiter/ops/triton/") for n in members):
                raise AiterNotFound(f"{wheel}: the archive has no aiter/ops/triton")
            zf.extractall(tmp, members)
    except (zipfile.BadZipFile, OSError) as exc:
        raise AiterNotFound(f"{wheel}: cannot read the wheel ({error_text(exc)})") from exc
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
    raise AiterNotFound(f"{path}: not an AITER tree: expected an amd-aiter wheel, a directory "
                        "holding aiter/ops/triton (unpacked wheel, source export) or the aiter "
                        "package dir")


def find_source(path: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(directory holding ``aiter/``, how it was found); raises :class:`AiterNotFound`."""
    if path is not None:
        return _root_of(Path(path).expanduser().resolve()), "path argument"
    env = os.environ.get(ENV_PATH)
    if env:
        return _root_of(Path(env).expanduser().resolve()), f"${ENV_PATH}"
    shell = sys.modules.get(PACKAGE)
    if shell is not None and getattr(shell, SYNTHETIC, None):
        return Path(getattr(shell, SYNTHETIC)), "already loaded"
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError) as exc:
        spec, why = None, error_text(exc)
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


def _source_fields(root: Path) -> dict[str, str]:
    """``key=value`` lines of the tree's AITER_SOURCE (ci/aiter_source.sh), or {}."""
    path = root / SOURCE_FILE
    if not path.is_file():
        return {}
    lines = path.read_text(errors="replace").splitlines()
    return dict(line.strip().split("=", 1) for line in lines if "=" in line)


def _version(root: Path) -> str | None:
    """AITER_SOURCE's version=, else the wheel METADATA's Version:, else aiter/_version.py."""
    version = _source_fields(root).get("version")
    if version:
        return version
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
