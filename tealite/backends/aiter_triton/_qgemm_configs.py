"""Which config AITER's quantized-GEMM wrappers launch with, and the shape facts around it.

Split from :mod:`tealite.backends.aiter_triton.qgemm` (routing, checks, numerics and adapters
stay there).  The config tealite hands AITER is AITER's own tuned choice, copied, with the
interpreter's block caps; what the wrapper then launches is read from a dry run of the wrapper
itself (:func:`launched`), because its host-side adjustments change between AITER releases,
with a replay of the 0.1.7.post2 adjustments as the fallback (:func:`replayed_config`).
"""
from __future__ import annotations

import torch
import triton

from tealite.backends.aiter_common.kernel_facts import find_kernel, first_launch, masked_loads
from tealite.backends.aiter_triton import DEVICES, kernels
from tealite.backends.aiter_triton.gemm import accepts, aiter_config, aiter_module
from tealite.types import permute_e8m0_scales

A8W8 = "gemm_a8w8"
A8W8_PER_TOKEN = "gemm_a8w8_per_token_scale"
A8W8_BLOCK = "gemm_a8w8_blockscale"
FP4 = "gemm_afp4wfp4"
FP4_SHUFFLED_SCALES = "gemm_afp4wfp4_preshuffled_scales"
FP4_SHUFFLED_WEIGHT = "gemm_afp4wfp4_preshuffled_weight_scales"
# MXFP4 route: the first entry point whose shape rule (_mx_route_ok) holds; the last is the
# catch-all.  The default of qgemm.Routing.mxfp4_preference (a test forces one entry point
# through qgemm.ROUTING).
MXFP4_PREFERENCE = (FP4_SHUFFLED_WEIGHT, FP4_SHUFFLED_SCALES, FP4)

_BLOCK_SCALE_K = 128  # Float8BlockScaling's K block (TE / DeepSeek-V3)
_MX_SCALE_K = 32
_SHUFFLE_K = 256  # e8m0_shuffle groups 8 scale columns = 256 elements along K
_WEIGHT_TILE_N = 16  # shuffle_weight((16, 16)) row group

# Interpreter block caps (AITER config keys -> maximum): CI shapes then span several programs
# and K steps.  Blockscale keeps its K step (it must equal the 128-long scale block); the
# preshuffled MXFP4 kernels keep theirs (>= 256: a shuffled scale group) and their BLOCK_SIZE_M
# side of 32 (the kernel's switch between shuffled and plain x scales).
_CAPS = {
    A8W8: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64},
    A8W8_PER_TOKEN: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64},
    A8W8_BLOCK: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32},
    FP4: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32},
    FP4_SHUFFLED_SCALES: {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32},
    FP4_SHUFFLED_WEIGHT: {"BLOCK_SIZE_N": 32},
}


# ---- configs as AITER's wrappers will adjust them -----------------------------------------------

def _caps(entry: str, m: int) -> dict:
    caps = dict(_CAPS[entry])
    if entry == FP4_SHUFFLED_WEIGHT:  # AITER asserts BLOCK_SIZE_M <= 16 (M < 32) or >= 32
        caps["BLOCK_SIZE_M"] = 16 if m < 32 else 32
    return caps


def _config_args(entry: str, m: int, n: int, k: int) -> tuple:
    if entry in (FP4, FP4_SHUFFLED_SCALES):
        return (m, n, k // 2)
    if entry == FP4_SHUFFLED_WEIGHT:
        return (m, n, k // 2, True)
    return (m, n, k)


def _config(entry: str, m: int, n: int, k: int) -> dict:
    """The config passed to AITER (its own choice, copied; interpreter caps).  A K-step cap
    that the wrapper undoes after splitting K with it is lifted to the K step the wrapper
    launches with: from v0.1.7.post3 gemm_afp4wfp4 raises BLOCK_SIZE_K to >= 128 after its
    split-K heuristic, so a capped 32 would leave split parts shorter than one K step
    (overlapping K ranges); AITER's own configs (K step 256) never meet that floor."""
    cfg = aiter_config(entry, *_config_args(entry, m, n, k), caps=_caps(entry, m))
    seen = _observe(entry, m, n, k, cfg) if m and n and k else None
    if seen is not None and seen[0].get("NUM_KSPLIT", 1) > 1 and \
            seen[0]["SPLITK_BLOCK_SIZE"] % seen[0]["BLOCK_SIZE_K"] and \
            seen[0]["BLOCK_SIZE_K"] > cfg.get("BLOCK_SIZE_K", 0):
        cfg["BLOCK_SIZE_K"] = seen[0]["BLOCK_SIZE_K"]
    return cfg


def _shrink_block_k(cfg: dict) -> None:
    """The per-token / blockscale wrappers' BLOCK_SIZE_K adjustment to the split size."""
    if cfg["BLOCK_SIZE_K"] > cfg["SPLITK_BLOCK_SIZE"]:
        cfg["BLOCK_SIZE_K"] = triton.next_power_of_2(cfg["SPLITK_BLOCK_SIZE"])
        if cfg["BLOCK_SIZE_K"] > cfg["SPLITK_BLOCK_SIZE"]:
            cfg["BLOCK_SIZE_K"] //= 4
    cfg["BLOCK_SIZE_K"] = max(cfg["BLOCK_SIZE_K"], 16)


def replayed_config(entry: str, m: int, n: int, k: int) -> dict:
    """AITER's wrapper's host-side adjustments of ``_config``'s dict, replayed on a copy as
    amd-aiter 0.1.7.post2 makes them (the fp4 split-K heuristic is AITER's own
    ``get_splitk``).  The fallback of :func:`effective_config`."""
    cfg = _config(entry, m, n, k)
    if entry in (A8W8_PER_TOKEN, A8W8_BLOCK):
        cfg["SPLITK_BLOCK_SIZE"] = triton.cdiv(k, cfg["NUM_KSPLIT"])
        _shrink_block_k(cfg)
    elif entry in (FP4, FP4_SHUFFLED_SCALES, FP4_SHUFFLED_WEIGHT):
        kb = k // 2
        if cfg["NUM_KSPLIT"] > 1:
            split, bk, nsplit = aiter_module(entry).get_splitk(kb, cfg["BLOCK_SIZE_K"],
                                                               cfg["NUM_KSPLIT"])
            cfg.update(SPLITK_BLOCK_SIZE=split, BLOCK_SIZE_K=bk, NUM_KSPLIT=nsplit)
        else:
            cfg["SPLITK_BLOCK_SIZE"] = 2 * kb
        if entry != FP4:
            if cfg["BLOCK_SIZE_K"] >= 2 * kb:
                cfg["BLOCK_SIZE_K"] = triton.next_power_of_2(2 * kb)
                cfg["SPLITK_BLOCK_SIZE"] = 2 * kb
            cfg["BLOCK_SIZE_N"] = max(cfg["BLOCK_SIZE_N"], 32)
    return cfg


# The keys of a launch that the checks and numerics below read.
_LAUNCH_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "NUM_KSPLIT",
                "SPLITK_BLOCK_SIZE")
_launched: dict[tuple, tuple[dict, str] | None] = {}


def _dry_run_args(entry: str, m: int, n: int, k: int, cfg: dict) -> tuple:
    """Inputs of the right shapes and dtypes for ``entry`` (never read: nothing runs)."""
    dev = DEVICES[0]
    if entry in (A8W8, A8W8_PER_TOKEN, A8W8_BLOCK):
        fp8 = kernels().fp8_dtype
        kb = triton.cdiv(k, _BLOCK_SCALE_K)
        xs, ws = {A8W8: ((m, 1), (1, n)), A8W8_PER_TOKEN: ((m, 1), (n, 1)),
                  A8W8_BLOCK: ((m, kb), (triton.cdiv(n, _BLOCK_SCALE_K), kb))}[entry]
        return (torch.zeros(m, k, device=dev).to(fp8), torch.zeros(n, k, device=dev).to(fp8),
                torch.ones(xs, device=dev), torch.ones(ws, device=dev))
    x = torch.zeros(m, k // 2, dtype=torch.uint8, device=dev)
    w = torch.zeros(n, k // 2, dtype=torch.uint8, device=dev)
    xs = torch.full((m, k // _MX_SCALE_K), 127, dtype=torch.uint8, device=dev)
    ws = torch.full((n, k // _MX_SCALE_K), 127, dtype=torch.uint8, device=dev)
    if entry == FP4:
        return x, w, xs, ws
    if entry == FP4_SHUFFLED_WEIGHT:
        w = w.view(n // _WEIGHT_TILE_N, -1)
    return x, w, _shuffled_scales(xs) if cfg["BLOCK_SIZE_M"] >= 32 else xs, _shuffled_scales(ws)


def launched(entry: str, m: int, n: int, k: int) -> tuple[dict, str] | None:
    """(config, kernel name) that AITER's own wrapper launches its GEMM kernel with when
    handed ``_config``'s dict, observed in a dry run (nothing executes).  The wrappers'
    host-side adjustments change between versions (from v0.1.7.post3 gemm_afp4wfp4 raises
    BLOCK_SIZE_K to >= 128 after its split-K heuristic; from v0.1.16 the preshuffled path
    splits K counted in elements): asking AITER replaces replaying them.  None when the
    wrapper raises (its own assertions; the replay's checks say why) or launches nothing."""
    cfg = _config(entry, m, n, k)
    seen = _observe(entry, m, n, k, cfg)
    return None if seen is None else (dict(cfg, **seen[0]), seen[1])


def _observe(entry: str, m: int, n: int, k: int, cfg: dict) -> tuple[dict, str] | None:
    """The launch keys and kernel name of a dry run of ``entry`` with ``cfg`` (memoized)."""
    module = aiter_module(entry)
    key = (entry, m, n, k, tuple(sorted(cfg.items())), id(module),
           getattr(module, "_USE_GEMM_SPLITK_BF16", None))
    if key not in _launched:
        fn = kernels().functions[entry]
        aot = {"use_aot": False} if entry == FP4_SHUFFLED_WEIGHT and accepts(fn, "use_aot") \
            else {}
        try:
            args = _dry_run_args(entry, m, n, k, cfg)
        except (RuntimeError, ValueError):  # a shape the entry's layout cannot hold
            launch = None
        else:
            launch = first_launch(fn, *args, key="BLOCK_SIZE_K", dtype=torch.float32,
                                  config=dict(cfg), **aot)
        _launched[key] = None if launch is None else (
            {k_: launch.kwargs[k_] for k_ in _LAUNCH_KEYS if k_ in launch.kwargs},
            launch.kernel)
    return _launched[key]


def effective_config(entry: str, m: int, n: int, k: int) -> dict:
    """What AITER's wrapper launches with for ``_config``'s dict: observed (:func:`launched`),
    else replayed (:func:`replayed_config`)."""
    seen = launched(entry, m, n, k) if m and n and k else None
    return seen[0] if seen is not None else replayed_config(entry, m, n, k)


def _ragged_k_safe(entry: str, m: int, n: int, k: int) -> bool:
    """The launched MXFP4 kernel masks its E8M0 scale loads (a ragged last K step is then
    read safely): read from the kernel's source, since AITER added the masks in v0.1.12 (the
    plain and preshuffled-scales kernels; the preshuffled-weight kernel has none)."""
    seen = launched(entry, m, n, k) if m and n and k else None
    kernel = find_kernel(seen[1]) if seen is not None else None
    masks = masked_loads(kernel, "scale") if kernel is not None else None
    return bool(masks) and any(masks)


def _fp4_even_k(cfg: dict, k: int) -> bool:
    """AITER's EVEN_K heuristic of the MXFP4 kernels (K counted in packed bytes there)."""
    kb, bk, split = k // 2, cfg["BLOCK_SIZE_K"], cfg["SPLITK_BLOCK_SIZE"]
    return kb % (bk // 2) == 0 and split % bk == 0 and kb % (split // 2) == 0


def _shuffled_scales(scales: torch.Tensor) -> torch.Tensor:
    s = permute_e8m0_scales(scales.contiguous())
    return s.view(s.shape[0] // 32, s.shape[1] * 32)
