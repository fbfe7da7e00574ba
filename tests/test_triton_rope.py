"""tealite's Triton RoPE kernel: it passes hard hand-picked cases of every option (in the
interpreter, or on a GPU without TRITON_INTERPRET), and under the interpreter the harness
catches seeded kernel bugs (the sin sign flipped, cos and sin swapped) while the correct
kernel's rounding stays inside the declared numerics.  The broad property check is the
differential suite (tests/test_differential.py -k "rope and triton")."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tealite import registry
from tealite.backends.triton import INTERPRET
from tealite.backends.triton import rope as K
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
interpreter_only = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
DEVICE = "cpu" if INTERPRET else "cuda"
LONG = {"kind": "te", "base": 10000.0, "pos_offset": 2 ** 20, "extra_rows": 3}


def _case(fmt="sbhd", shape=(9, 2, 3, 16), dtype="float32", **kw):
    c = {"tensor_format": fmt, "interleaved": False, "shape": list(shape), "d2": shape[-1],
         "cp_size": 1, "cp_rank": 0, "dtype": dtype,
         "freqs": {"kind": "te", "base": 10000.0, "pos_offset": 0, "extra_rows": 0},
         "dist": {"kind": "normal", "scale": 1.0}, "seed": 11}
    c.update(kw)
    return c


HARD = [
    _case(),
    _case("bshd", (17, 2, 2, 67), "bfloat16", d2=10, interleaved=True, freqs=LONG),
    _case("thd", (5, 4, 3, 24), "float16", seqlens=[0, 1, 5, 0], start_positions=[7, 0, 2, 1]),
    _case("thd", (6, 3, 1, 32), "bfloat16", seqlens=[24, 0, 8], cp_size=4, cp_rank=3,
          interleaved=True, d2=6),
    _case("sbhd", (10, 1, 2, 64), "float32", cp_size=2, cp_rank=1, freqs=LONG),
    _case("sbhd", (31, 2, 1, 40), "float32",
          freqs={"kind": "random", "base": 1.0, "pos_offset": 0, "extra_rows": 0}),
    _case("bshd", (0, 2, 2, 8), "float16"),
]


@pytest.mark.parametrize("op", ["rope_fwd", "rope_bwd"])
def test_the_kernel_passes_hard_cases(op):
    for case in HARD:
        report = run_case(get_spec(op), case, backends=["triton", "torch"], device=DEVICE)
        assert report.outcomes["triton"].status == "ok", report.describe()
        assert report.verdict == "pass", report.describe()


def test_the_tail_is_copied_bit_for_bit():
    t = torch.randn(6, 2, 2, 12, device=DEVICE).to(torch.bfloat16)
    f = torch.randn(6, 1, 1, 4, device=DEVICE)
    import tealite
    for fn in (tealite.rope_fwd, tealite.rope_bwd):
        y = fn(t, f, backend="triton")
        assert torch.equal(y[..., 4:], t[..., 4:])


def _seeded(make_backend, monkeypatch, replacement):
    """A backend running the triton RoPE with ``_cos_sin`` replaced."""
    b = make_backend("triton_rope_seeded")
    for op in ("rope_fwd", "rope_bwd"):
        good = TRITON.impls[op].fn

        def fn(*args, _good=good, **kwargs):
            with monkeypatch.context() as m:
                m.setattr(K, "_cos_sin", replacement)
                return _good(*args, **kwargs)

        b.implements(op, devices=TRITON.impls[op].support.devices,
                     numerics=TRITON.impls[op].numerics)(fn)
    return b.name


@triton.jit
def _sin_negated(f, ACCURATE: tl.constexpr):
    return tl.cos(f), -tl.sin(f)


@triton.jit
def _swapped(f, ACCURATE: tl.constexpr):
    return tl.sin(f), tl.cos(f)


@interpreter_only
@pytest.mark.parametrize("replacement", [_sin_negated, _swapped], ids=["sin-sign", "swapped"])
@pytest.mark.parametrize("op", ["rope_fwd", "rope_bwd"])
def test_seeded_trig_bugs_are_caught(make_backend, monkeypatch, replacement, op):
    name = _seeded(make_backend, monkeypatch, replacement)
    report = run_case(get_spec(op), HARD[1], backends=["torch", name], device=DEVICE)
    assert report.outcomes[name].status == "ok", report.describe()
    assert [c for c in report.failures if c.lhs == name and c.rhs == "reference"]
