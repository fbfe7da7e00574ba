"""The scaled_mm backend probes what torch._scaled_mm runs instead of assuming it (issue 13).

On a Xeon with oneDNN limited to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``) the CPU's FP8 matmul raised
``could not create a primitive descriptor for the matmul primitive`` and every such case was
reported as an error of the backend.  The machines these tests run on may not fail at all, so
a failing probe is faked: the case must then be unsupported, with the probe's reason, and
``list`` must show it.
"""
from __future__ import annotations

import pytest
import torch

import tealite
from tealite import recipes as R
from tealite.backends.scaled_mm import probes
from tealite_verify import listing
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec

ONEDNN_ERROR = "could not create a primitive descriptor for the matmul primitive"


@pytest.fixture
def fresh_probes():
    probes.failure.cache_clear()
    yield
    probes.failure.cache_clear()


@pytest.fixture
def failing_bf16_per_tensor(monkeypatch, fresh_probes):
    """The probe fails for e4m3 x e4m3 -> bfloat16 with per-tensor scales only."""
    real = probes.run_probe
    calls = []

    def fake(fmt_b, fmt_a, out_dtype, rowwise, device):
        calls.append((fmt_b, fmt_a, out_dtype, rowwise, device))
        if (fmt_b, fmt_a, out_dtype, rowwise) == ("e4m3", "e4m3", torch.bfloat16, False):
            raise RuntimeError(ONEDNN_ERROR)
        return real(fmt_b, fmt_a, out_dtype, rowwise, device)

    monkeypatch.setattr(probes, "run_probe", fake)
    return calls


def _operands(granularity="tensor"):
    a = tealite.quantize(torch.randn(32, 64), R.Float8CurrentScaling())
    b = tealite.quantize(torch.randn(8, 64), R.Float8CurrentScaling(granularity=granularity))
    return a, b


def test_every_combination_the_backend_uses_runs_or_says_why(fresh_probes):
    for combo in probes.used_on("cpu"):
        err = probes.failure(*combo, "cpu")
        assert err is None or isinstance(err, str) and err, combo
    assert len(probes.used_on("cpu")) == 18  # 3 format pairs x 3 dtypes x 2 scale kinds


def test_probe_runs_once_per_combination(failing_bf16_per_tensor):
    a, b = _operands()
    for _ in range(3):
        with pytest.raises(tealite.UnsupportedCase):
            tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="scaled_mm")
    assert failing_bf16_per_tensor.count(("e4m3", "e4m3", torch.bfloat16, False, "cpu")) == 1


def test_failing_probe_makes_the_case_unsupported_with_its_reason(failing_bf16_per_tensor):
    a, b = _operands()
    with pytest.raises(tealite.UnsupportedCase, match=ONEDNN_ERROR):
        tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="scaled_mm")
    # The other combinations still run where this machine's probe says so (torch 2.11's CPU
    # _scaled_mm, on the H200 host, refused rowwise scales: declared unsupported there too).
    tealite.qgemm(a, b, layout="TN", out_dtype=torch.float32, backend="scaled_mm")
    a, b = _operands("row")
    if probes.failure("e4m3", "e4m3", torch.bfloat16, True, "cpu") is None:
        tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="scaled_mm")
    else:
        with pytest.raises(tealite.UnsupportedCase, match="rowwise scales fails on this cpu"):
            tealite.qgemm(a, b, layout="TN", out_dtype=torch.bfloat16, backend="scaled_mm")
    # backend=None passes over scaled_mm to the next capable backend.
    assert tealite.qgemm(*_operands(), layout="TN", out_dtype=torch.bfloat16).out.shape == (8, 32)


def test_failing_probe_is_reported_unsupported_by_the_harness_not_as_an_error(
        failing_bf16_per_tensor):
    spec = get_spec("qgemm")
    case = next(c for c in spec.smoke_cases
                if c["recipe_a"]["kind"] == c["recipe_b"]["kind"] == "current"
                and c["recipe_a"]["granularity"] == c["recipe_b"]["granularity"] == "tensor"
                and c["out_dtype"] == "bfloat16" and not c["bias"])
    report = run_case(spec, case, backends=["torch", "scaled_mm"])
    out = report.outcomes["scaled_mm"]
    assert out.status == "unsupported", report.describe()
    assert ONEDNN_ERROR in out.reason and "probed" in out.reason, out.reason
    assert report.outcomes["torch"].status == "ok"
    assert report.verdict == "pass", report.describe()
    with_bias = dict(case, bias=True)  # asks _scaled_mm for fp32: runs
    assert run_case(spec, with_bias, backends=["scaled_mm"]).outcomes["scaled_mm"].status == "ok"


def test_list_shows_the_probe(failing_bf16_per_tensor):
    table = " ".join(listing.probed_table().split())  # the finding column wraps at 100
    assert "torch._scaled_mm e4m3 x e4m3 -> bfloat16, per-tensor scales" in table
    assert ONEDNN_ERROR in table and "declared unsupported" in table
    probes.failure.cache_clear()
    rows = [r for r in probes.describe(("cpu",)) if ONEDNN_ERROR in r[2]]
    assert len(rows) == 1 and rows[0][0].endswith("e4m3 x e4m3 -> bfloat16, per-tensor scales")


def test_list_says_all_run_when_they_do(monkeypatch, fresh_probes):
    monkeypatch.setattr(probes, "run_probe", lambda *a: None)
    assert probes.describe(("cpu",)) == [("torch._scaled_mm (scaled_mm backend)", "cpu",
                                          "all 18 FP8 format x output dtype x scale "
                                          "combinations run")]
