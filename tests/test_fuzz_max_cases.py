"""``fuzz --max-cases N``: a campaign sized by cases (issue 13's false-alarm campaign,
ci/false_alarm_campaign.sh), stopped by the count well before its time budget."""
from __future__ import annotations

import subprocess
import sys
import time

from _helpers_fuzz import ROOT, env_with, report, run_fuzz, stored

from tealite_verify.fuzz.supervisor import reached_max_cases


def test_reached_max_cases():
    assert not reached_max_cases(10**9, None)  # no count: time only
    assert not reached_max_cases(99, 100)
    assert reached_max_cases(100, 100) and reached_max_cases(101, 100)


def test_campaign_stops_at_the_case_count_not_the_deadline(tmp_path):
    t0 = time.monotonic()
    r = run_fuzz(tmp_path, "--op", "amax", "--backend", "torch", "--minutes", "10",
                 "--max-cases", "300", "--seed", "2", env=env_with())
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]  # stopped by count: not interrupted
    doc = report(tmp_path)
    # The cases in flight when the count is reached still finish (workers are signalled).
    assert 300 <= doc["totals"]["cases"] < 300 + 2000, doc["totals"]
    assert doc["config"]["max_cases"] == 300
    assert took < 240, took  # far inside the 10-minute budget
    assert stored(tmp_path) == {}


def test_max_cases_must_be_positive():
    r = subprocess.run([sys.executable, "-m", "tealite_verify", "fuzz", "--max-cases", "0"],
                       cwd=ROOT, env=env_with(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--max-cases: expected a positive integer" in r.stderr
