"""The MX qgemm variant with the E8M0 scales applied in the accumulator (qgemm.py
``VARIANTS["mx"] == "acc"``, _qgemm_mx_acc.py), under Triton's CPU interpreter (CI) or on a
GPU: hostile cases pass the qgemm spec with the variant's own declaration, every K step
size gives the same bits, scale pairs beyond fp32 take the exact path, seeded bugs (a scale
one 32-block late, the range check dropped) are caught, the declaration follows the switch,
and the kernel cross-compiles for sm_90 without spilling."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tealite import recipes as R
from tealite import registry
from tealite.backends import triton as triton_backend
from tealite.backends.triton import INTERPRET
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_cross_compile import compiled_json
from _helpers_qgemm import (MX_OUTLIERS, WIDE, launch_flags, mx_out_of_bound, mx_recipe,
                            qgemm_case, scales_one_block_late)

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
DEVICE = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("qgemm")

if TRITON.unavailable_reason() is None:
    from tealite.backends.triton import _qgemm_mx_acc as tma
    from tealite.backends.triton import qgemm as tq


@pytest.fixture
def acc(monkeypatch):
    """The variant switched on; yields the mx_acc flag of every dense launch."""
    yield launch_flags(monkeypatch, tq, "acc", "mx_acc")


_mx = mx_recipe
_case = functools.partial(qgemm_case, seed=11)
CASES = {
    "e4m3-TN-subnormal-codes": _case(_mx(), _mx(), "TN", 20, 40, 128, dist_a=MX_OUTLIERS,
                                     dist_b=MX_OUTLIERS, out_dtype="float32"),
    "e5m2-x-e4m3-NN-k45-bias": _case(_mx("e5m2"), _mx(), "NN", 17, 33, 45, bias=True),
    "e4m3-x-e5m2-TT-k100": _case(_mx(), _mx("e5m2", "floor"), "TT", 24, 20, 100),
    "e4m3-NT-wide-scales": _case(_mx(), _mx(), "NT", 18, 36, 96, dist_a=WIDE, dist_b=WIDE,
                                 out_dtype="float32"),
    "e5m2-tiny-k1": _case(_mx("e5m2"), _mx("e5m2"), "TN", 3, 7, 1, dist_a={"kind": "tiny"},
                          dtype="float32"),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_variant_passes_the_qgemm_spec(acc, name):
    if "subnormal" in name:  # the case holds what it is named for
        q = SPEC.make_inputs(CASES[name], DEVICE)["_qa"]
        bits = q.data.view(torch.uint8)
        assert bool((((bits & 0x78) == 0) & ((bits & 0x07) != 0)).any())
    report = run_case(SPEC, CASES[name], backends=["triton", "torch"], device=DEVICE)
    assert report.outcomes["triton"].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()
    assert acc and all(acc), acc  # the triton calls ran the variant


def _operands(seed=3, m=20, n=40, k=128, fmt_b="e4m3"):
    g = torch.Generator().manual_seed(seed)
    import tealite
    a = tealite.quantize(torch.randn(n, k, generator=g), R.MXFP8BlockScaling(), backend="torch")
    b = tealite.quantize(torch.randn(m, k, generator=g), R.MXFP8BlockScaling(fmt_b),
                         backend="torch")
    return [x.to(DEVICE) for x in (a.data, a.scale_inv, b.data, b.scale_inv)], (m, n, k)


@pytest.mark.skipif(not INTERPRET, reason="bit equality across K steps: interpreter sums")
def test_every_k_step_gives_the_same_bits():
    """BLOCK_K = 32, 64, 128 (1, 2, 4 unrolled blocks) and a K tail: the same per-block
    products added in the same order, so the same bits."""
    (a, sa, b, sb), (m, n, k) = _operands(k=160)
    mx = R.MXFP8BlockScaling()
    outs = [tq.launch(mx, a, sa, mx, b, sb, m=m, n=n, k=k, out_dtype=torch.float32, bias=None,
                      config=tq.QGemmConfig(16, 32, bk, 8, 4, 1), mx_acc=True)
            for bk in (32, 64, 128)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_mx_acc_is_refused_where_it_does_not_fit():
    codes = torch.zeros(8, 32, dtype=torch.uint8, device=DEVICE)
    scales = torch.full((8, 1), 127, dtype=torch.uint8, device=DEVICE)
    fp4 = R.MXFP4BlockScaling()
    with pytest.raises(ValueError, match="mx_acc: the MX accumulator variant takes"):
        tq.launch(fp4, codes[:, :16], scales, fp4, codes[:, :16], scales, m=8, n=8, k=32,
                  out_dtype=torch.float32, bias=None, mx_acc=True)


# ---- scale bytes at the edges of fp32 ----------------------------------------------------------

def _edge(case, fmt_b="e4m3"):
    """(a bits (N, K), a bytes, b bits (M, K), b bytes), K = 128 (4 blocks); M = 20, N = 40
    span several tiles.  "beyond-fp32": rows 0-3 and columns 0-2 of block 1 hold the smallest
    subnormal code under bytes 254 and 135: 2^(254 + 135 - 254) = 2^135 is no fp32 number, the
    products (2^-18 x 2^135 for e4m3) are (an unchecked fast path gives Inf); the other
    columns' block-1 bytes are 100, so no true product leaves fp32; "nan-byte": one 0xFF;
    "zero-blocks": amax == 0 blocks at byte 0 on both sides (their pair underflows, their
    products are 0)."""
    rng = np.random.default_rng(5)
    m, n, k = 20, 40, 128
    a_bits = rng.integers(0, 0x7E, (n, k)).astype(np.uint8)  # finite e4m3 codes, both signs
    a_bits |= (rng.integers(0, 2, (n, k)) << 7).astype(np.uint8)
    b_bits = rng.integers(0, 0x7B, (m, k)).astype(np.uint8)  # finite in e4m3 and e5m2
    a_bytes, b_bytes = rng.integers(120, 135, (n, 4)), rng.integers(120, 135, (m, 4))
    if case == "beyond-fp32":
        b_bits[:4, 32:64], a_bits[:3, 32:64] = 1, 1
        b_bytes[:4, 1], a_bytes[:3, 1], a_bytes[3:, 1] = 254, 135, 100
    elif case == "nan-byte":
        a_bytes[5, 3] = 0xFF
    elif case == "zero-blocks":
        b_bits[8:12, :32], b_bytes[8:12, 0] = 0, 0
        a_bits[30:34, :32], a_bytes[30:34, 0] = 0, 0
    return a_bits, a_bytes.astype(np.uint8), b_bits, b_bytes.astype(np.uint8)


def _mismatches(case, fmt_b="e4m3") -> int:
    """Elements of the variant's product outside its declared gemm bound (NaN must match)."""
    return mx_out_of_bound(_edge(case, fmt_b), "e4m3", fmt_b, DEVICE, tq._dense_numerics,
                           mx_acc=True)


@pytest.mark.parametrize("fmt_b", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", ["beyond-fp32", "nan-byte", "zero-blocks"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_scale_pairs_outside_fp32_stay_exact(acc, case, fmt_b):
    assert _mismatches(case, fmt_b) == 0


# ---- seeded bugs -------------------------------------------------------------------------------

def test_seeded_scale_one_block_late_is_caught(acc, monkeypatch):
    case = CASES["e4m3-NT-wide-scales"]
    good = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert good.verdict == "pass", good.describe()
    monkeypatch.setattr(tq, "_scale_operand", scales_one_block_late(tq._scale_operand))
    bad = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert bad.outcomes["triton"].status == "ok", bad.describe()
    assert bad.verdict == "fail", bad.describe()


@triton.jit
def _previous_column(x, j: tl.constexpr, NS: tl.constexpr):
    """Seeded: block j of a K step scaled with block j - 1's bytes (block 0 with the last)."""
    rs = tl.arange(0, NS)
    return tl.sum(tl.where(rs[None, :] == (j + NS - 1) % NS, x, 0), axis=1)


@pytest.mark.skipif(not INTERPRET, reason="swaps a jit helper: interpreter only")
def test_seeded_in_kernel_scale_one_block_late_is_caught(acc, monkeypatch):
    """The kernel's own per-block pick one block late (the interpreter's K step holds two
    blocks, so every other block gets its neighbour's scales)."""
    case = CASES["e4m3-NT-wide-scales"]
    monkeypatch.setattr(tma, "_column", _previous_column)
    bad = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert bad.outcomes["triton"].status == "ok", bad.describe()
    assert bad.verdict == "fail", bad.describe()


@triton.jit
def _never_exact(sa_ptr, sb_ptr, an, bm, an_ok, bm_ok, n_scales, stride_sa_row, stride_sa_k,
                 stride_sb_row, stride_sb_k, E8M0_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    return False


@pytest.mark.skipif(not INTERPRET, reason="swaps a jit helper: interpreter only")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_seeded_range_check_dropped_is_caught(acc, monkeypatch):
    """With every tile sent down the fast scaling, the 2^135 pair overflows fp32: caught,
    while the correct kernel passes (test above)."""
    monkeypatch.setattr(tma, "mx_acc_tile_exact", _never_exact)
    assert _mismatches("beyond-fp32") > 0


# ---- declared numerics follow the switch -------------------------------------------------------

def _params(fmt_a, fmt_b, k, device="cuda"):
    return {"kind": "mx", "fmt_a": fmt_a, "fmt_b": fmt_b, "k": k, "device": device}


@pytest.fixture
def hopper():
    with triton_backend.PLATFORM.override(rocm=False,
                                          native_fp8_formats=frozenset({"e4m3", "e5m2"})):
        yield


def test_declaration_follows_the_switch(hopper, monkeypatch):
    k = 4096
    monkeypatch.setitem(tq.VARIANTS, "mx", "fold")
    fold = tq._dense_numerics(_params("e4m3", "e5m2", k))
    assert fold == tq._numerics(_params("e4m3", "e5m2", k))  # default: unchanged
    assert fold["accumulator_unit_roundoff"] == 2.0**-23 and "alignment_floor" not in fold
    monkeypatch.setitem(tq.VARIANTS, "mx", "acc")
    num = tq._dense_numerics(_params("e4m3", "e5m2", k))
    u = num["accumulator_unit_roundoff"]
    # 128 blocks of 32 products at ~14 bits plus a 128-term fp32 sum, spread over K.
    assert k * u >= 128 * tq._gamma(32, 2.0**-13) + tq._gamma(128, 2.0**-24)
    assert 2.0**-13 < u < 1.01 * 2.0**-13
    assert num["alignment_floor"] == "fp8_codes"
    # Where the variant does not run, nothing changes: MXFP4, FNUZ, the interpreter, grouped.
    for params in (_params("e2m1", "e4m3", k), _params("e4m3fnuz", "e4m3fnuz", k),
                   _params("e4m3", "e4m3", k, "cpu")):
        assert tq._dense_numerics(params) == tq._numerics(params)
    assert "alignment_floor" not in tq._numerics(_params("e4m3", "e5m2", k))


def test_rocm_keeps_the_folded_path(monkeypatch):
    monkeypatch.setitem(tq.VARIANTS, "mx", "acc")
    with triton_backend.PLATFORM.override(rocm=True,
                                          native_fp8_formats=frozenset({"e4m3", "e5m2"})):
        assert not tq.mx_acc_runs("mx", "e4m3", "e4m3", "cuda")


# ---- compiled for sm_90 (CI has no GPU: cross-compiled) ----------------------------------------

_COMPILE = """
import json, sys
from benchmarks import qgemm_ptx as P
from tealite.backends.triton import qgemm as Q
out = P.stats(P.compile_mx(Q._CUDA[("mx-acc", True, "large")], True))
# gfx942 keeps the folded path (mx_acc_fits): the MX kernel as launched there, bytes decoded.
hip = P.compile_mx(Q._HIP[("mx", False)], False, ("hip", "gfx942", 64), typed=False)
out["hip_bytes"] = len(hip.asm["hsaco"])
json.dump(out, sys.stdout)
"""


def test_variant_compiles_for_sm90_without_spills():
    """The variant's default config as the backend launches it on an H100: FP8 wgmma per
    32-long block, no register spills; and the folded MX kernel ROCm keeps, for gfx942."""
    s = compiled_json(_COMPILE)
    assert s["wgmma"] >= 1 and s["spill"] == 0 and s["regs"] <= 255, s
    assert s["hip_bytes"] > 0, s
