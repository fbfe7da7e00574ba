"""Specs for RoPE forward and backward (TE's fused RoPE; semantics in tealite/ops/rope.py).

A case names the tensor format, the interleaving, the dims ``shape = (s, b, h, d)`` in every
format (thd: also the full sequence lengths, multiples of ``2 cp_size``, s then being the
longest local one; see :func:`seqlens`), the rotary dim ``d2``, context
parallelism (``cp_size``, ``cp_rank``), optional per-sequence start positions, and how
freqs are built: TE's ``RotaryPositionEmbedding`` table (``inv_freq = base^(-2i/d2)`` times
the position plus ``pos_offset``, halves repeated or interleaved, all in float32) or a
per-element random table (the op reads one angle per element, whatever the table).  A large
``pos_offset`` gives the large cos / sin arguments of long contexts with few rows.  The bound
is tiers/rotary.py's derivation (one FMA pair per element, the declared cos / sin error,
one output rounding).
"""
from __future__ import annotations

import functools

import torch
from hypothesis import strategies as st

import tealite
from tealite.types import Op
from tealite_verify import coverage as cov
from tealite_verify.references import rope as ref
from tealite_verify.specs import Expected, OpSpec, register
from tealite_verify.strategies.choices import pick
from tealite_verify.strategies.dtypes import float_dtypes
from tealite_verify.strategies.shapes import dim
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import dtype_of, generate
from tealite_verify.tiers import rotary
from tealite_verify.tiers.metrics import Tier

FORMATS = ("sbhd", "bshd", "thd")
# (max seq, max batch, max heads, max head dim) per size: the ci size keeps interpreted
# Triton cases tiny; the large one stays within what the numpy float64 reference (CPU, about
# ten arrays of the input's size) judges inside the fuzzer's per-case timeout.
_LIMITS = {"ci": (32, 2, 3, 64), "local": (256, 4, 8, 128), "large": (4096, 2, 16, 128)}
_OFFSETS = (0, 0, 0, 1000, 2 ** 15, 2 ** 20)


def _rotary_dim(d: int) -> st.SearchStrategy[int]:
    """An even d2 <= d: the whole head, its even floor, or partial (d2 / 2 odd included)."""
    even = d - d % 2
    options = [even, even, max(2, (d // 2) - (d // 2) % 2), 2, 6, 10]
    return pick(*[o for o in options if 2 <= o <= even])


# Strategies built once (choices.py: a strategy built inside a composite's body is validated
# anew on every draw).
_BOOL = st.booleans()


@functools.lru_cache(maxsize=None)
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=None)
def _head_dim(max_d: int) -> st.SearchStrategy[int]:
    return dim(max_d).filter(lambda v: v >= 2)


@functools.lru_cache(maxsize=None)
def _chunk_counts(top: int, max_seqs: int) -> st.SearchStrategy[list]:
    """Full sequence lengths in units of 2 cp: 0 and 1 (the shortest) often."""
    return st.lists(st.one_of(pick(0, 1), _ints(0, top)), min_size=1, max_size=max_seqs)


@functools.lru_cache(maxsize=None)
def _starts(n: int, hi: int) -> st.SearchStrategy[list]:
    return st.lists(_ints(0, hi), min_size=n, max_size=n)


@st.composite
def cases(draw, dtype: str | None = None, size: str = "ci", *, bwd: bool = False):
    max_s, max_b, max_h, max_d = _LIMITS[size]
    dtype = dtype or draw(float_dtypes())
    fmt = draw(pick(*FORMATS))
    cp = draw(pick(1, 1, 2, 4))
    d = draw(_head_dim(max_d))
    heads, b = draw(dim(max_h)), draw(dim(max_b, allow_zero=True))
    case = {"tensor_format": fmt, "interleaved": draw(_BOOL), "d2": draw(_rotary_dim(d)),
            "cp_size": cp, "cp_rank": draw(_ints(0, cp - 1)), "dtype": dtype}
    s = draw(dim(max_s, allow_zero=True))
    s = 2 * (s // 2) if cp > 1 else s  # two equal chunks per local sequence
    if fmt == "thd":
        unit = 2 * cp if cp > 1 else 1
        lens = draw(_chunk_counts(max(1, max_s // unit), max(1, max_b + 1)))
        case["seqlens"] = [n * unit for n in lens]
        s, b = max(case["seqlens"]) // cp, len(lens)
    case["shape"] = [s, b, heads, d]
    if cp == 1 and draw(_BOOL):
        case["start_positions"] = draw(_starts(b, 2 * max_s))
    case["freqs"] = {"kind": draw(pick("te", "te", "random")),
                     "base": draw(pick(10000.0, 500000.0, 10.0)),
                     "pos_offset": draw(pick(*_OFFSETS)),
                     "extra_rows": draw(pick(0, 1, 5))}
    case["dist"] = draw(distributions(dtype))
    case["seed"] = draw(seeds())
    return case


def seqlens(case) -> list[int]:
    """thd: the full sequence lengths.  ``shape`` is (s, b, h, d) in every format, s the
    longest local sequence: a case moved into thd without ``seqlens`` has b sequences of
    local length s, and one moved to s = 0 (the empty cell) has only empty sequences."""
    s, b, cp = case["shape"][0], case["shape"][1], case["cp_size"]
    if s == 0:
        return [0] * b
    return list(case.get("seqlens") or [s * cp] * b)


def _lens(case) -> list[int]:
    if case["tensor_format"] == "thd":
        return [n // case["cp_size"] for n in seqlens(case)]
    return [case["shape"][0]] * case["shape"][1]


def tensor_shape(case) -> list[int]:
    s, b, h, d = case["shape"]
    fmt = case["tensor_format"]
    if fmt == "thd":
        return [sum(_lens(case)), h, d]
    return [s, b, h, d] if fmt == "sbhd" else [b, s, h, d]


def _rows_needed(case) -> int:
    lens, cp = _lens(case), case["cp_size"]
    starts = case.get("start_positions") or [0] * len(lens)
    if cp > 1:
        top = max((n * cp for n in lens if n), default=0)
    else:
        top = max((n + s for n, s in zip(lens, starts) if n), default=0)
    return top + case["freqs"]["extra_rows"]


def make_freqs(case) -> torch.Tensor:
    """float32 (s2, 1, 1, d2) as TE builds it (every step in float32), or random angles."""
    spec, d2 = case["freqs"], case["d2"]
    rows = max(_rows_needed(case), 1)
    if spec["kind"] == "random":
        g = torch.Generator().manual_seed(case["seed"] + 11)
        f = (torch.rand((rows, d2), generator=g, dtype=torch.float64) * 2 - 1) * 64.0
        return f.to(torch.float32).reshape(rows, 1, 1, d2)
    inv = 1.0 / (spec["base"] ** (torch.arange(0, d2, 2, dtype=torch.float32) / d2))
    pos = torch.arange(rows, dtype=torch.float32) + float(spec["pos_offset"])
    ang = torch.outer(pos, inv)
    emb = torch.stack((ang, ang), dim=-1).reshape(rows, d2) if case["interleaved"] \
        else torch.cat((ang, ang), dim=-1)
    return emb.reshape(rows, 1, 1, d2)


def make_inputs(case, device, *, bwd: bool) -> dict:
    dt = dtype_of(case["dtype"])
    x = generate(case["dist"], tensor_shape(case), dt, case["seed"], device)
    inputs = {"dy" if bwd else "t": x, "freqs": make_freqs(case).to(device)}
    if case["tensor_format"] == "thd":
        cu = [0]
        for n in seqlens(case):
            cu.append(cu[-1] + n)
        inputs["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=device)
    if case.get("start_positions") is not None:
        inputs["start_positions"] = torch.tensor(case["start_positions"], dtype=torch.int32,
                                                 device=device)
    return inputs


def _options(case, inputs) -> dict:
    return dict(tensor_format=case["tensor_format"], interleaved=case["interleaved"],
                cu_seqlens=inputs.get("cu_seqlens"), cp_size=case["cp_size"],
                cp_rank=case["cp_rank"], start_positions=inputs.get("start_positions"))


def fwd_call(inputs, case, backend):
    return {"y": tealite.rope_fwd(inputs["t"], inputs["freqs"], backend=backend,
                                  **_options(case, inputs))}


def bwd_call(inputs, case, backend):
    return {"dx": tealite.rope_bwd(inputs["dy"], inputs["freqs"], backend=backend,
                                   **_options(case, inputs))}


def _ref_options(case, x) -> dict:
    cu = x.get("cu_seqlens")
    sp = x.get("start_positions")
    return dict(tensor_format=case["tensor_format"],
                cu_seqlens=None if cu is None else [int(v) for v in cu],
                cp_size=case["cp_size"], cp_rank=case["cp_rank"],
                start_positions=None if sp is None else [int(v) for v in sp])


def _reference(x, case, *, bwd: bool):
    name, out = ("dy", "dx") if bwd else ("t", "y")
    opts = _ref_options(case, x)
    fn = ref.rope_bwd if bwd else ref.rope_fwd
    value = fn(x[name], x["freqs"], interleaved=case["interleaved"], **opts)
    mag, weight = ref.magnitude(x[name], x["freqs"], interleaved=case["interleaved"],
                                backward=bwd, **opts)
    out_dt = dtype_of(case["dtype"])
    return {out: Expected(value, out_dt, Tier.ULP,
                          lambda n: rotary.rope_tolerance(value, mag, weight, out_dt, n))}


def _smoke(fmt, shape, dtype, **kw):
    case = {"tensor_format": fmt, "interleaved": False, "shape": shape, "d2": shape[-1],
            "cp_size": 1, "cp_rank": 0, "dtype": dtype,
            "freqs": {"kind": "te", "base": 10000.0, "pos_offset": 0, "extra_rows": 0},
            "dist": {"kind": "normal", "scale": 1.0}, "seed": 7}
    case.update(kw)
    return case


_SMOKE = (
    _smoke("sbhd", [13, 2, 3, 64], "bfloat16"),
    _smoke("bshd", [11, 2, 2, 40], "float16", interleaved=True, d2=20),
    _smoke("thd", [5, 3, 2, 32], "float32", seqlens=[0, 1, 5]),
    _smoke("thd", [6, 3, 2, 16], "float32", seqlens=[8, 0, 12], cp_size=2, cp_rank=1,
           interleaved=True, d2=8),
    _smoke("sbhd", [8, 2, 1, 32], "float16", cp_size=4, cp_rank=2),
    _smoke("bshd", [7, 2, 1, 18], "bfloat16", start_positions=[3, 9], d2=6,
           freqs={"kind": "te", "base": 10000.0, "pos_offset": 2 ** 20, "extra_rows": 1}),
    _smoke("sbhd", [9, 2, 2, 64], "float16", d2=32, interleaved=True),
)

_COVERAGE = (cov.layout_cells("tensor_format", FORMATS)
             + cov.layout_cells("interleaved", (True, False))
             + cov.product_cells(cov.layout_cells("tensor_format", FORMATS),
                                 cov.layout_cells("interleaved", (True, False)))
             + cov.layout_cells("cp_size", (1, 2, 4))
             + cov.edge_cells((cov.EMPTY, cov.MISALIGNED, cov.MAX_LAST, cov.ZERO_BLOCK,
                               cov.SUBNORMAL_BLOCK)))

for _name, _bwd, _call in ((Op.ROPE_FWD, False, fwd_call), (Op.ROPE_BWD, True, bwd_call)):
    def _make(case, device, _bwd=_bwd):
        return make_inputs(case, device, bwd=_bwd)

    def _cases(dtype=None, size="ci", _bwd=_bwd):
        return cases(dtype, size, bwd=_bwd)

    def _ref(x, case, _bwd=_bwd):
        return _reference(x, case, bwd=_bwd)

    register(OpSpec(name=_name, family="rope", cases=_cases, make_inputs=_make, call=_call,
                    reference=_ref, smoke_cases=_SMOKE, coverage=_COVERAGE))
