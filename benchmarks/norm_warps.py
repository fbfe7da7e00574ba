"""Sweep num_warps of the Triton norm forward kernel on a CUDA GPU (standalone, no pytest).

    python benchmarks/norm_warps.py [--rows 16384 --hidden 8192]

Prints us and % of a device copy of the same bytes (x read + y written) for RMSNorm and
LayerNorm at each warp count, and checks every variant gives the default's bits.
"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

import tealite
from tealite.backends.triton import norms as TN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=8192)
    args = ap.parse_args()
    x = torch.randn(args.rows, args.hidden, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(args.hidden, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.hidden, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(x.numel(), device="cuda", dtype=torch.bfloat16)  # same bytes as x -> y
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    default = TN._num_warps
    calls = {"rmsnorm": lambda: tealite.rmsnorm_fwd(x, g, backend="triton"),
             "layernorm": lambda: tealite.layernorm_fwd(x, g, b, backend="triton")}
    for name, fn in calls.items():
        want = fn()
        for warps in (None, 4, 8, 16, 32):
            TN._num_warps = default if warps is None else (lambda block, w=warps: w)
            try:
                got = fn()
                same = all(torch.equal(p, q) for p, q in zip(got, want))
                ms = do_bench(fn, return_mode="median")
                print(f"{name:10s} warps={warps or 'default':>7} {ms * 1e3:8.1f} us "
                      f"{100 * copy_ms / ms:6.1f} % of copy  same bits: {same}")
            except Exception as exc:  # out of resources etc.
                print(f"{name:10s} warps={warps} FAILED {type(exc).__name__}: {exc}"[:160])
        TN._num_warps = default


if __name__ == "__main__":
    main()
