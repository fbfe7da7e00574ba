"""ci/false_alarm_campaign.sh, the false-alarm campaign as one command (issue 13): sized by
cases, 0 on a clean campaign, non-zero on any finding, on a short campaign and on bad
arguments; its summary (ci/false_alarm_summary.py)."""
from __future__ import annotations

import importlib.util
import json
import subprocess

from _helpers_fuzz import ROOT, env_with

SCRIPT = ROOT / "ci" / "false_alarm_campaign.sh"
_spec = importlib.util.spec_from_file_location("false_alarm_summary",
                                               ROOT / "ci" / "false_alarm_summary.py")
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)


def campaign(tmp_path, *args, timeout=240, **env):
    e = env_with(env.pop("plugins", None), INTERPRET="0", WORKERS="1", **env)
    e.pop("TRITON_INTERPRET", None)  # the interpreted Triton backends: too slow for a test
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=e, capture_output=True,
                          text=True, timeout=timeout)


def test_verdicts():
    assert summary.verdict({"cases": 10, "findings": 0}, 10, 0, False)[0] == 0
    assert summary.verdict({"cases": 10, "findings": 2}, 10, 1, False)[0] == 1
    assert summary.verdict({"cases": 5, "findings": 0}, 10, 0, False)[0] == 3
    assert summary.verdict({"cases": 5, "findings": 0}, 10, 130, True)[0] == 130
    assert summary.verdict({"cases": 50, "findings": 0}, 10, 2, False)[0] == 2
    # A finding wins over everything: it is what the campaign exists to surface.
    assert summary.verdict({"cases": 5, "findings": 1}, 10, 130, True)[0] == 1


def test_clean_campaign_reaches_its_cases_and_writes_the_reports(tmp_path):
    out = tmp_path / "out"
    r = campaign(tmp_path, "cpu", "300", "7", str(out), OPS="amax")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    s = json.loads((out / "campaign.json").read_text())
    assert s["cases"] >= 300 and s["findings"] == 0 and s["seed"] == 7
    assert s["ran"]["amax"]["torch"] >= 300 and s["cases_per_s"] > 0
    md = (out / "campaign.md").read_text()
    assert "0 findings" in md and "ci/false_alarm_campaign.sh cpu 300 7" in md
    for name in ("report.json", "report.md", "list.txt", "fuzz.log"):
        assert (out / name).stat().st_size > 0, name
    assert "probed on this machine" in (out / "list.txt").read_text()


def test_any_finding_fails_the_campaign(tmp_path):
    """The deliberately wrong external GEMM backend (tests/external) is found."""
    out = tmp_path / "out"
    r = campaign(tmp_path, "cpu", "400", "3", str(out), OPS="gemm", MAX_MINUTES="1",
                 plugins="wrong_gemm_backend", ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    s = json.loads((out / "campaign.json").read_text())
    assert s["findings"] >= 1 and any("wrong_gemm" in f["backends"] for f in s["found"])
    assert list((out / "corpus").glob("*.json"))


def test_time_cap_before_the_cases_is_not_a_pass(tmp_path):
    r = campaign(tmp_path, "cpu", "100000000", "1", str(tmp_path / "out"), OPS="amax",
                 MAX_MINUTES="0.1")
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    assert "of 100000000 cases before the time cap" in r.stdout


def test_bad_arguments(tmp_path):
    for args, msg in ((["gpu", "10", "1"], "DEVICE must be cpu or cuda"),
                      (["cpu", "0", "1"], "CASES must be a positive integer"),
                      (["cpu", "10", "-1"], "SEED must be a non-negative integer"),
                      (["cpu"], "one command")):
        r = campaign(tmp_path, *args, timeout=30)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
