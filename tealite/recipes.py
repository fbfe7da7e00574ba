"""Quantization recipes, named as TransformerEngine users know them.

Each recipe names every numerics choice explicitly (format, scale granularity, scale rounding,
element rounding, saturation); nothing is read from globals or the environment.

Common scale rule for the non-MX recipes (TE's ``compute_scale_from_amax``), in fp32::

    amax  = max(amax, amax_epsilon)
    scale = fmt.max / amax                 (fp32 division)
    scale = float32 max  if scale is inf   (amax tiny but > 0)
    scale = 1            if amax is 0, NaN or Inf
    scale = 2^floor(log2 scale)  if force_pow2_scales (mantissa bits cleared: rounds DOWN)
    codes = cast(x * scale) with RNE;  scale_inv = 1 / scale (fp32) is stored

``Float8CurrentScaling(scale_rule=FP8ScaleRule.AMAX_OVER_FMAX)`` is AITER's rule instead (its
Triton quant kernels ``dynamic_per_tensor_quant_fp8_i8`` / ``dynamic_per_token_quant_fp8_i8``),
in fp32, with no epsilon and no power-of-two rounding::

    amax      = max |x| ignoring NaN (per row; a row of only NaN has amax NaN); per tensor,
                the max of the row amaxes with NaN winning (AITER's integer atomic max)
    scale_inv = amax / fmt.max             (fp32 division; stored)
    codes     = cast(x * (1 / scale_inv))  (fp32 reciprocal, fp32 product, RNE)

and nothing else: amax == 0 gives scale_inv 0, reciprocal inf and NaN codes (0 * inf);
amax == Inf gives scale_inv Inf, reciprocal 0, codes +-0 (NaN for +-Inf elements); a NaN
amax gives NaN everywhere.  The two rules' codes differ wherever fl(fl(1/fl(amax/max)) * x)
and fl(fl(max/amax) * x) round differently.  AITER's kernels report no amax, so ``quantize``
returns ``amax=None`` under this rule.

MX recipes store one E8M0 scale per block of 32 consecutive elements along the row and
codes = round(x / 2^e) with the recipe's element rounding, always saturating (OCP MX spec).
Rowwise quantization blocks along the last dim; columnwise quantization is the rowwise
quantization of x.T, stored transposed as (K, M) (a cast-transpose).
"""
from __future__ import annotations

from dataclasses import dataclass

from tealite.formats import (ElementRounding, FP8ScaleRule, Saturation, ScaleRounding,
                             get_format)


@dataclass(frozen=True)
class Float8CurrentScaling:
    """Per-tensor (or per-row / per-token) scale from the amax of the tensor being cast."""

    fmt: str = "e4m3"
    granularity: str = "tensor"  # "tensor" | "row"
    force_pow2_scales: bool = False
    amax_epsilon: float = 0.0
    saturation: Saturation = Saturation.SATURATE
    scale_rule: FP8ScaleRule = FP8ScaleRule.FMAX_OVER_AMAX  # AITER's kernels: AMAX_OVER_FMAX
    kind = "current"

    def __post_init__(self):
        _check_fp8(self.fmt)
        if self.granularity not in ("tensor", "row"):
            raise ValueError(f"granularity must be 'tensor' or 'row', got {self.granularity!r}")
        try:
            rule = FP8ScaleRule(self.scale_rule)
        except ValueError:
            raise ValueError(f"scale_rule must be one of {[r.value for r in FP8ScaleRule]}, "
                             f"got {self.scale_rule!r}") from None
        object.__setattr__(self, "scale_rule", rule)
        if rule is FP8ScaleRule.AMAX_OVER_FMAX and (self.force_pow2_scales
                                                    or self.amax_epsilon != 0.0):
            # AITER's kernels have neither; a variant no kernel follows is not a recipe.
            raise ValueError("scale_rule AMAX_OVER_FMAX (AITER's) has no force_pow2_scales and "
                             "no amax_epsilon: they must be False and 0.0, got "
                             f"{self.force_pow2_scales!r} and {self.amax_epsilon!r}")


@dataclass(frozen=True)
class Float8BlockScaling:
    """TE's Float8BlockScaling: 1x128 blocks (activations) or 128x128 blocks (weights)."""

    fmt: str = "e4m3"
    block: tuple[int, int] = (1, 128)
    force_pow2_scales: bool = True
    amax_epsilon: float = 0.0
    saturation: Saturation = Saturation.SATURATE
    kind = "block"

    def __post_init__(self):
        _check_fp8(self.fmt)
        if tuple(self.block) not in ((1, 128), (128, 128)):
            raise ValueError(f"block must be (1, 128) or (128, 128), got {self.block!r}")


@dataclass(frozen=True)
class DelayedScaling:
    """Per-tensor scale taken from an amax history; ``quantize`` uses the scale it is given
    and reports the new amax; ``delayed_scaling_update`` rolls the history."""

    fmt: str = "e4m3"
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"  # "max" | "most_recent"
    saturation: Saturation = Saturation.SATURATE
    kind = "delayed"

    def __post_init__(self):
        _check_fp8(self.fmt)
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("amax_compute_algo must be 'max' or 'most_recent', "
                             f"got {self.amax_compute_algo!r}")
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclass(frozen=True)
class MXBlockScaling:
    """OCP MX block scaling: one E8M0 scale per 32 elements along the row."""

    fmt: str = "e4m3"
    scale_rounding: ScaleRounding = ScaleRounding.RCEIL
    element_rounding: ElementRounding = ElementRounding.RNE
    block: int = 32
    kind = "mx"

    def __post_init__(self):
        get_format(self.fmt)
        if self.block != 32:
            raise ValueError(f"MX block must be 32, got {self.block}")


def MXFP8BlockScaling(fmt: str = "e4m3", scale_rounding=ScaleRounding.RCEIL,
                      element_rounding=ElementRounding.RNE) -> MXBlockScaling:
    """TE's MXFP8 recipe (RCEIL scales, RNE elements) by default."""
    _check_fp8(fmt)
    return MXBlockScaling(fmt, ScaleRounding(scale_rounding), ElementRounding(element_rounding))


def MXFP4BlockScaling(scale_rounding=ScaleRounding.FLOOR,
                      element_rounding=ElementRounding.RNE) -> MXBlockScaling:
    """MXFP4 (E2M1 elements); FLOOR scales and RNE elements (OCP spec, torchao) by default.
    AITER's Triton kernels use EVEN + TIES_AWAY; its HIP path differs again (NUMERICS.md)."""
    return MXBlockScaling("e2m1", ScaleRounding(scale_rounding), ElementRounding(element_rounding))


Recipe = Float8CurrentScaling | Float8BlockScaling | DelayedScaling | MXBlockScaling
TENSOR_TYPES = ("input", "weight", "grad_output", "output", "grad_input")


@dataclass(frozen=True)
class Role:
    """Where a tensor sits: the module type (e.g. "Linear"), the tensor type (one of
    TENSOR_TYPES) and the module's name (e.g. "layers.3.fc1")."""

    module_type: str
    tensor_type: str
    name: str = ""

    def __post_init__(self):
        if self.tensor_type not in TENSOR_TYPES:
            raise ValueError(f"tensor_type must be one of {TENSOR_TYPES}, "
                             f"got {self.tensor_type!r}")


@dataclass(frozen=True)
class CustomRecipe:
    """A recipe chosen per tensor: ``qfactory(role)`` returns the recipe (quantizer) for that
    role, or None to leave the tensor in high precision.  Outputs and grad-inputs may map to
    None; inputs, weights and grad-outputs must get a recipe."""

    qfactory: object
    kind = "custom"


def resolve(recipe, role: Role):
    """The concrete recipe for ``role``: a built-in recipe applies to every role; a
    CustomRecipe asks its factory and checks the answer."""
    if not isinstance(recipe, CustomRecipe):
        return recipe
    got = recipe.qfactory(role)
    if got is None:
        if role.tensor_type in ("output", "grad_input"):
            return None
        raise ValueError(f"qfactory returned None for {role}: inputs, weights and grad_outputs "
                         "need a recipe")
    if isinstance(got, CustomRecipe) or not isinstance(
            got, (Float8CurrentScaling, Float8BlockScaling, DelayedScaling, MXBlockScaling)):
        raise TypeError(f"qfactory must return a built-in recipe or None for {role}, "
                        f"got {type(got).__name__}")
    return got


def _check_fp8(fmt: str) -> None:
    f = get_format(fmt)
    if f.bits != 8:
        raise ValueError(f"this recipe needs an FP8 format, got {fmt!r}")


def describe(recipe) -> str:
    """A short stable name used in case descriptions and reports."""
    if isinstance(recipe, MXBlockScaling):
        return (f"mx[{recipe.fmt},{recipe.scale_rounding.value},"
                f"{recipe.element_rounding.value}]")
    if isinstance(recipe, Float8CurrentScaling):
        # TE's rule keeps the name it always had (stored corpora and repros refer to it).
        rule = "" if recipe.scale_rule is FP8ScaleRule.FMAX_OVER_AMAX else \
            f",{recipe.scale_rule.value}"
        return f"current[{recipe.fmt},{recipe.granularity},pow2={recipe.force_pow2_scales}" \
               f"{rule}]"
    if isinstance(recipe, Float8BlockScaling):
        return f"block[{recipe.fmt},{recipe.block[0]}x{recipe.block[1]}," \
               f"pow2={recipe.force_pow2_scales}]"
    if isinstance(recipe, DelayedScaling):
        return f"delayed[{recipe.fmt},margin={recipe.margin},{recipe.amax_compute_algo}]"
    raise TypeError(f"not a recipe: {recipe!r}")
