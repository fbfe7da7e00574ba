"""In-tree backends.  Each subpackage registers itself on import; importing one that cannot
run here must still succeed (its probe reports why it is unavailable)."""
from tealite.backends import torch as _torch  # noqa: F401
