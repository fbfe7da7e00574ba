"""First bandwidth numbers for tealite's Triton kernels on a GPU (device-event timing).

    python benchmarks/triton_bandwidth.py

Prints achieved GB/s (bytes read + written) for a device copy, RMSNorm / LayerNorm forward
and FP8 per-tensor / per-row quantization, with the torch backend alongside.  Issue 4 targets:
quantize >= 85 % and norms >= 80 % of the copy bandwidth.
"""
from __future__ import annotations

import torch
from triton.testing import do_bench

import tealite
from tealite import recipes as R


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def main() -> None:
    dev = "cuda"
    rows, hidden = 16384, 8192
    x = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16)
    g = torch.randn(hidden, device=dev, dtype=torch.bfloat16)
    b = torch.randn(hidden, device=dev, dtype=torch.bfloat16)
    n = x.numel()
    results = []
    big = torch.empty(2 * n, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(big)
    ms = do_bench(lambda: out.copy_(big), return_mode="median")
    copy = gbps(2 * big.numel() * 2, ms)
    results.append(("device copy", ms, copy))
    for backend in ("triton", "torch"):
        ms = do_bench(lambda: tealite.rmsnorm_fwd(x, g, backend=backend), return_mode="median")
        results.append((f"rmsnorm_fwd {backend}", ms, gbps(n * 4 + rows * 4, ms)))
        ms = do_bench(lambda: tealite.layernorm_fwd(x, g, b, backend=backend),
                      return_mode="median")
        results.append((f"layernorm_fwd {backend}", ms, gbps(n * 4 + rows * 8, ms)))
        for rec in (R.Float8CurrentScaling(), R.Float8CurrentScaling(granularity="row")):
            ms = do_bench(lambda: tealite.quantize(x, rec, backend=backend), return_mode="median")
            # current per-tensor scaling reads x twice (amax pass + cast pass)
            reads = 2 if rec.granularity == "tensor" else 1
            results.append((f"quantize fp8 {rec.granularity} {backend}", ms,
                            gbps(n * 2 * reads + n, ms)))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, ms, bw in results:
        print(f"{name:34s} {ms * 1e3:9.1f} us {bw:8.0f} GB/s {100 * bw / copy:6.1f} % of copy")


if __name__ == "__main__":
    main()
