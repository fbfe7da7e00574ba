"""The staged MX qgemm (qgemm.py ``VARIANTS["mx"] == "staged"``, _qgemm_mx_staged.py: both
operands staged once as exactly scaled bf16, tealite's bf16 GEMM, then an exact fixup of the
output tiles whose rows are not exact in bf16), under Triton's CPU interpreter (CI) or on a
GPU: hostile cases pass the qgemm spec, the stage pass flags exactly the inexact rows, seeded
bugs (scales one block late, the row flags dropped, the fixup skipped) are caught, and "auto"
stages only large problems on NVIDIA.  The scale-byte edges (overflow, lost subnormal codes,
NaN, zero blocks) and the seeded routing bugs run for this path beside the folded one in
tests/test_triton_qgemm.py."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from tealite import recipes as R
from tealite import registry
from tealite.backends.triton import INTERPRET
from tealite_verify.references import quantize as qref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

from _helpers_qgemm import (MX_OUTLIERS, WIDE, launch_flags, mx_edge_operands,
                            mx_out_of_bound, mx_recipe, qgemm_case, scales_one_block_late)

TRITON = registry.get_backend("triton")
pytestmark = pytest.mark.skipif(TRITON.unavailable_reason() is not None,
                                reason=f"triton backend: {TRITON.unavailable_reason()}")
DEVICE = "cpu" if INTERPRET else "cuda"
SPEC = get_spec("qgemm")

if TRITON.unavailable_reason() is None:
    from tealite.backends import triton as triton_backend
    from tealite.backends.triton import _qgemm_mx_staged as tms
    from tealite.backends.triton import qgemm as tq


@pytest.fixture
def staged(monkeypatch):
    """The staged path switched on; yields the mx_staged flag of every dense launch."""
    yield launch_flags(monkeypatch, tq, "staged", "mx_staged")


_mx = mx_recipe
_case = functools.partial(qgemm_case, seed=11)
CASES = {
    "e4m3-TN-subnormal-codes": _case(_mx(), _mx(), "TN", 20, 40, 128, dist_a=MX_OUTLIERS,
                                     dist_b=MX_OUTLIERS, out_dtype="float32"),
    "e5m2-x-e4m3-NN-k45-bias": _case(_mx("e5m2"), _mx(), "NN", 17, 33, 45, bias=True),
    "fp32-bias-TN": _case(_mx(), _mx(), "TN", 19, 21, 64, bias=True, dtype="float32",
                          out_dtype="float32"),
    "e4m3-NT-wide-scales": _case(_mx(), _mx(), "NT", 18, 36, 96, dist_a=WIDE, dist_b=WIDE,
                                 out_dtype="float32"),
    "e2m1-TN-k70": _case(_mx("e2m1"), _mx("e2m1"), "TN", 23, 17, 70),
    "e2m1-x-e4m3-TT-wide": _case(_mx("e2m1"), _mx(), "TT", 16, 24, 96, dist_a=WIDE,
                                 dist_b=WIDE, out_dtype="float32"),
    "e5m2-tiny-k1": _case(_mx("e5m2"), _mx("e5m2"), "TN", 3, 7, 1, dist_a={"kind": "tiny"},
                          dtype="float32"),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_staged_passes_the_qgemm_spec(staged, name):
    report = run_case(SPEC, CASES[name], backends=["triton", "torch"], device=DEVICE)
    assert report.outcomes["triton"].status == "ok", report.describe()
    assert report.verdict == "pass", report.describe()
    assert staged and all(staged), staged  # the triton calls ran the staged path


# ---- the stage pass's row flags ------------------------------------------------------------

def _mismatches(case, **launch_kw) -> int:
    return mx_out_of_bound(mx_edge_operands(case, "e4m3", "e4m3"), "e4m3", "e4m3", DEVICE,
                           tq._dense_numerics, mx_staged=True, **launch_kw)


@pytest.mark.parametrize("case, a_rows, b_rows", [
    ("overflow", [0, 1, 2], []), ("underflow", [], [0, 1, 2, 3]), ("nan-byte", [5], []),
    ("zero-blocks", [], [])])
def test_the_stage_pass_flags_exactly_the_inexact_rows(case, a_rows, b_rows):
    """The rows holding a byte above the fast range (NaN included) or a nonzero code under a
    byte below it are flagged, with the any-row word; every other row is staged exactly."""
    a_bits, a_bytes, b_bits, b_bytes = mx_edge_operands(case, "e4m3", "e4m3")
    common = dict(e8m0_bias=127, scale_block=32, even_low=True)
    for bits, byte, want in ((a_bits, a_bytes, a_rows), (b_bits, b_bytes, b_rows)):
        codes, scales = torch.from_numpy(bits).to(DEVICE), torch.from_numpy(byte).to(DEVICE)
        rows = codes.shape[0]
        staged16, flags = tms.stage(codes, scales, scales.stride(0), scales.stride(1), rows,
                                    128, tq._constants("e4m3"), **common)
        assert torch.nonzero(flags[:rows].cpu()).flatten().tolist() == want
        assert int(flags[rows]) == (1 if want else 0)  # the any-row word
        ok = np.ones(rows, bool)
        ok[want] = False
        np.testing.assert_array_equal(staged16.float().cpu().numpy()[ok],
                                      qref.mx_dequantize(bits, byte, "e4m3")[ok])


# ---- seeded bugs -------------------------------------------------------------------------------

def test_seeded_scale_one_block_late_is_caught(staged, monkeypatch):
    case = CASES["e4m3-NT-wide-scales"]
    monkeypatch.setattr(tq, "_scale_operand", scales_one_block_late(tq._scale_operand))
    bad = run_case(SPEC, case, backends=["triton", "torch"], device=DEVICE)
    assert bad.outcomes["triton"].status == "ok", bad.describe()
    assert bad.verdict == "fail", bad.describe()


@pytest.mark.parametrize("case", ["overflow", "underflow"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_seeded_row_flags_dropped_is_caught(monkeypatch, case):
    """Without the row flags no tile is redone: the bf16 GEMM's overflowed or lost values
    stand, and the check sees them (the correct path passes the same edges:
    tests/test_triton_qgemm.py)."""
    real = tms.stage

    def unflagged(*args, **kwargs):
        staged16, flags = real(*args, **kwargs)
        return staged16, torch.zeros_like(flags)

    monkeypatch.setattr(tms, "stage", unflagged)
    assert _mismatches(case) > 0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_seeded_fixup_skipped_is_caught(monkeypatch):
    real = tq._launch_one

    def no_fixup(*args, staged=False, **kwargs):
        if not staged:
            real(*args, **kwargs)

    monkeypatch.setattr(tq, "_launch_one", no_fixup)
    assert _mismatches("overflow") > 0


# ---- which problems stage --------------------------------------------------------------------

def test_auto_stages_only_large_problems_on_nvidia(monkeypatch):
    monkeypatch.setattr(tms, "INTERPRET", False)
    side = tms._AUTO_MIN_SIDE
    with triton_backend.PLATFORM.override(rocm=False):
        assert tms.staged_pays(8192, 8192, 8192, "cuda")
        assert tms.staged_pays(16384, 4096, 4096, "cuda")
        assert not tms.staged_pays(4096, 4096, 4096, "cuda")  # host-bound there
        assert not tms.staged_pays(side - 1, 2**20, 8192, "cuda")
        assert not tms.staged_pays(2**20, 8192, side - 1, "cuda")
        assert not tms.staged_pays(8192, 8192, 8192, "cpu")
        monkeypatch.setitem(tq.VARIANTS, "mx", "auto")
        assert tms.staged_runs("mx", 8192, 8192, 8192, "cuda")
        assert not tms.staged_runs("fp8", 8192, 8192, 8192, "cuda")
        monkeypatch.setitem(tq.VARIANTS, "mx", "fold")
        assert not tms.staged_runs("mx", 8192, 8192, 8192, "cuda")
    with triton_backend.PLATFORM.override(rocm=True):  # unmeasured there: the folded kernel
        assert not tms.staged_pays(8192, 8192, 8192, "cuda")


def test_staged_is_refused_for_other_kinds():
    codes = torch.zeros(8, 32, dtype=torch.uint8, device=DEVICE)
    fp8 = R.Float8CurrentScaling()
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match="mx_staged: the staged path takes MX recipes"):
        tq.launch(fp8, codes, one, fp8, codes, one, m=8, n=8, k=32, out_dtype=torch.float32,
                  bias=None, mx_staged=True)
