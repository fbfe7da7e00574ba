"""The benchmark suite (benchmarks/, which CI's pytest run does not collect) keeps working: its
byte counts match what the ops really write, and the whole suite runs once in smoke mode (tiny
shapes, CPU, Triton's interpreter) and renders its report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pytest_benchmark", reason="pytest-benchmark is not installed (test extra)")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(ROOT))

import tealite  # noqa: E402
from benchmarks import _cases as C  # noqa: E402
from benchmarks import report  # noqa: E402

# MX needs K (and M, columnwise) % 32; the FP8 recipes also get ragged shapes (partial blocks).
QUANT_SHAPES = ((32, 128), (64, 160))
RAGGED_SHAPES = ((33, 130), (5, 257))


def _quant_bytes_mismatches(formula) -> list[str]:
    """Cases where ``formula`` disagrees with input bytes + every tensor quantize returns."""
    bad = []
    for v in C.quant_variants():
        mx = isinstance(v.recipe, tealite.recipes.MXBlockScaling)
        for m, k in QUANT_SHAPES + (() if mx else RAGGED_SHAPES):
            x = torch.randn(m, k).to(torch.bfloat16)
            q = tealite.quantize(x, v.recipe, rowwise=v.rowwise, columnwise=v.columnwise,
                                 backend="torch")
            outs = (q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv, q.amax)
            actual = x.nbytes + sum(t.nbytes for t in outs if t is not None)
            predicted = formula(v.recipe, m, k, rowwise=v.rowwise, columnwise=v.columnwise,
                                in_itemsize=x.element_size())
            if predicted != actual:
                bad.append(f"{v.id} {m}x{k}: formula {predicted}, op writes+reads {actual}")
    return bad


def test_quantize_bytes_match_the_op_contract():
    assert _quant_bytes_mismatches(C.quantize_bytes) == []


def test_quantize_bytes_check_catches_a_wrong_formula(monkeypatch):
    """Seeded bug: MX scales counted as float32 (4 bytes) instead of one E8M0 byte."""
    good = C._scale_bytes

    def wrong(recipe, rows, cols):
        n = good(recipe, rows, cols)
        return 4 * n if isinstance(recipe, tealite.recipes.MXBlockScaling) else n

    monkeypatch.setattr(C, "_scale_bytes", wrong)
    bad = _quant_bytes_mismatches(C.quantize_bytes)
    assert bad and all(b.startswith("mx") for b in bad)


def test_rope_bytes_match_the_op():
    t, f = torch.randn(5, 2, 3, 16).bfloat16(), torch.randn(5, 1, 1, 10)
    y = tealite.rope_fwd(t, f, backend="torch")
    assert C.rope_bytes(tuple(t.shape), 10, 2) == t.nbytes + y.nbytes + f.nbytes


@pytest.mark.parametrize("bwd", [False, True])
def test_router_bytes_match_the_op(bwd):
    x = torch.randn(9, 16).bfloat16()
    probs, routing_map = tealite.router_fwd(x, 4, backend="torch")
    if bwd:
        dx = tealite.router_bwd(probs, x, routing_map, 4, backend="torch")
        actual = probs.nbytes + x.nbytes + routing_map.nbytes + dx.nbytes
    else:
        actual = x.nbytes + probs.nbytes + routing_map.nbytes
    assert C.router_bytes(9, 16, 2, bwd=bwd) == actual


def test_grouped_quantize_bytes_match_the_op():
    from benchmarks.test_bench_grouped_quantize import grouped_bytes
    x, splits = torch.randn(32, 130).bfloat16(), [5, 0, 27]
    for recipe in (tealite.recipes.Float8CurrentScaling(), tealite.recipes.Float8BlockScaling()):
        out = tealite.grouped_quantize(x, splits, recipe, columnwise=True, dbias=True,
                                       backend="torch")
        written = sum(t.nbytes for q in out.tensors for t in (
            q.data, q.scale_inv, q.columnwise_data, q.columnwise_scale_inv, q.amax)
            if t is not None)
        assert grouped_bytes(recipe, splits, 130, rowwise=True, columnwise=True, dbias=True,
                             itemsize=2) == x.nbytes + written + out.dbias.nbytes


def test_permute_bytes_match_the_op():
    x, idx = torch.randn(7, 24).bfloat16(), torch.tensor([[0, 2]] * 7, dtype=torch.int32)
    p = tealite.moe_permute(x, idx, map_type="index", num_experts=3, backend="torch")
    assert C.permute_bytes(x, idx, p.out, p.row_id_map.rows) == \
        x.nbytes + idx.nbytes + 14 * 24 * 2 + 14 * 4
    probs = torch.rand(7, 2)
    y = tealite.moe_unpermute(p.out, p.row_id_map, merging_probs=probs, backend="torch")
    assert C.unpermute_bytes(p.out, p.row_id_map.rows, y, probs) == \
        p.out.nbytes + 14 * 4 + x.nbytes + probs.nbytes


@pytest.mark.parametrize("bwd", [False, True])
def test_dropout_bytes_match_the_op(bwd):
    x = torch.randn(7, 24).bfloat16()
    y, mask = tealite.dropout_fwd(x, 0.1, seed=1, backend="torch")
    actual = x.nbytes + y.nbytes + mask.nbytes
    if bwd:
        dx = tealite.dropout_bwd(x, mask, 0.1, backend="torch")
        actual = x.nbytes + mask.nbytes + dx.nbytes
    assert C.dropout_bytes(x.numel(), 2) == actual


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm_bytes_match_the_op(kind):
    x, g, b = torch.randn(7, 96).bfloat16(), torch.randn(96).bfloat16(), torch.randn(96).bfloat16()
    if kind == "rmsnorm":
        r = tealite.rmsnorm_fwd(x, g, backend="torch")
        actual = x.nbytes + g.nbytes + r.y.nbytes + r.rsigma.nbytes
    else:
        r = tealite.layernorm_fwd(x, g, b, backend="torch")
        actual = x.nbytes + g.nbytes + b.nbytes + r.y.nbytes + r.mean.nbytes + r.rsigma.nbytes
    assert C.norm_bytes(kind, 7, 96, 2) == actual


def test_add_rmsnorm_pad_bytes_match_the_op():
    x, res, g = torch.randn(7, 90).bfloat16(), torch.randn(7, 90).bfloat16(), \
        torch.randn(90).bfloat16()
    r = tealite.add_rmsnorm_pad(x, g, eps=1e-5, residual=res, pad_to_multiple=32,
                                backend="torch")
    actual = x.nbytes + res.nbytes + g.nbytes + r.y.nbytes + r.residual_out.nbytes
    assert C.add_rmsnorm_pad_bytes(7, 90, r.y.shape[-1], 2) == actual


def test_multi_tensor_adam_bytes_match_the_op():
    """adam_bytes counts every tensor the op reads or writes once."""
    from benchmarks.test_bench_multi_tensor import adam_bytes
    sizes = [3, 0, 70]
    g = [torch.zeros(n).bfloat16() for n in sizes]
    p, w = [t.clone() for t in g], [torch.zeros(n) for n in sizes]
    m, v = [torch.zeros(n) for n in sizes], [torch.zeros(n) for n in sizes]
    moved = sum(t.nbytes for lst in (g, w, m, v) for t in lst) + \
        sum(t.nbytes for lst in (p, w, m, v) for t in lst)
    assert adam_bytes(sizes, 2, 2, True) == moved


def test_suite_runs_in_smoke_mode_and_reports(tmp_path):
    """One pass of every benchmark at tiny shapes under the interpreter: rows that can run
    carry device and wall numbers; the others are skips with a reason; none fail."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
           "--benchmark-json", str(out), "--bench-size", "tiny", "--bench-reps", "1",
           "--bench-warmup", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    ran = {b["name"]: b for b in data["benchmarks"]}
    skipped = data["tealite"]["skipped"]
    assert data["tealite"]["failed"] == []
    # Rows that need only torch always run.
    for name in ("test_copy", "test_quantize[fp8-perrow-torch]", "test_norm_fwd[rmsnorm-torch]",
                 "test_gemm_torch_matmul", "test_rope[fwd-torch]", "test_rope[bwd-torch]",
                 "test_router[fwd-softmax-torch]", "test_router[bwd-sigmoid-groups-torch]",
                 "test_grouped_gemm[uniform-torch]", "test_grouped_gemm[skewed-torch]",
                 "test_grouped_quantize[torch-fp8-block1x128-ct-dbias-skewed]",
                 "test_permute[index-torch]", "test_unpermute[probs-torch]",
                 "test_dropout[fwd-torch]", "test_dropout[bwd-torch]",
                 "test_multi_tensor_adam[torch]"):
        assert name in ran, (name, sorted(ran), skipped)
    assert all(s["reason"].strip() for s in skipped)
    # GPU-only rows: skipped on the CPU with their reason (benchmarks/test_bench_modules.py).
    assert any("test_layernorm_mlp[" in s["test"] and "GPU measurement" in s["reason"]
               for s in skipped), skipped
    # GPU-only rows are recorded as skips with their reason (issue 17: the bulk scaling update).
    assert any("delayed_scaling_update_bulk" in s["test"] and "GPU only" in s["reason"]
               for s in skipped), skipped
    for b in ran.values():
        ei = b["extra_info"]
        assert ei["timer"] == "wall" and ei["device_ms_median"] > 0 and b["stats"]["rounds"] >= 1
        assert (ei.get("gbps") or ei.get("tflops")) is not None, b["name"]
        assert ei.get("met") is None  # smoke numbers are never judged against targets
    md = report.render(data)
    assert "# tealite benchmarks" in md and "## quantize" in md and "torch " in md
    assert "## grouped_gemm" in md
    assert all(f"`{s['test']}`" in md for s in skipped)
