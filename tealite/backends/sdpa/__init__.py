"""torch SDPA's fused attention kernels on CUDA as a tealite backend (``sdpa``).

The kernels behind ``torch.nn.functional.scaled_dot_product_attention`` -- FlashAttention-2
and the memory-efficient (cutlass) kernel -- called through their aten ops, which take and
return the logsumexp (``torch.ops.aten._flash_attention_forward`` / ``_backward``,
``_efficient_attention_forward`` / ``_backward``): the public SDPA function hides the LSE and
recomputes the forward in its backward.  One backend, the kernel chosen per case (the first
of :data:`OPTIONS`'s ``kernels`` that can run it, SDPA's own preference order) and reported
as the case's ``entry_point``: the suite sees one name per op, and a test or a device run
forces a kernel with ``OPTIONS.override(kernels=("efficient",))``.  Why not one backend per
kernel: the registry holds one implementation per backend and op, and the kernels'
abilities are disjoint enough (flash: 16-bit, GQA, windows, ALiBi; efficient: fp32, a bias
tensor, top-left causal) that most cases have exactly one candidate.

CUDA only: on the CPU these ops have no kernel, and the backend is unavailable with the
reason.  The aten ops' arguments are passed by name, checked against the op's schema (torch
2.11 and 2.13 differ in the optional ones: an argument the installed torch lacks makes the
case unsupported with an "adapter:" reason, never a silent drop).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from tealite.registry import Backend, register_backend
from tealite.scoped import Scoped

NAME = "sdpa"
KERNELS = ("flash", "efficient")


@dataclass(frozen=True)
class Options:
    """Which SDPA kernels the backend may use, in order of preference."""

    kernels: tuple[str, ...] = KERNELS


OPTIONS: Scoped[Options] = Scoped("sdpa.OPTIONS", Options)


@dataclass(frozen=True)
class Platform:
    """Where the kernels run; a test simulates a GPU with ``PLATFORM.override(cuda=True)``."""

    cuda: bool
    hip: bool


def _detect_platform() -> Platform:
    import torch
    return Platform(cuda=torch.cuda.is_available(), hip=torch.version.hip is not None)


PLATFORM: Scoped[Platform] = Scoped("sdpa.PLATFORM", _detect_platform)


def _probe() -> str | None:
    import torch
    if not PLATFORM.get().cuda:
        return ("torch SDPA's flash and memory-efficient attention kernels run on CUDA only "
                "(no GPU here; the CPU has only SDPA's math path, which the torch backend "
                "covers)")
    missing = [n for n in ("_flash_attention_forward", "_efficient_attention_forward")
               if not hasattr(torch.ops.aten, n)]
    if missing:
        return f"torch {torch.__version__} lacks aten ops {missing}"
    return None


BACKEND = register_backend(Backend(
    name=NAME, probe=_probe, auto_dispatch=False,
    description="torch SDPA's CUDA kernels (FlashAttention-2, memory-efficient) with the LSE"))

FAMILIES = ("attention",)
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
