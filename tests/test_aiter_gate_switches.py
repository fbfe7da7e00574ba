"""The AITER gate reaches entry points that only a backend switch selects
(``tealite_verify.gate.caseset.SWITCHES``: AITER's fused attention backward): the committed
baseline holds their cases, a record's switch is applied when a compare re-runs it, and an
unknown switch is refused by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tealite import registry
from tealite.backends.aiter_triton import attention_fused_bwd as FB
from tealite_verify.gate import capture, caseset
from tealite_verify.specs.attention import make_case

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "ci" / "baselines" / "aiter-gate-cpu-interpreter.json"
REASON = registry.get_backend("aiter_triton").unavailable_reason()


def test_a_switch_selects_its_kernel_only_inside_its_context(monkeypatch):
    monkeypatch.delenv(FB.ENV_BWD, raising=False)
    with caseset.switch_context("fused-bwd"):
        assert FB.fused_selected()
    assert not FB.fused_selected()
    with caseset.switch_context(None):
        assert not FB.fused_selected()
    with pytest.raises(ValueError, match="unknown switch 'fast-bwd'.*fused-bwd"):
        caseset.switch_context("fast-bwd")


def test_the_committed_baseline_runs_every_switch():
    doc = json.loads(BASELINE.read_text())
    for (op, backend), table in caseset.SWITCHES.items():
        plain = [c for c in doc["cases"] if (c["op"], c["backend"]) == (op, backend)
                 and "switch" not in c]
        for switch in table:
            runs = [c for c in doc["cases"] if c.get("switch") == switch and
                    (c["op"], c["backend"]) == (op, backend)]
            if plain:  # an op the interpreter runs at all (not FP8 attention)
                assert any(c["verdict"] == "pass" for c in runs), (op, switch)
    fused = [c for c in doc["cases"] if c.get("entry_point") == FB.FUSED_BWD]
    assert fused and all(c.get("switch") == "fused-bwd" for c in fused)
    assert f"aiter_triton:{FB.FUSED_BWD}" in doc["contracts"]


@pytest.mark.skipif(REASON is not None, reason=f"aiter_triton: {REASON}")
def test_a_compare_reruns_a_record_under_its_switch(monkeypatch):
    """A case only the fused backward takes (head dim 24, not a power of 2): re-run under the
    record's switch it runs there; the same record without it is refused (the one kernel)."""
    doc = json.loads(BASELINE.read_text())
    case = make_case("bshd", "none", "float32", batch=1, sq=5, sk=7, heads_q=2, heads_kv=1,
                     d_qk=24, d_v=24)
    record = {"index": 0, "op": "attention_bwd", "backend": "aiter_triton", "key": "k",
              "case": case, "switch": "fused-bwd"}
    plain = dict(record, index=1)
    del plain["switch"]
    base = dict(doc, cases=[record, plain])
    # only the records matter here: the document's probes and scans are other tests'
    monkeypatch.setattr(capture, "_document", lambda records, settings, device:
                        {"cases": records})
    got = {r["index"]: r for r in capture.rerun(base)["cases"]}
    assert got[0]["switch"] == "fused-bwd" and got[0]["entry_point"] == FB.FUSED_BWD
    assert got[0]["verdict"] == "pass", got[0]
    assert "switch" not in got[1] and got[1]["status"] == "unsupported"
