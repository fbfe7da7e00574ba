"""Time the Triton GEMM's configs and TMA variants against torch.matmul on a GPU (no pytest).

    python benchmarks/gemm_configs.py            # about 2 minutes on an H100
    python benchmarks/gemm_configs.py --all-candidates --budget 400

Issue 4 (bf16 8192^3 TN >= 90 % of torch.matmul).  For each shape (M x N x K, bf16) and layout
TN (forward: D = B @ A.T, both operands K-contiguous) and NN (control), it prints torch.matmul's
time and, for the fixed choice the backend makes today, the best pointer-kernel config measured
so far and every ``TMA_CANDIDATES`` variant (TMA loads / persistent grid / warp specialization /
skewed K walk): TFLOP/s, % of torch and the max relative error against torch.  A variant that
fails (out of resources, compile error, unsupported API) is reported and skipped.  Then the
fixed choice and the best variant in NT / TT, fp16 and with the full epilogue, and finally the
``_C(...)`` line to paste into ``_CUDA[("16bit", "large")]`` in tealite/backends/triton/gemm.py
if a TMA variant beats the fixed choice.  ``--all-candidates`` also times every pointer-kernel
config in ``CANDIDATES`` (TN only).  Variants still untried when the time budget runs out are
listed as skipped.
"""
from __future__ import annotations

import argparse
import time

import torch
from triton.testing import do_bench

from tealite.backends.triton import gemm as tg

SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096))


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


def bench_shape(m, n, k, layout, variants, budget, start, skipped, results):
    a, b = operands(m, n, k, layout, torch.bfloat16)
    ref = torch_matmul(a, b, layout)
    want = ref()
    base = do_bench(ref, warmup=10, rep=40, return_mode="median")
    print(f"\n{m}x{n}x{k} bf16 {layout}")
    row("torch.matmul", m, n, k, base, base, "")
    for label, cfg in variants:
        if time.time() - start > budget:
            skipped.append(f"{m}x{n}x{k} {layout} {label}")
            continue
        ms, note = time_config(a, b, layout, cfg, want)
        row(label, m, n, k, ms, base, note)
        if ms is not None:
            results.setdefault(cfg, {})[(m, n, k, layout)] = 100 * base / ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=140.0, help="seconds before skipping")
    p.add_argument("--shapes", nargs="*", help="MxNxK, e.g. 8192x8192x8192")
    p.add_argument("--all-candidates", action="store_true",
                   help="also time every pointer-kernel config in CANDIDATES (TN)")
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    start = time.time()
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name()} ({props.multi_processor_count} SMs), torch "
          f"{torch.__version__}, triton {__import__('triton').__version__}, "
          f"hip={torch.version.hip}")
    skipped, results = [], {}
    fixed = tg.pick_config(*shapes[0][:2], torch.bfloat16, torch.device("cuda"))
    variants = [(f"{fixed.name()} (fixed)", fixed)]
    variants += [(c.name(), c) for c in (tg.GemmConfig(256, 128, 64, 8, 8, 3),) if c != fixed]
    variants += [(c.name(), c) for c in tg.TMA_CANDIDATES if c != fixed]
    for m, n, k in shapes:
        for layout in ("TN", "NN"):
            extra = [(c.name(), c) for c in tg.CANDIDATES if all(c != v for _, v in variants)]
            chosen = variants + (extra if args.all_candidates and layout == "TN" else [])
            bench_shape(m, n, k, layout, chosen, args.budget, start, skipped, results)
    # The best variant: highest worst-case % of torch over the measured shapes and layouts.
    keys = {key for r in results.values() for key in r}
    complete = {c: min(r.values()) for c, r in results.items() if set(r) == keys}
    best = max(complete, key=complete.get) if complete else fixed
    m, n, k = shapes[0]
    print(f"\n{m}x{n}x{k}: other layouts, fp16, epilogue (fixed {fixed.name()}, "
          f"best {best.name()})")
    cases = (("NT", torch.bfloat16, {}), ("TT", torch.bfloat16, {}), ("TN", torch.float16, {}),
             ("TN", torch.bfloat16, {"gelu": True, "bias": True, "beta": 1.0}))
    for layout, dtype, epi in cases:
        for tag, cfg in (("fixed", fixed), ("best", best)) if best != fixed else (("fixed",
                                                                                   fixed),):
            label = f"{tag} {layout} {str(dtype).removeprefix('torch.')}" + (
                " bias+gelu+beta" if epi else "")
            if time.time() - start > args.budget:
                skipped.append(label)
                continue
            a, b = operands(m, n, k, layout, dtype)
            ref = torch_matmul(a, b, layout)
            base = do_bench(ref, warmup=10, rep=40, return_mode="median")
            kw = dict(epi)
            if epi:
                kw.update(bias=torch.randn(n, device="cuda", dtype=dtype),
                          out=torch.randn(m, n, device="cuda", dtype=dtype))
            ms, note = time_config(a, b, layout, cfg, None if epi else ref(), **kw)
            row(label, m, n, k, ms, base, note)
            del a, b
    if skipped:
        print(f"\nskipped (time budget {args.budget:.0f} s): " + ", ".join(skipped))
    print("\nworst-case % of torch over " + ", ".join(
        f"{mm}x{nn}x{kk} {lay}" for mm, nn, kk, lay in sorted(keys)))
    for cfg, worst in sorted(complete.items(), key=lambda kv: -kv[1]):
        print(f"  {worst:6.1f} %  {cfg.source()}")
    if best != fixed and best.tma:
        print(f"\nSWITCH: in tealite/backends/triton/gemm.py set _CUDA[(\"16bit\", \"large\")] "
              f"= {best.source()}")
    else:
        print("\nSWITCH: keep the fixed choice " + fixed.source())
    print(f"\ntotal {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
