"""FP8 attention as a recipe (``attention_fwd(..., recipe=)``): the front-end's validation,
the torch backend's emulation judged by the ``attention_fwd_fp8`` spec (the reference on the
quantized-dequantized inputs, the attention tier), a wrong scale or descale caught, and the
backends without FP8 attention not taking part (FP8 attention is its own registry op).  No AITER needed (AITER's
FP8 path: tests/test_aiter_attention.py)."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.torch import attention as torch_attention
from tealite_verify.runner import run_case
from tealite_verify.specs import attention_fp8 as fp8spec
from tealite_verify.specs import get_spec

CASES = (fp8spec.make_case("bshd", "none", "float32", d_qk=16, d_v=16),
         fp8spec.make_case("thd", "padding", "float16", lens_q=[5, 0, 3], lens_kv=[7, 2, 3],
                           batch=3, d_qk=16, d_v=16),
         fp8spec.make_case("sbhd", "causal_bottom_right", "bfloat16", sq=7, sk=12, heads_kv=1))


def _torch_report(case):
    return run_case(get_spec(fp8spec.NAME), case, backends=["torch"], device="cpu")


@pytest.mark.parametrize("recipe", [R.Float8CurrentScaling(granularity="row"),
                                    R.DelayedScaling(), R.MXBlockScaling(), "e4m3"])
def test_the_front_end_takes_only_a_per_tensor_current_scaling_recipe(recipe):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(tealite.TealiteArgumentError, match="recipe must be a per-tensor FP8"):
        tealite.attention_fwd(q, q, q, recipe=recipe, backend="torch")


@pytest.mark.parametrize("case", CASES, ids=["bshd-fp32", "thd-fp16", "sbhd-bf16"])
def test_the_emulation_passes_and_a_wrong_scale_or_descale_is_caught(case, monkeypatch):
    """The torch emulation (q, k, v quantized with the recipe, dequantized, fp32 attention)
    passes; v's descale doubled, q left unquantized, or the scale used as the descale fail."""
    rep = _torch_report(case)
    assert rep.verdict == "pass", rep.describe()
    good = torch_attention.fp8_dequantized

    def doubled_v(t, r):
        return good(t, r) * (2.0 if t.shape[-1] == case["d_v"] and
                             t.shape[-2] == case["heads_kv"] else 1.0)

    def scale_for_descale(t, r):  # codes * scale instead of codes * scale_inv
        x = good(t, r)
        s = float(torch.finfo(torch.float8_e4m3fn).max) / float(t.abs().amax())
        return x * s * s

    for wrong in (doubled_v, lambda t, r: t.float(), scale_for_descale):
        monkeypatch.setattr(torch_attention, "fp8_dequantized", wrong)
        bad = _torch_report(case)
        assert {c.output for c in bad.failures if c.lhs == "torch"} & {"out", "lse"}, \
            bad.describe()


def test_the_emulation_is_attention_of_the_dequantized_inputs():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 6, 2, 8, generator=g).half() for _ in range(3))
    rec = R.Float8CurrentScaling()
    got = tealite.attention_fwd(q, k, v, recipe=rec, backend="torch")
    want = tealite.attention_fwd(*(torch_attention.fp8_dequantized(t, rec) for t in (q, k, v)),
                                 backend="torch")
    torch.testing.assert_close(got.out, want.out.half(), rtol=0, atol=0)
    torch.testing.assert_close(got.lse, want.lse, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["triton", "sdpa", "aiter"])
def test_backends_without_fp8_attention_never_see_a_recipe(backend):
    """FP8 attention is its own registry op: a backend that implements plain attention only is
    not asked to run a recipe case (it would compute unquantized attention), and the fuzzer /
    differential suite skip it with that reason."""
    from tealite import registry
    from tealite.types import Op
    b = registry.get_backend(backend)
    assert Op.ATTENTION_FWD.value in b.impls and Op.ATTENTION_FWD_FP8.value not in b.impls
