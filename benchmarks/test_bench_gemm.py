"""Compute-bound ops against torch baselines measured in the same run: bf16 GEMM vs
torch.matmul, FP8 GEMM (per-tensor / rowwise scales) vs torch._scaled_mm, block-scaled and MX
GEMMs (no torch baseline: TFLOP/s only), and AITER's Triton GEMMs side by side.

Every row first checks its output against a float32 product of the same (dequantized)
operands: ||out - ref|| / ||ref|| goes into extra_info, and on a GPU a tealite row above
:data:`REL_ERR_MAX` fails (a fast wrong kernel must not look like a result).
"""
from __future__ import annotations

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter
from tealite import recipes as R

BF16 = torch.bfloat16
GEMM_TARGET, QGEMM_TARGET = C.TARGETS["gemm"][1], C.TARGETS["qgemm_fp8"][1]
REL_ERR_MAX = 1e-2
LAYOUT = "TN"  # D = B @ A.T: A (N, K) the weight, B (M, K) the input, both K-contiguous

PAIRS = {  # (A's recipe, B's recipe)
    "fp8-tensor": (R.Float8CurrentScaling(), R.Float8CurrentScaling()),
    "fp8-row": (R.Float8CurrentScaling(granularity="row"),) * 2,
    "fp8-block": (R.Float8BlockScaling(block=(128, 128)), R.Float8BlockScaling(block=(1, 128))),
    "mxfp8": (R.MXFP8BlockScaling(),) * 2,
    "mxfp8-acc": (R.MXFP8BlockScaling(),) * 2,
    "mxfp8-fold": (R.MXFP8BlockScaling(),) * 2,
    "mxfp4": (R.MXFP4BlockScaling(),) * 2,
    "mxfp4-fold": (R.MXFP4BlockScaling(),) * 2,
}
# Rows that run a kernel variant of the triton backend: (module, its VARIANTS settings).  The
# plain MX rows run the default ("auto": staged operands on NVIDIA at these sizes).
VARIANT_PAIRS = {"mxfp8-acc": ("qgemm", {"mx": "acc"}),  # MX scales in the accumulator
                 "mxfp8-fold": ("qgemm", {"mx": "fold"}),  # scales folded in the GEMM loop
                 "mxfp4-fold": ("qgemm", {"mx": "fold"})}
SCALED_MM = {"fp8-tensor": "torch._scaled_mm fp8 per-tensor",
             "fp8-row": "torch._scaled_mm fp8 rowwise"}
QGEMM_CASES = [pytest.param(p, "triton", id=f"{p}-triton") for p in PAIRS] + \
    [pytest.param(p, "scaled_mm", id=f"{p}-scaled_mm") for p in SCALED_MM]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def mats(bench_config):
    """A (N, K) and B (M, K)."""
    m, n, k = bench_config.sizes.gemm
    return _bf16_randn((n, k), bench_config.device, 11), _bf16_randn((m, k), bench_config.device, 12)


def _mnk(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    return b.shape[0], a.shape[0], a.shape[1]


@pytest.fixture(scope="module")
def mats_ref(mats):
    a, b = mats
    return b.float() @ a.float().t()


class QOperands:
    """Quantized operands per recipe pair (built once, by whichever backend supports them),
    with their float32 reference product."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.a, self.b, self._q, self._ref = a, b, {}, {}

    def __call__(self, pair: str):
        if pair not in self._q:
            ra, rb = PAIRS[pair]
            try:
                self._q[pair] = (tealite.quantize(self.a, ra), tealite.quantize(self.b, rb))
            except tealite.UnsupportedCase as exc:
                pytest.skip(f"cannot quantize the operands: {exc}")
        return self._q[pair]

    def ref(self, pair: str) -> torch.Tensor:
        if pair not in self._ref:
            aq, bq = self(pair)
            deq = [tealite.dequantize(q, backend="torch") for q in (aq, bq)]
            self._ref[pair] = deq[1] @ deq[0].t()
        return self._ref[pair]


@pytest.fixture(scope="module")
def qops(mats):
    return QOperands(*mats)


def _check(ref_fn, strict: bool, gpu: bool):
    def check(out):
        out = getattr(out, "out", out)  # GemmOutput / QGemmOutput
        err = _rel_err(out, ref_fn())
        if strict and gpu:
            assert err <= REL_ERR_MAX, f"relative error {err:.3g} > {REL_ERR_MAX}"
        return {"rel_err": err}
    return check


def _scaled_mm(aq, bq, rowwise: bool):
    m, n = bq.data.shape[0], aq.data.shape[0]
    if rowwise:
        sa, sb = bq.scale_inv.float().reshape(m, 1), aq.scale_inv.float().reshape(1, n)
    else:
        sa, sb = bq.scale_inv.float().reshape(()), aq.scale_inv.float().reshape(())
    return lambda: torch._scaled_mm(bq.data, aq.data.t(), scale_a=sa, scale_b=sb,
                                    out_dtype=BF16)


def _matmul_baseline(baselines, a, b):
    return baselines.get("torch.matmul bf16", lambda: torch.matmul(b, a.t()),
                         C.gemm_flops(*_mnk(a, b)))


def _scaled_mm_baseline(baselines, qops, pair):
    aq, bq = qops(pair)
    return baselines.get(SCALED_MM[pair], _scaled_mm(aq, bq, pair == "fp8-row"),
                         C.gemm_flops(*_mnk(qops.a, qops.b)))


# ---- bf16 GEMM -----------------------------------------------------------------------------

def test_gemm_torch_matmul(bench, bench_config, baselines, mats, mats_ref):
    a, b = mats
    mnk = _mnk(a, b)
    bench.run(lambda: torch.matmul(b, a.t()), group="gemm", kernel="GEMM bf16 (B @ A.T)",
              backend="torch.matmul", shape=mnk, dtype=BF16, flops=C.gemm_flops(*mnk),
              reference=_matmul_baseline(baselines, a, b),
              check=_check(lambda: mats_ref, False, bench_config.gpu))


def test_gemm_triton(bench, bench_config, baselines, mats, mats_ref):
    a, b = mats
    mnk = _mnk(a, b)
    bench.run(lambda: tealite.gemm(a, b, layout=LAYOUT, backend="triton"), group="gemm",
              kernel=f"GEMM bf16 {LAYOUT}", backend="triton", shape=mnk, dtype=BF16,
              flops=C.gemm_flops(*mnk), reference=_matmul_baseline(baselines, a, b),
              target_pct=GEMM_TARGET, check=_check(lambda: mats_ref, True, bench_config.gpu))


def test_gemm_aiter(bench, bench_config, baselines, aiter, mats, mats_ref):
    need_aiter(aiter, "gemm_a16w16")
    a, b = mats
    mnk = _mnk(a, b)
    bench.run(lambda: aiter.gemm_a16w16(b, a, dtype=BF16), group="gemm",
              kernel=f"GEMM bf16 {LAYOUT}", backend="aiter gemm_a16w16", shape=mnk,
              dtype=BF16, flops=C.gemm_flops(*mnk),
              reference=_matmul_baseline(baselines, a, b),
              check=_check(lambda: mats_ref, False, bench_config.gpu), foreign=True)


# ---- quantized GEMM ------------------------------------------------------------------------

@pytest.mark.parametrize("pair", list(SCALED_MM))
def test_qgemm_torch_scaled_mm(bench, bench_config, baselines, qops, pair):
    aq, bq = qops(pair)
    mnk = _mnk(qops.a, qops.b)
    reference = _scaled_mm_baseline(baselines, qops, pair)
    if "error" in reference:
        pytest.skip(f"{SCALED_MM[pair]} does not run here: {reference['error']}")
    bench.run(_scaled_mm(aq, bq, pair == "fp8-row"), group="qgemm", kernel=f"qgemm {pair}",
              backend="torch._scaled_mm", shape=mnk, dtype=aq.data.dtype,
              flops=C.gemm_flops(*mnk), reference=reference,
              check=_check(lambda: qops.ref(pair), False, bench_config.gpu))


@pytest.mark.parametrize("pair,backend", QGEMM_CASES)
def test_qgemm(bench, bench_config, baselines, qops, pair, backend, monkeypatch):
    if pair in VARIANT_PAIRS:
        import importlib
        module, settings = VARIANT_PAIRS[pair]
        variants = importlib.import_module(f"tealite.backends.triton.{module}").VARIANTS
        for key, value in settings.items():
            monkeypatch.setitem(variants, key, value)
    aq, bq = qops(pair)
    mnk = _mnk(qops.a, qops.b)
    reference = _scaled_mm_baseline(baselines, qops, pair) if pair in SCALED_MM else None
    target = QGEMM_TARGET if backend == "triton" and pair in SCALED_MM else None
    bench.run(lambda: tealite.qgemm(aq, bq, layout=LAYOUT, out_dtype=BF16, backend=backend),
              group="qgemm", kernel=f"qgemm {pair} {LAYOUT}", backend=backend,
              shape=mnk, dtype=aq.data.dtype, flops=C.gemm_flops(*mnk),
              reference=reference, target_pct=target,
              check=_check(lambda: qops.ref(pair), True, bench_config.gpu))


def _aiter_qgemm_call(aiter, pair, aq, bq):
    m, n = bq.data.shape[0], aq.data.shape[0]
    if pair == "fp8-row":  # per-token x per-channel scales
        sx, sw = bq.scale_inv.float().reshape(m, 1), aq.scale_inv.float().reshape(1, n)
        return "gemm_a8w8", lambda: aiter.gemm_a8w8(bq.data, aq.data, sx, sw, dtype=BF16)
    if pair == "fp8-block":  # x scales (M, K/128), w scales (N/128, K/128): tealite's layout
        return "gemm_a8w8_blockscale", lambda: aiter.gemm_a8w8_blockscale(
            bq.data, aq.data, bq.scale_inv, aq.scale_inv, dtype=BF16)
    # mxfp4: packed e2m1 codes (low nibble = even element) and E8M0 bytes, as tealite's
    return "gemm_afp4wfp4", lambda: aiter.gemm_afp4wfp4(
        bq.data.view(torch.uint8), aq.data.view(torch.uint8), bq.scale_inv, aq.scale_inv,
        dtype=BF16)


@pytest.mark.parametrize("pair", ["fp8-row", "fp8-block", "mxfp4"])
def test_qgemm_aiter(bench, bench_config, baselines, aiter, qops, pair):
    aq, bq = qops(pair)
    name, fn = _aiter_qgemm_call(aiter, pair, aq, bq)
    need_aiter(aiter, name)
    if aq.data.dtype not in (aiter.fp8_dtype, torch.uint8):
        pytest.skip(f"AITER pinned to {aiter.arch} expects {aiter.fp8_dtype}, operands are "
                    f"{aq.data.dtype}")
    mnk = _mnk(qops.a, qops.b)
    reference = _scaled_mm_baseline(baselines, qops, pair) if pair in SCALED_MM else None
    bench.run(fn, group="qgemm", kernel=f"qgemm {pair} {LAYOUT}", backend=f"aiter {name}",
              shape=mnk, dtype=aq.data.dtype, flops=C.gemm_flops(*mnk),
              reference=reference, check=_check(lambda: qops.ref(pair), False,
                                                bench_config.gpu), foreign=True)
