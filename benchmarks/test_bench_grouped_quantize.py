"""Grouped quantize (+ dbias), issue 16, against the in-run device copy: tealite's Triton kernels
(one launch over all groups for FP8 per-tensor and 1x128 blocks), the split path they must
equal bit for bit (the Triton ``quantize`` once per group) and the torch backend, on bf16 x
cut by an even and a skewed ``m_splits``.  The target is quantize's (85 % of copy): grouping
adds per-group scales but no traffic.  Bytes: every group's quantize bytes
(``_cases.quantize_bytes``) plus dbias (G, K) in x's dtype."""
from __future__ import annotations

import pytest
import torch

import tealite
import tealite.recipes as R
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn

QUANT = C.TARGETS["quantize"][1]
# (total rows, hidden) and the splits: 8 experts even and skewed (one expert holding half the
# tokens, two empty); tiny: the smoke run's interpreter shapes.
SPLITS = {
    "large": (8192, {"even": [1024] * 8,
                     "skewed": [4096, 0, 1024, 1024, 0, 1024, 512, 512]}),
    "tiny": (128, {"even": [16] * 2, "skewed": [27, 0, 5]}),
}
VARIANTS = {
    "fp8-tensor-row": (R.Float8CurrentScaling(), True, False, False),
    "fp8-tensor-ct-dbias": (R.Float8CurrentScaling(), True, True, True),
    "fp8-block1x128-row": (R.Float8BlockScaling(), True, False, False),
    "fp8-block1x128-ct-dbias": (R.Float8BlockScaling(), True, True, True),
}


def grouped_bytes(recipe, splits, k, *, rowwise, columnwise, dbias, itemsize) -> int:
    total = sum(C.quantize_bytes(recipe, m, k, rowwise=rowwise, columnwise=columnwise,
                                 in_itemsize=itemsize) for m in splits)
    return total + (itemsize * len(splits) * k if dbias else 0)


def _split_path(x, splits, recipe, rowwise, columnwise):
    def run():
        return [tealite.quantize(part, recipe, rowwise=rowwise, columnwise=columnwise,
                                 backend="triton") for part in torch.split(x, splits)]
    return run


@pytest.mark.parametrize("split", ["even", "skewed"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("backend", ["triton", "triton-split", "torch"])
def test_grouped_quantize(bench, bench_config, copy_reference, backend, variant, split):
    k, all_splits = SPLITS["tiny" if bench_config.size == "tiny" else "large"]
    splits = all_splits[split]
    recipe, rowwise, columnwise, dbias = VARIANTS[variant]
    x = _bf16_randn((sum(splits), k), bench_config.device, 5)
    if backend == "triton-split":
        if dbias:
            pytest.skip("the split path has no dbias (it is grouped quantize's fused pass)")
        fn = _split_path(x, splits, recipe, rowwise, columnwise)
    else:
        def fn():
            return tealite.grouped_quantize(x, splits, recipe, rowwise=rowwise,
                                            columnwise=columnwise, dbias=dbias,
                                            backend=backend)
    bench.run(fn, group="grouped_quantize", kernel=f"grouped_quantize {variant} {split}",
              backend=backend, shape=x.shape, dtype=x.dtype,
              nbytes=grouped_bytes(recipe, splits, k, rowwise=rowwise, columnwise=columnwise,
                                   dbias=dbias, itemsize=x.element_size()),
              reference=copy_reference, target_pct=QUANT if backend == "triton" else None,
              variant=variant)
