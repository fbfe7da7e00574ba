"""RoPE: the front-end's argument checks, the float64 reference against hand-computed cases
and against an independent formulation (complex multiplication), and the rotary bound
(tiers/rotary.py) catching deliberately wrong ropes while passing correct ones that round
differently.

The variants are plug-in backends (``make_backend``) built from one parametrized fp32
implementation (:func:`_variant`), so each differs from a correct RoPE in exactly one thing.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tealite
from tealite.backends.torch import rope as T
from tealite.types import rope_positions
from tealite_verify.references import rope as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.rope import make_freqs

F32 = torch.float32


# ---- the reference: hand cases ------------------------------------------------------------

def _freqs(rows, angles):
    """(rows, 1, 1, d2) with every row the same angles."""
    return np.tile(np.asarray(angles, dtype=np.float64), (rows, 1)).reshape(rows, 1, 1, -1)


def test_reference_quarter_turns_by_hand():
    x = np.arange(1.0, 5.0).reshape(1, 1, 1, 4)  # (s, b, h, d) = [1, 2, 3, 4]
    q = math.pi / 2
    y = ref.rope_fwd(x, _freqs(1, [q] * 4))
    assert np.allclose(y.ravel(), [-3, -4, 1, 2])  # halves: (-x[2:], x[:2])
    y = ref.rope_fwd(x, _freqs(1, [q] * 4), interleaved=True)
    assert np.allclose(y.ravel(), [-2, 1, -4, 3])  # pairs: (-x1, x0, -x3, x2)
    y = ref.rope_fwd(x, _freqs(1, [q, q]))         # partial: d2 = 2, the tail passes
    assert np.allclose(y.ravel(), [-2, 1, 3, 4])
    dx = ref.rope_bwd(x, _freqs(1, [q] * 4))        # the transpose: (x[2:], -x[:2])
    assert np.allclose(dx.ravel(), [3, 4, -1, -2])


def test_reference_positions_by_hand():
    # cp = 2, local sequence of 4 = chunks of 2: rank 0 holds chunks 0 and 3, rank 1 1 and 2.
    assert ref.positions([4], cp_size=2, cp_rank=0).tolist() == [0, 1, 6, 7]
    assert ref.positions([4], cp_size=2, cp_rank=1).tolist() == [2, 3, 4, 5]
    assert ref.positions([2], cp_size=4, cp_rank=1).tolist() == [1, 6]
    assert ref.positions([2, 0, 3], starts=[3, 9, 5]).tolist() == [3, 4, 5, 6, 7]
    # The front-end's shared helper (torch backend, AITER adapter) agrees.
    for lens, kw in (([4, 8], {"cp_size": 2, "cp_rank": 1}), ([6], {"cp_size": 3, "cp_rank": 2}),
                     ([2, 0, 3], {"starts": [3, 9, 5]})):
        assert rope_positions(lens, **kw).tolist() == ref.positions(lens, **kw).tolist()


def test_reference_at_a_position_reads_that_freqs_row():
    x = np.ones((3, 1, 1, 2))
    f = np.array([0.0, 0.5, 1.0, 1.5]).repeat(2).reshape(4, 1, 1, 2)
    y = ref.rope_fwd(x, f, start_positions=[1])
    theta = np.array([0.5, 1.0, 1.5])
    assert np.allclose(y[:, 0, 0, 0], np.cos(theta) - np.sin(theta))


# ---- the reference: an independent formulation -----------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_reference_is_complex_multiplication(fmt, interleaved):
    """With TE's table (each pair shares its angle) RoPE multiplies the complex number
    (x_a + i x_b) of each pair by exp(i theta)."""
    rng = np.random.default_rng(1)
    s, b, h, d, d2 = 7, 2, 3, 12, 8
    inv = 1.0 / 10000 ** (np.arange(0, d2, 2) / d2)
    theta = np.outer(np.arange(s) + 3.0, inv)                         # (s, d2/2)
    table = np.repeat(theta, 2, axis=1) if interleaved else np.concatenate([theta, theta], 1)
    x = rng.standard_normal((s, b, h, d) if fmt == "sbhd" else (b, s, h, d))
    y = ref.rope_fwd(x, _freqs_rows(table), tensor_format=fmt, interleaved=interleaved,
                     start_positions=None)
    xs = x if fmt == "sbhd" else x.swapaxes(0, 1)
    a, c = (xs[..., 0:d2:2], xs[..., 1:d2:2]) if interleaved else \
        (xs[..., :d2 // 2], xs[..., d2 // 2:d2])
    z = (a + 1j * c) * np.exp(1j * theta)[:, None, None, :]
    ys = y if fmt == "sbhd" else y.swapaxes(0, 1)
    got = (ys[..., 0:d2:2], ys[..., 1:d2:2]) if interleaved else \
        (ys[..., :d2 // 2], ys[..., d2 // 2:d2])
    assert np.allclose(got[0], z.real, atol=1e-12) and np.allclose(got[1], z.imag, atol=1e-12)
    assert np.array_equal(ys[..., d2:], xs[..., d2:])


def _freqs_rows(table):
    return table.reshape(table.shape[0], 1, 1, -1)


@pytest.mark.parametrize("kw", [
    dict(tensor_format="sbhd"), dict(tensor_format="bshd", interleaved=True),
    dict(tensor_format="sbhd", cp_size=2, cp_rank=1),
    dict(tensor_format="bshd", start_positions=[2, 0, 1, 3]),
    dict(tensor_format="thd", cu_seqlens=[0, 8, 8, 12], cp_size=2, cp_rank=0, interleaved=True)])
def test_reference_backward_is_the_transpose(kw):
    rng = np.random.default_rng(2)
    shape = (6, 4, 10) if kw["tensor_format"] == "thd" else (4, 2, 2, 10)
    a, g = rng.standard_normal(shape), rng.standard_normal(shape)
    f = rng.uniform(-50, 50, (40, 1, 1, 6))  # any table: the transpose holds for all
    lhs = np.sum(ref.rope_fwd(a, f, **kw) * g)
    rhs = np.sum(a * ref.rope_bwd(g, f, **kw))
    assert abs(lhs - rhs) < 1e-10 * (1 + abs(lhs))


# ---- the front-end: bad input names the argument -------------------------------------------

def _t(*shape):
    return torch.randn(*shape)


BAD = [
    (dict(freqs=torch.zeros(8, 1, 1, 6, dtype=torch.float64)), "freqs dtype"),
    (dict(freqs=torch.zeros(8, 2, 1, 6)), "freqs must have shape (s2, 1, 1, d2)"),
    (dict(freqs=torch.zeros(8, 1, 1, 5)), "d2 (the rotary dim) must be even"),
    (dict(freqs=torch.zeros(8, 1, 1, 18)), "d2 = 18 must be <= the head dim d = 16"),
    (dict(freqs=torch.zeros(3, 1, 1, 16)), "freqs has 3 positions"),
    (dict(tensor_format="hbsd"), "tensor_format must be one of"),
    (dict(cp_size=2, cp_rank=2), "cp_rank must be an int in [0, cp_size = 2)"),
    (dict(cp_size=0), "cp_size must be an int >= 1"),
    (dict(interleaved=1), "interleaved must be a bool"),
    (dict(start_positions=torch.zeros(3, dtype=torch.int32)),
     "start_positions must have shape (2,)"),
    (dict(start_positions=torch.zeros(2, dtype=torch.int64)), "start_positions dtype"),
    (dict(start_positions=torch.tensor([0, -1], dtype=torch.int32)),
     "start_positions must be >= 0"),
    (dict(cp_size=2, cp_rank=0, start_positions=torch.zeros(2, dtype=torch.int32)),
     "start_positions is not supported with cp_size > 1"),
    (dict(cu_seqlens=torch.tensor([0, 4], dtype=torch.int32)),
     "cu_seqlens is for tensor_format 'thd'"),
    (dict(t=_t(5, 2, 2, 16), cp_size=2), "local sequence length must be even"),
]

THD_BAD = [
    (dict(), "tensor_format 'thd' needs cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 6, 4, 10], dtype=torch.int32)), "non-decreasing"),
    (dict(cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32)), "must equal t's token count 10"),
    (dict(cu_seqlens=torch.tensor([1, 4, 10], dtype=torch.int32)), "must start at 0"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int64)), "cu_seqlens dtype"),
    (dict(cu_seqlens=torch.tensor([0, 6, 20], dtype=torch.int32), cp_size=2),
     "must be multiples of 2*cp_size = 4"),
]


@pytest.mark.parametrize("kw,message", BAD)
def test_bad_input_names_the_argument(kw, message):
    args = dict(t=_t(4, 2, 3, 16), freqs=torch.zeros(8, 1, 1, 16))
    args.update(kw)
    t, f = args.pop("t"), args.pop("freqs")
    for fn in (tealite.rope_fwd, tealite.rope_bwd):
        with pytest.raises(tealite.TealiteArgumentError, match=_re(message)):
            fn(t, f, **args)


@pytest.mark.parametrize("kw,message", THD_BAD)
def test_bad_thd_input_names_the_argument(kw, message):
    with pytest.raises(tealite.TealiteArgumentError, match=_re(message)):
        tealite.rope_fwd(_t(10, 2, 8), torch.zeros(16, 1, 1, 8), tensor_format="thd", **kw)


def test_the_backward_names_dy():
    with pytest.raises(tealite.TealiteArgumentError, match="dy must be 4-D"):
        tealite.rope_bwd(_t(4, 3, 16), torch.zeros(8, 1, 1, 16))


def _re(text):
    import re
    return re.escape(text)


# ---- the bound: wrong ropes are caught, correct ones with other roundings are not ----------

def _variant(*, swap=False, mix=False, bwd_as_fwd=False, cp_off=False, tail=False,
             trig_bf16=False, ignore_start=False, f64=False, fma=False, trig_error=0.0):
    """An implementation of rope_fwd / rope_bwd as the torch backend computes it, with one
    change: a bug (swap .. ignore_start), a legitimate rounding difference (f64, fma), or
    cos / sin off by ``trig_error`` (a stand-in for a hardware approximation)."""
    def impl(t, freqs, *, tensor_format, interleaved, cu_seqlens, cp_size, cp_rank,
             start_positions, backward):
        tokens = T.to_tokens(t, tensor_format)
        lens = T.local_lens(t, tensor_format, cu_seqlens, cp_size)
        starts = None if (start_positions is None or ignore_start) else start_positions.tolist()
        pos = rope_positions(lens, cp_size=cp_size, cp_rank=cp_rank, starts=starts)
        if cp_off and cp_size > 1:  # the second chunk one chunk early
            pos = torch.cat([torch.where(torch.arange(n) < n // 2, p, p - n // 2)
                             for n, p in zip(lens, pos.split(lens))])
        d2 = freqs.shape[-1]
        f = freqs.reshape(freqs.shape[0], d2)[pos][:, None, :]
        wide = torch.float64 if (f64 or fma) else F32
        arg = f.to(torch.bfloat16).float() if trig_bf16 else f
        cos, sin = torch.cos(arg.to(wide)), torch.sin(arg.to(wide))
        if not (f64 or fma):
            cos, sin = cos.float() + trig_error, sin.float() - trig_error
        il = interleaved != mix
        x = tokens[..., :d2].to(wide)

        def rot(v, transpose):
            r = T._rotate(v, il, transpose=transpose)
            return -r if swap else r

        if backward and not bwd_as_fwd:
            y = x * cos + rot(x * sin, True)
        else:
            y = x * cos + rot(x, False) * sin
        if fma:
            y = y.float()  # one fp32 rounding of the exact pair, then the output rounding
        rest = tokens[..., d2:]
        if tail:
            rest = (rest.float() * torch.cos(f[..., :1])).to(t.dtype)
        out = torch.cat((y.to(t.dtype), rest), dim=-1)
        return T.from_tokens(out, t, tensor_format)
    return impl


def _register(make_backend, impl):
    b = make_backend("rope_variant")
    for op, backward in (("rope_fwd", False), ("rope_bwd", True)):
        def fn(t, freqs, *, _bw=backward, **kw):
            return impl(t, freqs, backward=_bw, **kw)
        b.implements(op, like="torch")(fn)
    return b.name


def _case(fmt="sbhd", shape=(9, 2, 2, 16), dtype="float32", **kw):
    c = {"tensor_format": fmt, "interleaved": False, "shape": list(shape), "d2": shape[-1],
         "cp_size": 1, "cp_rank": 0, "dtype": dtype,
         "freqs": {"kind": "te", "base": 10000.0, "pos_offset": 0, "extra_rows": 0},
         "dist": {"kind": "normal", "scale": 1.0}, "seed": 3}
    c.update(kw)
    return c


LONG = {"kind": "te", "base": 10000.0, "pos_offset": 2 ** 16, "extra_rows": 0}
WRONG = [
    ("swapped rotation sign", dict(swap=True), "rope_fwd", _case()),
    ("interleaved mixed up", dict(mix=True), "rope_fwd", _case(interleaved=True)),
    ("interleaved mixed up (bshd)", dict(mix=True), "rope_fwd", _case("bshd")),
    ("backward rotating forward", dict(bwd_as_fwd=True), "rope_bwd", _case()),
    ("cp chunk order off by one", dict(cp_off=True), "rope_fwd",
     _case(shape=(8, 2, 1, 16), cp_size=2, cp_rank=1)),
    ("cp chunk order off by one (thd)", dict(cp_off=True), "rope_bwd",
     _case("thd", shape=(6, 2, 2, 8), seqlens=[12, 4], cp_size=2, cp_rank=0)),
    ("partial tail rotated", dict(tail=True), "rope_fwd", _case(d2=6, dtype="bfloat16")),
    ("cos / sin of a bf16 angle", dict(trig_bf16=True), "rope_fwd", _case(freqs=LONG)),
    ("start positions ignored (TE's backward)", dict(ignore_start=True), "rope_bwd",
     _case("bshd", shape=(5, 2, 2, 16), start_positions=[4, 1])),
]
RIGHT = [("float64 math", dict(f64=True)), ("fused multiply-add pair", dict(fma=True))]
RIGHT_CASES = [_case(dtype=dt, **kw) for dt in ("float32", "bfloat16", "float16")
               for kw in ({}, {"interleaved": True, "freqs": LONG, "d2": 10})] + [
    _case("thd", shape=(6, 2, 2, 8), seqlens=[12, 0, 4], cp_size=2, cp_rank=1),
    _case("bshd", shape=(5, 2, 2, 16), start_positions=[4, 1], dtype="bfloat16")]


@pytest.mark.parametrize("what,knob,op,case", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_rope_is_caught(make_backend, what, knob, op, case):
    name = _register(make_backend, _variant(**knob))
    report = run_case(get_spec(op), case, backends=["torch", name])
    assert report.outcomes[name].status == "ok", report.describe()
    assert not [c for c in report.failures if c.lhs == "torch" and c.rhs == "reference"]
    assert [c for c in report.failures if c.lhs == name and c.rhs == "reference"], what


@pytest.mark.parametrize("what,knob", RIGHT, ids=[r[0] for r in RIGHT])
def test_a_correct_rope_rounding_differently_passes(make_backend, what, knob):
    name = _register(make_backend, _variant(**knob))
    for op in ("rope_fwd", "rope_bwd"):
        for case in RIGHT_CASES:
            report = run_case(get_spec(op), case, backends=["torch", name])
            assert report.verdict == "pass", (what, report.describe())


def test_the_spec_builds_te_tables_in_float32():
    """The harness's freqs are TE's RotaryPositionEmbedding table: float32 all the way."""
    f = make_freqs(_case(d2=8, freqs=LONG))
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=F32) / 8))
    row = (torch.tensor(3.0) + 2 ** 16) * inv
    assert f.dtype == F32 and torch.equal(f[3, 0, 0], torch.cat([row, row]))


@pytest.mark.parametrize("declared,caught", [(None, True), (32, False)])
def test_declared_trig_error_widens_the_bound(make_backend, declared, caught):
    """cos / sin 16 units of 2^-24 off: outside the default declaration (2 units), inside a
    kernel's honest declaration of 32."""
    b = make_backend("rope_trig")
    numerics = {"compute_dtype": F32} | ({"trig_ulps": declared} if declared else {})
    impl = _variant(trig_error=16 * 2.0 ** -24)
    for op, backward in (("rope_fwd", False), ("rope_bwd", True)):
        b.implements(op, numerics=numerics)(
            lambda t, freqs, _bw=backward, **kw: impl(t, freqs, backward=_bw, **kw))
    case = _case(dist={"kind": "normal", "scale": 64.0})
    for op in ("rope_fwd", "rope_bwd"):
        report = run_case(get_spec(op), case, backends=[b.name])
        assert bool(report.failures) == caught, report.describe()
