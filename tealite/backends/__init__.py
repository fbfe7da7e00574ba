"""In-tree backends.  Each subpackage registers itself on import; importing one that cannot
run here must still succeed (its probe reports why it is unavailable)."""
from tealite.backends import scaled_mm as _scaled_mm  # noqa: F401
from tealite.backends import torch as _torch  # noqa: F401
from tealite.backends import triton as _triton  # noqa: F401
from tealite.backends import aiter_triton as _aiter_triton  # noqa: F401
