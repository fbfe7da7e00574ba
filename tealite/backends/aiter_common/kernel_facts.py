"""Facts about the loaded AITER's kernels, asked of AITER itself rather than assumed per version.

* :func:`first_launch`: call an AITER wrapper in a dry run (tealite.backends.aiter_common.
  _loader_launch.dry_run: kernel launches are recorded, nothing executes) and return the first
  launch that carries a given keyword, i.e. the config the wrapper's host code settled on after
  its own adjustments (split-K heuristics, K-step floors), which change between versions.
* :func:`masked_loads`: for a kernel, whether each ``tl.load`` of a pointer whose expression
  mentions a word (e.g. ``scale``) passes ``mask=``: read from the kernel's source (e.g. the
  MXFP4 GEMMs' E8M0 scale loads are unmasked up to v0.1.11 and masked from v0.1.12).
"""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap

from tealite.backends.aiter_common._loader_launch import Launch, dry_run, innermost_kernel


def first_launch(fn, *args, key: str, **kwargs) -> Launch | None:
    """The first launch with keyword ``key`` of ``fn(*args, **kwargs)`` in a dry run; None when
    the wrapper raises (its own assertions) or launches no such kernel."""
    try:
        with dry_run() as launches:
            fn(*args, **kwargs)
    except Exception:  # the wrapper rejects the inputs: the caller's own checks say why
        return None
    return next((launch for launch in launches if key in launch.kwargs), None)


def find_kernel(name: str, package: str = "aiter"):
    """The innermost Triton function named ``name`` bound in a module of ``package`` (or None)."""
    from triton.runtime.jit import KernelInterface
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == package or mod_name.startswith(package + ".")):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, KernelInterface):
                kernel = innermost_kernel(value)
                if getattr(getattr(kernel, "fn", None), "__name__", None) == name:
                    return kernel
    return None


_masked: dict[tuple[object, str], tuple[bool, ...] | None] = {}


def masked_loads(kernel, word: str) -> tuple[bool, ...] | None:
    """For each ``tl.load`` in ``kernel`` whose pointer expression mentions ``word``: whether
    it passes ``mask=``.  None when the source cannot be read."""
    key = (getattr(kernel, "fn", None), word)  # the Python function: kept alive by the key
    if key not in _masked:
        _masked[key] = _scan(kernel, word)
    return _masked[key]


def _scan(kernel, word: str) -> tuple[bool, ...] | None:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn)))
    except (OSError, TypeError, SyntaxError, AttributeError):
        return None
    return tuple(any(k.arg == "mask" for k in node.keywords)
                 for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr == "load" and node.args
                 and word in ast.unparse(node.args[0]))
