"""Triton quantized GEMM under Triton's CPU interpreter (CI) or on a GPU: every scaling family
and code path against the float64 reference, exact decoders, declared numerics, and seeded
kernel bugs that the harness must catch (while the correct kernel passes the same case)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tealite import registry
from tealite import recipes as R
from tealite.backends import triton as triton_backend
from tealite.backends.triton import INTERPRET
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_qgemm import (ML_DTYPES as _ML, mx_edge_operands, mx_out_of_bound, mx_recipe,
                            qgemm_case)

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
DEVICE = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("qgemm")

if TRITON.unavailable_reason() is None:
    from tealite.backends.triton import _qgemm_operands as tqo
    from tealite.backends.triton import _qgemm_tiles as tqt
    from tealite.backends.triton import qgemm as tq
    _decode_f32 = tqo._decode_f32
    _times_e8m0_pair = tqo._times_e8m0_pair
    _e2m1_f32 = tqo._e2m1_f32


def _cur(fmt="e4m3", gran="tensor", **kw):
    return dict({"kind": "current", "fmt": fmt, "granularity": gran, "force_pow2_scales": False,
                 "amax_epsilon": 0.0}, **kw)


def _blk(fmt="e4m3", block=(128, 128), pow2=False):
    return {"kind": "block", "fmt": fmt, "block": list(block), "force_pow2_scales": pow2,
            "amax_epsilon": 0.0}


_mx = mx_recipe


def _case(ra, rb, layout, m, n, k, **kw):
    return qgemm_case(ra, rb, layout, m, n, k, seed=5, **kw)


_OUTLIERS = {"kind": "outliers", "scale": 1.0, "frac": 0.002, "factor": 1024.0}
CASES = {
    "tensor-e4m3-TN-k-tail": _case(_cur(), _cur(), "TN", 29, 48, 257),
    "row-x-tensor-e5m2-NN-bias-fp32": _case(_cur(gran="row"), _cur("e5m2"), "NN", 33, 17, 96,
                                            bias=True, out_dtype="float32"),
    "fnuz-row-x-tensor-TT-fp16": _case(_cur("e4m3fnuz", "row"), _cur("e5m2fnuz"), "TT", 18, 40,
                                       70, out_dtype="float16", dtype="float32"),
    # A delayed scale far too large with non-saturating casts: NaN (E4M3) and Inf (E5M2) codes.
    "delayed-nonfinite-nan-inf-codes": _case(
        {"kind": "delayed", "fmt": "e4m3", "scale": 2.0**7, "saturation": "nonfinite"},
        {"kind": "delayed", "fmt": "e5m2", "scale": 2.0**12, "saturation": "nonfinite"},
        "TN", 20, 24, 64, dist_a=_OUTLIERS, dist_b=_OUTLIERS, dtype="float32"),
    "block-128x128-x-1x128-NT-k-tail": _case(_blk(), _blk(block=(1, 128)), "NT", 20, 130, 300,
                                             out_dtype="float32"),
    "block-1x128-fnuz-pow2-bias": _case(_blk("e5m2fnuz", (1, 128), True),
                                        _blk("e5m2fnuz", (1, 128), True), "TN", 17, 33, 256,
                                        bias=True),
    "mx-e4m3-x-e5m2-TT": _case(_mx(), _mx("e5m2"), "TT", 24, 20, 64),
    "mxfp4-odd-k-partial-block": _case(_mx("e2m1", "floor"), _mx("e2m1", "even", "ties_away"),
                                       "TN", 19, 26, 45),
    "mxfp4-x-mxfp8-NN": _case(_mx("e2m1", "floor"), _mx("e4m3"), "NN", 21, 34, 96,
                              out_dtype="float16"),
    "k0-bias-only": _case(_cur(), _cur(gran="row"), "NT", 9, 12, 0, bias=True),
    "mxfp4-k1": _case(_mx("e2m1"), _mx(), "TN", 3, 7, 1),
    "mxfp8-fnuz-x-mxfp4-tiny": _case(_mx("e4m3fnuz", "ceil"), _mx("e2m1"), "NT", 16, 18, 64,
                                     dtype="float32", dist_a={"kind": "tiny"}),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_triton_qgemm_matches_reference(name):
    report = run_case(SPEC, CASES[name], backends=["triton", "torch"], device=DEVICE)
    assert report.outcomes["triton"].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


# ---- exact decoders ---------------------------------------------------------------------------

@triton.jit
def _decode_kernel(c_ptr, out_ptr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                   BIAS: tl.constexpr, SPECIALS: tl.constexpr, MIN_NORMAL: tl.constexpr):
    offs = tl.arange(0, 256)
    c = tl.load(c_ptr + offs).to(tl.int32)
    tl.store(out_ptr + offs, _decode_f32(c, EBITS, MBITS, BIAS, SPECIALS, MIN_NORMAL))


@triton.jit
def _e2m1_kernel(c_ptr, out_ptr):
    offs = tl.arange(0, 16)
    tl.store(out_ptr + offs, _e2m1_f32(tl.load(c_ptr + offs)))


@triton.jit
def _pair_kernel(part_ptr, byte_ptr, out_ptr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, 256)
    offs = rows[:, None] * 256 + cols[None, :]
    out = _times_e8m0_pair(tl.load(part_ptr + offs), tl.load(byte_ptr + rows),
                           tl.load(byte_ptr + cols), 127)
    tl.store(out_ptr + offs, out)


@pytest.mark.parametrize("fmt", list(_ML))
def test_decode_f32_is_exact_for_every_code(fmt):
    """Every code (NaN, Inf, -0 and subnormals included) decodes to the fp32 value ml_dtypes
    gives: the decoder the interpreter, FNUZ on NVIDIA and the MX fallback use."""
    n = 16 if fmt == "e2m1" else 256
    codes = (np.arange(256) % n).astype(np.uint8)
    c = torch.from_numpy(codes).to(DEVICE)
    out = torch.empty(256, dtype=torch.float32, device=DEVICE)
    consts = {k: v for k, v in tq._decode_constants(fmt).items() if k not in ("PACKED", "MAG")}
    _decode_kernel[(1,)](c, out, **consts)
    want = codes.view(_ML[fmt]).astype(np.float32)
    got = out.cpu().numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_e2m1_fast_decode_is_exact_for_every_code():
    """The MX path's E2M1 decoder (bit placement, then x 2^126 through the subnormal 2^-127
    for code 0.5): every code, -0 included, equals ml_dtypes' value bit for bit."""
    c = torch.arange(16, dtype=torch.int32, device=DEVICE)
    out = torch.empty(16, dtype=torch.float32, device=DEVICE)
    _e2m1_kernel[(1,)](c, out)
    want = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(out.cpu().numpy().view(np.uint32), want.view(np.uint32))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_fallback_scales_partials_exactly_for_every_byte_pair():
    """MX's fallback multiplies a block's partial sum by 2^(byte_b + byte_a - 254): exact for
    every pair of bytes where the exact result is a normal fp32 (even when one factor alone is
    not, e.g. 2^-127 x 2^127), off by less than the smallest normal below that, +-Inf above
    fp32's range, NaN for byte 0xFF.  Partials span what 32 code products can (2^-34..2^37)."""
    rng = np.random.default_rng(0)
    mant = rng.integers(1 << 23, 1 << 24, size=(256, 256)).astype(np.float64) / 2.0**23
    part = np.ldexp(mant * rng.choice([-1.0, 1.0], size=(256, 256)),
                    rng.integers(-34, 38, size=(256, 256))).astype(np.float32)
    byte = np.arange(256)
    out = torch.empty(256, 256, dtype=torch.float32, device=DEVICE)
    _pair_kernel[(4,)](torch.from_numpy(part).to(DEVICE),
                       torch.from_numpy(byte.astype(np.uint8)).to(DEVICE), out, ROWS=64)
    got = out.cpu().numpy().astype(np.float64)
    nan = (byte[:, None] == 255) | (byte[None, :] == 255)
    with np.errstate(over="ignore"):
        want = np.ldexp(part.astype(np.float64), byte[:, None] + byte[None, :] - 254)
    tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
    normal = ~nan & (np.abs(want) >= tiny) & (np.abs(want) <= big)
    assert np.array_equal(got[normal], want[normal])
    under = ~nan & (np.abs(want) < tiny)
    assert (np.abs(got[under] - want[under]) < tiny).all()
    over = ~nan & (np.abs(want) > big)
    assert over.any() and np.array_equal(got[over], np.copysign(np.inf, want[over]))
    assert normal[0, 254] and normal[1, 253]  # 2^-127 x 2^127: the split keeps them exact


# ---- declared numerics ------------------------------------------------------------------------

def _params(kind, fmt_a, fmt_b, k, device):
    return {"kind": kind, "fmt_a": fmt_a, "fmt_b": fmt_b, "k": k, "device": device}


@pytest.fixture
def hopper():
    """A simulated NVIDIA sm_90: a CUDA build of torch whose tensor cores multiply e4m3 and
    e5m2 natively (the numerics below are declared from the platform, not measured)."""
    with triton_backend.PLATFORM.override(rocm=False,
                                          native_fp8_formats=frozenset({"e4m3", "e5m2"})):
        yield


def test_numerics_declare_hopper_fp8_accumulation_only_on_native_cuda_dots(hopper):
    k = 4096
    fp8 = tq._numerics(_params("fp8", "e4m3", "e5m2", k, "cuda"))
    assert fp8["accumulator_unit_roundoff"] == 2.0**-13
    assert fp8["alignment_floor"] == "fp8_codes"
    assert "operands_dequantized_to" not in fp8
    nm = tq._numerics(_params("block", "e4m3", "e4m3", k, "cuda"))
    u = nm["accumulator_unit_roundoff"]
    # The declared K-term bound covers inner sums at ~14 bits plus fp32 sums of partials,
    # and is far tighter than modelling all of K at 14 bits.
    assert k * u >= 128 * 2.0**-13 + k * 2.0**-24
    assert u < 2.0**-13 / 16
    assert nm["operands_dequantized_to"] == torch.float32
    assert nm["mma_restart_k"] == 128  # a fresh dot per scale block: lift summed per block
    assert "mma_restart_k" not in fp8  # one accumulator over all of K
    # Decoded operands (FNUZ on NVIDIA) go through bf16 tensor-core dots: truncating fp32
    # accumulation (measured on an H100), nothing coarser.
    fnuz = tq._numerics(_params("fp8", "e4m3fnuz", "e4m3fnuz", k, "cuda"))
    assert fnuz["accumulator_unit_roundoff"] == 2.0**-23
    # The interpreter (numpy) sums in fp32 with round-to-nearest: the tier's default.
    assert "accumulator_unit_roundoff" not in tq._numerics(_params("fp8", "e4m3", "e4m3", k,
                                                                   "cpu"))


@pytest.mark.parametrize("fmts", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e2m1", "e4m3"),
                                  ("e4m3fnuz", "e2m1")])
def test_mx_numerics_are_the_base_model_at_the_tensor_cores_rounding(hopper, fmts):
    """MX declares exact products and fp32 sums: no operand term (both paths scale by powers
    of two exactly) and no 14-bit FP8 accumulator (it has no FP8 dot); on NVIDIA the bf16
    tensor cores' truncating accumulation (u = 2^-23), in the interpreter plain fp32.  Tighter
    than the old declarations: native FP8 had 2^-14 inner sums plus an operand term (>4x
    looser at K = 4096), the interpreter an operand term.  (Decoded formats on NVIDIA had
    round-to-nearest tensor-core sums plus an operand term; the H100 measurement behind
    gemm._TENSOR_CORE_U showed those sums truncate, so that one was not the truth.)"""
    k = 4096
    assert tq._numerics(_params("mx", *fmts, k, "cpu")) == {"compute_dtype": torch.float32}
    cuda = tq._numerics(_params("mx", *fmts, k, "cuda"))
    assert cuda == {"compute_dtype": torch.float32, "accumulator_unit_roundoff": 2.0**-23}
    old_native = tq._gamma(32, 2.0**-14) + tq._gamma(k, 2.0**-24) + 2 * 2.0**-24
    assert tq._gamma(k, 2.0**-23) < old_native / 4


def test_bad_scale_shapes_are_rejected_with_the_argument_named():
    codes = torch.zeros(8, 64, dtype=torch.uint8).view(torch.float8_e4m3fn).to(DEVICE)
    rec = R.Float8CurrentScaling(granularity="row")
    with pytest.raises(ValueError, match="a scales: one per row"):
        tq.launch(rec, codes, torch.ones(7, device=DEVICE), rec, codes,
                  torch.ones(8, device=DEVICE), m=8, n=8, k=64, out_dtype=torch.float32,
                  bias=None)
    blk = R.Float8BlockScaling(block=(128, 128))
    with pytest.raises(ValueError, match=r"b scales: shape \(8, 1\) expected"):
        tq.launch(blk, codes, torch.ones(1, 1, device=DEVICE), R.Float8BlockScaling(), codes,
                  torch.ones(8, 2, device=DEVICE), m=8, n=8, k=64, out_dtype=torch.float32,
                  bias=None)


# ---- MX scale bytes outside the fast path's exact range ----------------------------------------

def _edge_mismatches(case, fmt_a, fmt_b, **launch_kw) -> int:
    """Elements of the triton MX product (``launch_kw``: a variant, e.g. mx_staged=True)
    outside the declared gemm bound (NaN must match)."""
    return mx_out_of_bound(mx_edge_operands(case, fmt_a, fmt_b), fmt_a, fmt_b, DEVICE,
                           tq._numerics, **launch_kw)


_EDGES = ["overflow", "underflow", "nan-byte", "zero-blocks"]
_EDGE_FMTS = [("e4m3", "e4m3"), ("e2m1", "e5m2")]


# The folded MX kernel and the staged path (_qgemm_mx_staged.py: its stage pass flags the same
# rows, and its fixup runs the folded tile) meet the same edges.
_MX_PATHS = pytest.mark.parametrize("staged", [False, True], ids=["fold", "staged"])


@_MX_PATHS
@pytest.mark.parametrize("fmts", _EDGE_FMTS, ids="-".join)
@pytest.mark.parametrize("case", _EDGES)
def test_mx_scale_bytes_outside_the_fast_range_stay_exact(case, fmts, staged):
    """Tiles whose scaled operands would leave bf16's normal range (or meet a NaN byte) take
    the exact per-block fallback; zero blocks at byte 0 keep the fast path; both are judged
    against the float64 product with the declared (base-model) bound."""
    assert _edge_mismatches(case, *fmts, mx_staged=staged) == 0


@triton.jit
def _garbage_pair(part, byte_b, byte_a, E8M0_BIAS: tl.constexpr):
    return part * 0.0 + 12345.0


@pytest.mark.skipif(not INTERPRET, reason="swaps a jit helper: interpreter only")
def test_mx_routes_per_tile(monkeypatch):
    """With the fallback's scaling sabotaged, zero blocks at byte 0 stay exact (fast path after
    the code check), and a planted edge spoils only the tiles holding it (M = 20 rows and
    N = 40 columns are 2 x 2 tiles of the interpreter's 16 x 32 config)."""
    monkeypatch.setattr(tqt, "_times_e8m0_pair", _garbage_pair)
    assert _edge_mismatches("zero-blocks", "e4m3", "e4m3") == 0
    assert 0 < _edge_mismatches("overflow", "e4m3", "e4m3") < 20 * 40
    assert 0 < _edge_mismatches("underflow", "e4m3", "e4m3") < 20 * 40


def _always_fast(m):
    m.setattr(tq, "_fast_byte_range", lambda fmt, bias: (0, 255))


def _high_bytes_fast(m):
    good = tq._fast_byte_range
    m.setattr(tq, "_fast_byte_range", lambda fmt, bias: (good(fmt, bias)[0], 255))


def _codes_not_checked(m):
    good = tq._decode_constants
    m.setattr(tq, "_decode_constants", lambda fmt: dict(good(fmt), MAG=0))


@_MX_PATHS
@pytest.mark.parametrize("fmts", _EDGE_FMTS, ids="-".join)
@pytest.mark.parametrize("seed,cases", [
    (_always_fast, ["overflow", "underflow"]),  # no fallback at all
    (_high_bytes_fast, ["overflow"]),  # the upper byte bound dropped
    (_codes_not_checked, ["underflow"]),  # low bytes pass as if their codes were all zero
], ids=lambda v: v.__name__.strip("_") if callable(v) else "+".join(v))
def test_seeded_mx_routing_bugs_are_caught(monkeypatch, seed, cases, fmts, staged):
    for case in cases:
        with monkeypatch.context() as m:
            seed(m)
            assert _edge_mismatches(case, *fmts, mx_staged=staged) > 0, case


# ---- seeded kernel bugs -----------------------------------------------------------------------

def _padded_scales(fn):
    """Run ``fn`` with every 2-D scale tensor given as a view into a buffer twice as wide (same
    shape, values and row stride x2): a seeded kernel that indexes past the last scale block
    reads padding (1.0 / byte 127) inside the allocation instead of past its end."""
    def widen(s):
        if s.dim() != 2:
            return s
        pad = torch.full((s.shape[0], 2 * s.shape[1] + 4), 127 if s.dtype == torch.uint8 else 1.0,
                         dtype=s.dtype, device=s.device)
        pad[:, : s.shape[1]] = s
        return pad[:, : s.shape[1]]

    def run(ra, ac, as_, rb, bc, bs, **kw):
        return fn(ra, ac, widen(as_), rb, bc, widen(bs), **kw)
    return run


def _swap_row_scale_args(launch_one):
    """The epilogue gets A's scale vector as B's and B's as A's."""
    def run(cfg, args, flags, kind, m, n, k, **kwargs):
        args = list(args)
        args[2], args[3] = args[3], args[2]
        args[12], args[14] = args[14], args[12]  # stride_sa_row, stride_sb_row
        return launch_one(cfg, tuple(args), flags, kind, m, n, k, **kwargs)
    return run


def _ocp_constants_for_fnuz(good):
    return lambda fmt: good(fmt.removesuffix("fnuz"))


@triton.jit
def _interleaved_per_element(s, SCALE_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Seeded: element k of a K step gets scale block k % NS instead of k // 32."""
    R: tl.constexpr = s.shape[0]
    NS: tl.constexpr = BLOCK_K // SCALE_K
    return tl.reshape(tl.broadcast_to(s[:, None, :], (R, SCALE_K, NS)), (R, BLOCK_K))


SEEDED = {
    # Block scales advanced every 64 K instead of every 128.
    "block-scale-every-64-k": (
        lambda m: m.setattr(tq, "_scale_k", lambda kind: {"block": 64, "mx": 32}.get(kind)),
        _case(_blk(), _blk(block=(1, 128)), "TN", 20, 36, 300, out_dtype="float32"), True),
    # E8M0 decoded as 2^(byte - 128).
    "e8m0-bias-128": (lambda m: m.setattr(tq, "_E8M0_BIAS", 128),
                      _case(_mx(), _mx("e5m2"), "TN", 17, 20, 64), False),
    # E2M1 nibbles swapped.  Invisible when both operands are E2M1 with even K (the same
    # permutation of K on both sides leaves every dot product unchanged): a mixed pair shows it.
    "e2m1-nibbles-swapped": (lambda m: m.setattr(tq, "_E2M1_EVEN_IN_LOW_NIBBLE", False),
                             _case(_mx("e2m1"), _mx("e4m3"), "NT", 18, 20, 64), False),
    # Per-row scale vectors of A and B exchanged (square, so no out-of-bounds read).
    "row-scales-of-a-and-b-swapped": (
        lambda m: m.setattr(tq, "_launch_one", _swap_row_scale_args(tq._launch_one)),
        _case(_cur(gran="row"), _cur(gran="row"), "TN", 40, 40, 96,
              dist_a={"kind": "uniform", "lo": 0.5, "hi": 3.5}), False),
    # MX fast path: a K step's scale bytes expanded to its elements in the wrong order (the
    # interpreter's K step holds two 32-long blocks).
    "mx-scales-expanded-interleaved": (
        lambda m: m.setattr(tqo, "_per_element", _interleaved_per_element),
        _case(_mx(), _mx("e5m2"), "NT", 17, 20, 128, dist_a=_OUTLIERS), False),
    # E4M3FNUZ codes decoded with OCP E4M3's bias and NaN rule.
    "fnuz-decoded-as-ocp": (
        lambda m: m.setattr(tq, "_decode_constants", _ocp_constants_for_fnuz(tq._decode_constants)),
        _case(_cur("e4m3fnuz"), _cur("e4m3fnuz", "row"), "NN", 20, 24, 64), False),
}


@pytest.mark.parametrize("name", list(SEEDED))
def test_seeded_qgemm_kernel_bug_is_caught(make_backend, monkeypatch, name):
    """The same kernel with one seeded bug must be reported against the reference by the
    harness, on a case the correct kernel passes."""
    if not INTERPRET and name == "fnuz-decoded-as-ocp":
        pytest.skip("the decoder constants are only used where FP8 is decoded (interpreter)")
    if not INTERPRET and name == "mx-scales-expanded-interleaved":
        pytest.skip("swaps a jit helper: interpreter only")
    patch, case, pad = SEEDED[name]
    good = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert good.verdict == "pass", good.describe()
    b = make_backend("triton_seeded_qgemm")

    def seeded(*args, **kwargs):
        with monkeypatch.context() as m:
            patch(m)
            fn = _padded_scales(tq.qgemm) if pad else tq.qgemm
            return fn(*args, **kwargs)

    b.implements("qgemm", devices=TRITON.impls["qgemm"].support.devices,
                 numerics=TRITON.impls["qgemm"].numerics)(seeded)
    report = run_case(SPEC, case, backends=["torch", b.name], device=DEVICE)
    assert report.outcomes[b.name].status == "ok", report.describe()
    bad = [c for c in report.failures if c.lhs == b.name and c.rhs == "reference"]
    assert bad, report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
