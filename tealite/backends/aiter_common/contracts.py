"""What each AITER entry point promises: its numerics contract, declared next to the backend
code that calls it, and collected here for the harness, the gate and the docs.

AITER has several code paths for "the same" op (Triton kernels, CK/ASM/HIP ops, torch
references) and they do not always agree with each other or with TransformerEngine (see
NUMERICS.md: three MXFP4 conventions in one package, amax/max vs max/amax FP8 scales).  A
backend that calls an AITER entry point therefore declares *which* conventions it follows; the
harness checks it against the reference configured with exactly those conventions, and
:func:`differences_from_te` lists where they differ from TE's, as a table instead of a loose
tolerance.

Field values are short strings so a baseline JSON can record and diff them:

* ``fp8``: ``"ocp"`` | ``"fnuz"`` | ``"arch"`` (FNUZ on gfx942, OCP on gfx950) | None;
* ``scale_rule``: e.g. ``"e8m0-even"`` (MX, see formats.ScaleRounding),
  ``"fmax/amax"`` (TE: scale = fmax / amax, codes = cast(x * scale)),
  ``"amax/fmax"`` (AITER: scale_inv = amax / fmax, codes = cast(x * (1 / scale_inv))),
  ``"given"`` | None;
* ``element_rounding``: ``"rne"`` | ``"ties-away"`` | ``"cast"`` (whatever the target's
  fp32 -> fp8 conversion does; RNE on the GPUs we know) | None;
* ``saturation``: ``"saturate"`` | ``"nonfinite"`` | ``"cast"`` | None;
* ``layouts``: the operand / output layouts the entry point takes, e.g. ``"w:(N,K)"``,
  ``"w:shuffle(16,16)"``, ``"scales:e8m0_shuffle"``, ``"x_scale:(M,1)"``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

# TransformerEngine's conventions, per op family, for the difference table.
TE_CONVENTIONS: dict[str, dict[str, str]] = {
    "fp8-current": {"scale_rule": "fmax/amax", "element_rounding": "rne",
                    "saturation": "saturate"},
    "fp8-given": {"scale_rule": "given", "element_rounding": "rne", "saturation": "saturate"},
    "mxfp8": {"scale_rule": "e8m0-rceil", "element_rounding": "rne", "saturation": "saturate"},
    "mxfp4": {"scale_rule": "e8m0-rceil", "element_rounding": "rne", "saturation": "saturate"},
}


@dataclass(frozen=True)
class Contract:
    """The numerics contract of one AITER entry point as one tealite backend uses it."""

    backend: str                      # tealite backend name ("aiter", "aiter_triton")
    entry_point: str                  # AITER's name, e.g. "dynamic_mxfp4_quant"
    op: str                           # the tealite op it implements
    family: str | None = None         # key of TE_CONVENTIONS it is compared with, if any
    fp8: str | None = None
    scale_rule: str | None = None
    element_rounding: str | None = None
    saturation: str | None = None
    layouts: tuple[str, ...] = ()
    notes: str = ""
    extra: dict = field(default_factory=dict, hash=False, compare=True)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layouts"] = list(self.layouts)
        return d


_CONTRACTS: dict[tuple[str, str], Contract] = {}


def declare(contract: Contract) -> Contract:
    """Record ``contract`` (one per backend and entry point; redeclaring replaces it)."""
    _CONTRACTS[(contract.backend, contract.entry_point)] = contract
    return contract


def contracts(backend: str | None = None) -> list[Contract]:
    """Declared contracts, sorted by backend and entry point."""
    return [c for k, c in sorted(_CONTRACTS.items()) if backend is None or k[0] == backend]


def differences_from_te(backend: str | None = None) -> list[dict]:
    """One row per (entry point, field) where a contract differs from TE's convention."""
    rows = []
    for c in contracts(backend):
        te = TE_CONVENTIONS.get(c.family or "")
        if te is None:
            continue
        for key, want in te.items():
            got = getattr(c, key)
            if got is not None and got != want:
                rows.append({"backend": c.backend, "entry_point": c.entry_point, "op": c.op,
                             "field": key, "aiter": got, "te": want, "notes": c.notes})
    return rows
