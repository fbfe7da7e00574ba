"""``torch._scaled_mm`` backend: FP8 GEMM with per-tensor or per-row scales through
cuBLASLt (NVIDIA), hipBLASLt (ROCm) or torch's CPU kernel."""
from tealite.registry import Backend, register_backend


def _probe() -> str | None:
    import torch
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    return None


BACKEND = register_backend(Backend(
    name="scaled_mm", probe=_probe,
    description="torch._scaled_mm: FP8 per-tensor / rowwise GEMM (cuBLASLt, hipBLASLt, CPU)"))

from tealite.backends.scaled_mm import qgemm  # noqa: E402,F401
