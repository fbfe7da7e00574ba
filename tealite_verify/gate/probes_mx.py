"""MX probe blocks (32 values each) and what each field reads from an entry point's output.

Every field has its own blocks, built so that the field's candidate conventions give
different outputs on them and the other fields' conventions do not matter:

* ``scale_rule``: ordinary blocks whose amax sits at a power of two, one ulp either side of
  it, at 1.25 * 2^k, at the element max's mantissa * 2^k and one ulp above, and at EVEN's
  round-up point and one ulp below (two binades): FLOOR, CEIL, EVEN and RCEIL differ
  pairwise on at least one block (tests/test_gate_observe.py proves it);
* ``element_rounding``: blocks whose values at the block's scale are exact midpoints of the
  element grid (lower neighbour even and odd), values 3/4 of the way up a gap, amax 2^emax
  (scale 1 under every rule), fmax, and the first block again times 2^-10.  Codes are judged
  against the *observed* scale bytes, so a scale-rule change never reads as a rounding one;
* ``nan`` / ``inf``: one NaN (one +Inf, one -Inf) among representable values of amax
  2^emax, whose scale is byte 127 under every rule ("finite part alone");
* ``zero_block``: +0 and -0 blocks; ``subnormal_block``: only float32 subnormals, chosen
  so that at scale byte 0 (2^-127) they are representable elements (the codes then show
  whether the kernel divides by 2^-127, by 1, or flushes subnormals);
* ``amax_pow2``: amax exactly 2^k for four k: the scale exponent's offset from log2 amax.
"""
from __future__ import annotations

import numpy as np

from tealite_verify.gate import probes_common as pc
from tealite_verify.references import quantize as qref

F32 = np.float32
BLOCK = 32
SCALE_RULES = ("floor", "ceil", "even", "rceil")
SPECIAL_SLOT = 5  # where a NaN / Inf sits in its block


def _facts(fmt: str) -> tuple[float, int, int]:
    return qref.fmt_max(fmt), qref.fmt_emax(fmt), qref.fmt_mbits(fmt)


def _next(v: float, toward: float) -> float:
    return float(np.nextafter(F32(v), F32(toward)))


# ---- blocks ----------------------------------------------------------------------------------

def scale_rule_blocks(fmt: str) -> np.ndarray:
    fmax, emax, mbits = _facts(fmt)
    mant_max = fmax / 2.0 ** emax            # 1.5 for E2M1, 1.75 for E4M3
    even_up = 2.0 - 2.0 ** -(mbits + 1)      # EVEN rounds amax up from here (1.75 for E2M1)
    blocks = []
    for k in (3, -11):
        p = 2.0 ** k
        amaxes = [p, _next(p, 0), _next(p, np.inf), 1.25 * p, mant_max * p,
                  _next(mant_max * p, np.inf), _next(even_up * p, 0), even_up * p]
        for j, a in enumerate(amaxes):
            b = pc.fill_pattern(BLOCK, p)
            b[(7 * j + 3) % BLOCK] = F32(a) * (-1 if j % 2 else 1)  # |x| decides, not sign
            blocks.append(b)
    return np.stack(blocks)


def element_rounding_blocks(fmt: str) -> np.ndarray:
    fmax, emax, _ = _facts(fmt)
    top = 2.0 ** emax  # amax 2^emax: scale 1 under every rule

    def block(amax: float, lo: float, hi: float) -> np.ndarray:
        even, odd = pc.midpoints(fmt, lo, hi, avoid_carry=False)
        ties = np.concatenate([pc.spread(even, 4), pc.spread(odd, 4)])
        ups = pc.spread(pc.above_midpoints(fmt, lo, hi, avoid_carry=False), 3)
        return pc.row_of(BLOCK, [amax], ties, -ties, ups, -ups,
                         fill=pc.fill_pattern(BLOCK, top))

    low = block(top, 0.0, top)
    return np.stack([low, block(fmax, top, fmax), (low * F32(2.0 ** -10)).astype(F32)])


def _special_block(fmt: str, special: float) -> np.ndarray:
    _, emax, _ = _facts(fmt)
    top = 2.0 ** emax
    b = np.concatenate([[F32(top)], pc.exact_values(fmt, top, BLOCK - 1)]).astype(F32)
    b[SPECIAL_SLOT] = F32(special)
    return b


def nan_blocks(fmt: str) -> np.ndarray:
    return _special_block(fmt, np.nan)[None]


def inf_blocks(fmt: str) -> np.ndarray:
    return np.stack([_special_block(fmt, np.inf), _special_block(fmt, -np.inf)])


def zero_blocks(fmt: str) -> np.ndarray:
    return np.stack([np.zeros(BLOCK, F32), np.full(BLOCK, -0.0, F32)])


def subnormal_blocks(fmt: str) -> np.ndarray:
    # At scale 2^-127 these are 0.5, 1, 1.5 and 2^-13; all are multiples of 2^-144, so a
    # gated activation's gate half (y / 32) holds them exactly too.
    mags = np.array([2.0 ** -128, 2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -140], F32)
    return pc.alternate_signs(np.resize(mags, BLOCK))[None]


AMAX_POW2_EXPONENTS = (-5, 0, 7, 20)


def amax_pow2_blocks(fmt: str) -> np.ndarray:
    blocks = []
    for j, k in enumerate(AMAX_POW2_EXPONENTS):
        b = pc.fill_pattern(BLOCK, 2.0 ** k)
        b[(11 * j + 2) % BLOCK] = F32(2.0 ** k)
        blocks.append(b)
    return np.stack(blocks)


# ---- readers: (blocks, codes (B, 32), scale bytes (B,), fmt) -> field value ---------------------

def _block_amax(blocks: np.ndarray) -> np.ndarray:
    return np.max(np.abs(blocks), axis=1).astype(F32)


def read_scale_rule(blocks, codes, scales, fmt):
    amax = _block_amax(blocks)
    hits = [r for r in SCALE_RULES
            if np.array_equal(qref.e8m0_scale(amax, fmt, r), np.asarray(scales, np.uint8))]
    return hits or "none"


def _scaled(blocks: np.ndarray, scales) -> np.ndarray:
    """x / 2^(byte - 127), exact (float64, then float32: below float32's range every element
    format rounds to 0 anyway); NaN under byte 0xFF."""
    return qref.mx_scaled_values(blocks, np.asarray(scales, np.uint8)[:, None]).astype(F32)


def read_element_rounding(blocks, codes, scales, fmt):
    return pc.classify_rounding(_scaled(blocks, scales), codes, fmt)


def _finite_part_byte(block: np.ndarray, fmt: str) -> int:
    finite = np.where(np.isfinite(block), np.abs(block), 0).max()
    return int(qref.e8m0_scale(np.array([finite], F32), fmt, "floor")[0])


def _others(block, codes, byte, fmt, skip: np.ndarray) -> str:
    """'exact' when the non-special elements are exactly their values at the observed scale,
    else their codes."""
    rest = ~skip
    if byte != qref.E8M0_NAN:
        v = _scaled(block[None], [byte])[0]
        if np.array_equal(pc.round_codes(v[rest], fmt, "rne"), codes[rest]):
            return "exact"
    return pc.codes_summary(codes[rest], fmt)


def _special_desc(block, codes, byte, fmt, label: str) -> str:
    special = ~np.isfinite(block)
    want = _finite_part_byte(block, fmt)
    scale = f"scale 0x{byte:02X}" + ("" if byte == want else f" (finite part alone 0x{want:02X})")
    i = int(np.flatnonzero(special)[0])
    return (f"{scale}, {label} -> {pc.code_str(codes[i], fmt)}, "
            f"others {_others(block, codes, byte, fmt, special)}")


def read_nan(blocks, codes, scales, fmt):
    return "NaN: " + _special_desc(blocks[0], codes[0], int(scales[0]), fmt, "NaN")


def read_inf(blocks, codes, scales, fmt):
    return "; ".join(f"{lbl}: " + _special_desc(blocks[i], codes[i], int(scales[i]), fmt, lbl)
                     for i, lbl in enumerate(("+Inf", "-Inf")))


def read_zero_block(blocks, codes, scales, fmt):
    return "; ".join(f"{lbl}: scale 0x{int(scales[i]):02X}, codes {pc.codes_summary(codes[i], fmt)}"
                     for i, lbl in enumerate(("+0", "-0")))


def read_subnormal_block(blocks, codes, scales, fmt):
    byte = int(scales[0])
    none = np.zeros(BLOCK, bool)
    return f"scale 0x{byte:02X}, codes {_others(blocks[0], codes[0], byte, fmt, none)}"


def read_amax_pow2(blocks, codes, scales, fmt):
    parts = []
    for j, k in enumerate(AMAX_POW2_EXPONENTS):
        i = int(np.argmax(np.abs(blocks[j])))
        parts.append((int(scales[j]) - 127 - k, pc.code_str(codes[j][i], fmt)))
    if len(set(parts)) == 1:
        d, code = parts[0]
        return f"scale 2^(log2 amax {d:+d}), amax -> {code}"
    return "; ".join(f"amax 2^{k}: scale 2^(log2 amax {d:+d}), amax -> {code}"
                     for k, (d, code) in zip(AMAX_POW2_EXPONENTS, parts))


FIELDS = {
    "scale_rule": (scale_rule_blocks, read_scale_rule),
    "element_rounding": (element_rounding_blocks, read_element_rounding),
    "nan": (nan_blocks, read_nan),
    "inf": (inf_blocks, read_inf),
    "zero_block": (zero_blocks, read_zero_block),
    "subnormal_block": (subnormal_blocks, read_subnormal_block),
    "amax_pow2": (amax_pow2_blocks, read_amax_pow2),
}


def run_blocks(run: pc.Runner, blocks: np.ndarray) -> tuple[np.ndarray, list]:
    """All of a field's blocks side by side in ONE row (a fused norm's gamma can then carry
    them: every row of a norm shares gamma), split back into (codes (B, 32), bytes)."""
    out = run(blocks.reshape(1, -1), None)
    codes = np.asarray(out.codes, np.uint8).reshape(len(blocks), BLOCK)
    scales = [int(s) for s in np.asarray(out.scales, np.uint8).reshape(-1)]
    if len(scales) != len(blocks):
        raise ValueError(f"expected {len(blocks)} scale bytes, got {len(scales)}")
    return codes, scales


def observe_mx(run: pc.Runner, fmt: str) -> dict[str, pc.FieldOutcome]:
    """Every MX field of one entry point (``run`` quantizes rows of intermediates)."""
    out = {}
    for name, (build, read) in FIELDS.items():
        blocks = build(fmt)
        out[name] = pc.probe_field(
            blocks, lambda b=blocks: run_blocks(run, b),
            lambda codes, scales, b=blocks, r=read: r(b, codes, scales, fmt))
    return out
