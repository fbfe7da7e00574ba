"""Sweep num_warps of the Triton softmax kernels on a CUDA GPU (standalone, no pytest).

    python benchmarks/softmax_warps.py [--shape 4,16,2048,2048]

Prints us and % of a device copy of the same bytes (benchmarks/_cases.softmax_bytes) for each
forward kind and the backward at each warp count, and checks every variant gives the
default's bits.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tealite  # noqa: E402
from benchmarks import _cases as C  # noqa: E402
from benchmarks.test_bench_softmax import FWD_KINDS as KINDS, _inputs  # noqa: E402
from tealite.backends.triton import softmax as TS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4,16,2048,2048")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    x0 = torch.randn(shape, device="cuda").to(torch.bfloat16) * 4
    scale = 1.0 / math.sqrt(128.0)
    default = TS._num_warps
    calls = {}
    for kind in KINDS:
        x, mask = _inputs(kind, x0)
        calls[kind] = (lambda x=x, mask=mask, kind=kind: tealite.softmax_fwd(
            x, kind, scale=scale, mask=mask, backend="triton"),
            C.softmax_bytes(kind, x.shape, 2))
    y = tealite.softmax_fwd(x0, "scaled", scale=scale, backend="triton")
    calls["bwd scaled"] = (lambda: tealite.softmax_bwd(y, y, "scaled", scale=scale,
                                                       backend="triton"), 3 * y.numel() * 2)
    for name, (fn, nbytes) in calls.items():
        src = torch.empty(nbytes // 4, device="cuda", dtype=torch.int16)
        dst = torch.empty_like(src)
        copy_ms = do_bench(lambda: dst.copy_(src), return_mode="median")
        want = fn()
        for warps in (None, 2, 4, 8, 16):
            TS._num_warps = default if warps is None else (lambda block, w=warps: w)
            try:
                got = fn()
                ms = do_bench(fn, return_mode="median")
                print(f"{name:22s} warps={warps or 'default':>7} {ms * 1e3:8.1f} us "
                      f"{100 * copy_ms / ms:6.1f} % of copy  same bits: {torch.equal(got, want)}",
                      flush=True)
            except Exception as exc:  # out of resources etc.
                print(f"{name:22s} warps={warps} FAILED {type(exc).__name__}: {exc}"[:160])
        TS._num_warps = default


if __name__ == "__main__":
    main()
