"""Time the Triton GEMM's candidate configs against torch.matmul on a GPU (no pytest).

    python benchmarks/gemm_configs.py            # about 2-3 minutes on an H100
    python benchmarks/gemm_configs.py --budget 60 --shapes 8192x8192x8192

For each shape (M x N x K, bf16, layout TN = forward: D = B @ A.T with A (N, K), B (M, K)) it
prints torch.matmul's time and, for every config in tealite.backends.triton.gemm.CANDIDATES
plus the fixed choice the backend makes today, TFLOP/s and % of torch, and a max relative error
against torch as a sanity check.  A config that fails (out of shared memory or registers, a
compile error) is reported and skipped.  Then, with the fixed choice only: the other layouts,
fp16, and the full epilogue (bias + GELU + beta) at the first shape.  Configs still untried
when the time budget runs out are listed as skipped.  Issue 4's target: bf16 8192^3 >= 90 % of
torch.matmul.
"""
from __future__ import annotations

import argparse
import time

import torch
from triton.testing import do_bench

from tealite.backends.triton import gemm as tg

SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (8191, 8193, 4095))


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / ms / 1e9


def operands(m, n, k, layout, dtype, dev="cuda"):
    g = torch.Generator(device=dev).manual_seed(0)
    a_shape = (n, k) if layout[0] == "T" else (k, n)
    b_shape = (m, k) if layout[1] == "N" else (k, m)
    a = torch.randn(a_shape, device=dev, dtype=dtype, generator=g)
    b = torch.randn(b_shape, device=dev, dtype=dtype, generator=g)
    return a, b


def torch_matmul(a, b, layout):
    op_a = a.t() if layout[0] == "T" else a
    op_b = b.t() if layout[1] == "T" else b
    return lambda: torch.matmul(op_b, op_a)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def time_config(a, b, layout, cfg, want, **epilogue):
    kw = dict(layout=layout, out_dtype=a.dtype, bias=None, gelu=False, out=None, alpha=1.0,
              beta=0.0)
    kw.update(epilogue)
    fn = lambda: tg.launch(a, b, config=cfg, **kw)  # noqa: E731
    try:
        got = fn()[0]  # compiles
        torch.cuda.synchronize()
        ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
    except Exception as exc:  # out of resources, compile errors: report, keep going
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    if want is None:
        return ms, "(epilogue: not checked here; the differential tests judge it)"
    return ms, f"max rel err vs torch {rel_err(got, want):.2e}"


def row(label, m, n, k, ms, base_ms, note):
    if ms is None:
        print(f"  {label:34s} {'FAILED':>10s} {note}")
        return
    print(f"  {label:34s} {ms * 1e3:8.0f} us {tflops(m, n, k, ms):7.1f} TFLOP/s "
          f"{100 * base_ms / ms:6.1f} % of torch  {note}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=170.0, help="seconds before skipping configs")
    p.add_argument("--shapes", nargs="*", help="MxNxK, e.g. 8192x8192x8192")
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    start = time.time()
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name()} ({props.multi_processor_count} SMs), torch "
          f"{torch.__version__}, triton {__import__('triton').__version__}, "
          f"hip={torch.version.hip}")
    skipped = []
    for m, n, k in shapes:
        a, b = operands(m, n, k, "TN", torch.bfloat16)
        ref = torch_matmul(a, b, "TN")
        want = ref()
        base = do_bench(ref, warmup=10, rep=40, return_mode="median")
        fixed = tg.pick_config(m, n, torch.bfloat16, a.device)
        print(f"\n{m}x{n}x{k} bf16 TN: fixed choice {fixed.name()}")
        row("torch.matmul", m, n, k, base, base, "")
        configs = [fixed] + [c for c in tg.CANDIDATES if c != fixed]
        for cfg in configs:
            if time.time() - start > args.budget:
                skipped.append(f"{m}x{n}x{k} {cfg.name()}")
                continue
            ms, note = time_config(a, b, "TN", cfg, want)
            row(cfg.name() + (" (fixed)" if cfg == fixed else ""), m, n, k, ms, base, note)
        del a, b, want
    m, n, k = shapes[0]
    fixed = tg.pick_config(m, n, torch.bfloat16, torch.device("cuda"))
    print(f"\n{m}x{n}x{k}, fixed choice {fixed.name()}: layouts, fp16, epilogue")
    for layout, dtype, epi in (("NN", torch.bfloat16, {}), ("NT", torch.bfloat16, {}),
                               ("TT", torch.bfloat16, {}), ("TN", torch.float16, {}),
                               ("TN", torch.bfloat16, {"gelu": True, "bias": True,
                                                       "beta": 1.0})):
        label = f"{layout} {str(dtype).removeprefix('torch.')}" + (" bias+gelu+beta"
                                                                   if epi else "")
        if time.time() - start > args.budget:
            skipped.append(label)
            continue
        a, b = operands(m, n, k, layout, dtype)
        ref = torch_matmul(a, b, layout)
        base = do_bench(ref, warmup=10, rep=40, return_mode="median")
        if epi:
            epi = dict(epi, bias=torch.randn(n, device="cuda", dtype=dtype),
                       out=torch.randn(m, n, device="cuda", dtype=dtype))
        ms, note = time_config(a, b, layout, fixed, None if epi else ref(), **epi)
        row(label, m, n, k, ms, base, note)
        del a, b
    if skipped:
        print(f"\nskipped (time budget {args.budget:.0f} s): " + ", ".join(skipped))
    print(f"\ntotal {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
