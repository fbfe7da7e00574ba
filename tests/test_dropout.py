"""Dropout: the front-end's contract (scaling, p = 0 / 1, determinism, offsets, bad input) on
every backend, the exact checks (y and dx under the backend's own mask) catching wrong kernels,
and the statistical tier: exact binomial tails, its false-alarm rate on correct generators
within the stated alpha, and biased / patterned / stream-reusing generators caught at the
``local`` sample size.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tealite
from tealite import TealiteArgumentError, registry
from tealite.backends.torch.dropout import apply_mask, keep_mask
from tealite_verify.references import dropout as ref
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.strategies.training import DROPOUT_STATS_SHAPES
from tealite_verify.tiers import statistical as S
from tealite_verify.tiers.metrics import Tier

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _backends():
    """torch, and triton where it runs (a GPU, or the interpreter): skipped with the reason."""
    why = registry.get_backend("triton").unavailable_reason()
    return ["torch", pytest.param("triton", marks=pytest.mark.skipif(why is not None,
                                                                      reason=str(why)))]


def _device(backend):
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


# ---- the front-end's contract --------------------------------------------------------------

@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype", DTYPES)
def test_scaling_is_one_fp32_multiply_then_one_rounding(backend, dtype):
    x = (torch.randn(9, 37, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    x = x.to(_device(backend))
    for p in (0.1, 1.0 / 3.0, 0.7):
        y, mask = tealite.dropout_fwd(x, p, seed=7, offset=3, backend=backend)
        assert mask.dtype == torch.bool and mask.shape == x.shape
        want = ref.apply_mask(x.cpu().double().numpy(), mask.cpu().numpy(), p,
                              str(dtype).removeprefix("torch."))
        assert np.array_equal(y.cpu().float().numpy(), want.astype(np.float32))
        dx = tealite.dropout_bwd(x, mask, p, backend=backend)
        assert torch.equal(dx, y)  # the backward applies the forward's mask and scale


@pytest.mark.parametrize("backend", _backends())
def test_p_zero_is_identity_and_p_one_is_zeros(backend):
    x = torch.tensor([1.5, -0.0, float("nan"), float("inf"), -3.25] * 4).to(_device(backend))
    y, mask = tealite.dropout_fwd(x, 0.0, seed=1, backend=backend)
    # Bit for bit except NaN payloads: a GPU's fp32 multiply returns its canonical NaN
    # (0x7fffffff on NVIDIA) for x * 1.0, the CPU keeps the quiet NaN it was given.
    nan = torch.isnan(x)
    assert mask.all() and torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan].view(torch.int32), x[~nan].view(torch.int32))
    y, mask = tealite.dropout_fwd(x, 1.0, seed=1, backend=backend)
    assert not mask.any() and torch.equal(y.view(torch.int32), torch.zeros_like(y).view(
        torch.int32))  # +0 everywhere, NaN and Inf included: nothing divided by zero
    assert torch.equal(tealite.dropout_bwd(x, mask, 1.0, backend=backend),
                       torch.zeros_like(x))


@pytest.mark.parametrize("backend", _backends())
def test_same_seed_same_mask_other_offset_or_seed_another(backend):
    x = torch.zeros(4096, device=_device(backend))

    def mask(seed, offset):
        return tealite.dropout_fwd(x, 0.5, seed=seed, offset=offset, backend=backend).mask
    base = mask(2**40 + 3, 2**32 + 5)
    assert torch.equal(base, mask(2**40 + 3, 2**32 + 5))
    for other in (mask(2**40 + 3, 2**32 + 6), mask(2**40 + 4, 2**32 + 5)):
        assert 0.4 < (other == base).float().mean() < 0.6  # independent, not equal


def test_backends_masks_differ_but_both_pass_the_statistical_tier():
    why = registry.get_backend("triton").unavailable_reason()
    if why:
        pytest.skip(why)
    spec = get_spec("dropout_fwd")
    case = {"shape": [16, 40], "p": 0.3, "drop_seed": 11, "offset": 2, "dtype": "float32",
            "stats_shape": [64, 64], "dist": {"kind": "normal", "scale": 1.0}, "seed": 3}
    rep = run_case(spec, case, backends=["torch", "triton"], device=_device("triton"))
    assert rep.verdict == "pass", rep.describe()
    pair = {c.output: c.metrics.tier for c in rep.comparisons
            if {c.lhs, c.rhs} == {"torch", "triton"}}
    assert pair["stats"] == Tier.STATISTICAL_PAIR and pair["y"] == Tier.EXACT_PAIR
    t, u = (rep.outcomes[b].outputs["stats"] for b in ("torch", "triton"))
    assert not torch.equal(t, u)


@pytest.mark.parametrize("args, named", [
    (dict(p=1.5), "p must be in [0, 1]"), (dict(p=-0.1), "p must be in [0, 1]"),
    (dict(p=float("nan")), "p must be in [0, 1], got nan"), (dict(p="0.1"), "p must be"),
    (dict(p=True), "p must be"), (dict(seed=1.0), "seed must be an int"),
    (dict(seed=True), "seed must be an int"), (dict(seed=-1), "seed must be in [0, 2**63)"),
    (dict(offset=2**63), "offset must be in [0, 2**63)"),
])
def test_bad_input_names_the_argument(args, named):
    kw = {"p": 0.1, "seed": 1, "offset": 0, **args}
    with pytest.raises(TealiteArgumentError, match=named.replace("[", r"\[").replace(
            "]", r"\]").replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        tealite.dropout_fwd(torch.zeros(4), kw.pop("p"), backend="torch", **kw)


def test_bad_mask_names_the_argument():
    dy = torch.zeros(4, 8)
    with pytest.raises(TealiteArgumentError, match="mask dtype must be one of \\(bool\\)"):
        tealite.dropout_bwd(dy, torch.ones(4, 8, dtype=torch.uint8), 0.1, backend="torch")
    with pytest.raises(TealiteArgumentError, match="mask must have shape"):
        tealite.dropout_bwd(dy, torch.ones(8, 4, dtype=torch.bool), 0.1, backend="torch")


# ---- the exact checks catch wrong kernels ----------------------------------------------------

def _spec_verdicts(op, case, outputs):
    spec = get_spec(op)
    inputs = spec.make_inputs(case, "cpu")
    expected = spec.reference({k: v.double().numpy() for k, v in inputs.items()}, case)
    return inputs, {name: e.check(outputs(inputs), None) for name, e in expected.items()}


_CASE = {"shape": [12, 40], "p": 0.25, "drop_seed": 5, "offset": 9, "dtype": "bfloat16",
         "stats_shape": [64, 64], "dist": {"kind": "normal", "scale": 1.0}, "seed": 4}


def test_exact_check_catches_a_scale_rounded_to_bf16_first():
    # TE's 16-bit kernel multiplies in the 16-bit type by the scale rounded to it: not
    # tealite's contract (one fp32 multiply, one rounding).  p = 1/3 gives scale 1.5 exactly,
    # so use 0.3 (scale 1/0.7 is not a bf16 value).
    case = {**_CASE, "p": 0.3}

    def te_style(inputs):
        x = inputs["x"]
        keep = keep_mask(x.shape, "cpu", 0.3, 5, 9)
        s16 = torch.tensor(ref.scale_fp32(0.3)).to(torch.bfloat16)
        y = torch.where(keep, x * s16, torch.zeros((), dtype=x.dtype))
        return {"y": y, "mask": keep}
    _, v = _spec_verdicts("dropout_fwd", case, te_style)
    assert not v["y"].passed and v["y"].mismatches > 0


def test_exact_check_passes_the_correct_rule_and_catches_one_ulp():
    def good(inputs):
        keep = keep_mask(inputs["x"].shape, "cpu", 0.25, 5, 9)
        return {"y": apply_mask(inputs["x"], keep, ref.scale_fp32(0.25)), "mask": keep,
                "dx": apply_mask(inputs["dy"], keep, ref.scale_fp32(0.25))}

    def one_ulp(inputs):
        out = good(inputs)
        i = int(out["mask"].reshape(-1).nonzero()[0])
        out["y"].view(torch.int16).reshape(-1)[i] += 1
        return out
    _, v = _spec_verdicts("dropout_fwd", _CASE, good)
    assert v["y"].passed and v["mask"].passed
    _, v = _spec_verdicts("dropout_fwd", _CASE, one_ulp)
    assert not v["y"].passed and v["y"].mismatches == 1
    _, v = _spec_verdicts("dropout_bwd", _CASE, good)
    assert v["dx"].passed


def test_backward_with_a_regenerated_mask_is_caught():
    def regenerated(inputs):
        keep = keep_mask(inputs["x"].shape, "cpu", 0.25, 5, 9)
        other = keep_mask(inputs["x"].shape, "cpu", 0.25, 5, 10)
        return {"mask": keep, "dx": apply_mask(inputs["dy"], other, ref.scale_fp32(0.25))}
    _, v = _spec_verdicts("dropout_bwd", _CASE, regenerated)
    assert not v["dx"].passed


# ---- the statistical tier ----------------------------------------------------------------

@pytest.mark.parametrize("n, q", [(1, 0.5), (20, 0.1), (57, 0.5), (200, 0.97)])
def test_binomial_tails_are_exact(n, q):
    pmf = [math.comb(n, k) * q**k * (1 - q)**(n - k) for k in range(n + 1)]
    for x in range(n + 1):
        assert S.lower_tail(n, x, q) == pytest.approx(sum(pmf[:x + 1]), rel=1e-9, abs=1e-300)
        assert S.upper_tail(n, x, q) == pytest.approx(sum(pmf[x:]), rel=1e-9, abs=1e-300)


def test_tail_far_from_the_mean_is_tiny_not_zero_and_never_underestimated():
    n, q = 2**18, 0.5
    tail = S.lower_tail(n, n // 2 - 3000, q)  # ~11.7 sd below the mean
    assert 0 < tail < 1e-29
    assert S.lower_tail(n, n // 2, q) == pytest.approx(0.5 + 0.5 * math.sqrt(2 / (math.pi * n)),
                                                       rel=1e-6)


def _false_alarm_bound(trials: int, alpha: float, miss: float = 1e-6) -> int:
    """The smallest count F with P(Bin(trials, alpha) >= F) <= miss: more false alarms than
    that under a tier whose rate is <= alpha happens with probability <= miss."""
    f = 0
    while S.upper_tail(trials, f, alpha) > miss:
        f += 1
    return f


@pytest.mark.parametrize("generator", ["numpy", "torch"])
def test_false_alarm_rate_of_correct_generators_is_within_alpha(generator):
    # At alpha = 0.05 per case (so that alarms are frequent enough to count), over 300 seeds
    # with p drawn from a few values: the observed count stays below Bin(300, 0.05)'s 1e-6
    # quantile.  The tier's Bonferroni split is conservative, so the rate is usually below.
    alpha, trials, rows, cols = 0.05, 300, 32, 64
    alarms = 0
    for s in range(trials):
        p = (0.1, 0.5, 1 / 3, 0.9)[s % 4]
        if generator == "numpy":
            rng = np.random.default_rng(s)
            m, nxt = (rng.random((rows, cols)) >= p for _ in range(2))
        else:
            m, nxt = (keep_mask((rows, cols), "cpu", p, s, o) for o in (0, 1))
        alarms += S.judge_mask(m, p, alpha=alpha, row=cols, next_mask=nxt).mismatches > 0
    assert alarms <= _false_alarm_bound(trials, alpha), alarms


def _local_n():
    return min(r * c for r, c in DROPOUT_STATS_SHAPES["local"])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_probability_off_by_one_point_is_caught_at_the_local_size(p):
    rows = 512
    cols = _local_n() // rows
    biased = keep_mask((rows, cols), "cpu", p + 0.01, 3, 0)
    m = S.judge_mask(biased, p, row=cols, next_mask=keep_mask((rows, cols), "cpu", p + 0.01,
                                                               3, 1))
    assert not m.passed
    kept = S.mask_tests(biased, p, row=cols)[0]
    assert kept.name == "kept fraction" and kept.p_value() <= S.DEFAULT_ALPHA / m.numel
    fair = keep_mask((rows, cols), "cpu", p, 3, 0)
    assert S.judge_mask(fair, p, row=cols, next_mask=keep_mask((rows, cols), "cpu", p, 3,
                                                                1)).passed


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_every_kth_element_dropped_is_caught(k):
    # Kept fraction exactly 1 - 1/k, but the class 0 mod k is never kept.
    n = 4096
    m = (np.arange(n) % k) != 0
    assert S.judge_mask(m, 1.0 / k).note.find(f"mod {k}") > 0


def test_period_of_a_block_and_reused_or_shifted_streams_are_caught():
    base = keep_mask((64 * 64,), "cpu", 0.5, 1, 0).numpy()
    assert "lag 1024" in S.judge_mask(np.tile(base[:1024], 4), 0.5).note
    assert not S.judge_mask(base, 0.5, next_mask=base).passed          # offset ignored
    shifted = np.roll(base, -1)                                           # offset as a shift
    m = S.judge_mask(base, 0.5, next_mask=shifted)
    assert not m.passed and "shifted by one" in m.note


def test_p_zero_and_one_allow_no_randomness():
    assert S.judge_mask(np.ones(100, bool), 0.0).passed
    one_dropped = np.ones(100, bool)
    one_dropped[17] = False
    assert not S.judge_mask(one_dropped, 0.0).passed
    assert not S.judge_mask(np.eye(10, dtype=bool), 1.0).passed
