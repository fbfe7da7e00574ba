"""Mutation operators for dropout: a biased drop probability, the wrong scale, a periodic
mask, a generator that ignores the offset, and a backward that regenerates its mask instead
of using the forward's.

torch's implementations: ``dropout_fwd(x, *, p, scale, seed, offset)`` -> (y, kept mask) and
``dropout_bwd(dy, mask, *, p, scale)`` -> dx; the mutants build their masks with the torch
backend's own generator (``keep_mask``) and scaling (``apply_mask``), so y stays consistent
with the returned mask and only the statistical tier (or the backward's exact check) can
see the bug.
"""
from __future__ import annotations

import torch

from tealite.backends.torch.dropout import apply_mask, keep_mask
from tealite_verify.mutate.base import Mutation, register

# The period of the patterned mutant: a kernel whose Philox counter forgot the program id
# repeats its first block's draws (16: TE's RNG chunk).
_PERIOD = 16


def _p_off_by_one_point(fn):
    # Kept with probability 1 - (p + 0.01): a drop probability biased by one percentage point.
    def mutated(x, *, p, scale, seed, offset):
        keep = keep_mask(x.shape, x.device, min(1.0, p + 0.01), seed, offset)
        return apply_mask(x, keep, scale), keep
    return mutated


def _scale_one_over_p(fn):
    def mutated(x, *, p, scale, seed, offset):
        wrong = float(torch.tensor(1.0 / p, dtype=torch.float32)) if p > 0 else scale
        return fn(x, p=p, scale=wrong, seed=seed, offset=offset)
    return mutated


def _periodic_mask(fn):
    def mutated(x, *, p, scale, seed, offset):
        block = keep_mask((_PERIOD,), x.device, p, seed, offset)
        reps = -(-x.numel() // _PERIOD)
        keep = block.repeat(reps)[:x.numel()].reshape(x.shape)
        return apply_mask(x, keep, scale), keep
    return mutated


def _offset_ignored(fn):
    def mutated(x, *, p, scale, seed, offset):
        return fn(x, p=p, scale=scale, seed=seed, offset=0)
    return mutated


def _bwd_mask_regenerated(fn):
    # The backward draws its own mask (another offset) instead of reading the forward's.
    def mutated(dy, mask, *, p, scale):
        return fn(dy, keep_mask(dy.shape, dy.device, p, 0, 1), p=p, scale=scale)
    return mutated


for _m in (
    Mutation("dropout_fwd.p_off_by_one_point", "dropout_fwd", "parameter",
             "elements dropped with probability p + 0.01 (y consistent with that mask)",
             _p_off_by_one_point),
    Mutation("dropout_fwd.scale_one_over_p", "dropout_fwd", "formula",
             "kept elements scaled by 1/p instead of 1/(1-p)", _scale_one_over_p),
    Mutation("dropout_fwd.periodic_mask", "dropout_fwd", "formula",
             f"the first {_PERIOD} draws repeated over the tensor", _periodic_mask),
    Mutation("dropout_fwd.offset_ignored", "dropout_fwd", "parameter",
             "every offset draws offset 0's mask", _offset_ignored),
    Mutation("dropout_bwd.mask_regenerated", "dropout_bwd", "operand",
             "the backward regenerates a mask with another offset instead of the forward's",
             _bwd_mask_regenerated),
):
    register(_m)
