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

import enum
from dataclasses import dataclass, fields
from typing import ClassVar

from tealite.formats import (FP8_FORMATS, ElementRounding, FP8ScaleRule, Saturation,
                             ScaleRounding, get_format)


class Family(enum.Enum):
    """What a recipe's codes and scales are: which reference quantizer a harness applies and
    which tier judges the codes.  A new recipe that fits a family reuses both."""

    FP8 = "fp8"  # FP8 codes with float32 scale_inv (per tensor, row or block, or given)
    MX = "mx"    # OCP MX: codes per 32-element block with an E8M0 scale byte


class Granularity(enum.Enum):
    """Which elements share one scale."""

    TENSOR = "tensor"
    ROW = "row"
    BLOCK = "block"      # the recipe's (rows, cols) block
    MX_BLOCK = "mx32"    # 32 consecutive elements along the row


# ---- JSON: the recipes' one serialized form (cases, findings, baselines, repros) -----------

def _json_value(v):
    if isinstance(v, enum.Enum):
        return v.value
    return list(v) if isinstance(v, tuple) else v


class _Json:
    """``to_json`` / ``from_json`` for a frozen recipe dataclass.

    The form is ``{"kind": KIND, field: value, ...}`` with enums as their values and tuples as
    lists.  ``_OPTIONAL`` names the fields a stored form may leave out (read as their
    defaults, as the harness always has); ``_OMIT`` those ``to_json`` leaves out while at
    their default (so a TE-rule current recipe has no "scale_rule", as before the rule
    existed).  A stored case is never re-serialized: its JSON is the case (finding ids and
    repro commands are built from it), and ``to_json`` is only the form of a new draw."""

    kind: ClassVar[str]
    _OPTIONAL: ClassVar[tuple[str, ...]] = ()
    _OMIT: ClassVar[tuple[str, ...]] = ()
    _FROM_JSON: ClassVar[dict] = {}  # field -> converter from its JSON value

    def taxonomy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(family, variant) names of the choices that select a kernel, coarse to fine: e.g.
        (("current", "row"), ("te",)).  Coverage cells and finding classes join them with
        "/" (stored findings are named so: keep them stable)."""
        raise NotImplementedError

    def to_json(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._OMIT and value == f.default:
                continue
            out[f.name] = _json_value(value)
        return out

    @classmethod
    def from_json(cls, d: dict):
        names = [f.name for f in fields(cls)]
        if d.get("kind") != cls.kind:
            raise ValueError(f"{cls.__name__}.from_json: kind must be {cls.kind!r}, "
                             f"got {d.get('kind')!r}")
        unknown = set(d) - set(names) - {"kind"}
        if unknown:
            raise ValueError(f"{cls.__name__}.from_json: unknown keys {sorted(unknown)}; valid "
                             f"keys: {names}")
        missing = [n for n in names if n not in d and n not in cls._OPTIONAL]
        if missing:
            raise ValueError(f"{cls.__name__}.from_json: missing keys {missing} in {d!r}")
        kw = {n: cls._FROM_JSON.get(n, _same)(d[n]) for n in names if n in d}
        return cls(**kw)


def _same(v):
    return v



_SATURATIONS = tuple(Saturation)


@dataclass(frozen=True)
class Float8CurrentScaling(_Json):
    """Per-tensor (or per-row / per-token) scale from the amax of the tensor being cast."""

    fmt: str = "e4m3"
    granularity: str = "tensor"  # "tensor" | "row"
    force_pow2_scales: bool = False
    amax_epsilon: float = 0.0
    saturation: Saturation = Saturation.SATURATE
    scale_rule: FP8ScaleRule = FP8ScaleRule.FMAX_OVER_AMAX  # AITER's kernels: AMAX_OVER_FMAX
    kind = "current"
    family = Family.FP8
    scale_given = False  # the scale comes from this tensor's amax
    scale_exponent_slack = False
    _OPTIONAL = ("saturation", "scale_rule")
    _OMIT = ("scale_rule",)
    _FROM_JSON = {"saturation": Saturation, "scale_rule": FP8ScaleRule}

    def __post_init__(self):
        _check_fp8(self.fmt)
        object.__setattr__(self, "saturation", Saturation(self.saturation))
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

    @property
    def scale_granularity(self) -> Granularity:
        return Granularity(self.granularity)

    @property
    def amax_granularity(self) -> Granularity | None:
        """The amax ``quantize`` reports: none under AITER's rule (its kernels report none)."""
        return None if self.scale_rule is FP8ScaleRule.AMAX_OVER_FMAX else self.scale_granularity

    def describe(self) -> str:
        # TE's rule keeps the name it always had (stored corpora and repros refer to it).
        rule = "" if self.scale_rule is FP8ScaleRule.FMAX_OVER_AMAX else \
            f",{self.scale_rule.value}"
        return f"current[{self.fmt},{self.granularity},pow2={self.force_pow2_scales}{rule}]"

    def taxonomy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("current", self.granularity), \
            ("aiter" if self.scale_rule is FP8ScaleRule.AMAX_OVER_FMAX else "te",)

    @classmethod
    def domains(cls) -> tuple[dict, ...]:
        """The values each field can take, one dict per valid combination (continuous fields
        by representative values): TE's rule with every option, AITER's with none."""
        common = {"fmt": FP8_FORMATS, "granularity": ("tensor", "row"),
                  "saturation": _SATURATIONS}
        return (dict(common, force_pow2_scales=(False, True), amax_epsilon=(0.0, 1e-4),
                     scale_rule=(FP8ScaleRule.FMAX_OVER_AMAX,)),
                dict(common, force_pow2_scales=(False,), amax_epsilon=(0.0,),
                     scale_rule=(FP8ScaleRule.AMAX_OVER_FMAX,)))


@dataclass(frozen=True)
class Float8BlockScaling(_Json):
    """TE's Float8BlockScaling: 1x128 blocks (activations) or 128x128 blocks (weights)."""

    fmt: str = "e4m3"
    block: tuple[int, int] = (1, 128)
    force_pow2_scales: bool = True
    amax_epsilon: float = 0.0
    saturation: Saturation = Saturation.SATURATE
    kind = "block"
    family = Family.FP8
    scale_granularity = Granularity.BLOCK
    amax_granularity = None
    scale_given = False
    scale_exponent_slack = False
    scale_rule = FP8ScaleRule.FMAX_OVER_AMAX  # TE's compute_scale_from_amax per block
    _OPTIONAL = ("saturation",)
    _FROM_JSON = {"saturation": Saturation, "block": tuple}

    def __post_init__(self):
        _check_fp8(self.fmt)
        object.__setattr__(self, "saturation", Saturation(self.saturation))
        if tuple(self.block) not in ((1, 128), (128, 128)):
            raise ValueError(f"block must be (1, 128) or (128, 128), got {self.block!r}")

    def describe(self) -> str:
        return f"block[{self.fmt},{self.block[0]}x{self.block[1]},pow2={self.force_pow2_scales}]"

    def taxonomy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("block", f"{self.block[0]}x{self.block[1]}"), \
            ("pow2" if self.force_pow2_scales else "fp32",)

    @classmethod
    def domains(cls) -> tuple[dict, ...]:
        return ({"fmt": FP8_FORMATS, "block": ((1, 128), (128, 128)),
                 "force_pow2_scales": (False, True), "amax_epsilon": (0.0, 1e-4),
                 "saturation": _SATURATIONS},)


@dataclass(frozen=True)
class DelayedScaling(_Json):
    """Per-tensor scale taken from an amax history; ``quantize`` uses the scale it is given
    and reports the new amax; ``delayed_scaling_update`` rolls the history.  The scale is an
    input of each call, not part of the recipe (nor of its JSON)."""

    fmt: str = "e4m3"
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"  # "max" | "most_recent"
    saturation: Saturation = Saturation.SATURATE
    kind = "delayed"
    family = Family.FP8
    scale_granularity = Granularity.TENSOR
    amax_granularity = Granularity.TENSOR
    scale_given = True  # quantize takes the scale the history produced
    scale_exponent_slack = False
    scale_rule = FP8ScaleRule.FMAX_OVER_AMAX  # delayed_scaling_update's fmax / amax / 2^margin
    _OPTIONAL = ("margin", "amax_history_len", "amax_compute_algo", "saturation")
    _OMIT = ("margin", "amax_history_len", "amax_compute_algo")
    _FROM_JSON = {"saturation": Saturation}

    def __post_init__(self):
        _check_fp8(self.fmt)
        object.__setattr__(self, "saturation", Saturation(self.saturation))
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("amax_compute_algo must be 'max' or 'most_recent', "
                             f"got {self.amax_compute_algo!r}")
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")

    def describe(self) -> str:
        return f"delayed[{self.fmt},margin={self.margin},{self.amax_compute_algo}]"

    def taxonomy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("delayed",), ()

    @classmethod
    def domains(cls) -> tuple[dict, ...]:
        """The fields that change what ``quantize`` computes (margin, history length and
        algorithm only change ``delayed_scaling_update``, whose spec draws them)."""
        return ({"fmt": FP8_FORMATS, "saturation": _SATURATIONS},)


@dataclass(frozen=True)
class MXBlockScaling(_Json):
    """OCP MX block scaling: one E8M0 scale per 32 elements along the row."""

    fmt: str = "e4m3"
    scale_rounding: ScaleRounding = ScaleRounding.RCEIL
    element_rounding: ElementRounding = ElementRounding.RNE
    block: int = 32
    kind = "mx"
    family = Family.MX
    scale_granularity = Granularity.MX_BLOCK
    amax_granularity = None
    scale_given = False
    # A power-of-two scale one exponent off moves every code by one binade: a judge re-
    # quantizes under the backend's own scale (the e8m0-adjusted tier).
    scale_exponent_slack = True
    _OPTIONAL = ("block",)
    _OMIT = ("block",)
    _FROM_JSON = {"scale_rounding": ScaleRounding, "element_rounding": ElementRounding}

    def __post_init__(self):
        get_format(self.fmt)
        object.__setattr__(self, "scale_rounding", ScaleRounding(self.scale_rounding))
        object.__setattr__(self, "element_rounding", ElementRounding(self.element_rounding))
        if self.block != 32:
            raise ValueError(f"MX block must be 32, got {self.block}")

    def describe(self) -> str:
        return f"mx[{self.fmt},{self.scale_rounding.value},{self.element_rounding.value}]"

    def taxonomy(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        # FP8 elements round only by RNE (hardware casts): the element rounding names
        # a variant of MXFP4 only.
        if get_format(self.fmt).packed:
            return ("mxfp4",), (self.scale_rounding.value, self.element_rounding.value)
        return ("mxfp8",), (self.scale_rounding.value,)

    @classmethod
    def domains(cls) -> tuple[dict, ...]:
        return ({"fmt": FP8_FORMATS + ("e2m1",), "scale_rounding": tuple(ScaleRounding),
                 "element_rounding": tuple(ElementRounding)},)


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
class RoleTable:
    """A serializable ``qfactory``: (role, recipe or None) entries, the first that matches a
    role wins.  An entry's role matches on module and tensor type, and on the module name
    unless the entry's name is "" (any module)."""

    entries: tuple[tuple[Role, object], ...]

    def __post_init__(self):
        for role, recipe in self.entries:
            if not isinstance(role, Role):
                raise TypeError(f"RoleTable entries must be (Role, recipe) pairs, got {role!r}")
            if recipe is not None and not isinstance(recipe, RECIPES):
                raise TypeError(f"RoleTable: the recipe for {role} must be a built-in recipe "
                                f"or None, got {type(recipe).__name__}")

    def __call__(self, role: Role):
        for r, recipe in self.entries:
            if (r.module_type, r.tensor_type) == (role.module_type, role.tensor_type) \
                    and r.name in ("", role.name):
                return recipe
        raise LookupError(f"RoleTable has no entry for {role}")


@dataclass(frozen=True)
class CustomRecipe:
    """A recipe chosen per tensor: ``qfactory(role)`` returns the recipe (quantizer) for that
    role, or None to leave the tensor in high precision.  Outputs and grad-inputs may map to
    None; inputs, weights and grad-outputs must get a recipe.  Serializable when its factory
    is a :class:`RoleTable` (``CustomRecipe.from_table``)."""

    qfactory: object
    kind = "custom"

    @classmethod
    def from_table(cls, table) -> "CustomRecipe":
        """From ``{Role: recipe or None}`` or (Role, recipe) pairs, first match wins."""
        items = table.items() if isinstance(table, dict) else table
        return cls(RoleTable(tuple((role, recipe) for role, recipe in items)))

    def to_json(self) -> dict:
        if not isinstance(self.qfactory, RoleTable):
            raise TypeError("CustomRecipe.to_json: only a CustomRecipe built from a role table "
                            "(CustomRecipe.from_table) can be serialized; qfactory is "
                            f"{self.qfactory!r}")
        return {"kind": self.kind, "roles": [
            {"module_type": r.module_type, "tensor_type": r.tensor_type, "name": r.name,
             "recipe": None if recipe is None else recipe.to_json()}
            for r, recipe in self.qfactory.entries]}

    @classmethod
    def from_json(cls, d: dict) -> "CustomRecipe":
        if d.get("kind") != cls.kind or set(d) != {"kind", "roles"}:
            raise ValueError("CustomRecipe.from_json: want {'kind': 'custom', 'roles': [...]}, "
                             f"got keys {sorted(d)}")
        entries = []
        for e in d["roles"]:
            role = Role(e["module_type"], e["tensor_type"], e.get("name", ""))
            entries.append((role, None if e["recipe"] is None else from_json(e["recipe"])))
        return cls(RoleTable(tuple(entries)))

    def describe(self) -> str:
        return f"custom[{self.qfactory!r}]"


RECIPES = (Float8CurrentScaling, Float8BlockScaling, DelayedScaling, MXBlockScaling)
Recipe = Float8CurrentScaling | Float8BlockScaling | DelayedScaling | MXBlockScaling
BY_KIND = {cls.kind: cls for cls in RECIPES + (CustomRecipe,)}


def from_json(d: dict):
    """The recipe a JSON form names (see ``_Json``; a custom recipe's role table too)."""
    if not isinstance(d, dict) or d.get("kind") not in BY_KIND:
        got = d.get("kind") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"a recipe's JSON form needs 'kind' in {sorted(BY_KIND)}, got {got!r}")
    return BY_KIND[d["kind"]].from_json(d)


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
    if not isinstance(got, RECIPES):
        raise TypeError(f"qfactory must return a built-in recipe or None for {role}, "
                        f"got {type(got).__name__}")
    return got


def _check_fp8(fmt: str) -> None:
    f = get_format(fmt)
    if f.bits != 8:
        raise ValueError(f"this recipe needs an FP8 format, got {fmt!r}")


def describe(recipe) -> str:
    """A short stable name used in case descriptions and reports."""
    if not hasattr(recipe, "describe"):
        raise TypeError(f"not a recipe: {recipe!r}")
    return recipe.describe()
