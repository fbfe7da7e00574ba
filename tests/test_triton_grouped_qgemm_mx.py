"""tealite's Triton grouped qgemm for MX recipes (MXFP8 / MXFP4: E8M0 scales per 32 along K),
under Triton's CPU interpreter (CI) or on a GPU.  Each split-M tile is the dense kernel's MX
tile (qgemm.py ``_mx_tile``: exactly scaled operands on the fast path, per-32-block partials
on the exact fallback), so under the interpreter the grouped result is the split path's (a
loop of dense triton qgemm calls) bit for bit; NT runs the dense kernel per group.  The
harness's grouped_qgemm spec judges MX cases (reference and parity oracles); seeded bugs (the
weight scales one K block off, the E8M0 exponent off by one) fail it; empty groups give exact
zeros; the kernel cross-compiles for sm_90 and gfx942.  Shapes are tiny (M_total <= 40,
N <= 40, K <= 96)."""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite import registry
from tealite.backends.triton import INTERPRET
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from _helpers_cross_compile import compiled_json

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
DEVICE = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("grouped_qgemm")

if TRITON.unavailable_reason() is None:
    from tealite.backends.triton import grouped_gemm as tgg

PAIRS = {
    "mxfp8": (R.MXFP8BlockScaling(), R.MXFP8BlockScaling()),
    "mxfp8-e5m2-weights": (R.MXFP8BlockScaling("e5m2"), R.MXFP8BlockScaling()),
    "mxfp4": (R.MXFP4BlockScaling(), R.MXFP4BlockScaling()),
}


def _quantized(pair, splits, n, k, *, shared=False, seed=0, scales=(1.0, 1.0)):
    ra, rb = PAIRS[pair]
    g = torch.Generator().manual_seed(seed)
    a = [tealite.quantize((scales[0] * torch.randn(n, k, generator=g)).to(DEVICE), ra,
                          backend="torch")
         for _ in range(1 if shared else len(splits))]
    b = [tealite.quantize((scales[1] * torch.randn(s, k, generator=g)).to(DEVICE), rb,
                          backend="torch") for s in splits]
    return (a[0] if shared else a), b


def _split_path(a, b, splits, **kw):
    return torch.cat([tealite.qgemm(a if not isinstance(a, list) else a[g], b[g], layout="TN",
                                    backend="triton", **kw).out
                      for g, rows in enumerate(splits) if rows])


def _assert_within_fp32_sum_bound(out, a, b, splits, k):
    """Against the float64 product of the dequantized operands: exact products (scaled
    operands are exact, powers of two), fp32 sums of K terms (interpreter; 2^-23 for the
    tensor cores' truncating sums), one rounding to fp32: gamma_{K+1}(u) |B||A|^T."""
    u = 2.0**-24 if INTERPRET else 2.0**-23
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    lo = 0
    for g, rows in enumerate(splits):
        deq_b = tealite.dequantize(b[g], backend="torch").double()
        deq_a = tealite.dequantize(a if not isinstance(a, list) else a[g],
                                   backend="torch").double()
        err = (out[lo:lo + rows].double() - deq_b @ deq_a.t()).abs()
        assert bool((err <= gamma * (deq_b.abs() @ deq_a.abs().t())).all()), g
        lo += rows


# Ragged splits with empty groups; K = 96: three scale blocks, a K tail past the 64-long step.
# "fallback": tokens of magnitude 2^-120 (E8M0 bytes 0-3, below e4m3's fast range from 10:
# scaled bf16 operands would lose bits), weights of 2^100, so every tile takes the exact
# per-32-block fallback and the products stay normal fp32 numbers.
_UNIT = (1.0, 1.0)
MX_CASES = [
    pytest.param("mxfp8", [5, 0, 17, 1], 64, False, _UNIT, id="mxfp8-ragged"),
    pytest.param("mxfp8", [0, 23, 0, 9], 96, True, _UNIT, id="mxfp8-shared-k-tail"),
    pytest.param("mxfp8-e5m2-weights", [3, 19], 64, False, _UNIT, id="mxfp8-e5m2-x-e4m3"),
    pytest.param("mxfp4", [7, 0, 12], 64, False, _UNIT, id="mxfp4"),
    pytest.param("mxfp8", [6, 11], 64, False, (2.0**100, 2.0**-120), id="mxfp8-fallback-tiles"),
]


@pytest.mark.parametrize("pair,splits,k,shared,scales", MX_CASES)
def test_mx_grouped_qgemm_is_the_split_path_bit_for_bit(pair, splits, k, shared, scales):
    a, b = _quantized(pair, splits, 40, k, shared=shared, scales=scales)
    if scales != _UNIT:  # the case must reach the fallback: token bytes below the fast range
        lo, _ = tgg.qdense._fast_byte_range("e4m3", tgg._E8M0_BIAS)
        assert max(int(q.scale_inv.view(torch.uint8).max()) for q in b) < lo
        assert all(bool((q.data.view(torch.uint8) & 0x7F).any()) for q in b)
    out = tealite.grouped_qgemm(a, b, splits, layout="TN", out_dtype=torch.float32,
                                backend="triton")
    split = _split_path(a, b, splits, out_dtype=torch.float32)
    assert torch.equal(out, split) if INTERPRET else torch.allclose(out, split)
    _assert_within_fp32_sum_bound(out, a, b, splits, k)


def test_mx_all_zero_group_and_empty_groups_give_exact_zeros():
    """A group of zero tokens (amax 0: byte 0, every code 0) stores +0 exactly; under NT an
    empty group's plane is +0 without accumulate and left bit for bit with it (-0 kept)."""
    a, b = _quantized("mxfp8", [4, 6], 24, 64)
    b[1] = tealite.quantize(torch.zeros(6, 64, device=DEVICE), PAIRS["mxfp8"][1],
                            backend="torch")
    out = tealite.grouped_qgemm(a, b, [4, 6], layout="TN", out_dtype=torch.float32,
                                backend="triton")
    assert bool((out[4:] == 0).all()) and not bool(torch.signbit(out[4:]).any())
    mx = PAIRS["mxfp8"][0]
    g = torch.Generator().manual_seed(3)
    splits = [32, 0, 64]
    qa = [tealite.quantize(torch.randn(s, 12, generator=g).to(DEVICE), mx, rowwise=False,
                           columnwise=True, backend="torch") for s in splits]
    qb = [tealite.quantize(torch.randn(s, 5, generator=g).to(DEVICE), mx, rowwise=False,
                           columnwise=True, backend="torch") for s in splits]
    fresh = tealite.grouped_qgemm(qa, qb, splits, layout="NT", out_dtype=torch.float32,
                                  backend="triton")
    assert bool((fresh[1] == 0).all()) and not bool(torch.signbit(fresh[1]).any())
    prior = torch.full((3, 5, 12), -0.0, device=DEVICE)
    acc = tealite.grouped_qgemm(qa, qb, splits, layout="NT", out=prior.clone(),
                                out_dtype=torch.float32, accumulate=True, backend="triton")
    assert bool(torch.signbit(acc[1]).all()) and torch.equal(acc[2], fresh[2])


# ---- through the harness: reference and parity oracles, and seeded bugs -----------------------

_MX8 = {"kind": "mx", "fmt": "e4m3", "scale_rounding": "rceil", "element_rounding": "rne"}
_MX4 = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
_WIDE = {"kind": "wide", "log2_lo": -12, "log2_hi": 6, "sample_dtype": "float32"}


def _case(ra, rb, layout, splits, n, k, **kw):
    case = {"recipe_a": ra, "recipe_b": rb, "layout": layout, "m_splits": list(splits),
            "m": 8, "n": n, "k": k, "dtype": "bfloat16", "out_dtype": "bfloat16",
            "bias": False, "accumulate": False, "shared_weight": False,
            "dist_a": dict(_WIDE), "dist_b": {"kind": "normal", "scale": 1.0}, "seed": 1919}
    case.update(kw)
    return case


HARNESS = {
    "TN-mxfp8-bias-accumulate": _case(_MX8, _MX8, "TN", [5, 0, 17, 1], 24, 64, bias=True,
                                      accumulate=True),
    "NN-mxfp8-shared": _case(_MX8, _MX8, "NN", [9, 4], 17, 96, shared_weight=True,
                             out_dtype="float32"),
    "TN-mxfp4": _case(_MX4, _MX4, "TN", [0, 11, 6], 20, 64),
    "NT-mxfp8-empty-group": _case(_MX8, _MX8, "NT", [32, 0, 64], 12, 1, m=5),
}


@pytest.mark.parametrize("name", list(HARNESS))
def test_mx_cases_pass_the_reference_and_parity_oracles(name):
    report = run_case(SPEC, HARNESS[name], backends=["triton", "torch"], device=DEVICE)
    assert report.outcomes["triton"].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


def _scales_one_block_late(real):
    """The weight scales read one K block late: block j multiplied by block j - 1's scale
    (block 0 by the last one)."""
    def shifted(recipe, kind, a_scales, n, k):
        sa, *rest = real(recipe, kind, a_scales, n, k)
        return (torch.roll(sa, 1, dims=-1), *rest)
    return shifted


@pytest.mark.parametrize("bug", ["scale-block-off-by-one", "e8m0-exponent-off-by-one"])
def test_seeded_mx_scale_bugs_are_caught(monkeypatch, bug):
    case = HARNESS["TN-mxfp8-bias-accumulate"]
    good = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert good.verdict == "pass", good.describe()
    if bug == "scale-block-off-by-one":
        inputs = SPEC.make_inputs(case, DEVICE)
        assert any(not torch.equal(q.scale_inv[..., 0], q.scale_inv[..., 1])
                   for q in inputs["_qa"])
        monkeypatch.setattr(tgg, "_weight_scales_operand",
                            _scales_one_block_late(tgg._weight_scales_operand))
    else:
        monkeypatch.setattr(tgg, "_E8M0_BIAS", tgg._E8M0_BIAS - 1)  # every scale doubled
    bad = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert bad.outcomes["triton"].status == "ok", bad.describe()
    assert bad.verdict == "fail", bad.describe()


# ---- the kernel as compiled for the GPUs (CI has none: cross-compiled) -------------------------

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tealite.backends.triton import _grouped_kernels as GK
from tealite.backends.triton import qgemm as Q
# (target, the backend's MX config there, fp8-typed code tiles?); MXFP8 e4m3 both sides: on
# sm_90 the hardware converts e4m3 tiles, on gfx942 (FNUZ) the codes are decoded as bytes.
CASES = {"cuda": (("cuda", 90, 32), Q._CUDA[("mx", True, "large")], True),
         "hip": (("hip", "gfx942", 64), Q._HIP[("mx", False)], False)}
out = {}
for name, (target, cfg, typed) in CASES.items():
    const = dict(KIND=Q._KINDS["mx"], SCALE_K=Q._MX_SCALE_K, SA_ROWS=1, E8M0_BIAS=Q._E8M0_BIAS,
                 EVEN_LOW=Q._E2M1_EVEN_IN_LOW_NIBBLE, DOT_FP8=False, F32_OPERANDS=False,
                 A_TYPED=typed, B_TYPED=typed, HAS_BIAS=True, BIAS_BF16=True, OUT_BF16=True,
                 I64=False, EVEN_K=True, EVEN_SCALE_K=True, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                 **Q._operand_constants("A", "e4m3"), **Q._operand_constants("B", "e4m3"))
    code = "*fp8e4nv" if typed else "*u8"
    ptrs = dict(a_ptr=code, b_ptr=code, sa_ptr="*u8", sb_ptr="*u8", bias_ptr="*i16",
                out_ptr="*i16", offs_ptr="*i32", tiles_ptr="*i32")
    sig = {arg: "constexpr" if arg in const else ptrs.get(arg, "i32")
           for arg in GK.grouped_q_kernel.arg_names}
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if name == "hip":
        opts.update(waves_per_eu=cfg.waves_per_eu, matrix_instr_nonkdim=cfg.matrix_instr_nonkdim)
    k = triton.compile(ASTSource(GK.grouped_q_kernel, sig, const), target=GPUTarget(*target),
                       options=opts)
    out[name] = len(k.asm["cubin" if name == "cuda" else "hsaco"])
json.dump(out, sys.stdout)
"""


def test_mx_grouped_kernel_compiles_for_sm90_and_gfx942():
    """Cross-compiled in a fresh process without TRITON_INTERPRET (the interpreter forgives
    what a compiled kernel does not), with the configs the backend launches there."""
    sizes = compiled_json(_COMPILE)
    assert set(sizes) == {"cuda", "hip"} and all(sizes.values()), sizes
