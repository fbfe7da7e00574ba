"""Mutation operators for the activations: wrong function or derivative, gated halves swapped,
inputs or dy mishandled, a lowered input precision, dbias reduced wrongly, tail rows.

torch's implementations: ``act_fwd(x, *, kind) -> y``, ``act_bwd(dy, x, *, kind) -> dx``,
``dbias_dact(dy, x, *, kind) -> (dx, dbias)``.
"""
from __future__ import annotations

import torch

from tealite.ops.activations import GATED
from tealite_verify.mutate.base import (Mutation, on_output, register, stale_last_row,
                                        with_args, with_params)

# Each kind's derivative replaced by a look-alike's (a wrong activation derivative): the
# approximate / exact GELU pair, SiLU vs quick-GELU, ReLU vs squared ReLU, and the same for the
# gated forms.
_LOOK_ALIKE = {"gelu": "gelu_tanh", "gelu_tanh": "gelu", "silu": "qgelu", "qgelu": "silu",
               "relu": "srelu", "srelu": "relu", "swiglu": "qgeglu", "qgeglu": "swiglu",
               "geglu": "swiglu", "reglu": "sreglu", "sreglu": "reglu"}


def _gated_halves_swapped(args, kw):
    (x,) = args
    if kw["kind"] in GATED:
        a, g = x.chunk(2, dim=-1)
        x = torch.cat([g, a], dim=-1)
    return (x,), kw


def _input_through_bf16(args, kw):
    """Inputs rounded to bf16 first (a kernel that loads through a 16-bit buffer)."""
    (x,) = args
    return (x.to(torch.bfloat16).to(x.dtype),), kw


def _dy_ignored(args, kw):
    dy, x = args
    return (torch.ones_like(dy), x), kw


def _dbias_of_dy(fn):
    # dbias = sum of the incoming gradient, not of the activation's gradient (the bias taken
    # to sit after the activation).
    def mutated(dy, x, *, kind):
        dx, _ = fn(dy, x, kind=kind)
        dbias = dy.float().reshape(-1, dy.shape[-1]).sum(dim=0)
        return dx, dbias.to(dx.dtype)
    return mutated


def _dbias_last_row_dropped(fn):
    # The row loop stops one short: dbias misses the last row's contribution.
    def mutated(dy, x, *, kind):
        dx, dbias = fn(dy, x, kind=kind)
        full = _dx_fp32(dy, x, kind, fn)
        rows = full.reshape(-1, full.shape[-1]) if full.shape[-1] else None
        if rows is None or rows.shape[0] < 2:
            return dx, dbias
        return dx, rows[:-1].sum(dim=0).to(dbias.dtype)
    return mutated


def _dx_fp32(dy, x, kind, fn):
    """dx in fp32, by the torch implementation itself on fp32 copies (its math is fp32)."""
    dx32, _ = fn(dy.float(), x.float(), kind=kind)
    return dx32


def _dbias_wrong_axis(fn):
    # dbias reduced over the hidden axis (one value per row) instead of over the rows.
    def mutated(dy, x, *, kind):
        dx, dbias = fn(dy, x, kind=kind)
        full = _dx_fp32(dy, x, kind, fn)
        wrong = full.reshape(-1, full.shape[-1]).sum(dim=-1) if full.shape[-1] else dbias
        return dx, wrong.to(dbias.dtype)
    return mutated


for _m in (
    Mutation("act_fwd.gelu_as_tanh", "act_fwd", "formula",
             "exact GELU computed with the tanh approximation",
             with_params(lambda kw: dict(kw, kind="gelu_tanh" if kw["kind"] == "gelu"
                                         else kw["kind"]))),
    Mutation("act_fwd.gated_halves_swapped", "act_fwd", "layout",
             "gated kinds activate the gate half and multiply by the activation half",
             with_args(_gated_halves_swapped)),
    Mutation("act_fwd.input_through_bf16", "act_fwd", "precision",
             "fp32 / fp16 inputs rounded to bf16 before the activation",
             with_args(_input_through_bf16)),
    Mutation("act_fwd.last_row_stale", "act_fwd", "tail",
             "the output's last row keeps the first row's values",
             on_output(lambda t, a, kw: stale_last_row(t))),
    Mutation("act_bwd.dy_ignored", "act_bwd", "formula",
             "dx = act'(x), the incoming gradient never multiplied in", with_args(_dy_ignored)),
    Mutation("act_bwd.look_alike_derivative", "act_bwd", "formula",
             "each kind differentiated as a look-alike (gelu as gelu_tanh, silu as qgelu, "
             "relu as srelu, ...)",
             with_params(lambda kw: dict(kw, kind=_LOOK_ALIKE[kw["kind"]]))),
    Mutation("dbias_dact.dbias_of_dy", "dbias_dact", "formula",
             "dbias summed from dy instead of from dact(x) * dy", _dbias_of_dy),
    Mutation("dbias_dact.dbias_wrong_axis", "dbias_dact", "axis",
             "dbias summed over the hidden axis (one value per row) instead of over rows",
             _dbias_wrong_axis),
    Mutation("dbias_dact.dbias_last_row_dropped", "dbias_dact", "tail",
             "dbias misses the last row's contribution", _dbias_last_row_dropped),
):
    register(_m)
