"""Transpose (issue 17 part 4): bad input, bit-exact transposes of plain tensors and FP8 codes on
torch and Triton (interpreted) over odd shapes and strides, fp8_transpose equal to quantizing
with columnwise=True where it is a transpose (and refused, with the reason, where it is not),
and the exact tier catching a wrong transpose while passing a correct one written otherwise."""
from __future__ import annotations

import pytest
import torch

import tealite
import tealite.recipes as R
from tealite import registry
from tealite.errors import TealiteArgumentError
from tealite.formats import FP8_FORMATS, get_format
from tealite.training_types import TRANSPOSE_DTYPES
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from _helpers_cross_compile import compiled_json

SPEC = get_spec("transpose")
TRITON = registry.get_backend("triton").unavailable_reason() is None
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not TRITON, reason="triton backend unavailable (set TRITON_INTERPRET=1 or run on a GPU)"))]
SHAPES = [(0, 5), (5, 0), (1, 1), (1, 33), (31, 1), (37, 67), (64, 32), (33, 97)]


def _bits(t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _random(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape, torch.empty((), dtype=dtype).element_size()),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)  # every bit pattern: NaN payloads, -0, subnormals


# ---- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("x, match", [
    (torch.zeros(2, 3, 4), r"x must be 2-D, got shape \(2, 3, 4\)"),
    (torch.zeros(4, dtype=torch.float64).reshape(2, 2), r"x dtype must be one of \(float32, "),
    ([[1.0]], "x must be a torch.Tensor, got list"),
])
def test_bad_input_names_the_argument(x, match):
    with pytest.raises(TealiteArgumentError, match=match):
        tealite.transpose(x)


@pytest.mark.parametrize("recipe", [R.Float8CurrentScaling(granularity="row"),
                                    R.Float8BlockScaling(), R.MXFP8BlockScaling()],
                         ids=["per-row", "block1x128", "mxfp8"])
def test_fp8_transpose_refuses_row_scaled_recipes(recipe):
    q = tealite.quantize(torch.randn(64, 64), recipe, backend="torch")
    with pytest.raises(TealiteArgumentError, match="q: .* scales along the row .* "
                                                   "quantize with columnwise=True"):
        tealite.fp8_transpose(q)


def test_fp8_transpose_needs_rowwise_data():
    q = tealite.quantize(torch.randn(8, 8), R.Float8CurrentScaling(), rowwise=False,
                         columnwise=True, backend="torch")
    with pytest.raises(TealiteArgumentError, match="q has no rowwise data"):
        tealite.fp8_transpose(q)


# ---- bit-exact transposes --------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
def test_transpose_is_bit_exact(backend, dtype, triton_device):
    device = triton_device if backend == "triton" else "cpu"
    for i, shape in enumerate(SHAPES):
        x = _random(shape, dtype, i).to(device)
        y = tealite.transpose(x, backend=backend)
        assert y.shape == shape[::-1] and y.dtype == dtype and y.is_contiguous()
        assert torch.equal(_bits(y).cpu(), _bits(x.t()).cpu()), shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_transpose_follows_strides(backend, triton_device):
    device = triton_device if backend == "triton" else "cpu"
    base = torch.randn(70, 90, device=device)
    for x in (base[::3, 7:], base.t(), base[5:6], base[:, 4:5]):
        assert torch.equal(tealite.transpose(x, backend=backend), x.t())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
@pytest.mark.parametrize("recipe_of", [
    lambda f: R.Float8CurrentScaling(f), lambda f: R.DelayedScaling(f),
    lambda f: R.Float8BlockScaling(f, block=(128, 128))], ids=["current", "delayed", "128x128"])
def test_fp8_transpose_is_columnwise_quantization(backend, fmt, recipe_of, triton_device):
    """TE's cast-transpose semantics: the columnwise codes and scales quantize_columnwise
    writes are the transposed rowwise ones, where the scales do not depend on direction."""
    recipe = recipe_of(fmt)
    x = torch.randn(131, 259) * 3
    kw = {"scale": torch.tensor([0.75])} if recipe.scale_given else {}
    q = tealite.quantize(x, recipe, backend="torch", **kw)
    want = tealite.quantize(x, recipe, rowwise=False, columnwise=True, backend="torch", **kw)
    device = triton_device if backend == "triton" else "cpu"
    q_dev = tealite.types.QuantizedTensor(recipe=recipe, shape=q.shape, data=q.data.to(device),
                                          scale_inv=q.scale_inv.to(device))
    got = tealite.fp8_transpose(q_dev, backend=backend)
    assert got.columnwise_data.dtype == get_format(fmt).torch_dtype
    assert torch.equal(_bits(got.columnwise_data).cpu(), _bits(want.columnwise_data))
    assert torch.equal(got.columnwise_scale_inv.cpu(), want.columnwise_scale_inv)
    assert got.data is q_dev.data, "the rowwise fields are kept"


# ---- the exact tier judges transposes ----------------------------------------------------------

def _verdicts(make_backend, name, fn, case):
    b = make_backend(name)
    b.implements("transpose", like="torch")(fn)
    report = run_case(SPEC, case, backends=[b.name], pairwise=False)
    return [c.metrics.passed for c in report.comparisons]


SQUARE_CASE = dict(SPEC.smoke_cases[0], shape=[33, 33])


def test_a_correct_transpose_written_otherwise_passes(make_backend):
    def by_rows(x):  # row i of x becomes column i of y, one copy at a time
        y = torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype)
        for i in range(x.shape[0]):
            y[:, i] = x[i]
        return y

    assert all(_verdicts(make_backend, "tr_by_rows", by_rows, SQUARE_CASE))


@pytest.mark.parametrize("wrong", [
    lambda x: x.contiguous().view(x.shape[1], x.shape[0]),  # a reshape, not a transpose
    lambda x: x.clone(),                                     # square: the shape still fits
    lambda x: x.t().contiguous().flip(1),                    # columns reversed
], ids=["reshape", "identity", "flipped"])
def test_a_wrong_transpose_is_caught(make_backend, wrong):
    assert not all(_verdicts(make_backend, "tr_wrong", wrong, SQUARE_CASE))


# ---- AITER's HIP partial_transpose, against a fake aiter (no ROCm here) -------------------------

@pytest.fixture
def fake_aiter(monkeypatch):
    """A fake ``aiter`` whose ``partial_transpose`` does what quant_kernels.cu does (and checks
    the arguments the kernel relies on); every other entry point must not be called."""
    import sys
    import types

    from tealite.backends import aiter as A

    fake = types.ModuleType("aiter")
    fake.calls = []
    setattr(fake, A.FAKE_DEVICES_ATTR, ("cpu",))
    setattr(fake, A.FAKE_ARCH_ATTR, "gfx942")

    def partial_transpose(out, input, num_rows):
        assert out.is_contiguous() and input.is_contiguous()
        assert input.dtype in (torch.float32, torch.float16, torch.bfloat16)
        assert num_rows.dtype == torch.int32 and num_rows.shape == (1,)
        cols, n = input.shape[-1], int(num_rows[0])
        assert 0 < cols <= 8192
        out.view(-1)[: n * cols] = input.reshape(-1, cols)[:n].t().reshape(-1)
        fake.calls.append("partial_transpose")

    def never(*a, **k):
        raise AssertionError("only partial_transpose may be called")

    for name in A.ENTRY_POINTS:
        setattr(fake, name, partial_transpose if name == "partial_transpose" else never)
    monkeypatch.setitem(sys.modules, "aiter", fake)
    A.reset()
    with A.PLATFORM.override(rocm=True, gpu_visible=True):
        yield fake
    A.reset()


def test_aiter_partial_transpose_adapter(fake_aiter):
    report = run_case(SPEC, dict(SPEC.smoke_cases[0]), backends=["aiter", "torch"])
    assert report.outcomes["aiter"].status == "ok", report.outcomes["aiter"].reason
    assert report.outcomes["aiter"].numerics.entry_point == "partial_transpose"
    assert fake_aiter.calls and report.verdict == "pass", report.failures


@pytest.mark.parametrize("x, reason", [
    (torch.zeros(4, 4, dtype=torch.float8_e4m3fn), "float32 / float16 / bfloat16 only"),
    (torch.zeros(2, 8193), "no launch for more than 8192 columns"),
    (torch.zeros(3, 0), "no launch for 0 columns"),
])
def test_aiter_partial_transpose_refusals(fake_aiter, x, reason):
    with pytest.raises(tealite.UnsupportedCase, match=reason):
        tealite.transpose(x, backend="aiter")


# ---- the kernel as compiled for the GPUs (CI has none: cross-compiled) ---------------------------

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import transpose as TT
out = {}
for target in (("cuda", 90, 32), ("hip", "gfx942", 64)):
    for bits in ("*u8", "*i16", "*i32"):
        sig = {"x": bits, "y": bits, "M": "i32", "N": "i32", "sxm": "i32", "sxn": "i32",
               "BM": "constexpr", "BN": "constexpr"}
        k = triton.compile(ASTSource(TT._transpose_kernel, sig, {"BM": TT.TILE, "BN": TT.TILE}),
                           target=GPUTarget(*target))
        out[f"{target[0]}{bits}"] = len(k.asm["cubin" if target[0] == "cuda" else "hsaco"])
json.dump(out, sys.stdout)
"""


def test_kernel_compiles_for_sm90_and_gfx942():
    """Cross-compiled in a fresh process without TRITON_INTERPRET (the interpreter forgives
    what a compiled kernel does not), for every element width the backend launches."""
    pytest.importorskip("triton")
    sizes = compiled_json(_COMPILE)
    assert len(sizes) == 6 and all(sizes.values()), sizes
