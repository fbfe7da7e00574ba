"""Fused add + RMSNorm + pad (``tealite.add_rmsnorm_pad``): the front end's argument errors,
the reference's single rounding of the residual, and seeded wrong variants caught per backend
kind while the correct backends pass the same cases:

* torch kind (a registered test backend): eps added after the square root, the residual not
  added into residual_out, the padded columns left unwritten (NaN), NaN padding declared
  where the backend writes zeros;
* triton: the real kernel with its RMSNorm helper computing 1 / (sqrt(ms) + eps);
* aiter_triton: AITER's real kernel with the same bug in its ``_rmsmorm_op`` helper, and its
  NaN padding judged without the ``pad_nan_rows`` declaration.

The broad property checks are the differential suite (``pytest -m differential -k
add_rmsnorm_pad``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import tealite
from tealite import registry
from tealite.errors import TealiteArgumentError
from tealite_verify.references import norms as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

OP = "add_rmsnorm_pad"
SPEC = get_spec(OP)
NORMAL = {"kind": "normal", "scale": 1.0}
SMALL = {"kind": "normal", "scale": 0.1}  # rms 0.1: eps 1e-3 moves 1/rms by percents
NAN_ROWS = {"kind": "specials", "frac": 0.05, "sample_dtype": "float32"}


def _case(shape=(9, 40), dtype="float32", residual_dtype="float32", pad=16, eps=1e-5,
          dist=NORMAL, dist_res=NORMAL, seed=3):
    return {"shape": list(shape), "dtype": dtype, "weight_dtype": dtype,
            "residual_dtype": residual_dtype, "pad_to_multiple": pad, "eps": eps,
            "dist": dist, "dist_res": dist_res, "seed": seed}


def _failed_outputs(case, backend):
    """Outputs of ``backend`` that fail against the reference (torch must pass the case)."""
    report = run_case(SPEC, case, backends=["torch", backend], device="cpu")
    assert report.outcomes[backend].status == "ok", report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"], \
        report.describe()
    return {c.output for c in report.failures if c.lhs == backend and c.rhs == "reference"}


def _available(name):
    why = registry.get_backend(name).unavailable_reason()
    return pytest.mark.skipif(why is not None, reason=f"{name} backend: {why}")


# ---- bad input -----------------------------------------------------------------------------

X = torch.ones(4, 10)
W = torch.ones(10)


@pytest.mark.parametrize("kwargs,message", [
    ({"pad_to_multiple": -1}, "pad_to_multiple must be an int >= 0"),
    ({"pad_to_multiple": 16.0}, "pad_to_multiple must be an int >= 0"),
    ({"pad_to_multiple": True}, "pad_to_multiple must be an int >= 0"),
    ({"residual": torch.ones(4, 11)}, "residual must have shape (4, 10)"),
    ({"residual": torch.ones(4, 10, dtype=torch.float64)}, "residual dtype must be one of"),
    ({"residual": torch.ones(4, 10, device="meta")}, "all tensors must be on one device"),
    ({"eps": 0.0}, "eps must be > 0"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    kwargs = {"eps": 1e-5, **kwargs}
    with pytest.raises(TealiteArgumentError) as e:
        tealite.add_rmsnorm_pad(X, W, backend="torch", **kwargs)
    assert message in str(e.value)


def test_weight_length_and_a_half_precision_residual_of_fp32_x_are_refused():
    with pytest.raises(TealiteArgumentError, match=r"weight must have shape \(10,\)"):
        tealite.add_rmsnorm_pad(X, torch.ones(12), eps=1e-5)
    with pytest.raises(TealiteArgumentError, match=r"residual dtype must be one of \(float32"):
        tealite.add_rmsnorm_pad(X, W, eps=1e-5, residual=X.to(torch.bfloat16))


def test_result_shape_and_no_residual():
    r = tealite.add_rmsnorm_pad(torch.ones(2, 3, 37), torch.ones(37), eps=1e-5,
                                pad_to_multiple=16, backend="torch")
    assert isinstance(r, tealite.AddRMSNormPad)
    assert r.y.shape == (2, 3, 48) and r.residual_out is None
    assert torch.equal(r.y[..., 37:], torch.zeros(2, 3, 11))


# ---- the reference's rounding of the residual ------------------------------------------------

def test_round_once_is_a_single_rounding_where_a_cast_through_float32_is_two():
    v = 1 + 2.0**-8 + 2.0**-30  # just above a bf16 tie; float32 rounds it onto the tie
    assert float(np.float32(v).astype(ml_dtypes.bfloat16)) == 1.0
    assert float(ref.round_once(np.array(v), "bfloat16")) == 1.0078125
    assert float(ref.round_once(np.array(-v), "float16")) == float(np.float16(-v))
    assert np.isinf(ref.round_once(np.array([1e300]), "bfloat16")).all()
    # Why the front end refuses a bf16 residual with float32 x: two float32 operands added
    # in float32, then rounded to bf16, are not correctly rounded (the spec's exact tier for
    # residual_out would not hold).
    a, b = torch.tensor(1.0), torch.tensor(2.0**-8 + 2.0**-30)
    assert float((a + b).to(torch.bfloat16)) == 1.0
    assert float(ref.round_once(np.array(1.0 + 2.0**-8 + 2.0**-30), "bfloat16")) == 1.0078125


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_fp32_add_then_one_rounding_equals_the_correctly_rounded_sum(dtype):
    """The derivation behind residual_out's exact tier (specs/norms.py): two p-bit operands
    added in float32 and rounded to p bits give the correctly rounded sum; checked over
    operands spread across every binade, ties and cancellation included."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**15, 2**15, (2, 200_000), generator=g, dtype=torch.int32)
    a, b = bits.to(torch.int16).view(dtype).double()
    b = torch.where(torch.rand(b.shape, generator=g) < 0.3, -a * 1.001, b).to(dtype).double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[ok], b[ok]
    kernel = (a.float() + b.float()).to(dtype)
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    want = ref.round_once((a + b).numpy(), name)
    got = kernel.view(torch.int16).numpy().view(want.dtype)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got.astype(np.float32))
                                                               & np.isnan(want.astype(np.float32)))
    assert same.all()


# ---- the correct backends pass the cases the seeded variants fail ---------------------------

CASES = [_case(), _case(pad=0, residual_dtype=None), _case(eps=1e-3, dist=SMALL, dist_res=SMALL),
         _case(shape=(5, 131), dtype="float16", residual_dtype="float16", pad=128),
         _case(dist=NAN_ROWS, dist_res=NAN_ROWS, pad=24)]


@pytest.mark.parametrize("backend", ["triton", "aiter_triton"])
@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_kernels_pass_the_cases(backend, case, triton_device):
    b = registry.get_backend(backend)
    if b.unavailable_reason() is not None:
        pytest.skip(f"{backend}: {b.unavailable_reason()}")
    # the kernels' device: the interpreter's CPU, or the GPU they compiled for
    report = run_case(SPEC, case, backends=[backend, "torch"], device=triton_device)
    assert report.outcomes[backend].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


# ---- torch kind: a registered implementation with one thing wrong ---------------------------

def _torch_variant(bug):
    def fn(x, weight, *, eps, residual, pad_to_multiple, hidden_out):
        r = x.float() if residual is None else x.float() + residual.float()
        ms = (r * r).mean(dim=-1, keepdim=True)
        rs = 1.0 / (ms.sqrt() + eps) if bug == "eps_after_sqrt" else torch.rsqrt(ms + eps)
        y = (r * rs * weight.float()).to(x.dtype)
        fill = float("nan") if bug == "pad_unwritten" else 0.0
        out = torch.full((*x.shape[:-1], hidden_out), fill, dtype=x.dtype)
        out[..., :x.shape[-1]] = y
        res = x.float() if bug == "residual_not_added" else r
        return out, None if residual is None else res.to(residual.dtype)
    return fn


@pytest.mark.parametrize("bug,case,output", [
    ("eps_after_sqrt", CASES[2], "y"),
    ("residual_not_added", CASES[0], "residual_out"),
    ("pad_unwritten", CASES[0], "y_pad"),
    ("nan_padding_declared", CASES[4], "y_pad"),
])
def test_seeded_torch_kind_variant_is_caught(make_backend, bug, case, output):
    b = make_backend("add_rms_seeded")
    numerics = {"compute_dtype": torch.float32, "pad_nan_rows": bug == "nan_padding_declared"}
    b.implements(OP, dtypes=(torch.float32, torch.float16, torch.bfloat16),
                 numerics=numerics)(_torch_variant(bug))
    assert output in _failed_outputs(case, b.name)


# ---- triton: the real kernel with its RMSNorm helper changed ---------------------------------

@triton.jit
def _rms_eps_after_sqrt(x, g, b, mask, H_F, eps, RMS: tl.constexpr):
    ms = tl.math.div_rn(tl.sum(x * x, axis=0), H_F)
    rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms) + eps)
    return x * rs * g, 0.0, rs


@_available("triton")
def test_seeded_triton_kernel_is_caught(make_backend, monkeypatch):
    from tealite.backends.triton import INTERPRET
    from tealite.backends.triton import norms as tn
    if not INTERPRET:
        pytest.skip("a seeded helper is read at run time only by the interpreter")
    good = registry.get_backend("triton").impls[OP]
    b = make_backend("triton_add_rms_seeded")

    def fn(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(tn, "norm_row_fwd", _rms_eps_after_sqrt)
            return good.fn(*args, **kwargs)
    b.implements(OP, numerics=good.numerics)(fn)
    assert "y" in _failed_outputs(CASES[2], b.name)


# ---- aiter_triton: AITER's kernel with its helper changed, its declaration removed -----------

@triton.jit
def _aiter_eps_after_sqrt(row, weight, n_cols, epsilon):
    ms = tl.sum(row * row, axis=-1) / n_cols
    return row * (1.0 / (tl.sqrt(ms) + epsilon)) * weight


def _aiter_kernel_module():
    import sys
    from tealite.backends.aiter_triton import kernels
    fn = kernels().functions["fused_add_rmsnorm_pad"]
    return sys.modules[fn.__globals__["_fused_add_rmsnorm_pad"].fn.__module__]


@_available("aiter_triton")
def test_seeded_aiter_kernel_is_caught(monkeypatch):
    from tealite.backends.aiter_triton import INTERPRET
    if not INTERPRET:
        pytest.skip("a seeded helper is read at run time only by the interpreter")
    assert run_case(SPEC, CASES[2], backends=["aiter_triton"], device="cpu").verdict == "pass"
    monkeypatch.setattr(_aiter_kernel_module(), "_rmsmorm_op", _aiter_eps_after_sqrt)
    assert "y" in _failed_outputs(CASES[2], "aiter_triton")


@_available("aiter_triton")
def test_aiter_nan_padding_needs_its_declaration(make_backend):
    """AITER writes NaN into the padding of a row holding a NaN: declared, it passes (above);
    the same kernel declared like tealite's own (zeros) fails on y_pad."""
    good = registry.get_backend("aiter_triton").impls[OP]
    y = tealite.add_rmsnorm_pad(torch.tensor([[1.0, float("nan"), 2.0]]), torch.ones(3),
                                eps=1e-5, pad_to_multiple=4, backend="aiter_triton").y
    assert torch.isnan(y[0, 3])
    b = make_backend("aiter_add_rms_undeclared")
    b.implements(OP, numerics={"compute_dtype": torch.float32})(good.fn)
    assert _failed_outputs(CASES[4], b.name) == {"y_pad"}


@_available("aiter_triton")
def test_aiter_no_residual_runs_only_because_the_loader_leaves_assumes_unchecked(monkeypatch):
    """Without a residual AITER passes residual strides 0 against its kernel's
    ``tl.assume(res_stride_m > 0)``: checked, the interpreter raises "Assume failed"; the
    loader leaves AITER's assumes unchecked (the residual is then never read), so the case
    runs and matches torch."""
    import contextlib
    from tealite.backends.aiter_common import _loader_launch
    from tealite.backends.aiter_triton import INTERPRET, kernels
    if not INTERPRET:
        pytest.skip("the interpreter's assume check")
    x, w = torch.randn(3, 8), torch.ones(8)
    run = kernels().functions["fused_add_rmsnorm_pad"]
    assert run(x, w, 1e-5, None, 0).shape == (3, 8)
    monkeypatch.setattr(_loader_launch, "interpreter_assume_unchecked", contextlib.nullcontext)
    assert run(x, w, 1e-5, x.clone(), 0)[0].shape == (3, 8)  # strides > 0: the assume holds
    with pytest.raises(Exception, match="Assume failed"):
        run(x, w, 1e-5, None, 0)
