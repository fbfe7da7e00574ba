"""Shared by the Triton quantize test modules (test_triton_quantize_codecs.py,
test_triton_quantize_kernels.py): the triton backend, the mark that skips a module with the
backend's reason where it is unavailable, and the device its kernels run on."""
from __future__ import annotations

import pytest

from tealite import registry
from tealite.backends.triton import INTERPRET

TRITON = registry.get_backend("triton")
needs_triton = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                  reason=f"triton backend: {TRITON.unavailable_reason()}")
DEV = "cpu" if INTERPRET else "cuda"
