"""Where judging a case wholly on the GPU pays off (issue 5; docs/fuzzing.md).

    python benchmarks/device_reference_crossover.py     # needs CUDA

For the specs with ``device_reference`` (norms, activations, GEMM), runs fixed bf16 cases of
growing size through ``run_case`` on CUDA twice: with every case judged on the device
(``runner.DEVICE_REFERENCE_MIN_ELEMENTS = 0``) and with none (host bounds, device products
only), 10 runs each after 2 warm-ups, and prints ms per case with the inputs / reference /
compare split.  Standalone: not collected by pytest.
"""
from __future__ import annotations

import time

NEVER = 10**12


def timed(spec, case, minimum: int, runs: int = 10) -> str:
    from tealite_verify import runner
    runner.DEVICE_REFERENCE_MIN_ELEMENTS = minimum
    for _ in range(2):
        runner.run_case(spec, case, backends=["torch"], device="cuda")
    parts: dict[str, float] = {}
    t = time.perf_counter()
    for _ in range(runs):
        rep = runner.run_case(spec, case, backends=["torch"], device="cuda")
        for k, v in rep.timings.items():
            parts[k] = parts.get(k, 0.0) + v
    total = (time.perf_counter() - t) / runs
    ms = {k: 1e3 * parts.get(k, 0.0) / runs for k in ("inputs", "reference", "compare")}
    return (f"{1e3 * total:.2f} ({ms['inputs']:.2f}, {ms['reference']:.2f}, "
            f"{ms['compare']:.2f})")


def main() -> int:
    import torch

    from tealite_verify import profiles, runner
    from tealite_verify.specs import get_spec
    from tealite_verify.specs.gemm import make_case
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    profiles.load("local")
    default = runner.DEVICE_REFERENCE_MIN_ELEMENTS
    print("| op | largest input | device path ms (inputs, reference, compare) | host bounds |")
    print("|---|---|---|---|")
    for op in ("act_fwd", "act_bwd", "layernorm_fwd", "rmsnorm_bwd"):
        spec = get_spec(op)
        base = dict(spec.smoke_cases[0], dtype="bfloat16")
        if op.startswith("act"):
            base["kind"] = "gelu"
        if "weight_dtype" in base:
            base["weight_dtype"] = "bfloat16"
        for n in (1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20):
            case = dict(base, shape=[max(1, n // 1024), 1024])
            print(f"| {op} | {n} | {timed(spec, case, 0)} | {timed(spec, case, NEVER)} |")
    spec = get_spec("gemm")
    for m, n, k in ((64, 64, 64), (128, 128, 256), (256, 256, 512), (512, 512, 1024),
                    (1024, 1024, 4096)):
        case = make_case("TN", "bfloat16", m, n, k, bias=True, gelu=True)
        print(f"| gemm {m}x{n}x{k} | {max(n, m) * k} | {timed(spec, case, 0)} | "
              f"{timed(spec, case, NEVER)} |")
    runner.DEVICE_REFERENCE_MIN_ELEMENTS = default
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; runner default "
          f"DEVICE_REFERENCE_MIN_ELEMENTS = {default}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
