"""ci/verdicts.py (issue 14's "verdicts do not change"): a recorded baseline checks clean, and
a changed verdict or metric is reported with exit 1."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "ci" / "verdicts.py"
CASE = {"shape": [7, 33], "dtype": "bfloat16", "seed": 2,
        "dist": {"kind": "wide", "log2_lo": -12, "log2_hi": 12}}


@pytest.fixture
def verdicts(monkeypatch):
    spec = importlib.util.spec_from_file_location("ci_verdicts", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "_cases", lambda seeds, examples: [("amax", CASE)])
    return mod


def test_a_recorded_baseline_checks_clean_and_a_change_is_caught(verdicts, tmp_path):
    base = tmp_path / "v.json.gz"
    assert verdicts.main(["record", str(base)]) == 0
    assert verdicts.main(["check", str(base)]) == 0
    with gzip.open(base, "rt") as f:
        data = json.load(f)
    torch_ref = next(c for c in data["results"][0]["report"]["comparisons"]
                     if c["lhs"] == "torch" and c["rhs"] == "reference")
    torch_ref["metrics"]["max_abs_err"] = 1.0  # as if the tier had judged differently
    with gzip.open(base, "wt") as f:
        json.dump(data, f)
    report = tmp_path / "diff.json"
    assert verdicts.main(["check", str(base), "--report", str(report)]) == 1
    assert "max_abs_err" in report.read_text()


def test_check_refuses_another_interpreter_setting(verdicts, tmp_path, monkeypatch):
    base = tmp_path / "v.json.gz"
    assert verdicts.main(["record", str(base)]) == 0
    other = "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1"
    monkeypatch.setenv("TRITON_INTERPRET", other)
    assert verdicts.main(["check", str(base)]) == 2
