"""``torch._scaled_mm`` backend: FP8 GEMM with per-tensor or per-row scales through
cuBLASLt (NVIDIA), hipBLASLt (ROCm) or torch's CPU kernel."""
import importlib

from tealite.registry import Backend, register_backend


def _probe() -> str | None:
    import torch
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    return None


BACKEND = register_backend(Backend(
    name="scaled_mm", probe=_probe,
    description="torch._scaled_mm: FP8 per-tensor / rowwise GEMM (cuBLASLt, hipBLASLt, CPU)"))

# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("qgemm",)
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
