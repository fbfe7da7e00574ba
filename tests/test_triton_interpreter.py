"""The triton backend under Triton's CPU interpreter: it runs (when TRITON_INTERPRET=1, as in
CI), and the interpreter path still catches a seeded kernel bug."""
from __future__ import annotations

import pytest
import torch

from tealite import registry
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
# The same tests on a GPU run the compiled kernels on CUDA tensors.
DEV = "cpu" if TRITON.unavailable_reason() or "cpu" in TRITON.impls["quantize"].support.devices \
    else "cuda"

CASE = {"recipe": {"kind": "current", "fmt": "e4m3fnuz", "granularity": "tensor",
                   "force_pow2_scales": False, "amax_epsilon": 0.0, "saturation": "saturate"},
        "dtype": "bfloat16", "shape": [37, 70], "rowwise": True, "columnwise": True,
        "pad": False, "dist": {"kind": "quant_edges", "fmt": "e4m3fnuz", "block": 32},
        "seed": 3}


def test_triton_quantize_matches_reference_bit_exactly():
    report = run_case(get_spec("quantize"), CASE, backends=["triton", "torch"], device=DEV)
    assert report.verdict == "pass", report.describe()
    assert report.outcomes["triton"].status == "ok"


@pytest.mark.parametrize("wrong", [{"BIAS": 7}, {"MBITS": 2}, {"EMIN": -6}],
                         ids=["ocp-bias-on-fnuz", "mantissa-width", "subnormal-threshold"])
def test_seeded_kernel_bug_is_caught_under_the_interpreter(make_backend, monkeypatch, wrong):
    """The same kernel launched with one wrong format constant (e.g. OCP's bias 7 for
    E4M3FNUZ's 8) must be reported, through the interpreter, by the harness."""
    from tealite.backends.triton import quantize as tq
    good = tq._fmt_constants
    b = make_backend("triton_seeded")

    def seeded_quantize(x, recipe, *, rowwise, columnwise, scale):
        with monkeypatch.context() as m:
            m.setattr(tq, "_fmt_constants", lambda fmt: dict(good(fmt), **wrong))
            return tq.quantize(x, recipe, rowwise=rowwise, columnwise=columnwise, scale=scale)

    b.implements("quantize", devices=TRITON.impls["quantize"].support.devices)(seeded_quantize)
    report = run_case(get_spec("quantize"), CASE, backends=["torch", b.name], device=DEV)
    assert report.outcomes[b.name].status == "ok"
    bad = {c.output for c in report.failures if c.lhs == b.name and c.rhs == "reference"}
    assert "data" in bad and "columnwise_data" in bad, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]


def test_interpreter_bf16_workarounds_round_to_nearest_even():
    """bf16 outputs of the norm kernel are RNE (the interpreter's own bf16 store truncates)
    and bf16 subnormal inputs are read exactly (its own bf16 load mangles them)."""
    import tealite
    x = torch.tensor([[7.62234618111327e-39]], dtype=torch.float32).bfloat16().to(DEV)
    r = tealite.rmsnorm_fwd(x, torch.ones(1, dtype=torch.bfloat16, device=DEV), eps=1.0,
                            backend="triton")
    want = (x.float() / torch.sqrt(x.float() ** 2 + 1.0)).bfloat16()
    assert torch.equal(r.y.view(torch.int16), want.view(torch.int16))
    beta = torch.tensor([0.39229682], device=DEV)
    ln = tealite.layernorm_fwd(torch.zeros(1, 1, dtype=torch.bfloat16, device=DEV),
                               torch.ones(1, device=DEV), beta, backend="triton")
    assert ln.y.item() == 0.392578125  # RNE; truncation would give 0.390625


def test_interpreter_decodes_an_fp8_nan_code_as_a_finite_value():
    """Why aiter_triton's qgemm rejects NaN FP8 operand codes under the interpreter
    (tealite/backends/aiter_triton/qgemm.py: INTERPRETER_FP8_NAN): e4m3fn 0x7F, converted or
    fed to tl.dot, comes out as 480.0.  If a Triton release fixes this, this test fails and
    the rejection can go."""
    import os

    import triton
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a fact about Triton's CPU interpreter")

    @triton.jit
    def convert(x_ptr, o_ptr, DOT: tl.constexpr):
        i = tl.arange(0, 16)
        x = tl.load(x_ptr + i[:, None] * 16 + i[None, :])
        if DOT:
            tl.store(o_ptr + i[:, None] * 16 + i[None, :], tl.dot(x, x))
        else:
            tl.store(o_ptr + i[:, None] * 16 + i[None, :], x.to(tl.float32))

    x = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    x.view(torch.uint8)[0, 0] = 0x7F
    assert torch.isnan(x[0, 0].float())  # torch's decode: NaN
    out = torch.empty(16, 16)
    convert[(1,)](x, out, DOT=False)
    assert out[0, 0].item() == 480.0
    convert[(1,)](x, out, DOT=True)
    assert out[0, 0].item() == 480.0 ** 2  # x[0, 0] * x[0, 0]: a NaN would give NaN
