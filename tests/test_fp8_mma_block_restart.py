"""Block-scaled FP8 GEMMs on Hopper's FP8 MMA: the subnormal-code lift is taken per scale block.

A block-scaled kernel (Triton's, AITER's a8w8_blockscale) starts a fresh ``tl.dot`` per K block
and adds ``(part * s_B) * s_A`` in fp32.  Inside one block the MMA cuts each product at
2^(E - 13), E the largest nominal exponent of the block's products (a subnormal code counted at
its format's smallest normal exponent: tests/test_fp8_mma_accumulator.py).  So block b's error
is at most gamma_128(2^-13) max(S_b, L_b), S_b = sum |p| over the block, L_b its largest lifted
product, and the K blocks' errors add: sum_b max(S_b, L_b) >= max(sum_b S_b, max_b L_b).
The lift taken once over all of K (right for a single accumulator over K, where the
declared u is 2^-13 per term) under-counts when every block holds a subnormal-by-large product.
The case below is built for that: a correct kernel exceeded the old bound, and the declaration
now names the restart period (``mma_restart_k``) so the spec sums the lift per block.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tealite.numerics import FP8_CODE_ALIGNMENT, Numerics
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs import qgemm as qspec

from test_fp8_mma_accumulator import WINDOW_BITS, hopper_fp8_acc

SCALE_K = 128
E4M3_SUB = 2.0**-9  # smallest e4m3 subnormal: aligned by the MMA as if it were 2^-6
SMALL_A, SMALL_B = 1.75 * 2.0**-6, 1.125 * 2.0**-6  # product 0.984 * 2^-11: cut to 0 at unit 2^-11


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def declared(k: int, restart: bool) -> dict:
    """What triton's and aiter_triton's block qgemm declare on NVIDIA (u from a fresh dot per
    128-long block plus fp32 sums of the partials); ``restart`` adds the restart period."""
    u = (_gamma(SCALE_K, 2.0**-13) + _gamma(k, 2.0**-24)) / k
    num = {"compute_dtype": torch.float32, "accumulator_unit_roundoff": u,
           "operands_dequantized_to": torch.float32, "alignment_floor": FP8_CODE_ALIGNMENT}
    return dict(num, mma_restart_k=SCALE_K) if restart else num


def _lift_rows(blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a (N=1, K), b (M=1, K): in every 32-long chunk one product 2^-9 x 448 (nominal exponent
    2, so the chunk's unit is 2^-11) and small products just under 2^-11, all cut to 0; each
    block's amax is 448 on both sides (scale 1: codes = values)."""
    a = np.full(SCALE_K, SMALL_A)
    b = np.full(SCALE_K, SMALL_B)
    a[::32], b[::32] = E4M3_SUB, 448.0
    a[1], b[1] = 448.0, 0.0  # a's amax, multiplied by 0
    return (torch.tensor(np.tile(a, blocks))[None], torch.tensor(np.tile(b, blocks))[None])


def _cut_rows(blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Normal codes only (no lift): per chunk one product 1 x 1 and 31 products
    1.875 * 2^-6 x 2^-5 = 0.9375 * 2^-10, which a 13-bit window cuts by at most 0.75 * 2^-12
    each and a 10-bit window to 0 (1.8x the declared block bound at K = 4096)."""
    a = np.full(SCALE_K, 1.875 * 2.0**-6)
    b = np.full(SCALE_K, 2.0**-5)
    a[::32], b[::32] = 1.0, 1.0
    return (torch.tensor(np.tile(a, blocks))[None], torch.tensor(np.tile(b, blocks))[None])


def _case(blocks: int, rows=_lift_rows):
    ra = {"kind": "block", "fmt": "e4m3", "block": [1, 128], "force_pow2_scales": True,
          "amax_epsilon": 0.0}
    a, b = rows(blocks)
    case = {"bias": False, "dist_a": {"kind": "crafted"}, "dist_b": {"kind": "crafted"},
            "dtype": "float32", "k": SCALE_K * blocks, "layout": "TN", "m": 1, "n": 1,
            "out_dtype": "float32", "recipe_a": ra, "recipe_b": ra, "seed": 0}

    def make_inputs(c, device):
        return {"a_x": a.to(device), "b_x": b.to(device),
                "_qa": qspec._operand(a, ra, False, device),
                "_qb": qspec._operand(b, ra, False, device)}
    return dataclasses.replace(get_spec("qgemm"), make_inputs=make_inputs), case


def register_block_hopper(make_backend, numerics: dict, bits: int = WINDOW_BITS) -> str:
    """A block-scaled qgemm computing as a Hopper block kernel does: per 128-long K block a
    fresh MMA sum (the measured 13-bit window), times the block's two fp32 scales, added in
    fp32."""
    b = make_backend("hopper_block")

    @b.implements("qgemm", dtypes=(torch.float32,), numerics=numerics,
                  check=lambda p: None if p["kind"] == "block" else "block scaling only")
    def fn(recipe_a, a_codes, a_scales, recipe_b, b_codes, b_scales, *, m, n, k, out_dtype,
           bias):
        av, bv = a_codes.double().numpy(), b_codes.double().numpy()
        sa = a_scales.float().numpy().reshape(n, -1)  # (1, K/128) per row
        sb = b_scales.float().numpy().reshape(m, -1)
        acc = np.zeros((m, n), np.float32)
        for j, k0 in enumerate(range(0, k, SCALE_K)):
            part = hopper_fp8_acc(bv[:, k0:k0 + SCALE_K], av[:, k0:k0 + SCALE_K], -6, -6, bits)
            acc = acc + (part * sb[:, j:j + 1]) * sa[:, j][None, :]
        return torch.from_numpy(acc).to(out_dtype), {}
    return b.name


def test_the_case_is_what_it_claims():
    a, b = _lift_rows(32)
    av, bv = a.double().numpy(), b.double().numpy()
    got, exact = hopper_fp8_acc(bv[:, :32], av[:, :32], -6, -6), bv[:, :32] @ av[:, :32].T
    assert got[0, 0] == 0.875  # the small products of the chunk are all lost
    assert exact[0, 0] - got[0, 0] == pytest.approx(30 * SMALL_A * SMALL_B)


@pytest.mark.parametrize("blocks", [1, 32])
def test_block_kernel_passes_with_the_lift_summed_per_block(make_backend, blocks):
    spec, case = _case(blocks)
    name = register_block_hopper(make_backend, declared(case["k"], restart=True))
    report = run_case(spec, case, backends=[name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()


def test_the_lift_over_all_of_k_accused_the_correct_block_kernel(make_backend):
    """The old declaration (no restart period: the lift taken once over K) fails the same
    correct kernel at K = 4096: a false alarm, now fixed by declaring ``mma_restart_k``."""
    spec, case = _case(32)
    name = register_block_hopper(make_backend, declared(case["k"], restart=False))
    assert run_case(spec, case, backends=[name]).verdict == "fail"


@pytest.mark.parametrize("bits", [WINDOW_BITS, WINDOW_BITS - 3, WINDOW_BITS - 4])
def test_a_coarser_block_accumulator_is_still_caught(make_backend, bits):
    """The restart declaration is not a blanket: on normal codes cut at their worst, the
    measured 13-bit window passes and a kernel keeping 3 or 4 fewer fraction bits, declared
    as the real one, fails.  (One or two fewer bits pass: the block bound gamma_128 per
    block is 4x the per-32-chunk loss the window allows; that looseness predates this.)"""
    spec, case = _case(32, _cut_rows)
    name = register_block_hopper(make_backend, declared(case["k"], restart=True), bits=bits)
    report = run_case(spec, case, backends=[name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert report.verdict == ("pass" if bits == WINDOW_BITS else "fail"), report.describe()


def test_restart_k_is_a_numerics_field():
    num = Numerics.of(declared(256, restart=True))
    assert num.mma_restart_k == SCALE_K
    with pytest.raises(ValueError, match="mma_restart_k"):
        Numerics.of({"mma_restart_k": 0})


def test_the_emulated_kernel_declares_what_triton_block_qgemm_declares_on_hopper():
    from tealite.backends import triton as triton_backend
    from tealite.backends.triton import qgemm as tq
    with triton_backend.PLATFORM.override(rocm=False,
                                          native_fp8_formats=frozenset({"e4m3", "e5m2"})):
        for k in (128, 4096):
            got = tq._numerics({"kind": "block", "fmt_a": "e4m3", "fmt_b": "e4m3", "k": k,
                                "device": "cuda"})
            assert got == declared(k, restart=True)


def test_grouped_qgemm_sums_the_lift_per_block_in_each_group():
    """grouped_qgemm's magnitude (split M: one weight, a row range per group) is each group's
    single-GEMM magnitude with the same restart period, stacked as the output is."""
    from tealite_verify.specs import grouped_qgemm as gspec
    a, b = _lift_rows(4)
    b2 = torch.cat([b, 0.5 * b, b.flip(1)])  # three rows, one group of 1 and one of 2
    ra = _case(4)[1]["recipe_a"]
    a_k, b_k = a.double().numpy(), b2.double().numpy()
    p_abs = np.abs(b_k) @ np.abs(a_k).T
    groups = [b_k[:1], b_k[1:]]
    aligned = gspec._Aligned([a_k], groups, ra, ra, p_abs, [1, 2], "TN")
    want = np.concatenate([qspec._AlignedMagnitude(a_k, g, ra, ra, p_abs[rows])(SCALE_K)
                           for g, rows in zip(groups, (slice(0, 1), slice(1, 3)))])
    np.testing.assert_array_equal(aligned(SCALE_K), want)
    assert (aligned(SCALE_K) >= aligned(None)).all()
    # rows 0 and 1 meet a subnormal a code with 448 in every chunk: four blocks' lifts, not one
    assert (aligned(SCALE_K)[:2] > aligned(None)[:2]).all()


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) \
        and torch.version.hip is None


@pytest.mark.skipif(not _hopper(), reason="needs an NVIDIA sm_90+ GPU: the check is of the "
                                          "FP8 tensor cores the emulation models")
@pytest.mark.parametrize("backend", ["triton", "aiter_triton"])
@pytest.mark.parametrize("blocks, value", [(32, 112.0), (8, 28.0)])
def test_on_hopper_the_block_kernels_write_the_emulated_value_and_pass(backend, blocks, value):
    """The real kernels on the crafted case: the emulation's value, and a pass under the
    restart declaration (measured on an H100 2026-11-27: both backends, both sizes; under
    the old declaration triton failed)."""
    spec, case = _case(blocks)
    report = run_case(spec, dict(case, dtype="bfloat16"), backends=[backend], device="cuda")
    outcome = report.outcomes[backend]
    if outcome.status != "ok":
        pytest.skip(f"{backend}: {outcome.reason}")
    assert float(outcome.outputs["out"].reshape(-1)[0]) == value
    assert report.verdict == "pass", report.describe()
