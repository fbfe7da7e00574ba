"""Declarative op specs: for each op, how to draw cases, build inputs, call any backend, and
what the reference says (value + tolerance tier per output).

Adding an op = a reference function, a spec module here (discovered automatically), and
backend implementations.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from tealite.numerics import Numerics
from tealite.types import Op

from tealite_verify.graph_replay import GraphReplayPolicy
from tealite_verify.tiers.metrics import Tier

_SPECS: dict[str, "OpSpec"] = {}


@dataclass(frozen=True)
class Expected:
    """The reference's verdict on one output: the tier that judges it and what the tier needs.

    ``value``: float64 reference (numpy), or for the exact tier the expected tensor.
    ``bound(numerics) -> per-element tolerance``: None means the exact tier (unless
    ``check`` is given).
    """

    value: Any
    out_dtype: torch.dtype | None
    tier: Tier
    bound: Callable[[Numerics], np.ndarray] | None = None
    # Tiers that need more than one output (codes judged under the backend's own scales):
    # check(backend outputs, numerics) -> Metrics;
    # check_pair(outputs x, outputs y, numerics x, numerics y) -> Metrics.
    check: Callable[[dict, Numerics], Any] | None = None
    check_pair: Callable[[dict, dict, Numerics, Numerics], Any] | None = None
    # Opt-in probabilistic check (tiers/probabilistic.py), computed only when asked for:
    # prob_bound(numerics, per-case false-alarm probability) -> per-element bound, and
    # same_precision() -> the plain torch computation in the inputs' precision (float64
    # values), for the FlashAttention-style ratio.
    prob_bound: Callable[[Numerics, float], Any] | None = None
    same_precision: Callable[[], Any] | None = None

    def __post_init__(self):
        object.__setattr__(self, "tier", Tier(self.tier))  # a misspelled label is an error


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    # cases(dtype: str | None, size: str) -> SearchStrategy[dict]; size in SIZES.
    cases: Callable[..., Any]
    # make_inputs(case, device) -> named input tensors.
    make_inputs: Callable[[dict, str], dict[str, torch.Tensor]]
    # call(inputs, case, backend) -> named output tensors, through the tealite front-end.
    call: Callable[[dict, dict, str], dict[str, torch.Tensor]]
    # reference(inputs as float64 numpy, case) -> {output name: Expected}.
    reference: Callable[[dict, dict], dict[str, Expected]]
    smoke_cases: tuple[dict, ...] = field(default=())
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    # True when reference() and its bounds are written against the array namespace
    # (references._device.namespace): on a GPU case they then get float64 tensors on the
    # device and return tensors there, and the comparison runs on the device too.  Otherwise
    # (and off the GPU) they get numpy arrays.
    device_reference: bool = False
    # The coverage matrix: the cells (tealite_verify.coverage.Cell) the suite's drawn cases
    # must exercise for each (backend, dtype) where the backend accepts such a case.
    coverage: tuple = ()
    # The registry ops call() dispatches, when the spec is not itself one (a composite such
    # as quant_roundtrip drives quantize then dequantize); empty: the op named ``name``.
    drives: tuple[Op, ...] = ()
    # The CUDA-graph replay check's option (tealite_verify/graph_replay.py): whether the op
    # can be captured at all, and whether every case on a CUDA device runs the check.
    graph_replay: GraphReplayPolicy = field(default_factory=GraphReplayPolicy)

    @property
    def ops(self) -> tuple[str, ...]:
        """The registry ops this spec's cases run through."""
        return tuple(self.drives) or (self.name,)

    def implemented_by(self, backend) -> bool:
        """Whether ``backend`` (a tealite.registry.Backend) implements every op the spec
        drives: only such a backend is run, paired and fuzzed on its cases."""
        return all(op in backend.impls for op in self.ops)

    def devices_of(self, backend) -> frozenset:
        """The devices on which ``backend`` runs every op the spec drives."""
        return frozenset.intersection(*(backend.impls[op].support.devices for op in self.ops))


SIZES = ("ci", "local", "large")


def register(spec: OpSpec) -> OpSpec:
    _SPECS[spec.name] = spec
    return spec


def all_specs() -> dict[str, OpSpec]:
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    return dict(sorted(_SPECS.items()))


def get_spec(name: str) -> OpSpec:
    specs = all_specs()
    try:
        return specs[name]
    except KeyError:
        raise KeyError(f"no op spec named {name!r}; known: {sorted(specs)}") from None
