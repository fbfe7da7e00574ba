"""The Hypothesis strategies really produce the edge cases they promise, and
``tensors.generate`` builds exactly the tensors its distributions describe.

Existence checks use :func:`hypothesis.find` with a derandomized, generate-only budget, so a
strategy that silently stopped producing (say) an empty token dim fails here rather than
quietly weakening every differential test that draws from it.
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from tealite.ops.activations import GATED, KINDS, POINTWISE, output_shape
from tealite.ops.gemm import LAYOUTS
from tealite_verify.specs import all_specs
from tealite_verify.specs import activations as act_spec
from tealite_verify.specs import gemm as gemm_spec
from tealite_verify.strategies.dtypes import FLOAT_DTYPES, float_dtypes
from tealite_verify.strategies.shapes import PRIMES, dim, gemm_shapes, row_shapes
from tealite_verify.strategies.values import distributions, seeds
from tealite_verify.tensors import DTYPES, dtype_of, generate

# Derandomized (reproducible in CI), no database, no shrinking: we only need *an* example.
FIND = settings(database=None, max_examples=2000, derandomize=True, deadline=None,
                phases=[Phase.generate])
# For @given property loops over drawn values.
PROP = settings(database=None, max_examples=30, derandomize=True, deadline=None,
                suppress_health_check=list(HealthCheck))

DIST_KINDS = ("normal", "uniform", "outliers", "zero_rows", "integers", "tiny", "wide")
TORCH_DTYPES = [DTYPES[n] for n in FLOAT_DTYPES]
SPECS = all_specs()
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def exists(strategy, predicate):
    """Return an example of ``strategy`` satisfying ``predicate``; fail the test if none."""
    try:
        return find(strategy, predicate, settings=FIND)
    except NoSuchExample:
        pytest.fail(f"strategy {strategy!r} never produced an example satisfying the predicate")


def never(strategy, predicate):
    """Assert that ``strategy`` never produces an example satisfying ``predicate``."""
    with pytest.raises(NoSuchExample):
        find(strategy, predicate, settings=settings(FIND, max_examples=100))


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, math.isqrt(n) + 1))


def one_off(align: int):
    return lambda d: d > align and (d % align in (1, align - 1))


def bits(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() == 1:
        return t.view(torch.uint8)
    return t.view(INT_VIEW.get(t.dtype, t.dtype))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


# ---- shapes ------------------------------------------------------------------------------

def test_primes_table_is_prime():
    assert all(is_prime(p) for p in PRIMES)


@pytest.mark.parametrize("strategy", [dim(512), st.builds(lambda s: s[2], gemm_shapes())],
                         ids=["dim", "gemm_K"])
def test_prime_dim_above_100(strategy):
    v = exists(strategy, lambda d: d > 100 and is_prime(d))
    assert v > 100 and is_prime(v)


@pytest.mark.parametrize("align", [16, 32, 128])
def test_dim_one_off_a_multiple(align):
    exists(dim(512), one_off(align))
    # And in the shapes ops actually use: GEMM K and the row ops' hidden dim.
    exists(gemm_shapes(max_k=512).map(lambda s: s[2]), one_off(align))
    exists(row_shapes(max_hidden=512).map(lambda s: s[-1]), one_off(align))


@pytest.mark.parametrize("value", [127, 129, 257])
def test_specific_misaligned_sizes(value):
    exists(dim(512), lambda d: d == value)


def test_dim_of_one():
    exists(dim(512), lambda d: d == 1)
    exists(gemm_shapes(), lambda s: s[0] == 1 or s[1] == 1)
    exists(row_shapes(), lambda s: s[-1] == 1)


def test_dim_zero_only_when_allowed():
    exists(dim(64, allow_zero=True), lambda d: d == 0)
    never(dim(64), lambda d: d == 0)


@given(d=dim(300, allow_zero=True))
@PROP
def test_dim_within_bounds(d):
    assert 0 <= d <= 300


def test_gemm_shapes_empty_m():
    exists(gemm_shapes(), lambda s: s[0] == 0)
    never(gemm_shapes(allow_empty_m=False), lambda s: s[0] == 0)


def test_gemm_shapes_long_k():
    exists(gemm_shapes(max_k=512), lambda s: s[2] > 256)


@given(s=gemm_shapes(max_mn=96, max_k=512))
@PROP
def test_gemm_shapes_within_bounds(s):
    m, n, k = s
    assert 0 <= m <= 96 and 1 <= n <= 96 and 1 <= k <= 512


def test_row_shapes_empty_leading_dim():
    exists(row_shapes(), lambda s: s[0] == 0)
    never(row_shapes(allow_empty=False), lambda s: 0 in s)


def test_row_shapes_three_leading_dims():
    exists(row_shapes(), lambda s: len(s) == 4)
    exists(row_shapes(), lambda s: len(s) == 2)


@given(s=row_shapes(max_rows=64, max_hidden=512))
@PROP
def test_row_shapes_within_bounds(s):
    *lead, hidden = s
    assert 1 <= len(lead) <= 3
    assert 1 <= hidden <= 512
    assert math.prod(lead) <= 64
    assert all(d >= 1 for d in lead[1:])  # only the first leading dim may be empty


# ---- dtypes and distributions ------------------------------------------------------------

def test_float_dtypes_cover_all():
    for name in FLOAT_DTYPES:
        exists(float_dtypes(), lambda d, name=name: d == name)
        assert dtype_of(name) in TORCH_DTYPES


def test_dtype_of_unknown_name():
    with pytest.raises(ValueError, match="unknown dtype name 'float64'"):
        dtype_of("float64")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", DIST_KINDS)
def test_each_distribution_kind_for_each_dtype(dtype, kind):
    exists(distributions(dtype), lambda d: d["kind"] == kind)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_wide_false_excludes_wide(dtype):
    never(distributions(dtype, wide=False), lambda d: d["kind"] == "wide")


@given(data=st.data())
@PROP
def test_drawn_distributions_generate_finite_values(data):
    dtype = data.draw(float_dtypes())
    cap = data.draw(st.sampled_from([None, 4]))
    dist = data.draw(distributions(dtype, max_log2=cap))
    json.dumps(dist)
    x = generate(dist, (257,), dtype_of(dtype), data.draw(seeds()))
    assert torch.isfinite(x).all()
    if cap is not None:
        # The magnitude cap (GEMM fp16 inputs): nothing but N(0, s) tails exceeds 2^cap.
        if dist["kind"] == "wide":
            assert dist["log2_hi"] <= cap
        if dist["kind"] == "outliers":
            assert dist["factor"] <= 2.0 ** cap


# ---- tensors.generate --------------------------------------------------------------------

_BASE_DISTS = [
    {"kind": "normal", "scale": 2.0},
    {"kind": "uniform", "lo": -1.0, "hi": 2.0},
    {"kind": "wide", "log2_lo": -12, "log2_hi": 6},
    {"kind": "outliers", "scale": 1.0, "frac": 0.1, "factor": 64.0},
    {"kind": "tiny"},
    {"kind": "zero_rows", "scale": 1.0, "frac": 0.25},
    {"kind": "integers", "hi": 3},
]
# Both sampling precisions (float64: stored descriptions; float32: what strategies draw).
SAMPLE_DISTS = _BASE_DISTS + [dict(d, sample_dtype="float32") for d in _BASE_DISTS
                              if d["kind"] != "integers"]
DIST_IDS = [d["kind"] + ("-f32" if "sample_dtype" in d else "") for d in SAMPLE_DISTS]
SAMPLE_DTYPES = [{}, {"sample_dtype": "float32"}]


@pytest.mark.parametrize("sample", ["float64", "float32"])
def test_generate_samples_in_the_declared_precision(sample):
    """A description without sample_dtype (every stored case before the key existed) must
    keep generating exactly the tensor it was found with: float64 normals from the seeded CPU
    generator.  float32 sampling is torch's float32 stream from the same seed."""
    g = torch.Generator().manual_seed(9)
    sd = torch.float64 if sample == "float64" else torch.float32
    want = (torch.randn((5, 7), generator=g, dtype=sd).double() * 2.0).to(torch.bfloat16)
    dist = {"kind": "normal", "scale": 2.0}
    if sample == "float32":
        dist["sample_dtype"] = "float32"
    assert same_bits(generate(dist, (5, 7), torch.bfloat16, 9), want)
    other = dict(dist, sample_dtype="float32" if sample == "float64" else "float64")
    assert not same_bits(generate(other, (5, 7), torch.bfloat16, 9), want)


def test_generate_rejects_unknown_sample_dtype():
    with pytest.raises(ValueError, match="sample_dtype must be one of.*'float16'"):
        generate({"kind": "normal", "sample_dtype": "float16"}, (2,), torch.float32, 0)


def test_drawn_float_distributions_sample_in_float32():
    seen = find(distributions("bfloat16"), lambda d: d["kind"] == "normal")
    assert seen["sample_dtype"] == "float32"


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
@pytest.mark.parametrize("dist", SAMPLE_DISTS, ids=DIST_IDS)
def test_generate_is_bit_deterministic(dist, dtype):
    a = generate(dist, (37, 65), dtype, 1234)
    b = generate(dist, (37, 65), dtype, 1234)
    assert same_bits(a, b)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
@pytest.mark.parametrize("dist", SAMPLE_DISTS, ids=DIST_IDS)
def test_generate_seeds_differ(dist, dtype):
    a = generate(dist, (37, 65), dtype, 1234)
    b = generate(dist, (37, 65), dtype, 1235)
    assert not same_bits(a, b)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
@pytest.mark.parametrize("dist", SAMPLE_DISTS, ids=DIST_IDS)
def test_generate_dtype_and_shape(dist, dtype):
    for shape in [(0,), (3, 0), (0, 4, 5), (), (1,), (2, 3, 4), (129,)]:
        x = generate(dist, shape, dtype, 7)
        assert x.dtype == dtype, shape
        assert tuple(x.shape) == shape
        assert x.device.type == "cpu"
        assert torch.isfinite(x).all()


def test_generate_accepts_list_shape_and_rejects_unknown_kind():
    assert generate({"kind": "normal"}, [2, 3], torch.float32, 0).shape == (2, 3)
    with pytest.raises(ValueError, match="unknown distribution kind 'bogus'"):
        generate({"kind": "bogus"}, (2,), torch.float32, 0)


@pytest.mark.parametrize("sample", SAMPLE_DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
def test_tiny_produces_subnormals(dtype, sample):
    x = generate({"kind": "tiny", **sample}, (4096,), dtype, 3)
    fi = torch.finfo(dtype)
    a = x.double().abs()
    sub = (a < fi.tiny) & (x != 0)
    assert sub.any(), f"no subnormal {dtype} values"
    assert (x != 0).all()                       # no flush to zero
    assert (a >= fi.tiny).any()                 # the smallest normals are there too
    assert a.max().item() <= 4 * fi.tiny        # "up to four times the smallest normal"
    # The smallest subnormal, 2^(log2(tiny) - mantissa bits), is reached.
    smallest_sub = fi.tiny * fi.eps  # eps = 2^-mantissa_bits
    assert a.min().item() <= smallest_sub * 4
    assert (x > 0).any() and (x < 0).any()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
def test_zero_rows(dtype):
    x = generate({"kind": "zero_rows", "scale": 1.0, "frac": 1.0}, (17, 33), dtype, 5)
    assert (x == 0).all()
    x = generate({"kind": "zero_rows", "scale": 1.0, "frac": 0.25}, (400, 8, 3), dtype, 5)
    flat = x.reshape(400, -1)
    zero = (flat == 0).all(dim=1)
    assert 0 < zero.sum() < 400
    assert (flat[~zero] != 0).any(dim=1).all()  # whole rows are zeroed, nothing else
    # An empty leading dim and a 0-D tensor must not crash.
    all_zero = {"kind": "zero_rows", "scale": 1.0, "frac": 1.0}
    assert generate(all_zero, (0, 4), dtype, 5).shape == (0, 4)
    assert generate(all_zero, (), dtype, 5).shape == ()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
@pytest.mark.parametrize("hi", [1, 3, 15])
def test_integers(dtype, hi):
    x = generate({"kind": "integers", "hi": hi}, (64, 64), dtype, 9).double()
    assert (x == x.round()).all()
    assert x.abs().max().item() <= hi
    assert set(x.unique().tolist()) == set(float(v) for v in range(-hi, hi + 1))


@pytest.mark.parametrize("sample", SAMPLE_DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=FLOAT_DTYPES)
@pytest.mark.parametrize("lo,hi", [(-24, 2), (-12, 6), (-4, 5)])
def test_wide_spans_exponent_range(dtype, lo, hi, sample):
    x = generate({"kind": "wide", "log2_lo": lo, "log2_hi": hi, **sample}, (20000,), dtype, 11)
    e = torch.log2(x.double().abs())
    assert (x != 0).all()
    # Rounding to the dtype may land exactly on 2^hi (or 2^lo) but never beyond.
    assert e.min().item() >= lo and e.max().item() <= hi
    assert e.min().item() < lo + 0.5 and e.max().item() > hi - 0.5
    # Roughly log-uniform: every unit-wide octave of the range is populated.
    octaves = torch.floor(e).clamp(max=hi - 1).long().unique().tolist()
    assert octaves == list(range(lo, hi))
    assert (x > 0).any() and (x < 0).any()


# ---- op specs: cases() coverage ----------------------------------------------------------
# Drawing a whole case costs a few ms of Hypothesis time, so each spec gets one coverage run that stops as soon as every target was seen, and checks the
# spec's invariants on every case it draws on the way.

class _Covered(Exception):
    pass


def cover(strategy, targets: dict, *, invariant=None, max_examples: int = 1000) -> None:
    hit: set[str] = set()

    @given(strategy)
    @settings(FIND, max_examples=max_examples, suppress_health_check=list(HealthCheck))
    def run(example):
        if invariant is not None:
            invariant(example)
        hit.update(name for name, pred in targets.items() if pred(example))
        if len(hit) == len(targets):
            raise _Covered

    try:
        run()
    except _Covered:
        pass
    missing = sorted(set(targets) - hit)
    assert not missing, f"{len(hit)}/{len(targets)} targets seen; never produced: {missing}"


GEMM_DTYPE_PAIRS = [(d, d) for d in FLOAT_DTYPES] + [(d, "float32") for d in FLOAT_DTYPES
                                                      if d != "float32"]


def _gemm_invariant(c):
    assert c["layout"] in LAYOUTS
    assert (c["dtype"], c["out_dtype"]) in GEMM_DTYPE_PAIRS
    assert c["beta"] in (0.0, 1.0, -0.5) and math.isfinite(c["alpha"])
    m, n, k = c["m"], c["n"], c["k"]
    assert 0 <= m <= 48 and 1 <= n <= 48 and 1 <= k <= 256  # the "ci" size limits
    if c["dtype"] == "float16":  # fp16 inputs are capped so K products do not overflow
        for d in (c["dist_a"], c["dist_b"]):
            assert d["kind"] != "wide" or d["log2_hi"] <= 4
            assert d["kind"] != "outliers" or d["factor"] <= 16


def test_gemm_cases_cover_layouts_dtypes_epilogues():
    targets = {f"layout={lay}": (lambda c, lay=lay: c["layout"] == lay) for lay in LAYOUTS}
    targets.update({f"{d}->{o}": (lambda c, d=d, o=o: (c["dtype"], c["out_dtype"]) == (d, o))
                    for d, o in GEMM_DTYPE_PAIRS})
    targets.update({
        "bias": lambda c: c["bias"],
        "gelu": lambda c: c["gelu"],
        "beta!=0": lambda c: c["beta"] != 0.0,
        "alpha!=1": lambda c: c["alpha"] != 1.0,
        "bias+gelu+beta": lambda c: c["bias"] and c["gelu"] and c["beta"] != 0.0,
        "M=0": lambda c: c["m"] == 0,
        "K>128": lambda c: c["k"] > 128,
    })
    cover(gemm_spec.cases(), targets, invariant=_gemm_invariant)


def _act_invariant(kinds):
    def check(c):
        assert c["kind"] in kinds
        if c["kind"] in GATED:
            assert c["shape"][-1] >= 2 and c["shape"][-1] % 2 == 0, c
    return check


@pytest.mark.parametrize("op,kinds", [("act_fwd", KINDS), ("dbias_dact", POINTWISE)])
def test_act_cases_cover_every_kind(op, kinds):
    targets = {k: (lambda c, k=k: c["kind"] == k) for k in kinds}
    targets["empty rows"] = lambda c: c["shape"][0] == 0
    targets["3 leading dims"] = lambda c: len(c["shape"]) == 4
    cover(SPECS[op].cases(), targets, invariant=_act_invariant(kinds))


def test_act_bwd_cases_draw_gated_and_pointwise_kinds():
    # act_bwd draws from the same composite as act_fwd (covered above), plus a dy distribution.
    def invariant(c):
        _act_invariant(KINDS)(c)
        assert c["dist_dy"]["kind"] != "wide"

    cover(SPECS["act_bwd"].cases(), {"gated": lambda c: c["kind"] in GATED,
                                     "pointwise": lambda c: c["kind"] in POINTWISE},
          invariant=invariant)


@given(case=act_spec.cases(bwd=True, kinds=tuple(GATED)))
@settings(PROP, max_examples=12)
def test_gated_cases_have_even_last_dim(case):
    assert case["kind"] in GATED
    assert case["shape"][-1] >= 2 and case["shape"][-1] % 2 == 0
    inputs = act_spec.make_inputs(case, "cpu")
    assert tuple(inputs["x"].shape) == tuple(case["shape"])
    assert tuple(inputs["dy"].shape) == output_shape(case["shape"], case["kind"])


def test_gated_cases_odd_hidden_is_rounded_to_even():
    # row_shapes does draw odd hidden sizes, so the even-ness above is the spec's doing.
    exists(row_shapes(max_rows=24, max_hidden=256), lambda s: s[-1] % 2 == 1)
    exists(act_spec.cases(bwd=False, kinds=("swiglu",)), lambda c: c["shape"][-1] == 2)


# All four norm specs share one composite; cover its richest instantiation (LayerNorm
# backward: offset and dist_dy on); the others' keys are checked in the round-trip test below.
@pytest.mark.parametrize("op", ["layernorm_bwd"])
def test_norm_cases_cover_edges(op):
    targets = {f"dtype={d}": (lambda c, d=d: c["dtype"] == d) for d in FLOAT_DTYPES}
    targets.update({
        "fp32 weights for low precision x": lambda c: c["dtype"] != "float32"
        and c["weight_dtype"] == "float32",
        "zero_centered_gamma": lambda c: c["zero_centered_gamma"],
        "empty rows": lambda c: c["shape"][0] == 0,
        "3 leading dims": lambda c: len(c["shape"]) == 4,
    })
    targets["large offset"] = lambda c: c["offset"] >= 100.0

    def invariant(c):
        assert c["weight_dtype"] in (c["dtype"], "float32")
        assert c["eps"] > 0
        assert ("dist_dy" in c) == op.endswith("_bwd")
        assert ("offset" in c) == op.startswith("layernorm")

    cover(SPECS[op].cases(), targets, invariant=invariant)


# ---- op specs: determinism and serializability -------------------------------------------


def _same_inputs(a: dict, b: dict) -> bool:
    def same(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and same_bits(x, y)
        if isinstance(x, np.ndarray):  # e.g. exact bit patterns kept for a reference
            return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
        if isinstance(x, (list, tuple)):  # e.g. one QuantizedTensor per group (grouped_qgemm)
            return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
        if dataclasses.is_dataclass(x):  # e.g. a QuantizedTensor built by make_inputs
            return type(x) is type(y) and all(
                same(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
        return x == y
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


@pytest.mark.parametrize("op", sorted(SPECS))
def test_smoke_cases_json_serializable(op):
    spec = SPECS[op]
    assert spec.smoke_cases, f"{op} has no smoke cases"
    for case in spec.smoke_cases:
        text = json.dumps(case)
        assert json.loads(text) == case


@pytest.mark.parametrize("op", sorted(SPECS))
def test_smoke_case_make_inputs_deterministic(op):
    spec = SPECS[op]
    for case in spec.smoke_cases:
        first = spec.make_inputs(case, "cpu")
        assert first, f"{op}: make_inputs returned nothing"
        assert _same_inputs(first, spec.make_inputs(json.loads(json.dumps(case)), "cpu"))


@pytest.mark.parametrize("op", sorted(SPECS))
def test_drawn_cases_json_roundtrip_and_deterministic_inputs(op):
    spec = SPECS[op]

    @given(case=spec.cases())
    @settings(PROP, max_examples=4)
    def check(case):
        text = json.dumps(case)
        again = json.loads(text)
        assert again == case
        if spec.family == "norms":
            assert ("offset" in case) == op.startswith("layernorm")
            assert ("dist_dy" in case) == op.endswith("_bwd")
        first = spec.make_inputs(case, "cpu")
        assert _same_inputs(first, spec.make_inputs(again, "cpu"))

    check()


@pytest.mark.parametrize("op", ["layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_norm_tiny_inputs_are_subnormals_of_x_dtype(op, dtype):
    spec = SPECS[op]
    case = dict(spec.smoke_cases[0], dtype=dtype, weight_dtype=dtype, dist={"kind": "tiny"})
    x = spec.make_inputs(case, "cpu")["x"]
    tiny = torch.finfo(x.dtype).tiny
    assert ((x.double().abs() < tiny) & (x != 0)).any()


def test_pick_builds_one_strategy_per_value_list_and_keeps_types_apart():
    """pick() is sampled_from built once per distinct list (a composite calls it on every
    draw); values that compare equal but differ in type or sign are different lists."""
    from tealite_verify.strategies.choices import pick
    assert pick("a", "b", "b") is pick("a", "b", "b")
    assert pick(0, 1) is not pick(False, True)
    assert find(pick(False, True), lambda v: True) is False
    assert str(find(pick(-0.0), lambda v: True)) == "-0.0"
    assert find(pick(0.0), lambda v: True) == 0.0 and str(find(pick(0.0), lambda v: True)) == "0.0"
    seen = {find(pick(1, 2, 3), lambda v, t=t: v == t) for t in (1, 2, 3)}
    assert seen == {1, 2, 3}
    with pytest.raises(ValueError, match="at least one value"):
        pick()
