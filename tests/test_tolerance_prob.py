"""The opt-in probabilistic GEMM bound and its "suspicious" verdict (issue 13, part 5;
tealite_verify/tiers/probabilistic.py, docs/probabilistic.md).

Higham & Mary (SIAM J. Sci. Comput. 2019): with mean-zero independent rounding errors an
n-term inner product is within gamma~_n(lambda) sum|a_i b_i|, gamma~_n = exp(lambda sqrt(n) u +
n u^2/(1-u)) - 1, except with probability n * 2 exp(-lambda^2 (1-u)^2 / 2).  These tests check
the lambda choice against that formula, that a correct torch GEMM at large K on zero-mean data
is not flagged, that bugs the deterministic tier cannot see there are flagged, that the check
is off unless asked for, and that bad input is refused by name.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tealite.numerics import Numerics

from tealite_verify.tiers import gemm as TG
from tealite_verify.tiers import primitives as TPR
from tealite_verify.tiers import probabilistic as TP
from tealite_verify.cli import main
from tealite_verify.fuzz import report as fuzz_report
from tealite_verify.fuzz import worker as fuzz_worker
from tealite_verify.runner import run_case
from tealite_verify.specs import get_spec
from tealite_verify.specs.gemm import make_case

sys.path.insert(0, str(Path(__file__).parent / "external"))
import prob_mutants  # noqa: E402

U32 = 2.0 ** -24
P = 1e-9
_ROW = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
        "amax_epsilon": 0.0}


def _qgemm_case(k, seed, recipe=_ROW, out_dtype="float32", m=64, n=64):
    return {"recipe_a": recipe, "recipe_b": recipe, "m": m, "n": n, "k": k, "layout": "TN",
            "dtype": "bfloat16", "out_dtype": out_dtype, "bias": False,
            "dist_a": {"kind": "normal", "scale": 1.0},
            "dist_b": {"kind": "normal", "scale": 1.0}, "seed": seed}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    """Every test states whether it wants the check: none inherits it from the shell."""
    monkeypatch.delenv(TP.ENV_VAR, raising=False)


def _mutant(make_backend, name):
    return prob_mutants.register(make_backend(f"prob_{name}"), name).name


# ---- lambda, gamma~ ----------------------------------------------------------------------------

@pytest.mark.parametrize("p, numel, k", [(1e-9, 256 * 256, 4096), (1e-3, 1, 1),
                                         (1e-12, 1024 * 1024, 8192), (0.5, 7, 300)])
def test_lambda_gives_the_stated_false_alarm_probability(p, numel, k):
    events = TP.rounding_events(numel, k)
    assert events == numel * (k + 1)  # Theorem 3.1's union over the K (+1 seeded) terms
    lam = TP.lambda_for(p, events, U32)
    # Closed form: events * 2 exp(-lambda^2 (1-u)^2 / 2) = p.
    assert lam == pytest.approx(math.sqrt(2 * math.log(2 * events / p)) / (1 - U32), rel=1e-15)
    assert events * TP.failure_probability(lam, U32) == pytest.approx(p, rel=1e-9)
    # ... and it is the smallest such lambda: 1 % less misses the target.
    assert events * TP.failure_probability(0.99 * lam, U32) > p


def test_lambda_for_the_documented_case():
    """docs/probabilistic.md quotes lambda = 9.04 for a 256 x 256 output at K = 4096."""
    assert TP.lambda_for(1e-9, TP.rounding_events(256 * 256, 4096), U32) == pytest.approx(
        9.036, abs=5e-4)


def test_gamma_tilde_matches_higham_mary():
    lam, n, u = 9.0, 4096, U32
    want = math.exp(lam * math.sqrt(n) * u + n * u * u / (1 - u)) - 1
    assert TP.gamma_tilde(n, u, lam) == pytest.approx(want, rel=1e-12)
    assert TP.gamma_tilde(n, u, lam) == pytest.approx(lam * math.sqrt(n) * u, rel=1e-4)
    g = TP.accumulation_gamma(lam)
    # sqrt(K) growth where lambda sqrt(K) < K, the deterministic gamma_K below that.
    assert g(4096, u) == TP.gamma_tilde(4096, u, lam) < TPR.gamma(4096, u) / 7
    assert g(16, u) == TPR.gamma(16, u) < TP.gamma_tilde(16, u, lam)


def test_prob_bound_is_the_deterministic_one_with_gamma_tilde():
    """Only the accumulation term changes: prob - det = (gamma~_K - gamma_K) |A||B| exactly
    for plain fp32 accumulation with an fp32 output far from any ulp effect."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((32, 4096)), rng.standard_normal((4096, 32))
    p, p_abs = a @ b, np.abs(a) @ np.abs(b)
    num = Numerics(compute_dtype=torch.float32)
    kw = dict(alpha=1.0, epilogue_abs=np.zeros_like(p))
    det = TG.gemm_error(p_abs, p, 4096, num)
    lam = TP.lambda_for(P, TP.rounding_events(p.size, 4096), U32)
    prob = TG.gemm_error(p_abs, p, 4096, num, accumulation_gamma=TP.accumulation_gamma(lam))
    np.testing.assert_allclose(det - prob, (TPR.gamma(4096, U32) - TP.gamma_tilde(4096, U32, lam))
                               * p_abs, rtol=1e-9)
    full = TP.gemm_prob_tolerances(p_abs, p, p, 4096, torch.float32, num, P, **kw)["out"]
    assert (full < TG.gemm_tolerances(p_abs, p, p, 4096, torch.float32, num, **kw)["out"]).all()


@pytest.mark.parametrize("declared", [{"accumulator_unit_roundoff": 2.0 ** -23},
                                      {"alignment_floor": torch.float16}])
def test_truncating_accumulators_keep_the_deterministic_bound(declared):
    """Tensor-core truncation (Fasi et al. 2021) is not mean-zero: Higham-Mary's model M does
    not hold, so such a declaration keeps gamma_K and can never be suspicious through it."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 2048)), rng.standard_normal((2048, 8))
    p, p_abs = a @ b, np.abs(a) @ np.abs(b)
    num = Numerics(compute_dtype=torch.float32, **declared)
    kw = dict(alpha=1.0, epilogue_abs=np.zeros_like(p))
    np.testing.assert_array_equal(
        TP.gemm_prob_tolerances(p_abs, p, p, 2048, torch.float16, num, P, **kw)["out"],
        TG.gemm_tolerances(p_abs, p, p, 2048, torch.float16, num, **kw)["out"])


# ---- correct backends: no false alarm ----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_correct_torch_gemm_at_large_k_is_not_suspicious(dtype):
    """Zero-mean normal data, K = 4096, 24 seeds: every case is judged by the probabilistic
    bound (tighter than the deterministic one here) and none is flagged."""
    spec = get_spec("gemm")
    worst = 0.0
    for seed in range(24):
        rep = run_case(spec, make_case("TN", dtype, 48, 40, 4096, seed=seed),
                       backends=["torch"], probabilistic=P)
        (c,) = rep.comparisons
        assert c.metrics.prob_ratio is not None and c.metrics.passed, rep.describe()
        assert not c.metrics.suspicious and rep.graded_verdict == "pass", rep.describe()
        assert c.metrics.fa_ratio == 1.0  # torch is the same-precision computation
        worst = max(worst, c.metrics.prob_ratio)
    assert 0.0 < worst <= 1.0


def test_correct_torch_qgemm_and_epilogues_are_not_suspicious():
    spec = get_spec("gemm")
    cases = [make_case("NT", "bfloat16", 33, 17, 3000, bias=True, gelu=True, alpha=-2.0,
                       seed=s) for s in range(6)]
    cases += [make_case("TT", "float16", 20, 31, 2048, out_dtype="float32", beta=1.0, seed=s)
              for s in range(6)]
    for case in cases:
        rep = run_case(spec, case, backends=["torch"], probabilistic=P)
        assert rep.graded_verdict == "pass", rep.describe()
        assert all(c.metrics.prob_ratio is not None for c in rep.comparisons)
    q = get_spec("qgemm")
    for seed in range(6):
        rep = run_case(q, _qgemm_case(4096, seed), backends=["torch"], probabilistic=P)
        assert rep.graded_verdict == "pass", rep.describe()
        assert rep.comparisons[0].metrics.prob_ratio is not None


# ---- what it adds ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, dtype", [("scale_ulp", "float16"), ("scale_ulp", "float32"),
                                         ("row_bias_ulp", "float16"),
                                         ("partial_sums_in_input_dtype", "float16"),
                                         ("acc_16_bits", "float32")])
def test_bug_the_deterministic_tier_misses_at_large_k_is_suspicious(make_backend, name, dtype):
    """Each seeded bug passes the deterministic gemm tier at K = 4096 (its bound is ~20 fp16
    ulps wide on zero-mean data) and is graded suspicious by the probabilistic check."""
    wrong = _mutant(make_backend, name)
    rep = run_case(get_spec("gemm"), make_case("TN", dtype, 128, 128, 4096, seed=1001),
                   backends=["torch", wrong], probabilistic=P)
    info = rep.describe()
    assert rep.verdict == "pass", info  # invisible to the deterministic bound ...
    assert rep.graded_verdict == "suspicious", info  # ... but not to the probabilistic one
    assert [c.lhs for c in rep.suspicious] == [wrong], info
    assert "SUSP" in info and "TEALITE_VERIFY_PROBABILISTIC=1e-09" in info
    fa = [c.metrics.fa_ratio for c in rep.comparisons if c.lhs == wrong][0]
    assert fa > 1.0, info  # the FlashAttention-style cross-check sees it too


def test_qgemm_scale_off_by_one_fp16_ulp_is_suspicious(make_backend):
    wrong = _mutant(make_backend, "qgemm_one_scale_ulp")
    rep = run_case(get_spec("qgemm"), _qgemm_case(4096, 5, m=128, n=128),
                   backends=["torch", wrong], probabilistic=P)
    assert rep.verdict == "pass" and rep.graded_verdict == "suspicious", rep.describe()


def test_without_the_flag_the_same_bug_passes_silently(make_backend):
    """Off by default: no probabilistic fields, and every deterministic verdict and metric is
    the same as with the check on (it only adds fields)."""
    wrong = _mutant(make_backend, "scale_ulp")
    spec, case = get_spec("gemm"), make_case("TN", "float16", 128, 128, 4096, seed=1001)
    off = run_case(spec, case, backends=["torch", wrong])
    on = run_case(spec, case, backends=["torch", wrong], probabilistic=P)
    assert off.probabilistic is None and off.graded_verdict == off.verdict == "pass"
    assert not off.suspicious and "SUSP" not in off.describe()
    assert all(c.metrics.prob_ratio is None and c.metrics.fa_ratio is None
               for c in off.comparisons)
    assert [c.metrics for c in off.comparisons] == [
        dataclasses.replace(c.metrics, prob_ratio=None, fa_ratio=None) for c in on.comparisons]
    # Pairwise comparisons never carry it.
    assert all(c.metrics.prob_ratio is None for c in on.comparisons if c.rhs != "reference")


def test_environment_variable_turns_it_on(monkeypatch, make_backend):
    """How fuzz workers get it: run_case reads $TEALITE_VERIFY_PROBABILISTIC by default."""
    wrong = _mutant(make_backend, "scale_ulp")
    monkeypatch.setenv(TP.ENV_VAR, "1e-6")
    rep = run_case(get_spec("gemm"), make_case("TN", "float16", 64, 64, 4096, seed=3),
                   backends=[wrong])
    assert rep.probabilistic == 1e-6 and rep.graded_verdict == "suspicious", rep.describe()
    assert rep.to_dict()["graded_verdict"] == "suspicious"
    assert rep.to_dict()["comparisons"][0]["metrics"]["suspicious"] is True


def test_run_reports_suspicious_apart_and_fails_only_when_asked(make_backend, monkeypatch,
                                                                capsys):
    """``run``: a suspicious case is printed and counted in its own table, exit 0; exit 1 with
    --fail-on-suspicious; nothing of it without the flag.  The case list is narrowed to one
    large-K case (the main job's own cases have K <= 256, where the bug fails outright)."""
    from tealite_verify import cli
    wrong = _mutant(make_backend, "scale_ulp")
    spec = dataclasses.replace(get_spec("gemm"), smoke_cases=())
    monkeypatch.setattr(cli, "get_spec", lambda op: spec)
    monkeypatch.setattr(cli, "_stratified", lambda spec, args: [])
    monkeypatch.setattr(cli, "drawn_cases", lambda *a: [
        make_case("TN", "float16", 128, 128, 4096, seed=1001)])
    base = ["run", "--op", "gemm", "--backend", "torch", "--backend", wrong]
    assert main(base + ["--probabilistic"]) == 0
    out, err = capsys.readouterr()
    assert "probabilistic check" in out and "1 suspicious case(s) (not failures)" in out
    assert f"SUSP {wrong} vs reference" in err and "0 failing case(s)" in out
    assert main(base + ["--fail-on-suspicious"]) == 1
    assert "--fail-on-suspicious: exit 1" in capsys.readouterr().out
    assert main(base) == 0
    out, err = capsys.readouterr()
    assert "probabilistic" not in out and "SUSP" not in err  # off by default


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, 1, 1.5, -1e-9, float("nan"), "often", None])
def test_probability_outside_the_open_unit_interval_is_refused(bad):
    with pytest.raises(ValueError, match=r"false_alarm_probability must be a probability in "
                                         r"\(0, 1\)"):
        TP.check_probability(bad)
    with pytest.raises(ValueError, match="probabilistic must be a probability"):
        run_case(get_spec("gemm"), make_case("TN", "float32", 4, 4, 4), backends=["torch"],
                 probabilistic=bad if bad is not None else "x")


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(TP.ENV_VAR, "2")
    with pytest.raises(ValueError, match="TEALITE_VERIFY_PROBABILISTIC must be a probability"):
        run_case(get_spec("gemm"), make_case("TN", "float32", 4, 4, 4), backends=["torch"])


@pytest.mark.parametrize("cmd", ["run", "fuzz"])
def test_cli_refuses_a_bad_probability_by_name(cmd, capsys):
    assert main([cmd, "--op", "gemm", "--probabilistic", "1.5"]) == 2
    assert "--probabilistic must be a probability in (0, 1), got '1.5'" in capsys.readouterr().err


def test_gamma_tilde_and_lambda_refuse_nonsense():
    with pytest.raises(ValueError, match="gamma_tilde needs"):
        TP.gamma_tilde(-1, U32, 1.0)
    with pytest.raises(ValueError, match="gamma_tilde needs"):
        TP.gamma_tilde(10, 1.5, 1.0)
    with pytest.raises(ValueError, match="p_case must be a probability"):
        TP.lambda_for(0.0, 10, U32)
    with pytest.raises(ValueError, match="numel and k must be >= 0"):
        TP.rounding_events(-1, 3)


# ---- fuzz report -------------------------------------------------------------------------------

def test_fuzz_worker_and_report_carry_the_suspicious_verdict(make_backend):
    wrong = _mutant(make_backend, "scale_ulp")
    rep = run_case(get_spec("gemm"), make_case("TN", "float16", 128, 128, 4096, seed=1001),
                   backends=["torch", wrong], probabilistic=P)
    ev = {"event": "done", "op": "gemm", "verdict": rep.verdict,
          "backends": fuzz_worker._backend_stats(rep), **fuzz_worker._suspicious_events(rep)}
    assert ev["backends"][wrong]["suspicious"] and not ev["backends"]["torch"]["suspicious"]
    st = fuzz_report.Stats()
    st.add_case(ev)
    st.add_case({"event": "done", "op": "gemm", "verdict": "pass",
                 "backends": {"torch": {"status": "ok", "ratio": 0.5}}})  # check off
    assert st.suspicious_cases == 1 and st.per[("gemm", wrong)].suspicious == 1
    assert st.per[("gemm", "torch")].prob_cases == 1 and st.per[("gemm", "torch")].cases == 2
    table = fuzz_report.summary_table(st)
    assert "suspicious" in table.splitlines()[0] and "max err/err(torch)" in table
    doc = fuzz_report.json_report({"ops": ["gemm"], "device": "cpu", "seed": 0}, {}, st, 1.0,
                                  [], [], False)
    prob = doc["probabilistic"]
    assert prob["suspicious_cases"] == 1 and prob["suspicious"][0]["backend"] == wrong
    assert "TEALITE_VERIFY_PROBABILISTIC" in prob["suspicious"][0]["repro"]
    assert doc["table"][0]["suspicious"] in ("0", "1")
    md = fuzz_report.markdown(doc)
    assert "Probabilistic check" in md and wrong in md
    # With the check off nothing of it shows.
    plain = fuzz_report.Stats()
    plain.add_case({"event": "done", "op": "gemm", "verdict": "pass",
                    "backends": {"torch": {"status": "ok", "ratio": 0.5}}})
    assert "suspicious" not in fuzz_report.summary_table(plain)
    assert fuzz_report.json_report({}, {}, plain, 1.0, [], [], False)["probabilistic"] is None
