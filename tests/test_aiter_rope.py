"""The ``aiter_triton`` RoPE (AITER's ``rope_*`` Triton entry points): AITER's rotate styles
map onto TE's ``interleaved`` as declared, every entry point passes the harness on the cases
routed to it, a seeded wrong variant is caught, a missing entry point is refused with the
loader's reason, and what the backend refuses for the interpreter or an AITER bug is pinned
by a proof or a strict xfail.

Needs an AITER source and a GPU or ``TRITON_INTERPRET=1``; otherwise skipped with the reason.
"""
from __future__ import annotations

import math

import pytest
import torch

from tealite import registry
from tealite.backends import aiter_triton
from tealite.backends.aiter_common import contracts
from tealite.backends.aiter_triton import INTERPRET, NAME
from tealite.backends.aiter_triton import rope as A
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

BACKEND = registry.get_backend(NAME)
REASON = BACKEND.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"aiter_triton: {REASON}")
DEV = "cpu" if INTERPRET else "cuda"


@pytest.fixture
def at():
    from tealite.backends.aiter_triton import kernels
    return kernels()


def case(fmt="sbhd", shape=(9, 2, 2, 16), dtype="float32", **kw):
    c = {"tensor_format": fmt, "interleaved": False, "shape": list(shape), "d2": shape[-1],
         "cp_size": 1, "cp_rank": 0, "dtype": dtype,
         "freqs": {"kind": "te", "base": 10000.0, "pos_offset": 0, "extra_rows": 0},
         "dist": {"kind": "normal", "scale": 1.0}, "seed": 5}
    c.update(kw)
    return c


# One case per entry point (forward and backward each), and the options each covers.
ROUTED = {
    "rope": case("bshd", (7, 2, 2, 16), interleaved=True),
    "rope_thd": case("thd", (5, 3, 2, 16), seqlens=[0, 5, 1], d2=8, dtype="float16"),
    "rope_cached_positions": case("sbhd", (8, 2, 1, 32), cp_size=2, cp_rank=1),
    "rope_cached_thd_positions_2c": case("thd", (4, 2, 4, 8), seqlens=[4, 3],
                                         start_positions=[2, 9], interleaved=True),
}


def test_every_entry_point_declares_its_contract_and_is_loaded(at):
    declared = {c.entry_point: c for c in contracts.contracts(NAME)}
    for entry in A.ENTRY_POINTS:
        assert declared[entry].op == ("rope_bwd" if entry.endswith("_bwd") else "rope_fwd")
        assert at.has(entry), at.missing.get(entry)


@pytest.mark.parametrize("style,want", [(A.NEOX, [-3, -4, 1, 2]), (A.GPTJ, [-2, 1, -4, 3])])
def test_rotate_styles_are_te_halves_and_pairs(at, style, want):
    """A quarter turn by hand: NEOX rotates halves (TE interleaved=False), GPTJ pairs
    (interleaved=True)."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], device=DEV).reshape(1, 1, 1, 4)
    f = torch.full((1, 1, 1, 4), math.pi / 2, device=DEV)
    y = at.rope_fwd(x, f, style, False, False)
    torch.testing.assert_close(y.reshape(-1).cpu(), torch.tensor(want, dtype=torch.float32),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("base", sorted(ROUTED))
@pytest.mark.parametrize("op", ["rope_fwd", "rope_bwd"])
def test_each_entry_point_matches_the_reference(op, base):
    rep = run_case(get_spec(op), ROUTED[base], backends=["torch", NAME], device=DEV)
    assert rep.outcomes[NAME].status == "ok", rep.describe()
    assert rep.verdict == "pass", rep.describe()
    assert rep.outcomes[NAME].numerics.entry_point == f"{base}_{op[5:]}"


def test_a_seeded_wrong_style_is_caught(at, monkeypatch):
    """The entry point called with the other rotate style: the harness reports it."""
    c = ROUTED["rope"]
    good = at.functions["rope_fwd"]
    monkeypatch.setitem(at.functions, "rope_fwd",
                        lambda x, f, style, *a: good(x, f, 1 - style, *a))
    rep = run_case(get_spec("rope_fwd"), c, backends=[NAME], device=DEV)
    assert [x for x in rep.failures if x.lhs == NAME and x.rhs == "reference"], rep.describe()


def test_a_missing_entry_point_is_refused_with_its_reason(at, monkeypatch):
    monkeypatch.delitem(at.functions, "rope_thd_fwd")
    monkeypatch.setitem(at.missing, "rope_thd_fwd", "ModuleNotFoundError: moved (test)")
    rep = run_case(get_spec("rope_fwd"), ROUTED["rope_thd"], backends=[NAME], device=DEV)
    out = rep.outcomes[NAME]
    assert out.status == "unsupported" and "lacks rope_thd_fwd" in out.reason


@pytest.mark.parametrize("c,why", [
    (case(d2=6), "rotate the whole head or exactly its first half"),
    (case(shape=(9, 2, 2, 24)), "is not a power of two"),
    (case("thd", (4, 2, 3, 8), seqlens=[4, 3], start_positions=[0, 1]), "out of bounds"),
])
def test_refused_cases_say_why(c, why):
    out = run_case(get_spec("rope_fwd"), c, backends=[NAME], device=DEV).outcomes[NAME]
    assert out.status == "unsupported" and why in out.reason


def test_the_2c_kernels_write_past_the_last_head(at):
    """AITER 0.1.7's cached thd 2c kernel with 3 heads (not a power of two) writes a fourth:
    shown with the in-place variant on a view of a 4-head buffer, whose 4th head (outside
    the view) changes.  This is why the backend refuses such cases (THD_2C_HEADS)."""
    inplace = getattr(at.module_of("rope_cached_thd_positions_2c_fwd"),
                      "rope_cached_thd_positions_2c_fwd_inplace")
    buf = torch.randn(5, 4, 8, device=DEV)
    guard = buf[:, 3].clone()
    x = buf[:, :3]
    cos = torch.cos(torch.rand(8, 8, device=DEV))
    sin = torch.sin(torch.rand(8, 8, device=DEV))
    pos = torch.arange(5, device=DEV)
    inplace(x, x, cos, sin, pos, A.NEOX, False, False)
    assert not torch.equal(buf[:, 3], guard)


@pytest.mark.xfail(INTERPRET, strict=True,
                   reason="interpreter: fp32 -> bf16 truncates (proof: tests/test_aiter_norms.py"
                          "::test_interpreter_bf16_conversion_is_the_cause)")
def test_bf16_rope_under_the_interpreter_fails_only_there():
    with aiter_triton.lift_platform_rejections(bf16_in_interpreter=True):
        rep = run_case(get_spec("rope_fwd"), case(dtype="bfloat16", shape=(8, 1, 2, 16)),
                       backends=[NAME], device=DEV)
    assert rep.outcomes[NAME].status == "ok" and rep.verdict == "pass", rep.describe()
