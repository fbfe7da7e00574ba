"""Probe hardware numerics that the tolerance model's declared keys rest on (run on a GPU).

1. Does ``tl.dot`` on fp16 / bf16 operands keep subnormal inputs (or flush them to zero)?
2. Is tensor-core accumulation round-to-nearest or truncating (Fasi et al. 2021)?
Prints one line per probe; the results are recorded in docs/device-runs.md.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dot16(x_ptr, y_ptr, o_ptr, IEEE: tl.constexpr):
    r = tl.arange(0, 16)
    x = tl.load(x_ptr + r[:, None] * 16 + r[None, :])
    y = tl.load(y_ptr + r[:, None] * 16 + r[None, :])
    acc = tl.dot(x, y, out_dtype=tl.float32)
    tl.store(o_ptr + r[:, None] * 16 + r[None, :], acc)


def dot(x, y):
    o = torch.empty(16, 16, dtype=torch.float32, device="cuda")
    _dot16[(1,)](x.contiguous(), y.contiguous(), o, IEEE=False)
    return o


def main():
    for dt, sub in ((torch.float16, 2.0 ** -24), (torch.float16, 3 * 2.0 ** -20),
                    (torch.bfloat16, 2.0 ** -130)):
        x = torch.zeros(16, 16, dtype=dt, device="cuda")
        y = torch.zeros(16, 16, dtype=dt, device="cuda")
        x[0, 0] = sub
        y[0, 0] = 1.0
        got = dot(x, y)[0, 0].item()
        print(f"subnormal {dt} input {sub:.3e} x 1 -> {got:.3e} "
              f"({'kept' if got == sub else 'FLUSHED/changed'})")
    # Accumulation rounding: 1 + 2^-24 + 2^-24 (each exactly representable products).
    for dt in (torch.float16, torch.bfloat16):
        x = torch.zeros(16, 16, dtype=dt, device="cuda")
        y = torch.zeros(16, 16, dtype=dt, device="cuda")
        x[0, 0], y[0, 0] = 1.0, 1.0
        x[0, 1], y[1, 0] = 2.0 ** -12, 2.0 ** -12          # 2^-24: half an ulp of 1
        x[0, 2], y[2, 0] = 2.0 ** -12, 2.0 ** -12
        x[0, 3], y[3, 0] = -(2.0 ** -12), 2.0 ** -12 * 0.75  # -0.75 * 2^-24
        exact = 1.0 + 2.0 ** -24 + 2.0 ** -24 - 0.75 * 2.0 ** -24
        got = dot(x, y)[0, 0].item()
        print(f"accumulation {dt}: exact {exact!r}, got {got!r}, "
              f"RN(fp32)={torch.tensor(exact, dtype=torch.float64).float().item()!r}")
    # fp16 K=2 tiny x wide (the differential test's failing case, seed 1).
    x = torch.zeros(16, 16, dtype=torch.float16, device="cuda")
    y = torch.zeros(16, 16, dtype=torch.float16, device="cuda")
    vals = torch.tensor([2.0 ** -24 * 5, 2.0 ** -24 * 1023], dtype=torch.float16)
    x[0, :2] = vals.cuda()
    y[:2, 0] = torch.tensor([0.75, 2.0 ** -20], dtype=torch.float16).cuda()
    exact = float(vals[0]) * 0.75 + float(vals[1]) * 2.0 ** -20
    print(f"fp16 subnormal dot: exact {exact!r} got {dot(x, y)[0, 0].item()!r}")


if __name__ == "__main__":
    main()
