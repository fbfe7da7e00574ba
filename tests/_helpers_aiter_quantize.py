"""Shared by the aiter_triton quantize test modules (test_aiter_quantize.py: contracts,
dispatch and the FP8 entry points; test_aiter_quantize_mxfp4.py: dynamic_mxfp4_quant): whether
AITER is there, the quantize spec and its runs against the reference, rejections, and AITER's
kernel source recompiled with one seeded change."""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys

import numpy as np
import pytest
import tealite
from tealite import recipes as R
from tealite.backends.aiter_common import loader as L
from tealite.errors import UnsupportedCase
from tealite.formats import ElementRounding, ScaleRounding
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_aiter import B

REASON = L.why_unavailable()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_aiter = pytest.mark.skipif(REASON is not None, reason=f"AITER not available: {REASON}")
# Importing these loads nothing from AITER (kernels() does, on first use).
from tealite.backends.aiter_triton import kernels  # noqa: E402

F32 = np.float32
MXFP4_AITER = R.MXFP4BlockScaling(ScaleRounding.EVEN, ElementRounding.TIES_AWAY)
SPEC = get_spec("quantize")


@pytest.fixture(scope="module")
def device(triton_device):
    return triton_device


MX_RECIPE = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "even",
             "element_rounding": "ties_away"}


def _run(case, device):
    return run_case(SPEC, case, backends=[B, "torch"], device=device)


def _assert_pass(report):
    assert report.outcomes[B].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


def _assert_caught(report):
    assert report.outcomes[B].status == "ok", report.describe()
    assert any(c.lhs == B and c.rhs == "reference" for c in report.failures), report.describe()


def _rejected(x, recipe, match, **kw):
    with pytest.raises(UnsupportedCase, match=match):
        tealite.quantize(x, recipe, backend=B, **kw)


def _seed_kernel(tmp_path, monkeypatch, ep: str, kernel: str, old: str, new: str):
    """Replace ``kernel`` in the module of AITER's ``ep`` wrapper with a copy compiled from
    AITER's own kernel source with ``old`` replaced by ``new`` (exactly once)."""
    wrapper = sys.modules[kernels().functions[ep].__module__]
    original = getattr(wrapper, kernel)
    path = inspect.getsourcefile(L._innermost_kernel(original).fn)
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, f"{old!r} not unique in {path}"
    seeded = tmp_path / f"seeded_{kernel}_{abs(hash(new))}.py"
    seeded.write_text(text.replace(old, new))
    spec = importlib.util.spec_from_file_location(seeded.stem, seeded)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    copy = getattr(module, kernel)
    # As the loader does for AITER's own kernels: AMD-only launch options dropped off ROCm,
    # the interpreter's check of AITER's `tl.assume(pid > 0)` hint disabled.
    L._wrap_launch(L._innermost_kernel(copy), () if L._on_rocm() else L.AMD_ONLY_LAUNCH_OPTIONS,
                   INTERPRET and L._interpreter_has_assume_hook())
    monkeypatch.setattr(wrapper, kernel, copy)
