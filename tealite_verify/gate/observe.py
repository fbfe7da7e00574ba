"""Contracts observed by probing: which conventions an AITER quantizer's output actually
follows, found by comparing it bit-exactly with the reference under every candidate
convention, on inputs built to tell them apart.

A declared contract is what tealite's code says; the observed one is what the installed
AITER does.  A release that switches, say, its MXFP4 scale rule from EVEN to RCEIL changes
the observed ``matches`` even where every case still happens to pass, and the gate reports it
as a contract change.  ``matches`` lists every candidate that reproduces the output exactly
(empty: none does, e.g. a platform cast bug or a new rule).
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

import tealite
from tealite import recipes as R
from tealite.backends.aiter import contracts as aiter_contracts
from tealite.errors import BackendUnavailable, UnsupportedCase
from tealite.formats import ElementRounding, FP8ScaleRule, ScaleRounding
from tealite_verify.references import quantize as qref

F32 = np.float32


def mx_probe_input(rows: int = 64, cols: int = 128, seed: int = 20261122) -> np.ndarray:
    """float32 (rows, cols): per-row magnitudes over many binades (scale rules differ on
    amaxes with mantissa bits), amaxes just below / at powers of two and at the element max
    times a power of two (RCEIL vs CEIL), and rows of element-grid ties (RNE vs ties-away)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(F32)
    x *= np.exp2(rng.integers(-20, 20, size=(rows, 1))).astype(F32)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], F32)  # E2M1 midpoints
    for r in range(0, rows, 8):
        x[r] = np.resize(ties * (-1.0) ** np.arange(8), cols)  # alternating signs
        x[r + 1, :] *= 0
        x[r + 1, 0::32] = F32(7.0) * 2.0 ** (r // 8)       # 1.75 * 2^k: EVEN/CEIL vs FLOOR
        x[r + 2, 0::32] = F32(6.0) * 2.0 ** (r // 8)       # element max: RCEIL == FLOOR
        x[r + 3, 0::32] = F32(448.0) * 2.0 ** (r // 8 - 4)  # E4M3 max: RCEIL vs CEIL
        x[r + 4, 0::32] = np.nextafter(F32(2.0 ** (r // 8)), F32(0))  # just below 2^k
    return x


def _run_mx(backend: str, recipe, x: np.ndarray, device: str):
    q = tealite.quantize(torch.from_numpy(x).to(device), recipe, backend=backend)
    bits = q.data.view(torch.uint8).cpu().numpy()
    if recipe.fmt == "e2m1":
        bits = qref.unpack_e2m1(bits, x.shape[1])
    return bits, q.scale_inv.view(torch.uint8).cpu().numpy()


def _mx_matches(bits, scales, x, fmt) -> list[str]:
    found = []
    for sr, er in itertools.product(ScaleRounding, ElementRounding):
        want_bits, want_scales = qref.mx_quantize(x, fmt, sr.value, er.value)
        if np.array_equal(want_scales, scales) and np.array_equal(want_bits, bits):
            found.append(f"{sr.value}/{er.value}")
    return found


def _mx_recipe(c: aiter_contracts.Contract):
    fmt = "e2m1" if c.family == "mxfp4" else c.extra.get("fmt", "e4m3")
    sr = ScaleRounding((c.scale_rule or "").removeprefix("e8m0-"))
    er = ElementRounding((c.element_rounding or "").replace("-", "_"))
    return R.MXBlockScaling(fmt, sr, er)


def fp8_probe_input(rows: int = 32, cols: int = 96, seed: int = 20261123) -> np.ndarray:
    """float32 (rows, cols) for per-tensor / per-row FP8 probes.  Every row's amax is 4.75, so
    both granularities see the amax at which the two scale rules' fp32 roundings differ
    (fl(448 / 4.75) vs fl(1 / fl(4.75 / 448))): 3.5625 encodes 0x7A under TE's rule and 0x7B
    under AITER's.  The rest is uniform in (-4.75, 4.75), where the rules' multipliers split
    many more codes."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4.75, 4.75, size=(rows, cols)).astype(F32)
    x[:, 0] = F32(4.75)
    x[:, 1] = F32(3.5625)
    x[:, 2] = F32(-3.5625)
    return x


def _fp8_matches(bits, scale_inv, x, fmt, granularity) -> list[str]:
    found = []
    for rule, rounding in itertools.product(("fmax/amax", "amax/fmax"), ("rne", "ties_away")):
        if rule == "amax/fmax":
            a = qref.aiter_amax(x, per_row=granularity == "row")
            s_inv = qref.aiter_scale_inv(a, fmt)
            v = qref.aiter_scaled(x, s_inv[:, None] if granularity == "row" else s_inv[0])
        else:
            a = qref.amax(x, axis=1 if granularity == "row" else None).reshape(-1)
            s = qref.te_scale_from_amax(a, fmt)
            s_inv = qref.reciprocal(s)
            with np.errstate(over="ignore", invalid="ignore"):
                v = (x * (s[:, None] if granularity == "row" else s[0])).astype(F32)
        want = qref.codes_to_bits(qref.round_elements(v, fmt, rounding=rounding))
        if np.array_equal(want, bits) and np.array_equal(s_inv.reshape(-1),
                                                         scale_inv.reshape(-1)):
            found.append(f"{rule}/{rounding}")
    return found


def _observe_fp8(c: aiter_contracts.Contract, device: str) -> dict:
    from tealite.backends import aiter_triton
    from tealite.backends.aiter_triton import quantize as aq
    fmt = aq._fp8_name(aq.kernels())
    granularity = "row" if "token" in c.entry_point else "tensor"
    recipe = R.Float8CurrentScaling(fmt, granularity, scale_rule=FP8ScaleRule.AMAX_OVER_FMAX)
    x = fp8_probe_input()
    saved = aiter_triton.REJECT_FP8_IN_INTERPRETER
    aiter_triton.REJECT_FP8_IN_INTERPRETER = False  # a probe records what runs, cast bug and all
    try:
        q = tealite.quantize(torch.from_numpy(x).to(device), recipe, backend=c.backend)
    finally:
        aiter_triton.REJECT_FP8_IN_INTERPRETER = saved
    bits = q.data.view(torch.uint8).cpu().numpy()
    return {"probe": f"fp8 {fmt} {granularity} {x.shape}",
            "matches": _fp8_matches(bits, q.scale_inv.float().cpu().numpy(), x, fmt,
                                    granularity)}


def _observe_mx(c: aiter_contracts.Contract, device: str) -> dict:
    from tealite.backends import aiter_triton
    recipe = _mx_recipe(c)
    x = mx_probe_input()
    saved = aiter_triton.REJECT_MXFP4_ON_NVIDIA
    aiter_triton.REJECT_MXFP4_ON_NVIDIA = False  # a probe records what runs
    try:
        bits, scales = _run_mx(c.backend, recipe, x, device)
    finally:
        aiter_triton.REJECT_MXFP4_ON_NVIDIA = saved
    return {"probe": f"mx {recipe.fmt} {x.shape}", "matches": _mx_matches(bits, scales, x,
                                                                           recipe.fmt)}


def observe_contract(c: aiter_contracts.Contract, device: str) -> dict | None:
    """What probing shows for one declared contract, or None when it has no probe."""
    if c.op != "quantize":
        return None
    if c.backend == "aiter_triton" and c.family == "fp8-current":
        probe = _observe_fp8
    elif c.family in ("mxfp4", "mxfp8"):
        probe = _observe_mx
    else:
        return None
    try:
        return probe(c, device)
    except (UnsupportedCase, BackendUnavailable, ValueError) as exc:
        return {"matches": [], "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # a crashing kernel is an observation too
        return {"matches": [], "error": f"{type(exc).__name__}: {exc}"}


def observe_all(device: str) -> dict:
    """``{"backend:entry_point": observation}`` for every probeable declared contract."""
    from tealite import registry
    out = {}
    for c in aiter_contracts.contracts():
        b = registry.backends().get(c.backend)
        if b is None or b.unavailable_reason() is not None:
            continue
        obs = observe_contract(c, device)
        if obs is not None:
            out[f"{c.backend}:{c.entry_point}"] = obs
    return out
