"""Where the float64 references run.

A float64 GEMM of the shapes the fuzzer draws costs far more on the CPU than the kernel it
judges on a GPU, so when a case runs on CUDA the runner asks for the reference products on
the same device (an H100 does ~60 TFLOP/s in fp64).  ``torch.matmul`` in float64 is an
oracle here, like numpy's: it is not tealite code, and float64 on either side is ~2^-53
relative per term, far below any tolerance the harness applies.  References still take and
return numpy arrays; only the product moves.

The elementwise references (norms, activations, their special functions) follow the same
rule through an array namespace ``xp``: they are written once against ``namespace(x)``, which
is numpy (plus ``math.erf``/``erfc`` per element, i.e. libm) for numpy arrays and a small
torch float64 namespace for tensors.  ``on_reference_device`` moves a reference's numpy inputs
to the current reference device once and brings its outputs back, so callers see numpy in,
numpy out; with no device set it calls the function untouched (results bit-identical to plain
numpy).  torch float64 is an oracle for the same reason as above.  Its exp, tanh, erf and erfc
are a few ulp (2^-52 relative each) from libm's, not bit-equal: torch.special.erfc is SLEEF's
(1.5 ulp bound) on the CPU and CUDA's (a few ulp, per the CUDA Programming Guide's
double-precision table) on a GPU, while the numpy path calls libm's erfc per element.  Sums
differ only in order (numpy pairwise, torch cascade / tree), x**3 is pow in numpy and x*x*x in
torch (CPU), and +, -, *, /, sqrt are IEEE-rounded on both.  A few ulp of float64 is ~2^-50
relative, thousands of times below the fp32 unit roundoff the tightest tolerance allows.
NaN and Inf propagate alike (torch.maximum propagates NaN like np.maximum); only the sign of a
zero maximum may differ (np.maximum(-0.0, 0.0) is +0.0, torch's is -0.0), which no tolerance
can see.  tests/test_reference_device_agreement.py bounds the two paths' difference.
"""
from __future__ import annotations

import functools
import math
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Callable, Iterator, TypeVar

import numpy as np

_DEVICE: ContextVar[str | None] = ContextVar("tealite_verify_reference_device", default=None)
F = TypeVar("F", bound=Callable)


def current() -> str | None:
    """The torch device reference products run on, or None for numpy on the CPU."""
    return _DEVICE.get()


@contextmanager
def reference_device(device: str | None) -> Iterator[None]:
    """Run reference products on torch ``device`` (None: numpy) inside the block."""
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def for_case(device: str) -> str | None:
    """The reference device for a case on ``device``: the GPU itself, else numpy."""
    return device if str(device).startswith("cuda") else None


def matmul_f64(x, y) -> np.ndarray:
    """``x @ y`` in float64, on the current reference device; numpy in, numpy out (tensors
    in, for a reference already on the device: a tensor there)."""
    if _is_tensor(x) or _is_tensor(y):
        xp = namespace(x, y)
        return xp.asarray(x) @ xp.asarray(y)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    device = current()
    if device is None:
        return x @ y
    import torch  # local: numpy-only references must not pay for it

    tx = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    ty = torch.from_numpy(np.ascontiguousarray(y)).to(device)
    return (tx @ ty).cpu().numpy()


# ---- array namespaces --------------------------------------------------------------------

_libm_erf = np.frompyfunc(math.erf, 1, 1)
_libm_erfc = np.frompyfunc(math.erfc, 1, 1)


def _numpy_erf(x) -> np.ndarray:
    return np.asarray(_libm_erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def _numpy_erfc(x) -> np.ndarray:
    return np.asarray(_libm_erfc(np.asarray(x, dtype=np.float64)), dtype=np.float64)


NUMPY = SimpleNamespace(
    name="numpy", asarray=lambda x: np.asarray(x, dtype=np.float64),
    sqrt=np.sqrt, exp=np.exp, tanh=np.tanh, abs=np.abs, maximum=np.maximum, where=np.where,
    concatenate=np.concatenate, mean=np.mean, sum=np.sum, erf=_numpy_erf, erfc=_numpy_erfc,
    zeros_like=np.zeros_like, expm1=np.expm1, log1p=np.log1p, minimum=np.minimum, amax=np.amax)


class TorchF64:
    """The array functions the references use, as torch float64 on one device.

    Python scalars become float64 tensors on the device (torch.where(c, 1.0, 0.0) alone
    would be float32); the signatures are numpy's (axis, keepdims).
    """

    def __init__(self, device):
        import torch

        self.torch, self.device, self.name = torch, device, f"torch:{device}"
        self.sqrt, self.exp, self.tanh, self.abs = torch.sqrt, torch.exp, torch.tanh, torch.abs
        self.zeros_like = torch.zeros_like
        self.erf, self.erfc = torch.special.erf, torch.special.erfc
        self.expm1, self.log1p = torch.expm1, torch.log1p

    def minimum(self, a, b):
        return self.torch.minimum(self.asarray(a), self.asarray(b))

    def amax(self, x, axis, keepdims=False):
        return self.torch.amax(x, dim=axis, keepdim=keepdims)

    def asarray(self, x):
        return self.torch.as_tensor(x, dtype=self.torch.float64, device=self.device)

    def maximum(self, a, b):
        return self.torch.maximum(self.asarray(a), self.asarray(b))

    def where(self, cond, a, b):
        return self.torch.where(cond, self.asarray(a), self.asarray(b))

    def concatenate(self, arrays, axis=0):
        return self.torch.cat(list(arrays), dim=axis)

    def mean(self, x, axis, keepdims=False):
        return self.torch.mean(x, dim=axis, keepdim=keepdims)

    def sum(self, x, axis, keepdims=False):
        return self.torch.sum(x, dim=axis, keepdim=keepdims)


@functools.lru_cache(maxsize=None)
def _torch_namespace(device) -> TorchF64:
    return TorchF64(device)


def _is_tensor(a) -> bool:
    torch = sys.modules.get("torch")  # never import torch for numpy arrays
    return torch is not None and isinstance(a, torch.Tensor)


def namespace(*arrays):
    """The namespace of the arrays: torch float64 on their device for tensors, else numpy."""
    for a in arrays:
        if _is_tensor(a):
            return _torch_namespace(a.device)
    return NUMPY


# ---- numpy in, numpy out -----------------------------------------------------------------

def _to_device(a, device):
    if not isinstance(a, np.ndarray):
        return a
    import torch

    # Writable and contiguous: torch.from_numpy warns on read-only arrays (runner views).
    return torch.from_numpy(np.require(a, np.float64, ["C", "W"])).to(device)


def _to_numpy(out):
    if _is_tensor(out):
        return out.cpu().numpy()
    if isinstance(out, (tuple, list)):
        return type(out)(_to_numpy(o) for o in out)
    if isinstance(out, dict):
        return {k: _to_numpy(v) for k, v in out.items()}
    return out


def on_reference_device(fn: F) -> F:
    """Run the reference ``fn`` on the current reference device; numpy in, numpy out.

    With no device set, or no numpy array among the arguments (a reference calling another
    with tensors already on the device), ``fn`` is called as is.  Otherwise its numpy
    arguments move to the device as float64 tensors and its tensor results (also inside
    tuples, lists, dicts) come back as numpy float64 arrays.
    """
    @functools.wraps(fn)
    def run(*args, **kwargs):
        device = current()
        if device is None or not any(isinstance(a, np.ndarray)
                                     for a in (*args, *kwargs.values())):
            return fn(*args, **kwargs)
        args = tuple(_to_device(a, device) for a in args)
        kwargs = {k: _to_device(v, device) for k, v in kwargs.items()}
        return _to_numpy(fn(*args, **kwargs))

    return run  # type: ignore[return-value]
