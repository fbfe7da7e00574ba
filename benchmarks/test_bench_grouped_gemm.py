"""Grouped GEMM (issue 16) against the dense GEMM at the same total FLOPs: the MoE layer's
G expert GEMMs in one grouped call vs one (M_total, N, K) GEMM of the same backend.

Rows ("grouped_gemm" group): tealite's triton grouped bf16 GEMM (TN fprop) for a uniform
split (8 groups x 2048 tokens, N = K = 4096) and a skewed one (the same total, group sizes
from 0 to 6144), each against the triton dense bf16 GEMM of (16384, 4096, 4096) (target
85 %); the torch backend's loop of matmuls and AITER's Triton ``gmm`` on the same operands;
grouped FP8 block scaling (1x128 activations, 128x128 weights) against the triton dense FP8
block GEMM (target 85 %), and grouped MXFP8 (E8M0 per 32 along K, both operands) against the
triton dense MXFP8 GEMM (the same target; not yet run on a GPU).  Every row first checks its output against a float32 product of the
same (dequantized) operands, as benchmarks/test_bench_gemm.py does.

Operands are built so the grouped call copies nothing: the per-group activation blocks are
row slices of one tensor and the per-group weights slices of one stacked tensor (a MoE
layer's layout), which the triton backend reads in place.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import tealite
from benchmarks import _cases as C
from benchmarks.conftest import _bf16_randn, need_aiter
from tealite import recipes as R

BF16 = torch.bfloat16
TARGET = C.TARGETS["grouped_gemm"][1]
REL_ERR_MAX = 1e-2
# (splits, N, K) per size.  Large: issue 16's 8 x 2048 x 4096 x 4096 and a skewed split of
# the same 16384 tokens with an empty expert.  Tiny (smoke, interpreter): K = 128, one full
# scale block.
SHAPES = {
    "large": {"uniform": ((2048,) * 8, 4096, 4096),
              "skewed": ((6144, 4096, 2048, 1536, 1024, 768, 768, 0), 4096, 4096)},
    "tiny": {"uniform": ((16, 16), 32, 128), "skewed": ((29, 0, 3), 32, 128)},
}
BLOCK_A, BLOCK_B = R.Float8BlockScaling(block=(128, 128)), R.Float8BlockScaling(block=(1, 128))
MX = R.MXFP8BlockScaling()


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(ref_fn, strict: bool, gpu: bool):
    def check(out):
        err = _rel_err(out, ref_fn())
        if strict and gpu:
            assert err <= REL_ERR_MAX, f"relative error {err:.3g} > {REL_ERR_MAX}"
        return {"rel_err": err}
    return check


@dataclasses.dataclass
class Problem:
    splits: tuple
    w: torch.Tensor   # (G, N, K) bf16: group g's weight, TN
    x: torch.Tensor   # (M_total, K) bf16: the tokens, group after group
    _ref: torch.Tensor | None = None
    _q: dict = dataclasses.field(default_factory=dict)

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.x.shape[0], self.w.shape[1], self.w.shape[2]

    @property
    def flops(self) -> int:
        return C.gemm_flops(*self.mnk)

    def rows(self, g: int) -> slice:
        lo = sum(self.splits[:g])
        return slice(lo, lo + self.splits[g])

    def ref(self) -> torch.Tensor:
        if self._ref is None:
            self._ref = torch.cat([self.x[self.rows(g)].float() @ self.w[g].float().t()
                                   for g in range(len(self.splits))])
        return self._ref

    def quantized(self, recipe_a=BLOCK_A, recipe_b=BLOCK_B):
        """(per-group weight QuantizedTensors, per-group token QuantizedTensors, the dense
        pair, float32 reference): views of one quantization of the stacked operands (128x128
        blocks never straddle two experts since N % 128 == 0; 1x128 and MX blocks are per
        row)."""
        key = (recipe_a, recipe_b)
        if key not in self._q:
            g_count, n, k = self.w.shape
            xq = tealite.quantize(self.x, recipe_b)
            rows = recipe_a.block[0] if recipe_a.kind == "block" else 1
            if n % rows == 0:
                wq = tealite.quantize(self.w.reshape(g_count * n, k), recipe_a)
                nb = n // rows
                a = [dataclasses.replace(wq, shape=(n, k), data=wq.data[g * n:(g + 1) * n],
                                         scale_inv=wq.scale_inv[g * nb:(g + 1) * nb])
                     for g in range(g_count)]
            else:  # tiny shapes: blocks would straddle experts; one quantization each
                a = [tealite.quantize(self.w[g], recipe_a) for g in range(g_count)]
            b = [dataclasses.replace(xq, shape=(s, k), data=xq.data[self.rows(g)],
                                     scale_inv=xq.scale_inv[self.rows(g)])
                 for g, s in enumerate(self.splits)]

            def deq(q):
                return tealite.dequantize(q, backend="torch")
            ref = torch.cat([deq(b[g]) @ deq(a[g]).t() for g in range(g_count)])
            # The dense GEMM of the same FLOPs: all tokens times expert 0's weight.
            dense_w = a[0]
            self._q[key] = (a, b, (dense_w, xq), ref)
        return self._q[key]


@pytest.fixture(scope="module", params=["uniform", "skewed"])
def problem(request, bench_config) -> Problem:
    size = "large" if bench_config.size == "large" else "tiny"
    splits, n, k = SHAPES[size][request.param]
    dev = bench_config.device
    return Problem(splits, _bf16_randn((len(splits), n, k), dev, 21),
                   _bf16_randn((sum(splits), k), dev, 22))


def _dense_baseline(baselines, p: Problem) -> dict:
    """The triton dense bf16 GEMM of the same total FLOPs: (M_total, K) @ (K, N)."""
    return baselines.get(f"triton gemm bf16 dense {p.mnk}",
                         lambda: tealite.gemm(p.w[0], p.x, layout="TN", backend="triton"),
                         p.flops)


def _dense_q_baseline(baselines, p: Problem, recipes=(BLOCK_A, BLOCK_B),
                      name="fp8-block") -> dict:
    _, _, (wq, xq), _ = p.quantized(*recipes)
    return baselines.get(f"triton qgemm {name} dense {p.mnk}",
                         lambda: tealite.qgemm(wq, xq, layout="TN", out_dtype=BF16,
                                               backend="triton"), p.flops)


def _split_name(p: Problem) -> str:
    return "uniform" if len(set(p.splits)) == 1 else "skewed"


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_grouped_gemm(bench, bench_config, baselines, problem, backend):
    p = problem
    bench.run(lambda: tealite.grouped_gemm(p.w, p.x, p.splits, layout="TN", backend=backend),
              group="grouped_gemm", kernel=f"grouped GEMM bf16 TN {_split_name(p)} "
              f"G={len(p.splits)}", backend=backend, shape=p.mnk, dtype=BF16, flops=p.flops,
              reference=_dense_baseline(baselines, p),
              target_pct=TARGET if backend == "triton" else None,
              check=_check(p.ref, backend == "triton", bench_config.gpu))


def test_grouped_gemm_aiter(bench, bench_config, baselines, aiter, problem):
    need_aiter(aiter, "gmm")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("AITER's gmm dots bf16 tiles directly: Triton's interpreter multiplies "
                    "bf16 tl.dot operands as raw bits (its numbers would be garbage)")
    p = problem
    sizes = torch.tensor(p.splits, dtype=torch.int32, device=p.x.device)
    rhs = p.w.transpose(1, 2)  # (G, K, N) column-major: AITER's TRANS_RHS (TN)
    bench.run(lambda: aiter.gmm(p.x, rhs, sizes, preferred_element_type=BF16),
              group="grouped_gemm", kernel=f"grouped GEMM bf16 TN {_split_name(p)} "
              f"G={len(p.splits)}", backend="aiter gmm", shape=p.mnk, dtype=BF16,
              flops=p.flops, reference=_dense_baseline(baselines, p),
              check=_check(p.ref, False, bench_config.gpu), foreign=True)


def test_grouped_qgemm_block(bench, bench_config, baselines, problem):
    p = problem
    a, b, _, ref = p.quantized()
    bench.run(lambda: tealite.grouped_qgemm(a, b, p.splits, layout="TN", out_dtype=BF16,
                                            backend="triton"),
              group="grouped_gemm", kernel=f"grouped qgemm fp8-block TN {_split_name(p)} "
              f"G={len(p.splits)}", backend="triton", shape=p.mnk, dtype=a[0].data.dtype,
              flops=p.flops, reference=_dense_q_baseline(baselines, p), target_pct=TARGET,
              check=_check(lambda: ref, True, bench_config.gpu))


def test_grouped_qgemm_mxfp8(bench, bench_config, baselines, problem):
    p = problem
    a, b, _, ref = p.quantized(MX, MX)
    bench.run(lambda: tealite.grouped_qgemm(a, b, p.splits, layout="TN", out_dtype=BF16,
                                            backend="triton"),
              group="grouped_gemm", kernel=f"grouped qgemm mxfp8 TN {_split_name(p)} "
              f"G={len(p.splits)}", backend="triton", shape=p.mnk, dtype=a[0].data.dtype,
              flops=p.flops, reference=_dense_q_baseline(baselines, p, (MX, MX), "mxfp8"),
              target_pct=TARGET, check=_check(lambda: ref, True, bench_config.gpu))
