"""Quantized codes and scales, by default bit-exact (the ``exact`` tier); what every quantized
output's tier needs first: the backend's code bits read off its storage, or the reason they
are malformed.

The storage contract: data in the format's dtype (``uint8`` for packed e2m1, exactly ceil(n/2)
bytes per row).  FP8 codes compare as FP8 values bit-exactly, except that any NaN code matches
any NaN (torch writes 0x7F for an e5m2 NaN, ml_dtypes 0x7E: both are NaN, no payload
contract).  Pair rule: the two backends' codes bit-exact in the same sense.  An output the
recipe says must be absent (AITER's rule reports no amax) is judged by :func:`check_no_amax`.
"""
from __future__ import annotations

import numpy as np
import torch

from tealite.formats import get_format

from tealite_verify.references import quantize as ref
from tealite_verify.tiers.exact import compare_exact
from tealite_verify.tiers.metrics import Metrics, absent, malformed


def host(t) -> np.ndarray:
    """A backend's output tensor as a numpy array on the host (its own dtype)."""
    return t.detach().cpu().numpy()


def code_bits(outputs, name: str, fmt: str, n: int, *, rows: int | None = None,
              context: str = ""):
    """The unpacked code bits (rows, n) of output ``name``, or the reason it is malformed (a
    str): missing, not in the format's storage dtype, or (e2m1) not ceil(n/2) bytes per row.
    With ``rows`` the whole shape must match (``context`` is added to that message)."""
    data = outputs.get(name)
    if data is None:
        return f"output {name!r} missing"
    f = get_format(fmt)
    want = f.torch_dtype or torch.uint8
    if data.dtype != want:
        return f"{name} dtype {data.dtype} != {want} for {fmt}"
    width = -(-n // 2) if f.packed else n
    if rows is not None and tuple(data.shape) != (rows, width):
        return f"{name} shape {tuple(data.shape)} != expected {(rows, width)}{context}"
    if f.packed and data.shape[-1] != width:
        return f"{name} has {data.shape[-1]} bytes per row, want ceil({n}/2)"
    bits = data.detach().cpu().contiguous().view(torch.uint8).numpy()
    return ref.unpack_e2m1(bits, n) if f.packed else bits


def array_of(outputs, name: str, dtype: torch.dtype):
    """Output ``name`` as a numpy array, or the reason it is malformed (missing, wrong dtype)."""
    t = outputs.get(name)
    if t is None:
        return f"output {name!r} missing"
    if t.dtype != dtype:
        return f"{name} dtype {t.dtype} != {dtype}"
    return host(t)


def check_fp8_codes(outputs, name: str, fmt: str, n: int, want_bits) -> Metrics:
    """FP8 codes (output ``name``) against the reference's bits, as FP8 values."""
    codes = code_bits(outputs, name, fmt, n)
    if isinstance(codes, str):
        return malformed(codes)
    ml = ref.ML_DTYPES[fmt]
    return compare_exact(codes.view(ml), np.asarray(want_bits).view(ml))


def pair_fp8_codes(ox, oy, name: str, fmt: str, n: int) -> Metrics:
    """Two backends' FP8 codes, as FP8 values."""
    cx, cy = code_bits(ox, name, fmt, n), code_bits(oy, name, fmt, n)
    if isinstance(cx, str) or isinstance(cy, str):
        return malformed(cx if isinstance(cx, str) else cy)
    ml = ref.ML_DTYPES[fmt]
    return compare_exact(cx.view(ml), cy.view(ml))


def check_no_amax(outputs) -> Metrics:
    """AITER's rule reports no amax (tealite.recipes): an amax output breaks the contract."""
    if outputs.get("amax") is not None:
        return malformed("amax must be None under scale_rule amax/fmax (AITER's kernels "
                         "report none)")
    return absent()
