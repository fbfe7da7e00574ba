"""FP8 attention as a recipe: ``attention_fwd(..., recipe=Float8CurrentScaling())``.

The recipe's quantization points are declared by the contract (tealite/attention_types.py):
q, k and v are each quantized as a whole with the per-tensor recipe, and attention is taken
of their dequantized values.  A backend may round more on the way (AITER's kernel re-quantizes
P per key block): its declared numerics say so (``attention_p_rounded_to``).

Which tier, and why: the reference is computed on the *quantized-dequantized* inputs -- the
bit-exact reference quantizer (recipe_rules.quantize / dequantize, checked against every code
of every format) applied to q, k, v, then the float64 attention reference
(references/attention.py) -- and the output is judged by the attention tier
(tiers/attention.py) with the backend's declared numerics, its bounds computed from the
dequantized inputs.  Propagating the input quantization error through attention instead
(|Delta q| <= u_fp8 |q| per element, into the scores and through the softmax) would bound
*any* quantization within half a code, so a wrong scale that stays within the format's range
(a descale off by a power of two, a per-head scale used per tensor) would pass, and the bound
would be orders of magnitude above the attention's own rounding.  Since the quantizer is
deterministic and its reference bit-exact, the only error left is the attention's: the same
tier as unquantized attention, and a wrong scale or descale changes the dequantized inputs
themselves, which no bound absorbs (tests/test_aiter_attention.py seeds both).

Cases are the attention strategy's (strategies/attention.py) with the recipe added.  The
front-end dispatches a recipe case to its own registry op, ``attention_fwd_fp8`` (this spec's
name): only a backend that implements it takes part.

The backward, ``attention_bwd(..., recipe=)`` (spec ``attention_bwd_fp8``), the same way:
dout, q, k, v quantized per tensor; the reference is the float64 backward of their
dequantized values, handed ``out`` / ``lse`` of the reference forward of the dequantized
q, k, v (rounded to q's dtype and fp32, what the recipe's forward would hand over); the
bound is the attention tier's backward with ``code_floors`` (tiers/attention.py, "FP8":
the operands' descales, P / dS rounded to FP8 with a dynamic per-block scale where the
backend declares it, and subnormal codes lifted where its MMA aligns them).  The forward's
bound takes the descales and the floors too.
"""
from __future__ import annotations

import numpy as np
import torch

import tealite
from tealite import recipes as R
from tealite.formats import get_format
from tealite_verify import recipe_rules
from tealite_verify.specs import OpSpec, register
from tealite_verify.specs import attention as att
from tealite_verify.strategies.attention import cases as attention_cases
from tealite_verify.tiers.attention import CodeFloors

NAME = "attention_fwd_fp8"
RECIPE = R.Float8CurrentScaling()
_FLOATS = ("float32", "bfloat16", "float16")


def recipe_of(case) -> R.Float8CurrentScaling:
    return R.Float8CurrentScaling.from_json(case["recipe"])


def make_case(layout="bshd", mask="none", dtype="bfloat16", **kw) -> dict:
    """An FP8 attention case (attention's make_case plus the recipe)."""
    return dict(att.make_case(layout, mask, dtype, **kw), recipe=RECIPE.to_json())


def cases(dtype=None, size="ci"):
    return attention_cases(dtype, size, bwd=False).filter(
        lambda c: c["dtype"] in _FLOATS).map(lambda c: dict(c, recipe=RECIPE.to_json()))


def call(inputs, case, backend):
    kw = att._keywords(inputs, case, backend)
    return tealite.attention_fwd(inputs["q"], inputs["k"], inputs["v"], recipe=recipe_of(case),
                                 **kw)._asdict()


def _quantized(x: np.ndarray, recipe):
    x32 = np.asarray(x, np.float32).reshape(-1, x.shape[-1]) if x.size else \
        np.zeros((0, max(x.shape[-1], 1)), np.float32)
    return recipe_rules.quantize(x32, recipe)


def dequantized(x: np.ndarray, recipe) -> np.ndarray:
    """float64 values of ``x`` quantized as a whole with ``recipe`` (the reference
    quantizer, bit-exact), in x's shape."""
    q = _quantized(x, recipe)
    return recipe_rules.dequantize(q.bits, q.scale_inv, recipe).reshape(x.shape)


def code_floor(x: np.ndarray, recipe) -> float:
    """Twice the code format's smallest normal, in x's dequantized units: what a subnormal
    code of x counts as in Hopper's FP8 MMA (tiers/attention.py, CodeFloors)."""
    scale_inv = float(np.asarray(_quantized(x, recipe).scale_inv).reshape(-1)[0])
    return 2.0 * float(torch.finfo(get_format(recipe.fmt).torch_dtype).tiny) * scale_inv


def _operands(x, recipe, names):
    """(x with ``names`` dequantized, their CodeFloors)."""
    arrays = {n: np.asarray(x[n]) for n in names}
    floors = CodeFloors(**{n: code_floor(a, recipe) for n, a in arrays.items()})
    return dict(x, **{n: dequantized(a, recipe) for n, a in arrays.items()}), floors


def reference(x, case):
    xq, floors = _operands(x, recipe_of(case), ("q", "k", "v"))
    return att.fwd_reference(xq, case, code_floors=floors)


BWD_NAME = "attention_bwd_fp8"


def bwd_cases(dtype=None, size="ci"):
    return attention_cases(dtype, size, bwd=True).filter(
        lambda c: c["dtype"] in _FLOATS).map(lambda c: dict(c, recipe=RECIPE.to_json()))


def _backward_inputs(case, device):
    recipe = recipe_of(case)
    return att._backward_inputs(case, device, operands=lambda t: dequantized(t, recipe))


def bwd_call(inputs, case, backend):
    kw = att._keywords(inputs, case, backend)
    return tealite.attention_bwd(inputs["dout"], inputs["q"], inputs["k"], inputs["v"],
                                 inputs["out"], inputs["lse"], recipe=recipe_of(case),
                                 **kw)._asdict()


def bwd_reference(x, case):
    xq, floors = _operands(x, recipe_of(case), ("dout", "q", "k", "v"))
    return att.bwd_reference(xq, case, code_floors=floors)


_SMOKE = (
    make_case(),
    make_case("sbhd", "causal_bottom_right", "float16", sq=7, sk=19, heads_kv=1, d_v=16),
    make_case("thd", "padding_causal_bottom_right", "float32", lens_q=[5, 0, 1],
              lens_kv=[7, 3, 1], batch=3, d_qk=16, d_v=16),
)

register(OpSpec(
    name=NAME, family="attention", make_inputs=att._forward_inputs, call=call,
    reference=reference, cases=cases, smoke_cases=_SMOKE,
    coverage=att.COVERAGE))  # the attention strategy's cells: every layout x mask, the biases
register(OpSpec(
    name=BWD_NAME, family="attention", make_inputs=_backward_inputs, call=bwd_call,
    reference=bwd_reference, cases=bwd_cases, smoke_cases=_SMOKE, coverage=att.COVERAGE))

__all__ = ["BWD_NAME", "NAME", "RECIPE", "bwd_cases", "cases", "dequantized", "make_case",
           "recipe_of"]

