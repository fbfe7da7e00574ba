"""tealite's Triton softmax kernels and AITER's Triton ``softmax`` (``aiter_triton``): hard fixed
cases pass (rows of prime / non-power-of-two length, sq != sk, fully masked and fully hidden
rows, logits that overflow exp without the max subtraction), a seeded kernel bug (the
causal diagonal one key off) is caught, and AITER's entry
point is mapped only onto the cases it computes exactly (the others refused with the reason).

Runs in the interpreter (TRITON_INTERPRET=1) or on a GPU; skipped with the reason otherwise.
"""
from __future__ import annotations

import pytest
import triton
import triton.language as tl  # noqa: F401  (a @triton.jit body below must see it)

from tealite import registry
from tealite.backends.aiter_common import contracts
from tealite.backends.triton import INTERPRET
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from _helpers_cross_compile import compiled_json

TRITON = registry.get_backend("triton")
AITER = registry.get_backend("aiter_triton")
needs_triton = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                  reason=f"triton backend: {TRITON.unavailable_reason()}")
needs_aiter = pytest.mark.skipif(AITER.unavailable_reason() is not None,
                                 reason=f"aiter_triton: {AITER.unavailable_reason()}")
interpreter_only = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
DEVICE = "cpu" if INTERPRET else "cuda"
LARGE = {"kind": "uniform", "lo": 200.0, "hi": 900.0}


def _case(kind, shape, dtype, *, scale=0.125, dist=None, **kw):
    c = {"kind": kind, "shape": list(shape), "dtype": dtype, "scale": scale,
         "dist": dist or {"kind": "normal", "scale": 4.0}, "seed": 9,
         "dist_dy": {"kind": "normal", "scale": 1.0}}
    if kind == "scaled_masked":
        c.update(mask_batch="b", mask_frac=0.3, masked_rows=0.25)
    c.update(kw)
    return c


HARD = [
    _case("scaled", [1, 2, 3, 67], "bfloat16", scale=1.0, dist=LARGE),
    _case("scaled_masked", [2, 2, 5, 29], "float16"),
    _case("scaled_masked", [2, 1, 3, 13], "float32", mask_batch="1", mask_frac=1.0),
    _case("scaled_upper_triang", [3, 1, 31, 31], "bfloat16"),
    _case("scaled_aligned_causal", [1, 2, 9, 4], "float32"),     # sq > sk: hidden rows
    _case("scaled_aligned_causal", [2, 1, 5, 37], "float16", dist=LARGE, scale=1.0),
]


def _run(op, case, backends):
    return run_case(get_spec(op), case, backends=backends, device=DEVICE)


@needs_triton
@pytest.mark.parametrize("op", ["softmax_fwd", "softmax_bwd"])
def test_triton_passes_hard_cases(op):
    for case in HARD:
        rep = _run(op, case, ["torch", "triton"])
        assert rep.outcomes["triton"].status == "ok", rep.describe()
        assert rep.verdict == "pass", rep.describe()


@needs_triton
@interpreter_only
@pytest.mark.parametrize("patch, cases", [
    # the causal kept-key test one key too generous
    ("_kept", [_case("scaled_upper_triang", [2, 1, 9, 9], "float32"),
               _case("scaled_aligned_causal", [1, 2, 5, 11], "bfloat16")]),
])
def test_triton_seeded_diagonal_bug_is_caught(monkeypatch, patch, cases):
    from tealite.backends.triton import softmax as S

    @triton.jit
    def kept_off_by_one(row, cols, sq, sk):
        q = row % sq
        return cols <= q + (sk - sq) + 1

    monkeypatch.setattr(S, patch, kept_off_by_one)
    for case in cases:
        rep = _run("softmax_fwd", case, ["torch", "triton"])
        assert rep.outcomes["triton"].status == "ok", rep.describe()
        assert any(c.lhs == "triton" and c.rhs == "reference" for c in rep.failures), \
            rep.describe()


@needs_aiter
def test_aiter_softmax_contract_and_exact_mapping():
    declared = {c.entry_point: c for c in contracts.contracts("aiter_triton")}
    assert declared["softmax"].op == "softmax_fwd"
    rep = _run("softmax_fwd", _case("scaled", [2, 3, 5, 67], "float32", scale=1.0, dist=LARGE),
               ["torch", "aiter_triton"])
    assert rep.outcomes["aiter_triton"].status == "ok", rep.describe()
    assert rep.verdict == "pass", rep.describe()
    assert rep.outcomes["aiter_triton"].numerics.entry_point == "softmax"


@needs_aiter
@pytest.mark.parametrize("case, reason", [
    (_case("scaled", [1, 1, 2, 8], "float32", scale=0.5), "only scale == 1.0"),
    (_case("scaled_masked", [1, 1, 2, 8], "float32", scale=1.0), "plain row softmax"),
    (_case("scaled_upper_triang", [1, 1, 8, 8], "float32", scale=1.0), "plain row softmax"),
])
def test_aiter_softmax_refuses_what_it_does_not_compute(case, reason):
    rep = _run("softmax_fwd", case, ["aiter_triton"])
    outcome = rep.outcomes["aiter_triton"]
    assert outcome.status == "unsupported" and reason in outcome.reason, rep.describe()


_COMPILE_FWD = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import softmax as S
sig = {"x_ptr": "*i16", "mask_ptr": "*u8", "y_ptr": "*i16", "sq": "i32", "sk": "i32",
       "scale": "fp32", "rows_per_batch": "i32", "MASK_PER_BATCH": "i32"}
const = {"KIND": 1, "IS_BF16": True, "FILL": -10000.0, "BLOCK": 2048}
sig.update({c: "constexpr" for c in const})
out = {}
for target, asm, pattern in ((("cuda", 90, 32), "ptx", r"div\\.rn\\.f32|cvt\\.rn\\.bf16\\.f32"),
                             (("hip", "gfx942", 64), "amdgcn", r"v_div_fixup_f32")):
    k = triton.compile(ASTSource(S._softmax_fwd_kernel, sig, const), target=GPUTarget(*target),
                       options={"num_warps": 8})
    found = re.findall(pattern, k.asm[asm])
    out[target[0]] = {name: found.count(name) for name in sorted(set(found))}
json.dump(out, sys.stdout)
"""


def test_compiled_forward_divides_once_per_row_and_stores_bf16_natively():
    """Cross-compiled for sm_90 and gfx942 (no TRITON_INTERPRET): one IEEE division per row
    (the reciprocal of the sum; each of the 8 elements a thread holds is a multiply), and on
    CUDA the bf16 store is the native RNE conversion, not the interpreter-safe integer
    rounding.  Measured on an H100 before this: a div_rn per element and the integer rounding
    kept the masked kind instruction-bound at 64 % of copy."""
    ops = compiled_json(_COMPILE_FWD)
    assert ops["cuda"].get("div.rn.f32") == 1, ops
    assert ops["cuda"].get("cvt.rn.bf16.f32", 0) >= 1, ops
    assert ops["hip"].get("v_div_fixup_f32") == 1, ops
