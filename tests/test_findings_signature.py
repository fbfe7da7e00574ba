"""Finding signatures name the bug: op, output, kind, backends and the case class (recipe
family with roundings, format, saturation, dtype, tier, edge class) — issue 13: a new bug in
the same op and output must not hide behind an old finding."""
from __future__ import annotations

import json

from tealite_verify import coverage
from tealite_verify.fuzz.findings import Corpus, make_signature, new_finding

DELAYED = {"kind": "delayed", "fmt": "e4m3", "scale": 48.0, "saturation": "saturate"}
ROW_AITER = {"kind": "current", "fmt": "e4m3", "granularity": "row", "force_pow2_scales": False,
             "amax_epsilon": 0.0, "saturation": "saturate", "scale_rule": "amax/fmax"}


def _case(recipe, dist, dtype="float32", shape=(1, 28)):
    return {"kind": "swiglu", "shape": list(shape), "dtype": dtype, "dist": dist, "seed": 0,
            "recipe": recipe, "return_amax": False}


def _finding(case, tier="code-interval"):
    return new_finding("mismatch", "act_fwd_quantize", ["torch"], case, "cpu", output="data",
                       metrics={"tier": tier})


def test_same_class_same_signature_on_another_case():
    a = _finding(_case(DELAYED, {"kind": "normal", "scale": 4.0}))
    b = _finding(_case(dict(DELAYED, scale=3.0), {"kind": "normal", "scale": 1.0},
                       shape=(7, 64)))
    assert a.signature == b.signature


def test_the_issue_13_collision_is_two_findings():
    # The committed delayed-scaling finding and the swiglu all-zero-row NaN codes shared one
    # signature before the case class was part of it.
    old = _finding(_case(DELAYED, {"kind": "normal", "scale": 4.0}))
    new = _finding(_case(ROW_AITER, {"kind": "integers", "hi": 1}, shape=(1, 2)))
    assert old.signature != new.signature
    assert new.case_class["recipe"] == "current/row/aiter"
    assert new.case_class["edge"] == coverage.TIES


def test_each_class_field_separates():
    base = _case(DELAYED, {"kind": "normal", "scale": 1.0})
    sig = _finding(base).signature
    variants = [
        _case(dict(DELAYED, fmt="e5m2"), base["dist"]),                     # format
        _case(dict(DELAYED, saturation="nonfinite"), base["dist"]),         # saturation
        _case(DELAYED, base["dist"], dtype="bfloat16"),                     # dtype
        _case(DELAYED, {"kind": "specials", "frac": 0.1}),                  # edge class
        _case(DELAYED, base["dist"], shape=(0, 28)),                        # empty
    ]
    sigs = {_finding(v).signature for v in variants}
    assert sig not in sigs and len(sigs) == len(variants)
    assert _finding(base, tier="exact").signature != sig                    # tier
    mx = {"kind": "mx", "fmt": "e2m1", "scale_rounding": "floor", "element_rounding": "rne"}
    rne = _finding(_case(mx, base["dist"], shape=(1, 64))).signature
    away = _finding(_case(dict(mx, element_rounding="ties_away"), base["dist"],
                          shape=(1, 64))).signature
    assert rne != away                                                      # rounding


def test_retriage_renames_and_merges(tmp_path):
    corpus = Corpus(tmp_path)
    a = _finding(_case(DELAYED, {"kind": "normal", "scale": 4.0}))
    b = _finding(_case(dict(DELAYED, scale=2.0), {"kind": "normal", "scale": 1.0}))
    want = a.signature
    for f in (a, b):  # stored under the old, class-free signature
        f.signature = make_signature(f.kind, f.op, f.backends, f.output, None)
        f.case_class = {}
        corpus.root.joinpath(f"{f.op}-{f.kind}-{f.signature[:12]}-{f.case['seed']}{id(f)}.json"
                             ).write_text(json.dumps(f.to_json()))
    moves = corpus.retriage()
    assert len(moves) == 2
    stored = corpus.all()
    assert len(stored) == 1 and stored[0][1].count == 2
    assert stored[0][1].signature == want
    assert corpus.retriage() == []  # idempotent
