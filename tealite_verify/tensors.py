"""Turn a drawn *description* of a tensor (distribution + seed) into the tensor.

Hypothesis draws small descriptions; the (possibly large) tensor is generated here from a
seeded torch.Generator on the CPU, computed in float64, rounded once to the target dtype, then
moved to the device, so the same case produces bit-identical inputs on every device.

``dist["sample_dtype"]`` ("float64" when absent, or "float32") is the precision the generator
draws its normal and uniform samples in.  Strategies draw "float32": torch's CPU float64
``randn`` is several times slower than its float32 one (9.5 vs 2.0 ms for 327k samples on the
project's CPU), the largest part of building a case's inputs, and every input dtype we test
has at most float32's 24 significant bits.  Descriptions stored before the key existed keep
float64 sampling, so they still generate exactly the tensors they were found with.

Distributions (``dist["kind"]``):

``normal``      N(0, scale^2)
``uniform``     U(lo, hi)
``wide``        sign * 2^U(log2_lo, log2_hi): a wide dynamic range
``outliers``    N(0, scale^2) with a fraction ``frac`` multiplied by ``factor``
``tiny``        magnitudes around the dtype's smallest normal, subnormals included
``subnormal``   only subnormals of the dtype (every block subnormal-only), random signs
``max_last``    N(0, scale^2) with the last element (flattened) the largest in magnitude: a
                reduction that drops or mis-indexes its tail misses the maximum
``zero_rows``   N(0, scale^2) with a fraction ``frac`` of rows (leading index) set to 0
``integers``    integers in [-hi, hi]: exact products and sums, so low-precision outputs
                land exactly on rounding ties
``specials``    N(0, 1) with a fraction ``frac`` replaced by NaN, +Inf, -Inf or -0.0
``quant_edges`` for quantizers of format ``fmt`` with blocks of ``block`` along the last dim:
                every block holds exact codes and exact midpoints between adjacent codes
                (element rounding ties) at a random power-of-two scale, and one element at
                fmt.max * 2^j moved by -1, 0 or +1 ulp of the dtype (scale rounding boundaries)
"""
from __future__ import annotations

import numpy as np
import torch

_MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(DTYPES)}") from None


_SAMPLE_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def from_bits(arr, dtype: torch.dtype) -> torch.Tensor:
    """A numpy / ml_dtypes array (a reference's value) as a torch tensor of ``dtype``, bit for
    bit: through its integer view, since torch has no numpy bfloat16 and the exact tier reads
    torch bits as signed integers."""
    arr = np.ascontiguousarray(arr)
    return torch.from_numpy(arr.view(f"i{arr.dtype.itemsize}").copy()).view(dtype)


def sample_dtype(dist: dict) -> torch.dtype:
    name = dist.get("sample_dtype", "float64")
    try:
        return _SAMPLE_DTYPES[name]
    except KeyError:
        raise ValueError(f"dist sample_dtype must be one of {sorted(_SAMPLE_DTYPES)}, "
                         f"got {name!r}") from None


def generate(dist: dict, shape, dtype: torch.dtype, seed: int, device="cpu") -> torch.Tensor:
    shape = tuple(int(s) for s in shape)
    g = torch.Generator().manual_seed(int(seed) & (2**63 - 1))
    kind = dist["kind"]
    sd = sample_dtype(dist)

    def randn(size):
        return torch.randn(size, generator=g, dtype=sd).double()

    def rand(size):
        return torch.rand(size, generator=g, dtype=sd).double()

    if kind in ("normal", "outliers", "zero_rows"):
        x = randn(shape) * dist.get("scale", 1.0)
        if kind == "outliers":
            hit = rand(shape) < dist["frac"]
            x = torch.where(hit, x * dist["factor"], x)
        if kind == "zero_rows" and len(shape) >= 1 and shape[0] > 0:
            rows = rand(shape[0]) < dist["frac"]
            x[rows] = 0.0
    elif kind == "uniform":
        x = dist["lo"] + (dist["hi"] - dist["lo"]) * rand(shape)
    elif kind == "wide":
        e = dist["log2_lo"] + (dist["log2_hi"] - dist["log2_lo"]) * rand(shape)
        x = _signs(shape, g) * torch.exp2(e)
    elif kind == "tiny":
        # From the smallest subnormal up to four times the smallest normal.
        tiny = torch.finfo(dtype).tiny
        mant = _MANTISSA_BITS[dtype]
        e = torch.log2(torch.tensor(tiny, dtype=torch.float64)) + torch.empty(
            shape, dtype=sd).uniform_(-mant, 2, generator=g).double()
        x = _signs(shape, g) * torch.exp2(e)
    elif kind == "subnormal":
        # Uniform in log2 over the subnormal range: from the smallest subnormal to just below
        # the smallest normal.
        tiny = torch.finfo(dtype).tiny
        lo = -_MANTISSA_BITS[dtype]
        e = torch.empty(shape, dtype=sd).uniform_(lo, -0.01, generator=g).double()
        x = _signs(shape, g) * tiny * torch.exp2(e)
    elif kind == "max_last":
        x = randn(shape) * dist.get("scale", 1.0)
        if x.numel():
            flat = x.reshape(-1)
            flat[-1] = 2.0 * flat.abs().max() + dist.get("scale", 1.0)
    elif kind == "specials":
        x = randn(shape)
        pick = rand(shape)
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0],
                               dtype=torch.float64)
        which = torch.randint(0, 4, shape, generator=g)
        x = torch.where(pick < dist["frac"], special[which], x)
    elif kind == "quant_edges":
        x = _quant_edges(dist, shape, dtype, g)
    elif kind == "integers":
        hi = int(dist["hi"])
        x = torch.randint(-hi, hi + 1, shape, generator=g).to(torch.float64)
    else:
        raise ValueError(f"unknown distribution kind {kind!r}")
    return x.to(dtype).to(device)


def _signs(shape, g) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1


def _format_values(fmt: str) -> torch.Tensor:
    import numpy as np

    from tealite_verify.references.quantize import ML_DTYPES
    bits = np.arange(16 if fmt == "e2m1" else 256, dtype=np.uint8)
    vals = bits.view(ML_DTYPES[fmt]).astype(np.float64)
    vals = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    return torch.from_numpy(vals)


def _quant_edges(dist: dict, shape, dtype, g) -> torch.Tensor:
    vals = _format_values(dist["fmt"])
    mids = (vals[1:] + vals[:-1]) / 2
    pool = torch.cat([vals, mids])
    n = 1
    for s in shape:
        n *= s
    x = pool[torch.randint(0, len(pool), (n,), generator=g)] * _signs((n,), g)
    x = x.reshape(shape) if shape else x.reshape(())
    if len(shape) >= 1 and shape[-1] > 0:
        block = int(dist.get("block", 32))
        lead = x.reshape(-1, shape[-1])
        nb = -(-shape[-1] // block)
        scale = torch.exp2(torch.randint(-8, 9, (lead.shape[0], nb), generator=g).double())
        lead = lead * scale.repeat_interleave(block, 1)[:, : shape[-1]]
        # One boundary element per block: fmt max * 2^j nudged by -1/0/+1 ulp of dtype.
        fmax = float(vals.max())
        ulp_rel = 2.0 ** -_MANTISSA_BITS[dtype]
        nudge = (torch.randint(-1, 2, (lead.shape[0], nb), generator=g).double() * ulp_rel)
        edge = fmax * scale * (1 + nudge)
        for b in range(nb):
            col = b * block + int(torch.randint(0, min(block, shape[-1] - b * block), (1,),
                                                generator=g))
            lead[:, col] = edge[:, b]
        x = lead.reshape(shape)
    return x
