"""Memory-bound ops against the in-run device copy: quantize (every recipe family, rowwise and
cast-transpose) and RMSNorm / LayerNorm forward, tealite's triton backend with the torch
backend as a fallback reference, and AITER's Triton kernels side by side."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite.ops.norms import padded_hidden
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter

BF16 = torch.bfloat16
QUANT, NORM = C.TARGETS["quantize"][1], C.TARGETS["norm"][1]
# The torch backend is timed only where the earlier record has it (FP8 per-tensor / per-row).
TORCH_QUANT_ROWS = ("fp8-tensor-row", "fp8-perrow")
QUANT_CASES = [pytest.param(v, "triton", id=f"{v.id}-triton") for v in C.quant_variants()] + \
    [pytest.param(v, "torch", id=f"{v.id}-torch") for v in C.quant_variants()
     if v.id in TORCH_QUANT_ROWS]


@pytest.fixture(scope="module")
def x(bench_config):
    s = bench_config.sizes
    return _bf16_randn((s.rows, s.hidden), bench_config.device, 1)


@pytest.fixture(scope="module")
def weights(bench_config):
    h = bench_config.sizes.hidden
    return (_bf16_randn((h,), bench_config.device, 2), _bf16_randn((h,), bench_config.device, 3))


def test_copy(bench, bench_config, copy_reference):
    cfg = bench_config
    src = _bf16_randn((cfg.sizes.copy_elems,), cfg.device, 0)
    dst = torch.empty_like(src)
    bench.run(lambda: dst.copy_(src), group="copy", kernel="device copy (dst.copy_(src))",
              backend="torch", shape=src.shape, dtype=BF16, nbytes=2 * src.nbytes,
              reference=copy_reference)


@pytest.mark.parametrize("variant,backend", QUANT_CASES)
def test_quantize(bench, x, copy_reference, variant, backend):
    m, k = x.shape
    nbytes = C.quantize_bytes(variant.recipe, m, k, rowwise=variant.rowwise,
                              columnwise=variant.columnwise, in_itemsize=x.element_size())
    bench.run(lambda: tealite.quantize(x, variant.recipe, rowwise=variant.rowwise,
                                       columnwise=variant.columnwise, backend=backend),
              group="quantize", kernel=f"quantize {variant.label}", backend=backend,
              shape=x.shape, dtype=x.dtype, nbytes=nbytes, reference=copy_reference,
              target_pct=QUANT if backend == "triton" else None, variant=variant.id)


def _norm_call(kind, x, g, b, backend):
    if kind == "rmsnorm":
        return lambda: tealite.rmsnorm_fwd(x, g, backend=backend)
    return lambda: tealite.layernorm_fwd(x, g, b, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm_fwd(bench, x, weights, copy_reference, kind, backend):
    g, b = weights
    m, h = x.shape
    bench.run(_norm_call(kind, x, g, b, backend), group="norm", kernel=f"{kind}_fwd",
              backend=backend, shape=x.shape, dtype=x.dtype,
              nbytes=C.norm_bytes(kind, m, h, x.element_size()), reference=copy_reference,
              target_pct=NORM if backend == "triton" else None)


ADD_PAD = 256  # pads a hidden size that is not a multiple of 256 (a multiple: no padding)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_add_rmsnorm_pad(bench, x, weights, copy_reference, backend):
    """Fused residual add + RMSNorm + hidden padding (issue 17; AITER's row below)."""
    g, _ = weights
    m, h = x.shape
    res = _bf16_randn((m, h), x.device, 4)
    h_out = padded_hidden(h, ADD_PAD)
    bench.run(lambda: tealite.add_rmsnorm_pad(x, g, eps=1e-5, residual=res,
                                              pad_to_multiple=ADD_PAD, backend=backend),
              group="norm", kernel=f"add_rmsnorm_pad (pad to {ADD_PAD})", backend=backend,
              shape=x.shape, dtype=x.dtype, reference=copy_reference,
              nbytes=C.add_rmsnorm_pad_bytes(m, h, h_out, x.element_size()))


# ---- AITER's Triton kernels (loaded without ROCm), same shapes --------------------------

@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm_fwd_aiter(bench, aiter, x, weights, copy_reference, kind):
    g, b = weights
    m, h = x.shape
    name = "rms_norm" if kind == "rmsnorm" else "layer_norm"
    need_aiter(aiter, name)
    fn = (lambda: aiter.rms_norm(x, g, 1e-5)) if kind == "rmsnorm" else \
        (lambda: aiter.layer_norm(x, g, b, 1e-5))
    bench.run(fn, group="norm", kernel=f"{kind}_fwd", backend=f"aiter {name}", shape=x.shape,
              dtype=x.dtype, nbytes=C.norm_bytes(kind, m, h, x.element_size()),
              reference=copy_reference, foreign=True)


def test_add_rmsnorm_pad_aiter(bench, aiter, x, weights, copy_reference):
    g, _ = weights
    m, h = x.shape
    need_aiter(aiter, "fused_add_rmsnorm_pad")
    res = _bf16_randn((m, h), x.device, 4)
    h_out = padded_hidden(h, ADD_PAD)
    bench.run(lambda: aiter.fused_add_rmsnorm_pad(x, g, 1e-5, res, ADD_PAD), group="norm",
              kernel=f"add_rmsnorm_pad (pad to {ADD_PAD})", backend="aiter fused_add_rmsnorm_pad",
              shape=x.shape, dtype=x.dtype, reference=copy_reference, foreign=True,
              nbytes=C.add_rmsnorm_pad_bytes(m, h, h_out, x.element_size()))


def test_quantize_mxfp4_aiter(bench, aiter, x, copy_reference):
    """AITER's MXFP4 quant (EVEN scales, ties-away elements: AITER's Triton convention)."""
    need_aiter(aiter, "dynamic_mxfp4_quant")
    m, k = x.shape
    recipe = tealite.recipes.MXFP4BlockScaling("even", "ties_away")
    bench.run(lambda: aiter.dynamic_mxfp4_quant(x), group="quantize",
              kernel="quantize MXFP4 (e2m1, EVEN, ties-away), rowwise",
              backend="aiter dynamic_mxfp4_quant", shape=x.shape, dtype=x.dtype,
              nbytes=C.quantize_bytes(recipe, m, k, rowwise=True, columnwise=False,
                                      in_itemsize=x.element_size()),
              reference=copy_reference, foreign=True, variant="mxfp4-row")


@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_quantize_fp8_aiter(bench, aiter, x, copy_reference, granularity):
    """AITER's dynamic FP8 quant: per-token (one pass) or per-tensor (atomic-max amax kernel,
    then a cast kernel: two reads of x, charged as one)."""
    name = f"dynamic_per_{'token' if granularity == 'row' else 'tensor'}_quant_fp8_i8"
    need_aiter(aiter, name)
    m, k = x.shape
    qx = torch.empty((m, k), dtype=aiter.fp8_dtype, device=x.device)
    scale = torch.zeros(m if granularity == "row" else 1, dtype=torch.float32, device=x.device)
    if granularity == "row":
        def fn():
            return aiter.dynamic_per_token_quant_fp8_i8(qx, x, scale)
    else:
        def fn():
            scale.zero_()  # the amax kernel atomically max-reduces into it
            return aiter.dynamic_per_tensor_quant_fp8_i8(qx, x, scale)
    recipe = tealite.recipes.Float8CurrentScaling(granularity=granularity)
    label = "per-row (per-token)" if granularity == "row" else "per-tensor"
    bench.run(fn, group="quantize", kernel=f"quantize FP8 {label}, rowwise",
              backend=f"aiter {name}", shape=x.shape, dtype=x.dtype,
              nbytes=C.quantize_bytes(recipe, m, k, rowwise=True, columnwise=False,
                                      in_itemsize=x.element_size(), amax=False),
              reference=copy_reference, foreign=True,
              variant="fp8-perrow" if granularity == "row" else "fp8-tensor-row")
