"""The ``aiter_triton`` grouped GEMM (AITER's ``gmm`` / ``ptgmm`` / ``nptgmm`` Triton entry
points): each passes the harness on the cases routed to it (AITER's own kernel code, in the
interpreter on CI), the loader's interpreter shim gives their loop variables the compiled
(tensor) type and nothing else, nptgmm's unwritten empty groups are zeros through the adapter,
a seeded wrong group size is caught, a missing entry point and the unsupported cases are
refused with the reason.

Needs an AITER source and a GPU or ``TRITON_INTERPRET=1``; otherwise skipped with the reason.
"""
from __future__ import annotations

import pytest
import torch

from tealite import registry
from tealite.backends.aiter_common import _loader_launch as launch
from tealite.backends.aiter_common import contracts
from tealite.backends.aiter_triton import INTERPRET, NAME
from tealite.backends.aiter_triton import grouped_gemm as A
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.grouped_gemm import make_case

BACKEND = registry.get_backend(NAME)
REASON = BACKEND.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"aiter_triton: {REASON}")
DEV = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("grouped_gemm")
# fp16: bf16 is refused under the interpreter (its bf16 dot); a GPU runs both.
ROUTED = {
    "gmm-TN": make_case("TN", "float16", [5, 0, 17, 1, 0, 13], 40, 48),
    "gmm-NN-one-group": make_case("NN", "float16", [0, 29, 0], 17, 33),
    "ptgmm": make_case("NT", "float16", [7, 0, 11, 13], 40, 1, m=40),
    "nptgmm": make_case("NT", "float16", [0, 9], 20, 1, m=17),
}


@pytest.fixture
def at():
    from tealite.backends.aiter_triton import kernels
    return kernels()


def _params(case) -> dict:
    splits = case["m_splits"]
    k = sum(splits) if case["layout"] == "NT" else case["k"]
    m = case["m"] if case["layout"] == "NT" else sum(splits)
    return dict(groups=len(splits), m_splits=tuple(splits), m=m, n=case["n"], k=k,
                layout=case["layout"], dtype=torch.float16, out_dtype=torch.float16,
                bias=case["bias"], accumulate=case["accumulate"],
                shared_weight=case["shared_weight"], device=DEV)


def test_every_entry_point_declares_its_contract_and_is_loaded(at):
    declared = {c.entry_point: c for c in contracts.contracts(NAME)}
    for entry in A.ENTRY_POINTS:
        assert declared[entry].op == "grouped_gemm"
        assert at.has(entry), at.missing.get(entry)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_each_entry_point_matches_the_reference(name):
    case = ROUTED[name]
    assert A.entry_point(_params(case)) == name.split("-")[0]
    rep = run_case(SPEC, case, backends=[NAME, "torch"], device=DEV)
    assert rep.outcomes[NAME].status == "ok", rep.describe()
    assert rep.verdict == "pass", rep.describe()


def test_nptgmm_leaves_empty_groups_unwritten_and_the_adapter_zeroes_them(at):
    """AITER's contract difference (declared): nptgmm returns early on an empty group."""
    b = torch.randn(9, 6, device=DEV).half()  # (K_total, M): lhs = b.t(), column-major
    a = torch.randn(9, 4, device=DEV).half()  # (K_total, N)
    sizes = torch.tensor([0, 9], dtype=torch.int32, device=DEV)
    out = torch.full((2, 6, 4), 7.0, dtype=torch.float16, device=DEV)
    at.nptgmm(b.t(), a, sizes, preferred_element_type=torch.float16, existing_out=out,
              config=A._config(A.NPTGMM, 9, 6, 4, 2))
    assert bool((out[0] == 7.0).all())  # AITER: unwritten
    assert A.entry_point(dict(layout="NT", k=9, m=6, n=4, groups=2)) == A.NPTGMM
    y = BACKEND.impls["grouped_gemm"].fn(a, b, (0, 9), layout="NT", out_dtype=torch.float16,
                                         bias=None, out=None, accumulate=False)
    assert bool((y[0] == 0).all()) and not bool(torch.signbit(y[0]).any())


def test_the_interpreter_shim_types_loop_variables_only_inside_its_block():
    def kernel():
        pass

    scope = kernel.__globals__
    assert "range" not in scope
    with launch.interpreter_tensor_loops(kernel):
        values = list(scope["range"](2, 5))
    assert "range" not in scope
    assert [int(v.handle.data[0]) for v in values] == [2, 3, 4]
    assert all(hasattr(v, "to") for v in values)  # what `g.to(tl.int64)` needs
    assert launch.TENSOR_LOOP_KERNELS == {"gmm_kernel", "tgmm_persistent_kernel",
                                          "tgmm_non_persistent_kernel"}


def test_a_seeded_wrong_group_size_is_caught(at, monkeypatch):
    """group_sizes shifted by one token between two groups: AITER multiplies a boundary row
    by the wrong expert; the harness must say so (the correct adapter passes)."""
    case = ROUTED["gmm-TN"]
    real = at.functions[A.GMM]

    def shifted(lhs, rhs, sizes, **kw):
        wrong = sizes.clone()
        wrong[0] += 1
        wrong[2] -= 1
        return real(lhs, rhs, wrong, **kw)

    monkeypatch.setitem(at.functions, A.GMM, shifted)
    rep = run_case(SPEC, case, backends=[NAME, "torch"], device=DEV)
    assert rep.outcomes[NAME].status == "ok", rep.describe()
    assert rep.verdict == "fail", rep.describe()


def test_a_missing_entry_point_is_refused_with_its_reason(at, monkeypatch):
    monkeypatch.delitem(at.functions, A.PTGMM)
    monkeypatch.setitem(at.missing, A.PTGMM, "ModuleNotFoundError: moved (test)")
    rep = run_case(SPEC, ROUTED["gmm-TN"], backends=[NAME], device=DEV)
    out = rep.outcomes[NAME]
    assert out.status == "unsupported" and "lacks ptgmm" in out.reason


@pytest.mark.parametrize("change,why", [
    (dict(bias=True), "no bias epilogue"),
    (dict(accumulate=True), "no accumulate"),
    (dict(shared_weight=True), "one weight per group"),
    (dict(dtype="float32"), "dtype float32 not in"),
    (dict(out_dtype="float32"), "fp16 / bf16 operands and outputs"),
    (dict(k=0), "K > 0"),
])
def test_refused_cases_say_why(change, why):
    case = dict(ROUTED["gmm-TN"], **change)
    rep = run_case(SPEC, case, backends=[NAME], device=DEV)
    out = rep.outcomes[NAME]
    assert out.status == "unsupported" and why in out.reason, out.reason


@pytest.mark.skipif(not INTERPRET, reason="the bf16 rejection is for the interpreter only")
def test_bf16_is_refused_under_the_interpreter_with_the_reason():
    rep = run_case(SPEC, make_case("TN", "bfloat16", [3, 4], 16, 16), backends=[NAME],
                   device=DEV)
    out = rep.outcomes[NAME]
    assert out.status == "unsupported" and "bf16" in out.reason
