"""What ``torch._scaled_mm`` can run on this machine, probed once per process.

On the CPU, ``torch._scaled_mm`` is a oneDNN matmul primitive whose FP8 implementations depend
on the CPU's instruction set (and on ``ONEDNN_MAX_CPU_ISA``): on a Xeon with AVX512-BF16 and
AMX limited to AVX2, it raised ``RuntimeError: could not create a primitive descriptor for
the matmul primitive`` (issue 13), while on an AMD EPYC (AVX512-BF16, no AMX) every
combination below ran under every ISA limit from SSE41 up.  On GPUs it depends on the
architecture.  So the backend does not assume support: it runs one tiny product per
combination it would use (operand formats, the dtype it asks ``_scaled_mm`` for, per-tensor or
rowwise scales) on the device, the first time a case needs it, and declares a combination
that raises unsupported with the error as the reason.

Only an exception counts as "unsupported"; a combination that runs but computes a wrong value is
left to the harness to report as a bug, never hidden here.
"""
from __future__ import annotations

import functools

import torch

_FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
        "e5m2fnuz": "float8_e5m2fnuz"}
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # bias -> float32, else out dtype
# (M, K, N) of the probe: K a multiple of 16 (cuBLASLt's rule; the backend pads to it).
_M, _K, _N = 16, 32, 16


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run_probe(fmt_b: str, fmt_a: str, out_dtype: torch.dtype, rowwise: bool,
              device: str) -> None:
    """One tiny ``_scaled_mm`` laid out as the backend calls it: mat1 = B codes (M, K) row-major,
    mat2 = A codes transposed (K, N) column-major, scales 0-d or (M, 1) / (1, N).  Raises what
    torch raises."""
    b = torch.ones(_M, _K, device=device).to(getattr(torch, _FP8[fmt_b]))
    a = torch.ones(_N, _K, device=device).to(getattr(torch, _FP8[fmt_a]))
    if rowwise:
        sb, sa = torch.ones(_M, 1, device=device), torch.ones(1, _N, device=device)
    else:
        sb, sa = torch.ones((), device=device), torch.ones((), device=device)
    torch._scaled_mm(b, a.t(), scale_a=sb, scale_b=sa, out_dtype=out_dtype)


@functools.lru_cache(maxsize=None)
def failure(fmt_b: str, fmt_a: str, out_dtype: torch.dtype, rowwise: bool,
            device: str = "cpu") -> str | None:
    """None when the probe product runs; else why not (the exception, one line)."""
    if not hasattr(torch, _FP8.get(fmt_b, "")) or not hasattr(torch, _FP8.get(fmt_a, "")):
        return f"torch {torch.__version__} has no FP8 dtype for {fmt_b} x {fmt_a}"
    try:
        run_probe(fmt_b, fmt_a, out_dtype, rowwise, device)
    except Exception as exc:  # whatever torch raises is the reason, said as it said it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first[:200]}"
    return None


def combination(fmt_b: str, fmt_a: str, out_dtype: torch.dtype, rowwise: bool) -> str:
    return (f"{fmt_b} x {fmt_a} -> {_short(out_dtype)}, "
            f"{'rowwise' if rowwise else 'per-tensor'} scales")


def why_not(fmt_b: str, fmt_a: str, out_dtype: torch.dtype, rowwise: bool,
            device: str) -> str | None:
    """The Support check's reason for a combination the probe saw fail on ``device``."""
    err = failure(fmt_b, fmt_a, out_dtype, rowwise, device)
    if err is None:
        return None
    return (f"torch._scaled_mm {combination(fmt_b, fmt_a, out_dtype, rowwise)} fails on this "
            f"{device} (probed: {err})")


def combinations(formats) -> list[tuple[str, str, torch.dtype, bool]]:
    """Every (fmt_b, fmt_a, out dtype, rowwise) over ``formats`` the backend may ask for
    (never e5m2 x e5m2, which it refuses)."""
    return [(fb, fa, out, rw) for fb in formats for fa in formats
            if not (fb == fa == "e5m2") for out in OUT_DTYPES for rw in (False, True)]


def used_on(device: str) -> list[tuple[str, str, torch.dtype, bool]]:
    """The combinations the backend may ask for on ``device``: on CUDA rowwise scales only
    with a bfloat16 result (qgemm._why_not refuses the others before any probe)."""
    return [c for c in combinations(platform_formats())
            if device != "cuda" or not c[3] or c[2] == torch.bfloat16]


def platform_formats() -> tuple[str, ...]:
    """The FP8 formats the backend accepts here (FNUZ only under ROCm)."""
    return ("e4m3fnuz", "e5m2fnuz", "e4m3", "e5m2") if torch.version.hip else ("e4m3", "e5m2")


def describe(devices: tuple[str, ...] = ("cpu",)) -> list[tuple[str, str, str]]:
    """(what, device, finding) rows for ``python -m tealite_verify list``: one row per device
    when every combination runs, else one per failing combination."""
    rows = []
    for device in devices:
        combos = used_on(device)
        failed = [(c, failure(*c, device)) for c in combos]
        failed = [(c, e) for c, e in failed if e is not None]
        if not failed:
            rows.append(("torch._scaled_mm (scaled_mm backend)", device,
                         f"all {len(combos)} FP8 format x output dtype x scale combinations "
                         "run"))
        for c, err in failed:
            rows.append((f"torch._scaled_mm {combination(*c)}", device,
                         f"fails: {err} (declared unsupported)"))
    return rows
