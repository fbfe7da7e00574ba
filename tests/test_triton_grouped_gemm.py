"""tealite's Triton grouped GEMM (backends/triton/grouped_gemm.py) under Triton's CPU
interpreter (CI) or on a GPU: every layout, empty / prime / lopsided splits, bias, accumulate
(an empty group's -0 kept), shared weights, against the float64 reference and bit for bit
against the split path (a loop of the triton dense gemm / qgemm) where declared; FP8
per-tensor / per-row / block grouped qgemm (MX: test_triton_grouped_qgemm_mx.py); and
seeded kernel bugs (a wrong group offset, a tile crossing a group boundary) that the harness
catches while the correct kernel passes the same case.  Shapes are tiny: M_total <= 64, N, K <= 64, block
K = 128 or 256."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite import registry
from tealite.backends.triton import INTERPRET
from tealite.moe_types import split_offsets
from tealite.types import Op
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.grouped_gemm import make_case

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
DEVICE = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("grouped_gemm")


def _randn(*shape, generator=None):
    """Operands drawn on the host (seeded CPU generators) and moved to the kernel's device:
    compiled kernels refuse host tensors."""
    return torch.randn(*shape, generator=generator).to(DEVICE)

if TRITON.unavailable_reason() is None:
    from tealite.backends.triton import _grouped_kernels as gk
    from tealite.backends.triton import grouped_gemm as tgg

CASES = {
    "TN-bf16-zeros-bias": make_case("TN", "bfloat16", [5, 0, 17, 1, 0, 13], 40, 48, bias=True),
    "NN-fp16-shared-fp32-out": make_case("NN", "float16", [0, 7, 29], 17, 33,
                                         shared_weight=True, out_dtype="float32"),
    "TN-fp32-one-group-everything": make_case("TN", "float32", [0, 0, 61, 0], 24, 40),
    "TN-bf16-many-small-accumulate": make_case("TN", "bfloat16", [1, 0, 3, 2, 0, 1, 3, 2], 33,
                                               20, accumulate=True, bias=True),
    "NT-fp32-empty-group-accumulate": make_case("NT", "float32", [5, 0, 40, 3], 40, 1, m=24,
                                                accumulate=True),
    "NT-bf16-all-empty": make_case("NT", "bfloat16", [0, 0], 8, 1, m=4),
    "NT-fp16-primes": make_case("NT", "float16", [7, 11, 13], 20, 1, m=17, out_dtype="float32"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_triton_grouped_gemm_matches_reference_and_split_path(name):
    report = run_case(SPEC, CASES[name], backends=["triton", "torch"], device=DEVICE)
    assert report.outcomes["triton"].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


def test_parity_is_declared_exact_only_where_the_tile_loop_is_the_dense_one():
    params = dict(groups=2, m_splits=(3, 4), m=7, n=8, k=8, layout="TN", dtype=torch.bfloat16,
                  out_dtype=torch.bfloat16, bias=False, accumulate=False, shared_weight=False,
                  device=DEVICE)
    num = TRITON.impls[Op.GROUPED_GEMM.value].numerics(params)
    assert num.grouped_matches_split is INTERPRET


def test_accumulate_keeps_an_empty_groups_negative_zeros_and_zeroes_without():
    a, b = _randn(9, 8), _randn(9, 6)
    prior = _randn(3, 6, 8)
    prior[1] = -0.0
    out = tealite.grouped_gemm(a, b, [4, 0, 5], layout="NT", out=prior.clone(),
                               accumulate=True, backend="triton")
    assert torch.equal(out[1], prior[1]) and bool(torch.signbit(out[1]).all())
    fresh = tealite.grouped_gemm(a, b, [4, 0, 5], layout="NT", backend="triton")
    assert bool((fresh[1] == 0).all()) and not bool(torch.signbit(fresh[1]).any())


def test_persistent_programs_walk_several_groups():
    """Fewer programs than tiles (the interpreter runs 3): each program's forward group scan
    crosses empty groups and several boundaries; the result is the split path's, bit for
    bit, with the dense kernel's tiles."""
    splits = [17, 0, 0, 31, 2, 0, 9]
    a, b = _randn(len(splits), 40, 24), _randn(sum(splits), 24)
    out = tealite.grouped_gemm(a, b, splits, layout="TN", backend="triton")
    off = split_offsets(splits)
    for g, rows in enumerate(splits):
        dense = tealite.gemm(a[g], b[off[g]:off[g + 1]], layout="TN", backend="triton").out
        if INTERPRET:
            assert torch.equal(out[off[g]:off[g + 1]], dense), g
        else:
            torch.testing.assert_close(out[off[g]:off[g + 1]], dense)
    cfg = tgg.pick_config(torch.float32)
    tiles = gk.tile_table(splits, cfg.block_m, -(-40 // cfg.block_n))[-1]
    if INTERPRET:  # a GPU runs up to a few programs per SM: these 4 tiles get 4 programs
        assert tgg.programs(tiles, torch.device(DEVICE)) < tiles


# ---- FP8 ------------------------------------------------------------------------------------

def _cur(gran="tensor"):
    return R.Float8CurrentScaling(granularity=gran)


PAIRS = {
    "tensor": (_cur(), _cur()),
    "row": (_cur("row"), _cur("row")),
    "block": (R.Float8BlockScaling(block=(128, 128)), R.Float8BlockScaling(block=(1, 128))),
    "block-1x128-pow2": (R.Float8BlockScaling(block=(1, 128), force_pow2_scales=True),
                         R.Float8BlockScaling(block=(1, 128), force_pow2_scales=True)),
}


def _quantized(pair, splits, n, k, *, layout="TN", shared=False, seed=0):
    ra, rb = PAIRS[pair]
    g = torch.Generator().manual_seed(seed)
    if layout == "NT":
        a = [tealite.quantize(_randn(s, n, generator=g), ra, rowwise=False,
                              columnwise=True, backend="torch") for s in splits]
        b = [tealite.quantize(_randn(s, 24, generator=g), rb, rowwise=False,
                              columnwise=True, backend="torch") for s in splits]
        return a, b
    weights = 1 if shared else len(splits)
    a = [tealite.quantize(_randn(n, k, generator=g), ra, backend="torch")
         for _ in range(weights)]
    b = [tealite.quantize(_randn(s, k, generator=g), rb, backend="torch") for s in splits]
    return (a[0] if shared else a), b


def _split_path(a, b, splits, layout, **kw):
    """The dense triton qgemm per non-empty group, rows (or planes) in order."""
    outs = []
    for g, rows in enumerate(splits):
        a_g = a if not isinstance(a, list) else a[g]
        if rows or layout == "NT":
            outs.append(tealite.qgemm(a_g, b[g], layout=layout, backend="triton", **kw).out)
    return torch.stack(outs) if layout == "NT" else torch.cat(outs)


# Every pair on a ragged split with two 128-long scale blocks; block scaling also with one
# group holding every token.
QCASES = [pytest.param(p, [5, 0, 17, 1], 256, id=f"{p}-ragged") for p in PAIRS] + \
    [pytest.param("block", [0, 40], 128, id="block-one-group")]


@pytest.mark.parametrize("pair,splits,k", QCASES)
def test_grouped_qgemm_is_the_split_path_bit_for_bit(pair, splits, k):
    a, b = _quantized(pair, splits, 40, k, shared=pair == "row")
    bias = _randn(len(splits), 40)
    out = tealite.grouped_qgemm(a, b, splits, layout="TN", out_dtype=torch.float32,
                                bias=bias.bfloat16(), backend="triton")
    split = torch.cat([
        tealite.qgemm(a if not isinstance(a, list) else a[g], b[g], layout="TN",
                      out_dtype=torch.float32, bias=bias.bfloat16()[g], backend="triton").out
        for g, rows in enumerate(splits) if rows])
    assert torch.equal(out, split) if INTERPRET else torch.allclose(out, split)
    _assert_within_fp32_sum_bound(out, a, b, splits, bias.bfloat16(), k)


def _assert_within_fp32_sum_bound(out, a, b, splits, bias, k):
    """Against the float64 product of the dequantized operands: the kernel's products of codes
    are exact and it sums at most K of them in fp32 (interpreter), scales each 128-block
    partial twice (block scaling) and adds the bias once, so
    |err| <= gamma_{K+3}(2^-24) (|B||A|^T + |bias|)."""
    for g, rows in enumerate(splits):
        if not rows:
            continue
        lo = sum(splits[:g])
        deq_b = tealite.dequantize(b[g], backend="torch").double()
        deq_a = tealite.dequantize(a if not isinstance(a, list) else a[g],
                                   backend="torch").double()
        exact = deq_b @ deq_a.t() + bias[g].double()
        # GPU: Hopper's FP8 MMA sums at ~14 bits (qgemm.py's _FP8_MMA_UNIT_ROUNDOFF), which
        # covers the tensor cores' truncating bf16 sums too.
        u = 2.0 ** -24 if INTERPRET else 2.0 ** -13
        gamma = (k + 3) * u / (1 - (k + 3) * u)
        bound = gamma * (deq_b.abs() @ deq_a.abs().t() + bias[g].double().abs())
        err = (out[lo:lo + rows].double() - exact).abs()
        assert bool((err <= bound).all()), (g, (err - bound).max().item())


def test_grouped_qgemm_accumulates_in_fp32_and_rounds_once():
    splits = [3, 0, 9]
    a, b = _quantized("block", splits, 24, 128)
    prior = _randn(sum(splits), 24).bfloat16()
    out = tealite.grouped_qgemm(a, b, splits, layout="TN", out=prior.clone(), accumulate=True,
                                backend="triton")
    split = _split_path(a, b, splits, "TN", out_dtype=torch.float32)
    assert torch.equal(out, (prior.float() + split).bfloat16())


def test_grouped_qgemm_nt_runs_the_dense_kernel_per_group():
    splits = [5, 0, 130]
    a, b = _quantized("tensor", splits, 20, None, layout="NT")
    out = tealite.grouped_qgemm(a, b, splits, layout="NT", out_dtype=torch.float32,
                                backend="triton")
    assert bool((out[1] == 0).all())
    for g in (0, 2):
        dense = tealite.qgemm(a[g], b[g], layout="NT", out_dtype=torch.float32,
                              backend="triton").out
        assert torch.equal(out[g], dense)


# ---- seeded kernel bugs ----------------------------------------------------------------------

def _shifted_offsets(splits):
    """Group g >= 1 starts one row late: its first row is read (and written) as group
    g - 1's."""
    off = list(split_offsets(splits))
    return tuple(o + (1 if 0 < i < len(splits) and o < off[-1] else 0)
                 for i, o in enumerate(off))


def _boundary_crossing_tiles(splits, block_m, n_tiles):
    """Tiles counted on the whole token range, as if groups were not tile-aligned: a tile
    then covers rows of two groups with one weight."""
    total = -(-sum(splits) // block_m) * n_tiles
    return [0] + [total] * len(splits)


@pytest.mark.parametrize("bug", ["offset", "tiles"])
def test_seeded_group_offset_bugs_are_caught(monkeypatch, bug):
    case = make_case("TN", "float32", [5, 3, 0, 9], 24, 16)
    good = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert good.verdict == "pass", good.describe()
    if bug == "offset":
        monkeypatch.setattr(tgg, "split_offsets", _shifted_offsets)
    else:
        monkeypatch.setattr(tgg, "tile_table", _boundary_crossing_tiles)
    bad = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert bad.outcomes["triton"].status == "ok", bad.describe()
    assert bad.verdict == "fail", bad.describe()


def test_benchmark_operands_are_read_in_place():
    """A MoE layer's operands (row slices of one tensor, slices of one stacked weight) reach
    the kernel as views, not copies."""
    x = torch.randn(12, 8)
    parts = [x[0:5], x[5:5], x[5:12]]
    assert tgg._rows_of(parts).data_ptr() == x.data_ptr()
    w = torch.randn(3, 4, 8)
    assert tgg._stack_groups([w[0], w[1], w[2]]).data_ptr() == w.data_ptr()
    copied = tgg._stack_groups([w[0], w[2]])
    assert copied.data_ptr() != w.data_ptr() and torch.equal(copied, w[[0, 2]])


def test_adjacent_separate_allocations_are_copied_not_viewed():
    """Two storages that happen to lie back to back (CUDA's caching allocator does this; here
    two buffers cut from one bytearray) must not be viewed as one: the view would run past
    the first storage's end (an H100 run of this file raised exactly that)."""
    buf = bytearray(2 * 6 * 4 * 4)
    a = torch.frombuffer(buf, dtype=torch.float32, count=24).view(6, 4)
    b = torch.frombuffer(buf, dtype=torch.float32, count=24, offset=96).view(6, 4)
    assert b.data_ptr() == a.data_ptr() + 96  # adjacent, yet two storages
    a.copy_(torch.arange(24.0).view(6, 4))
    b.copy_(-torch.arange(24.0).view(6, 4))
    assert torch.equal(tgg._rows_of([a, b]), torch.cat([a, b]))
    assert torch.equal(tgg._stack_groups([a, b]), torch.stack([a, b]))
