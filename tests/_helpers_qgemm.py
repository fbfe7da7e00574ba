"""Shared pieces of the triton qgemm tests (test_triton_qgemm.py, test_triton_qgemm_mx_acc.py,
test_triton_qgemm_mx_staged.py): recipe and case JSON, MX operands with one edge planted in
their scale bytes, the count of a launch's elements outside the declared gemm bound, the
seeded scales-one-block-late wrapper, and a spy on the dense launch's variant flag."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

ML_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
             "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
             "e2m1": ml_dtypes.float4_e2m1fn}
# Outliers put most of a block's codes far below its largest: subnormal codes.
MX_OUTLIERS = {"kind": "outliers", "scale": 1.0, "frac": 0.01, "factor": 4096.0}
WIDE = {"kind": "wide", "log2_lo": -30, "log2_hi": 20, "sample_dtype": "float32"}


def mx_recipe(fmt="e4m3", scale="rceil", elem="rne") -> dict:
    return {"kind": "mx", "fmt": fmt, "scale_rounding": scale, "element_rounding": elem}


def qgemm_case(ra, rb, layout, m, n, k, *, seed, **kw) -> dict:
    case = {"recipe_a": ra, "recipe_b": rb, "m": m, "n": n, "k": k, "layout": layout,
            "dtype": "bfloat16", "out_dtype": "bfloat16", "bias": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": seed}
    case.update(kw)
    return case


def finite_codes(fmt, shape, rng, subnormal=False):
    """Random finite codes (unpacked for e2m1) of ``fmt``, or only its subnormal ones."""
    n = 16 if fmt == "e2m1" else 256
    codes = np.arange(n, dtype=np.uint8)
    vals = np.abs(codes.view(ML_DTYPES[fmt]).astype(np.float64))
    keep = np.isfinite(vals)
    if subnormal:
        keep &= (vals > 0) & (vals < float(ml_dtypes.finfo(ML_DTYPES[fmt]).smallest_normal))
    return rng.choice(codes[keep], size=shape)


def mx_edge_operands(case, fmt_a, fmt_b):
    """(a bits (N, K), a bytes, b bits (M, K), b bytes), unpacked codes: normal random MX
    operands with one edge planted; M = 20, N = 40 span fast and fallback tiles in one
    launch.  "overflow": A rows 0-2 above the fast range; "underflow": B rows 0-3 subnormal
    codes at byte 0, their products the rows' whole result; "nan-byte": one 0xFF in A row 5;
    "zero-blocks": amax == 0 blocks (byte 0, zero codes) in B rows 8-11, A rows 30-33."""
    from tealite.backends.triton import qgemm as tq  # read at call time: seeded tests patch it
    rng = np.random.default_rng(7)
    m, n, k = 20, 40, 128
    a_bits, b_bits = finite_codes(fmt_a, (n, k), rng), finite_codes(fmt_b, (m, k), rng)
    a_bytes, b_bytes = rng.integers(120, 135, (n, 4)), rng.integers(120, 135, (m, 4))
    if case == "overflow":
        # Columns 0-2, block 1: codes x 2^(byte - 127) above bf16's (= fp32's) largest value;
        # B's block 1 scaled down so that every product stays far inside fp32.
        a_bytes[:3, 1] = min(tq._fast_byte_range(fmt_a, 127)[1] + 3, 254)
        b_bytes[:, 1] = 20
    elif case == "underflow":
        # Rows 0-3: only block 2 is nonzero, subnormal codes at byte 0 (below bf16's subnormal
        # step 2^-133); A's block 2 scaled up so those products are the rows' whole result.
        b_bits[:4] = 0
        b_bits[:4, 64:96] = finite_codes(fmt_b, (4, 32), rng, subnormal=True)
        b_bytes[:4] = 0
        a_bytes[:, 2] = 200
    elif case == "nan-byte":
        a_bytes[5, 3] = 0xFF
    elif case == "zero-blocks":
        b_bits[8:12], b_bytes[8:12] = 0, 0
        a_bits[30:34, :32], a_bytes[30:34, 0] = 0, 0
    return a_bits, a_bytes.astype(np.uint8), b_bits, b_bytes.astype(np.uint8)


def mx_out_of_bound(operands, fmt_a, fmt_b, device, numerics_of, **launch_kw) -> int:
    """Elements of ``qgemm.launch``'s MX product (fp32 out, no bias; ``launch_kw``: the
    variant flags) outside the gemm bound of the numerics ``numerics_of(params)`` declares;
    NaN must match.  ``operands``: unpacked (a bits, a bytes, b bits, b bytes)."""
    from tealite import recipes as R
    from tealite.backends.triton import qgemm as tq
    from tealite.numerics import Numerics
    from tealite_verify.references import quantize as qref
    from tealite_verify.tiers import gemm as TG
    a_bits, a_bytes, b_bits, b_bytes = operands
    (n, k), m = a_bits.shape, b_bits.shape[0]

    def codes(bits, fmt):
        return torch.from_numpy(qref.pack_e2m1(bits) if fmt == "e2m1" else bits).to(device)

    out = tq.launch(R.MXBlockScaling(fmt_a), codes(a_bits, fmt_a),
                    torch.from_numpy(a_bytes).to(device), R.MXBlockScaling(fmt_b),
                    codes(b_bits, fmt_b), torch.from_numpy(b_bytes).to(device), m=m, n=n, k=k,
                    out_dtype=torch.float32, bias=None, **launch_kw)
    out = out.cpu().numpy().astype(np.float64)
    a = qref.mx_dequantize(a_bits, a_bytes, fmt_a)
    b = qref.mx_dequantize(b_bits, b_bytes, fmt_b)
    with np.errstate(invalid="ignore", over="ignore"):
        want, p_abs = b @ a.T, np.abs(b) @ np.abs(a).T
    numerics = Numerics.of(numerics_of({"kind": "mx", "fmt_a": fmt_a, "fmt_b": fmt_b, "k": k,
                                        "device": str(device)}))
    if numerics.alignment_floor is not None:  # the FP8 MMA's magnitudes, lifted
        p_abs = np.maximum(p_abs, np.abs(b).max() * np.abs(a).max())
    tol = TG.gemm_tolerances(np.nan_to_num(p_abs), np.nan_to_num(want), want, k,
                             torch.float32, numerics, alpha=1.0,
                             epilogue_abs=np.zeros_like(want))["out"]
    nan = np.isnan(want)
    with np.errstate(invalid="ignore"):
        bad = np.isnan(out) != nan
        bad |= ~nan & ~(np.abs(out - want) <= tol)
    return int(bad.sum())


def scales_one_block_late(real):
    """Seeded: qgemm's ``_scale_operand`` with MX scales read one 32-block late (block c
    multiplied by block c - 1's scale)."""
    def late(recipe, scales, rows, k, name):
        s, *rest = real(recipe, scales, rows, k, name)
        return (torch.roll(s, 1, dims=-1) if s.dim() == 2 else s, *rest)
    return late


def launch_flags(monkeypatch, tq, variant: str, flag: str) -> list:
    """Switch ``qgemm.VARIANTS["mx"]`` to ``variant``; the returned list collects the value
    of the launch keyword ``flag`` of every dense launch after that."""
    flags = []
    real = tq.launch

    def spy(*args, **kwargs):
        flags.append(kwargs.get(flag, False))
        return real(*args, **kwargs)

    monkeypatch.setitem(tq.VARIANTS, "mx", variant)
    monkeypatch.setattr(tq, "launch", spy)
    return flags
