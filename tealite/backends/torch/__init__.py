"""PyTorch fallback backend: every op in working precision (fp32 internal math), CPU and GPU.

Each family module registers its implementations on ``BACKEND`` when imported.
"""
from tealite.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    name="torch",
    description="PyTorch reference-quality fallback: fp32 internal math, any device torch runs on",
))

from tealite.backends.torch import activations, gemm, layouts, norms, qgemm, quantize  # noqa: E402,F401,I001
from tealite.backends.torch import fused  # noqa: E402,F401  (after norms, activations, quantize)
