"""PyTorch fallback backend: every op in working precision (fp32 internal math), CPU and GPU."""
import importlib

from tealite.registry import Backend, register_backend

BACKEND = register_backend(Backend(
    name="torch",
    description="PyTorch reference-quality fallback: fp32 internal math, any device torch runs on",
))

# Every family module registers its implementations on BACKEND when imported.  They are
# imported by name, as the registry imports the backends: the package never imports its
# families statically, so they may import it (BACKEND, platform facts) without a circle.
FAMILIES = ("activations", "gemm", "layouts", "norms", "qgemm", "quantize", "fused", "rope",
            "attention", "softmax", "grouped_gemm", "router", "permute", "moe_ffn",
            "grouped_quantize", "scaling", "transpose", "multi_tensor", "dropout")
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
