"""Grouped GEMM (TE's ``general_grouped_gemm`` / ``GroupedLinear``): G GEMMs in one call.

The semantics (splits, layouts, single vs per-group weights, bias, accumulate, empty groups,
parity with the split path) are written once in tealite/moe_types.py; in short, with TE's
layout letters (A the weight side, B the token side):

=======  =========================  ==================  ===================================
layout   A                          B                   out
=======  =========================  ==================  ===================================
``TN``   (G, N, K) or shared (N, K)  (M_total, K)        (M_total, N): rows_g = B_g @ A_g^T
``NN``   (G, K, N) or shared (K, N)  (M_total, K)        (M_total, N): rows_g = B_g @ A_g
``NT``   (K_total, N)               (K_total, M)        (G, M, N): out[g] = B_g^T @ A_g
=======  =========================  ==================  ===================================

``m_splits`` cuts B's rows (TN / NN) or both operands' rows (NT: the contraction) into G
consecutive groups.  ``bias`` (G, N) adds row g to group g's rows (TN / NN only; the wgrad
bias is a reduction, not an epilogue).  ``accumulate=True`` adds the product into ``out``
(beta = 1, TE's fused wgrad accumulation); ``out`` is then required.  Empty groups: no rows
(TN / NN); for NT ``out[g]`` is exactly zero, or with ``accumulate`` left unchanged bit for
bit (no kernel may add a -0 or round it again).

:func:`grouped_qgemm` takes quantized operands, as :func:`tealite.qgemm` does, one
QuantizedTensor per group on the token side (NT: both sides) and one per group or one
shared on the weight side, with every pair obeying qgemm's recipe rules (each group's
operands read in their K-last orientation: quantize with ``columnwise=True`` where the layout
stores K first).  ``accumulate`` there adds the fp32 product to ``out`` in fp32 and rounds
once to ``out_dtype``.
"""
from __future__ import annotations

from typing import Sequence

import torch

import tealite.registry as registry
from tealite._checks import (FLOAT_DTYPES, check_choice, check_dtype_in, check_same_device,
                             check_shape, check_tensor, require)
from tealite.moe_types import GROUPED_LAYOUTS, ScaledOperand, check_splits, splits_k
from tealite.ops.qgemm import check_operands, operand_devices
from tealite.types import Op, QuantizedTensor


def _weight_dims(a: torch.Tensor, layout: str, groups: int) -> tuple[int, int, bool]:
    """(N, K, shared) of a split-M weight operand: (G, N, K) / (G, K, N), or one 2-D weight."""
    require(a.dim() in (2, 3), f"a (the weights) must be 3-D (one per group, G={groups}) or 2-D "
                               f"(one shared weight) under layout {layout}, got shape "
                               f"{tuple(a.shape)}")
    shared = a.dim() == 2
    if not shared:
        require(a.shape[0] == groups, f"a must stack one weight per group: a.shape[0] must be "
                                      f"len(m_splits) = {groups}, got {a.shape[0]}")
    rows, cols = a.shape[-2:]
    n, k = (rows, cols) if layout[0] == "T" else (cols, rows)
    return n, k, shared


def _check_out(out, accumulate: bool, shape: tuple, out_dtype, layout: str) -> None:
    require(isinstance(accumulate, bool),
            f"accumulate must be a bool, got {type(accumulate).__name__}")
    require(not accumulate or out is not None,
            "accumulate=True needs out= holding the prior output to add into")
    if out is not None:
        check_tensor("out", out, ndim=len(shape), dtypes=(out_dtype,))
        what = "(G, M, N) for layout NT" if splits_k(layout) else \
            f"(M_total, N) for layout {layout}"
        check_shape("out", out, shape, what)


def _check_bias(bias, groups: int, n: int, layout: str, dtypes) -> None:
    if bias is None:
        return
    require(not splits_k(layout), "bias is not taken under layout NT (the wgrad bias is a "
                                  "reduction over tokens, not an epilogue); pass bias=None")
    check_tensor("bias", bias, ndim=2, dtypes=dtypes)
    check_shape("bias", bias, (groups, n), "one (N,) row per group")


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, m_splits, *, layout: str = "TN",
                 out_dtype: torch.dtype | None = None, bias: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, accumulate: bool = False,
                 backend: str | None = None) -> torch.Tensor:
    check_choice("layout", layout, GROUPED_LAYOUTS)
    check_tensor("b", b, ndim=2)
    check_tensor("a", a, min_ndim=2)
    require(a.dtype == b.dtype, f"a and b must share a dtype, got a {a.dtype} and b {b.dtype}")
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_dtype_in("out_dtype", out_dtype, FLOAT_DTYPES)
    if splits_k(layout):
        check_tensor("a", a, ndim=2)
        require(a.shape[0] == b.shape[0], f"under layout NT a (K_total, N) and b (K_total, M) "
                                          f"must share K_total, got a {tuple(a.shape)} and b "
                                          f"{tuple(b.shape)}")
        splits = check_splits("m_splits", m_splits, b.shape[0])
        n, m, k, shared = a.shape[1], b.shape[1], b.shape[0], False
        out_shape = (len(splits), m, n)
    else:
        splits = check_splits("m_splits", m_splits, b.shape[0])
        n, k, shared = _weight_dims(a, layout, len(splits))
        require(b.shape[1] == k, f"contraction dims differ under layout {layout}: a gives K={k} "
                                 f"(a shape {tuple(a.shape)}), b gives K={b.shape[1]} (b shape "
                                 f"{tuple(b.shape)})")
        m = b.shape[0]
        out_shape = (m, n)
    _check_bias(bias, len(splits), n, layout, (a.dtype,))
    _check_out(out, accumulate, out_shape, out_dtype, layout)
    device = check_same_device(a=a, b=b, bias=bias, out=out)
    params = dict(groups=len(splits), m_splits=splits, m=m, n=n, k=k, layout=layout,
                  dtype=a.dtype, out_dtype=out_dtype, bias=bias is not None,
                  accumulate=accumulate, shared_weight=shared,
                  device=registry.device_kind(device))
    impl = registry.dispatch(Op.GROUPED_GEMM, params, backend)
    return impl.fn(a, b, splits, layout=layout, out_dtype=out_dtype, bias=bias, out=out,
                   accumulate=accumulate)


def _per_group(name: str, x, groups: int | None, *, shared_ok: bool) -> list[QuantizedTensor]:
    """``x`` as a list of QuantizedTensors: one per group (``groups`` long when known), or with
    ``shared_ok`` a single QuantizedTensor shared by every group."""
    if shared_ok and isinstance(x, QuantizedTensor):
        return [x]
    what = "a QuantizedTensor or a sequence of them" if shared_ok else \
        "a sequence of QuantizedTensors, one per group"
    require(isinstance(x, Sequence) and not isinstance(x, (str, bytes)),
            f"{name} must be {what}, got {type(x).__name__}")
    for g, q in enumerate(x):
        require(isinstance(q, QuantizedTensor),
                f"{name}[{g}] must be a QuantizedTensor, got {type(q).__name__}")
    if groups is not None:
        require(len(x) == groups, f"{name} must hold one QuantizedTensor per group "
                                  f"(len(m_splits) = {groups}), got {len(x)}")
    require(len(x) > 0, f"{name} must hold at least one QuantizedTensor")
    first = x[0].recipe
    odd = next((g for g, q in enumerate(x) if q.recipe != first), None)
    require(odd is None, f"every group of {name} must share one recipe: {name}[{odd}] has "
                         f"{x[odd or 0].recipe!r}, {name}[0] has {first!r}")
    return list(x)


def grouped_qgemm(a, b, m_splits, *, layout: str = "TN",
                  out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, accumulate: bool = False,
                  backend: str | None = None) -> torch.Tensor:
    check_choice("layout", layout, GROUPED_LAYOUTS)
    check_dtype_in("out_dtype", out_dtype, FLOAT_DTYPES)
    qb = _per_group("b", b, None, shared_ok=False)
    groups = len(qb)
    qa = _per_group("a", a, groups, shared_ok=not splits_k(layout))
    rows = [q.shape[0] for q in qb]  # b is (m_g, K) split-M, (k_g, M) under NT: rows either way
    splits = check_splits("m_splits", m_splits, sum(rows), groups=groups)
    bad = next((g for g in range(groups) if rows[g] != splits[g]), None)
    require(bad is None, f"m_splits[{bad}] = {splits[bad or 0]} but b[{bad}] holds "
                         f"{rows[bad or 0]} rows (shape {qb[bad or 0].shape})")
    pairs = [check_operands(qa[g if len(qa) > 1 else 0], qb[g], layout,
                            a_name=f"a[{g}]" if len(qa) > 1 else "a", b_name=f"b[{g}]")
             for g in range(groups)]
    n = pairs[0].n
    for g, p in enumerate(pairs):
        require(p.n == n, f"every group's N must agree: a[{g}] gives N={p.n}, a[0] gives N={n}")
        if not splits_k(layout):
            require(p.k == pairs[0].k, f"every group's K must agree under layout {layout}: "
                                       f"group {g} has K={p.k}, group 0 K={pairs[0].k}")
        else:
            require(p.m == pairs[0].m, f"every group's M must agree under layout NT: b[{g}] "
                                       f"gives M={p.m}, b[0] gives M={pairs[0].m}")
    m = pairs[0].m if splits_k(layout) else sum(splits)
    k = sum(splits) if splits_k(layout) else pairs[0].k
    _check_bias(bias, groups, n, layout, FLOAT_DTYPES)
    _check_out(out, accumulate, (groups, m, n) if splits_k(layout) else (m, n), out_dtype,
               layout)
    devices = set().union(*(operand_devices(p) for p in pairs))
    devices |= {t.device for t in (bias, out) if t is not None}
    require(len(devices) == 1,
            f"all operands must be on one device, got {sorted(map(str, devices))}")
    params = dict(kind=pairs[0].kind, groups=groups, m_splits=splits, m=m, n=n, k=k,
                  layout=layout, out_dtype=out_dtype, dtype=out_dtype, fmt_a=qa[0].recipe.fmt,
                  fmt_b=qb[0].recipe.fmt, recipe_a=qa[0].recipe, recipe_b=qb[0].recipe,
                  bias=bias is not None, accumulate=accumulate, shared_weight=len(qa) == 1,
                  device=registry.device_kind(next(iter(devices))))
    impl = registry.dispatch(Op.GROUPED_QGEMM, params, backend)
    a_ops = tuple(ScaledOperand(p.a_codes, p.a_scales) for p in pairs[:len(qa)])
    b_ops = tuple(ScaledOperand(p.b_codes, p.b_scales) for p in pairs)
    return impl.fn(qa[0].recipe, a_ops, qb[0].recipe, b_ops, splits, m=m, n=n, k=k,
                   layout=layout, out_dtype=out_dtype, bias=bias, out=out,
                   accumulate=accumulate)
