"""The mutation score (tealite_verify/mutate/, docs/mutation.md): the CI-profile suite kills
every must-kill operator; survivors are classified (undetectable by design / not exercised);
the mutant plug-in, the fuzz stage and the CLI's bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from tealite import registry
from tealite_verify.cli import main
from tealite_verify.mutate import base, plugin
from tealite_verify.mutate import fuzz as mutate_fuzz
from tealite_verify.mutate.base import Mutation, bump_ulps, library, on_output, with_params
from tealite_verify.mutate.runner import (KILLED_SUITE, NOT_EXERCISED, SURVIVED, UNDETECTABLE,
                                          FuzzResult, Score, outputs_differ, suite_score)

LIBRARY = library()
MUST_KILL = sorted(n for n, m in LIBRARY.items() if m.must_kill)
# The op list: every one has operators.
OPS = ("gemm", "qgemm", "quantize", "dequantize", "amax", "delayed_scaling_update",
       "rmsnorm_fwd", "rmsnorm_bwd", "layernorm_fwd", "layernorm_bwd", "act_fwd", "act_bwd",
       "dbias_dact", "layernorm_fwd_quantize", "rmsnorm_fwd_quantize", "act_fwd_quantize",
       "shuffle_weight", "shuffle_e8m0")


def test_library_spans_the_ops_and_operator_kinds():
    assert len(LIBRARY) >= 30
    assert set(OPS) <= {m.op for m in LIBRARY.values()}
    kinds = {m.kind for m in LIBRARY.values()}
    assert {"rounding-mode", "scale-exponent", "k-ulp", "operand", "epilogue", "precision",
            "tail", "layout", "reduction", "axis", "format", "saturation"} <= kinds
    for m in LIBRARY.values():
        assert m.must_kill or m.why_not, m.name


@pytest.mark.parametrize("name", MUST_KILL)
def test_ci_suite_kills_must_kill_operator(name):
    """The suite's CI-profile cases (all dtypes of the op) kill it: a comparison fails while
    torch passes the same case."""
    res = suite_score(LIBRARY[name])
    assert res.complete and res.killed >= 1, (name, res)
    assert res.first_kill is not None and "raised" not in res.first_kill["detail"], \
        "a kill must be a failed comparison, not the mutation's own code crashing"


def test_undetectable_by_design_is_classified():
    """1 fp32 ulp in rsigma: outputs change on most cases, every err/tol stays < 1."""
    m = LIBRARY["layernorm_fwd.rsigma_1ulp_last_row"]
    score = Score(m, suite_score(m, stop_at_first_kill=False))
    assert not m.must_kill
    assert (score.verdict, score.reason) == (SURVIVED, UNDETECTABLE), score.suite
    assert score.suite.changed > score.suite.cases // 2
    assert 0.0 < score.suite.max_ratio_changed < 1.0
    # The same bug 4096 ulps large is caught: the verdict follows the effect's size.
    big = Score(LIBRARY["layernorm_fwd.rsigma_4096ulp_last_row"],
                suite_score(LIBRARY["layernorm_fwd.rsigma_4096ulp_last_row"]))
    assert big.verdict == KILLED_SUITE


def _temporary(m: Mutation):
    base.register(m)
    return m


def test_not_exercised_is_classified():
    """A bug on a path no suite case takes (alpha == 1234.5) changes no output."""
    m = Mutation("gemm.test_never_taken", "gemm", "epilogue", "bias dropped at alpha 1234.5",
                 with_params(lambda kw: dict(kw, bias=None) if kw["alpha"] == 1234.5 else kw),
                 must_kill=False, why_not="test")
    score = Score(m, suite_score(m, dtypes=["bfloat16"]))
    assert (score.verdict, score.reason) == (SURVIVED, NOT_EXERCISED), score.suite
    assert score.suite.cases > 0 and score.suite.changed == 0


def test_mutant_backend_is_declared_like_torch_and_removed_after():
    m = LIBRARY["gemm.bias_dropped"]
    torch_impls = registry.get_backend("torch").impls
    with pytest.raises(RuntimeError), plugin.registered(m) as b:
        assert set(b.impls) == set(torch_impls)
        for op, impl in b.impls.items():
            assert impl.support is torch_impls[op].support
            assert impl.numerics is torch_impls[op].numerics
        assert b.impls["gemm"].fn is not torch_impls["gemm"].fn
        assert b.impls["act_fwd"].fn is torch_impls["act_fwd"].fn
        assert not b.auto_dispatch
        raise RuntimeError("leave the block abnormally")
    assert plugin.NAME not in registry.backends()


def _import_plugin(mutant: str) -> subprocess.CompletedProcess:
    code = ("from tealite import registry; registry.load_plugins(); "
            "print(registry.plugin_load_errors()); "
            "b = registry.backends().get('mutant'); print(b.description if b else None)")
    env = dict(os.environ, TEALITE_BACKEND_MODULES="tealite_verify.mutate.plugin",
               TEALITE_MUTANT=mutant)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_plugin_registers_from_the_environment():
    ok = _import_plugin("amax.signed_max")
    assert ok.returncode == 0, ok.stderr
    assert "[]" in ok.stdout and "amax.signed_max" in ok.stdout
    bad = _import_plugin("amax.nosuch")
    assert "TEALITE_MUTANT='amax.nosuch'" in bad.stdout and "None" in bad.stdout


def test_patch_is_seen_only_by_the_mutant_thread():
    from tealite.backends.torch import quantize as TQB
    seen = {}
    original = TQB.fp8_cast_rne
    with base.patched(TQB, "fp8_cast_rne", lambda orig: (lambda v, fmt: "mutated")):
        seen["here"] = TQB.fp8_cast_rne(None, None)
        t = threading.Thread(target=lambda: seen.__setitem__(
            "other", TQB.fp8_cast_rne(torch.ones(2), _fmt("e4m3"))))
        t.start()
        t.join()
    assert seen["here"] == "mutated"
    assert seen["other"].dtype == torch.float8_e4m3fn
    assert TQB.fp8_cast_rne is original


def _fmt(name):
    from tealite.formats import get_format
    return get_format(name)


def test_bump_ulps_moves_away_from_zero_and_stays_finite():
    t = torch.tensor([1.0, -1.0, 0.0, 3.0e38], dtype=torch.bfloat16)
    assert bump_ulps(t, 1, 0)[0].item() == 1.0078125
    assert bump_ulps(t, 2, 1)[1].item() == -1.015625
    assert bump_ulps(t, 1, 2)[2].item() > 0  # the smallest subnormal
    assert torch.isfinite(bump_ulps(t, 1 << 20, 3)).all()
    assert bump_ulps(t, 1 << 20, 3)[3].item() == torch.finfo(torch.bfloat16).max
    assert torch.equal(bump_ulps(t, 1, 0)[1:], t[1:])


def test_outputs_differ_sees_bits():
    z = torch.tensor([0.0])
    assert outputs_differ({"y": z}, {"y": -z})
    assert not outputs_differ({"y": torch.tensor([float("nan")])},
                              {"y": torch.tensor([float("nan")])})
    assert outputs_differ({"y": z}, {"y": z, "extra": z})
    assert outputs_differ({"y": z}, {"y": z.double()})


def test_fuzz_stage_finds_a_mutant_and_reads_the_time():
    """One real campaign on a mutant the fuzzer finds at once (any negative maximum)."""
    res = mutate_fuzz.fuzz_mutant(LIBRARY["amax.signed_max"], 20)
    assert res.killed, res
    # Read from the JSON report: within the campaign, so within the subprocess's wall time.
    assert res.time_to_finding_s is not None and 0 <= res.time_to_finding_s <= res.wall_s + 1
    assert res.cases >= 1 and "amax" in res.finding


def test_fuzz_finding_that_fails_on_torch_is_not_a_kill(monkeypatch, tmp_path):
    finding = {"kind": "mismatch", "op": "amax", "backends": ["mutant"], "output": "amax",
               "detail": "x", "case": {}, "first_seen": "2026-01-01T00:00:05+0000"}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(finding))
    doc = {"finished": "2026-01-01T00:00:10+0000", "totals": {"elapsed_s": 10.0, "cases": 7},
           "findings": [{"backends": ["mutant"], "path": str(path)}]}
    monkeypatch.setattr(mutate_fuzz, "torch_fails_too", lambda f: True)
    res = FuzzResult(seconds=10.0)
    mutate_fuzz._judge(res, doc)
    assert not res.killed and "false alarm" in res.note
    monkeypatch.setattr(mutate_fuzz, "torch_fails_too", lambda f: False)
    res = FuzzResult(seconds=10.0)
    mutate_fuzz._judge(res, doc)
    assert res.killed and res.time_to_finding_s == 5.0 and res.cases == 7


# ---- the CLI ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,named", [
    (["--op", "nosuch"], "--op 'nosuch'"),
    (["--op", "quant_roundtrip"], "--op 'quant_roundtrip'"),
    (["--operator", "gemm.nosuch"], "--operator 'gemm.nosuch'"),
    (["--minutes", "0"], "--minutes"),
    (["--fuzz-seconds", "-1"], "--fuzz-seconds"),
    (["--dtype", "float64"], "--dtype 'float64'"),
    (["--thresholds", "--op", "nosuch"], "--op 'nosuch'"),
    (["--thresholds", "--operator", "gemm.bias_dropped"], "--operator"),
])
def test_bad_input_is_a_clear_error(capsys, argv, named):
    assert main(["mutate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err


def test_cli_reports_and_exits_1_when_a_must_kill_operator_survives(capsys, tmp_path):
    noop = _temporary(Mutation("amax.test_noop", "amax", "formula", "no change",
                               on_output(lambda t, a, kw: t)))
    try:
        path = tmp_path / "m.json"
        rc = main(["mutate", "--operator", noop.name, "--operator", "amax.signed_max",
                   "--fuzz", "none", "--json", str(path), "--markdown", str(tmp_path / "m.md")])
    finally:
        base._LIBRARY.pop(noop.name)
    assert rc == 1
    captured = capsys.readouterr()
    assert "must-kill operator not killed: amax.test_noop (survived: not-exercised)" in \
        captured.err
    doc = json.loads(path.read_text())
    verdicts = {o["operator"]: o["verdict"] for o in doc["operators"]}
    assert verdicts == {"amax.test_noop": "survived", "amax.signed_max": "killed-suite"}
    assert "| amax.signed_max | amax | yes | killed-suite |" in (tmp_path / "m.md").read_text()


def test_cli_thresholds_for_one_op(capsys):
    assert main(["mutate", "--thresholds", "--op", "amax", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("amax"))
    assert row.split()[:7] == ["amax", "amax", "exact", "bfloat16", row.split()[4], "1", "1"]
