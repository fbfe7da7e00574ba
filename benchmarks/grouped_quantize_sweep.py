"""Grouped quantize's kernel variants side by side on a GPU, bit-checked:
``python -m benchmarks.grouped_quantize_sweep [--reps 20] [--only ct]``.

For every row of benchmarks/test_bench_grouped_quantize.py (bf16 8192 x 8192, 8 groups even
and skewed) plus two that isolate the cast-transpose (a given scale: no amax pass; 1x128
without dbias), and for each ``grouped_quantize.VARIANTS["ct"]`` ("plain", the default, and
"aligned", at the default tiles): the op-level time (device events, L2 flushed, median) and the
kernels alone (torch.profiler's busy time per call), both as % of an in-run device copy of
the same bytes (the bench's byte count).  Every configuration's outputs (codes, scales,
amaxes, dbias) are compared bit for bit with the default's; a mismatch prints DIFFERS and
the exit status is 1.  Prints one line per configuration; about a minute on an H100.
"""
from __future__ import annotations

import argparse
import sys

import torch

import tealite
import tealite.recipes as R
from benchmarks import _timing as T
from benchmarks.test_bench_grouped_quantize import SPLITS, VARIANTS, grouped_bytes
from tealite.backends.triton import grouped_quantize as G

ROWS = dict(VARIANTS, **{
    "fp8-delayed-ct-dbias": (R.DelayedScaling(), True, True, True),
    "fp8-block1x128-ct": (R.Float8BlockScaling(), True, True, False),
})
# Only the kernel variant (G.CT_VARIANTS) is swept: another tile or warp count would change
# the dbias partials' summation order (a tile's fp32 column sums), which is part of the bits.


def output_bits(out) -> list:
    """Every output tensor of a grouped quantize (codes, scales, amaxes, dbias) as bytes."""
    fields = [t for q in out.tensors for t in (q.data, q.scale_inv, q.columnwise_data,
                                               q.columnwise_scale_inv, q.amax)]
    return [None if t is None else t.contiguous().view(torch.uint8).clone()
            for t in fields + [out.dbias]]


def same_bits(a, b) -> bool:
    return len(a) == len(b) and all(
        (u is None) == (w is None) and (u is None or torch.equal(u, w)) for u, w in zip(a, b))


def _copy_ms(nbytes: int, dev, reps: int, flush) -> float:
    src = torch.randn(nbytes // 4, device=dev).to(torch.bfloat16)  # half read, half written
    dst = torch.empty_like(src)
    return T.measure(lambda: dst.copy_(src), dev, reps=reps, warmup=3, flush=flush).median_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="", help="rows whose name contains this")
    ap.add_argument("--size", default="large", choices=sorted(SPLITS))
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    flush = T.L2Flusher(dev)
    k, split_sets = SPLITS[args.size]
    bad = 0
    print(f"{'row':26s} {'split':6s} {'variant':8s} {'op ms':>7s} "
          f"{'op %':>6s} {'kern ms':>7s} {'kern %':>6s}  bits")
    for name, (recipe, rowwise, columnwise, dbias) in ROWS.items():
        if args.only not in name:
            continue
        for split, splits in split_sets.items():
            x = torch.randn((sum(splits), k), device=dev).to(torch.bfloat16)
            scale = torch.full((len(splits),), 3.0, device=dev) if recipe.scale_given else None
            nbytes = grouped_bytes(recipe, splits, k, rowwise=rowwise, columnwise=columnwise,
                                   dbias=dbias, itemsize=2)
            copy_ms = _copy_ms(nbytes, dev, args.reps, flush)
            fn = lambda: tealite.grouped_quantize(  # noqa: E731
                x, splits, recipe, rowwise=rowwise, columnwise=columnwise, dbias=dbias,
                scale=scale, backend="triton")
            want = None
            for variant in G.CT_VARIANTS:
                G.VARIANTS["ct"] = variant
                try:
                    got = output_bits(fn())
                    want = got if want is None else want
                    same = same_bits(got, want)
                    bad += not same
                    op = T.measure(fn, dev, reps=args.reps, warmup=3, flush=flush).median_ms
                    kern = T.kernel_profile(fn, dev).busy_ms if T.is_gpu(dev) else float("nan")
                finally:
                    G.VARIANTS["ct"] = "plain"
                print(f"{name:26s} {split:6s} {variant:8s} {op:7.3f} "
                      f"{100 * copy_ms / op:5.1f}% {kern:7.3f} {100 * copy_ms / kern:5.1f}%  "
                      f"{'same' if same else 'DIFFERS'}", flush=True)
    print(f"copy reference: in-run dst.copy_(src) of each row's bytes; {bad} configurations "
          "differ from the default's bits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
