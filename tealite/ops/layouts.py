"""AITER's pre-shuffled layouts and their inverses.

``shuffle_weight(w, layout=(IN, IK))`` (AITER's ``shuffle_weight``; (16, 16) is what its FP8 /
INT8 / BF16 / packed-FP4 GEMMs read): with ``Kv = 16 bytes / element size`` and
``BK = 2 * IK`` elements, w (N, K) is viewed as (N/IN, IN, K/BK, BK/Kv, Kv) and reordered to
(N/IN, K/BK, BK/Kv, IN, Kv), i.e. each IN x BK tile is stored as BK/Kv runs of IN rows x Kv
contiguous elements.  Packed FP4 is shuffled as bytes (so its logical K must be a multiple of
64).  Requires N % IN == 0 and K % BK == 0; nothing is padded.

``shuffle_e8m0_scales(s)`` (AITER's ``e8m0_shuffle``, from rocm-libraries PreSwizzle): s (M, S)
uint8 is padded to (M', S') = (M rounded up to 256, S rounded up to 8), viewed as
(M'/32, 2, 16, S'/8, 2, 4) and permuted by (0, 3, 5, 2, 4, 1).  The padding is zero-filled here
(AITER leaves it uninitialised: a consumer must never read it).

The inverses take the shuffled tensor (and, for scales, the original M and S).
"""
from __future__ import annotations

import torch

import tealite.registry as registry
from tealite._checks import check_tensor, require
from tealite.types import Op, padded_scale_shape, weight_tile  # noqa: F401  (re-exported)

WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
                 torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.int8, torch.uint8)


def _check_weight(name: str, w: torch.Tensor, layout) -> None:
    check_tensor(name, w, ndim=2, dtypes=WEIGHT_DTYPES)
    require(isinstance(layout, tuple) and len(layout) == 2 and all(
        isinstance(v, int) and v > 0 for v in layout), f"layout must be (IN, IK), got {layout!r}")
    bn, bk, kv = weight_tile(w.dtype, layout)
    n, k = w.shape
    require(bk % kv == 0, f"layout IK={layout[1]} gives BK={bk}, not a multiple of Kv={kv}")
    require(n % bn == 0, f"{name}.shape[0] (N) must be a multiple of {bn}, got {n}")
    require(k % bk == 0, f"{name}.shape[1] (K) must be a multiple of {bk} elements of "
                         f"{w.dtype} (for packed FP4: {2 * bk} logical values), got {k}")


def shuffle_weight(w: torch.Tensor, layout=(16, 16), *, backend: str | None = None):
    _check_weight("w", w, layout)
    params = dict(dtype=w.dtype, layout=layout, device=registry.device_kind(w.device))
    return registry.dispatch(Op.SHUFFLE_WEIGHT, params, backend).fn(w, layout, inverse=False)


def unshuffle_weight(w: torch.Tensor, layout=(16, 16), *, backend: str | None = None):
    _check_weight("w", w, layout)
    params = dict(dtype=w.dtype, layout=layout, device=registry.device_kind(w.device))
    return registry.dispatch(Op.SHUFFLE_WEIGHT, params, backend).fn(w, layout, inverse=True)


def shuffle_e8m0_scales(scales: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    check_tensor("scales", scales, ndim=2, dtypes=(torch.uint8,))
    params = dict(dtype=scales.dtype, device=registry.device_kind(scales.device))
    return registry.dispatch(Op.SHUFFLE_E8M0, params, backend).fn(scales, None)


def unshuffle_e8m0_scales(shuffled: torch.Tensor, m: int, s: int, *,
                          backend: str | None = None) -> torch.Tensor:
    check_tensor("shuffled", shuffled, ndim=2, dtypes=(torch.uint8,))
    require(isinstance(m, int) and isinstance(s, int) and m >= 0 and s >= 0,
            f"m and s must be non-negative ints, got {m!r}, {s!r}")
    want = padded_scale_shape(m, s)
    require(tuple(shuffled.shape) == want,
            f"shuffled must have the padded shape {want} for m={m}, s={s}, "
            f"got {tuple(shuffled.shape)}")
    params = dict(dtype=shuffled.dtype, device=registry.device_kind(shuffled.device))
    return registry.dispatch(Op.SHUFFLE_E8M0, params, backend).fn(shuffled, (m, s))
