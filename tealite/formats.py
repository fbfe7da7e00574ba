"""Low-precision number formats and the rounding / saturation policies applied to them.

=============  ====  =======  ====  =======================================================
format         bits  max      emax  notes
=============  ====  =======  ====  =======================================================
``e4m3``       8     448      8     OCP E4M3 (``float8_e4m3fn``): no inf, NaN = S.1111.111
``e5m2``       8     57344    15    OCP E5M2: IEEE-like, has inf
``e4m3fnuz``   8     240      7     MI300 (gfx942): bias 8, no -0, single NaN 0x80
``e5m2fnuz``   8     57344    15    MI300 (gfx942): bias 16, no -0, single NaN 0x80
``e2m1``       4     6        2     FP4; values 0 .5 1 1.5 2 3 4 6; packed 2 per byte,
                                    low nibble = even element (TE and AITER agree)
``e8m0``       8     2^127    --    MX scale: 2^(b-127), 0xFF = NaN, no zero
=============  ====  =======  ====  =======================================================

``emax`` is the exponent of the largest power of two not above ``max`` (the "emax_elem" of
the OCP MX spec), used by the FLOOR / CEIL / EVEN MX scale rules.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ScaleRounding(str, enum.Enum):
    """How an MX block's E8M0 scale exponent is derived from the block amax."""

    FLOOR = "floor"  # floor(log2 amax) - emax            (OCP MX spec; torchao default)
    CEIL = "ceil"    # ceil(log2 amax) - emax
    EVEN = "even"    # round amax to the element's mantissa width, then FLOOR (AITER Triton)
    RCEIL = "rceil"  # ceil(log2(amax * (1/max))) in fp32  (TE MXFP8, cuBLAS UE8M0)


class ElementRounding(str, enum.Enum):
    RNE = "rne"              # round to nearest, ties to even (hardware casts, torchao)
    TIES_AWAY = "ties_away"  # round to nearest, ties away from zero (AITER Triton MXFP4)


class FP8ScaleRule(str, enum.Enum):
    """How a per-tensor / per-row FP8 scale is derived from amax and applied (fp32)."""

    # TE's compute_scale_from_amax: scale = fmax / amax; codes = cast(x * scale);
    # scale_inv = 1 / scale is stored.
    FMAX_OVER_AMAX = "fmax/amax"
    # AITER's Triton quant kernels: scale_inv = amax / fmax is stored; codes =
    # cast(x * (1 / scale_inv)).  The two codes differ where the two fp32 roundings differ.
    AMAX_OVER_FMAX = "amax/fmax"


class Saturation(str, enum.Enum):
    """What a cast does with finite values beyond the format's max."""

    SATURATE = "saturate"  # clamp to +-max (TE's satfinite casts, the MX spec)
    NONFINITE = "nonfinite"  # NaN (inf for e5m2), as torch's CUDA cast to e4m3fn does


@dataclass(frozen=True)
class Format:
    name: str
    bits: int
    mbits: int
    max: float
    emax: int
    torch_dtype: torch.dtype | None  # None: stored packed in uint8 (e2m1)
    fnuz: bool = False

    @property
    def packed(self) -> bool:
        return self.torch_dtype is None


FORMATS = {
    f.name: f for f in (
        Format("e4m3", 8, 3, 448.0, 8, torch.float8_e4m3fn),
        Format("e5m2", 8, 2, 57344.0, 15, torch.float8_e5m2),
        Format("e4m3fnuz", 8, 3, 240.0, 7, torch.float8_e4m3fnuz, fnuz=True),
        Format("e5m2fnuz", 8, 2, 57344.0, 15, torch.float8_e5m2fnuz, fnuz=True),
        Format("e2m1", 4, 1, 6.0, 2, None),
    )
}
FP8_FORMATS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; known: {sorted(FORMATS)}") from None


def fp8_formats_for_arch(arch: str) -> tuple[str, str]:
    """(E4M3, E5M2) format names a GPU architecture computes in.

    gfx942 (MI300) has FNUZ FP8; gfx950 (MI350) and NVIDIA (sm_89+) have OCP FP8.  Unknown
    architectures raise instead of guessing (AITER silently falls back to uint8 there).
    """
    if arch.startswith("gfx942"):
        return "e4m3fnuz", "e5m2fnuz"
    if arch.startswith("gfx950") or arch.startswith("sm_"):
        return "e4m3", "e5m2"
    raise ValueError(f"no FP8 format known for arch {arch!r} (expected gfx942, gfx950 or sm_*)")
