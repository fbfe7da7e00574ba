"""The HTML report (issue 18, ``run --html`` / ``fuzz --html``): generated for a tiny run, self-
contained (every image a data URI, no link or source outside the page), with every section,
and a deliberately wrong backend's worst case listed with a repro command that reproduces it.
The page's checks are shown catching a page that breaks them."""
from __future__ import annotations

import base64
import html
import json
import math
import re
import shlex

import pytest

pytest.importorskip("matplotlib", reason="the HTML report needs matplotlib (the test extra)")

import torch  # noqa: E402

from tealite.registry import get_backend  # noqa: E402
from tealite_verify.cli import main  # noqa: E402
from tealite_verify.fuzz.findings import new_finding  # noqa: E402
from tealite_verify.fuzz.report import Stats  # noqa: E402
from tealite_verify.report import fuzz as fuzz_report  # noqa: E402
from tealite_verify.report import page  # noqa: E402
from tealite_verify.report.model import (TOP_BIN, ZERO_BIN, Headroom, bin_upper_edge,  # noqa
                                         bins_above_one, ratio_bin)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def outside_references(text: str) -> list[str]:
    """Everything in the page that would load something from outside it: a src that is not
    an image data URI, an href that is not an anchor in the page, a script, stylesheet link,
    CSS import or url()."""
    bad = [f"src={v}" for v in re.findall(r"""\bsrc\s*=\s*["']?([^"'\s>]*)""", text)
           if not v.startswith(("data:image/png;base64,", "data:image/svg+xml"))]
    bad += [f"href={v}" for v in re.findall(r"""\bhref\s*=\s*["']?([^"'\s>]*)""", text)
            if not v.startswith("#")]
    bad += [m for m in re.findall(r"<script|<link|@import|url\(|<iframe", text, re.I)]
    return bad


def image_payloads(text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'<img [^>]*src="data:image/png;base64,'
                                                     r'([A-Za-z0-9+/=]+)"', text)]


def rows_of(text: str, section: str) -> list[tuple[str, list[str]]]:
    """(row class, cell texts unescaped) of the section's table rows."""
    body = text.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]
    out = []
    for cls, row in re.findall(r'<tr(?: class="([^"]*)")?>(.*?)</tr>', body, re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c))
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        out.append((cls, cells))
    return out


def test_the_self_containment_check_catches_outside_references():
    good = '<img src="data:image/png;base64,AAAA"><a href="#worst">x</a>'
    assert outside_references(good) == []
    for bad in ('<img src="https://example.org/a.png">', '<img src="plot.png">',
                '<a href="report.css">', '<script>1</script>', '<style>@import "x";</style>',
                '<div style="background:url(x.png)">'):
        assert outside_references(good + bad), bad


@pytest.fixture
def wrong_gemm(make_backend):
    """torch's GEMM with every output 1 % too large: beyond any tier's bound wherever the
    product is not tiny."""
    b = make_backend("html_wrong_gemm")
    torch_gemm = get_backend("torch").impls["gemm"].fn

    @b.implements("gemm", like="torch")
    def gemm(a, bb, **kw):
        d, pre = torch_gemm(a, bb, **kw)
        return d.mul_(1.01), pre
    return b.name


def test_run_html_page(tmp_path, capsys, wrong_gemm):
    path = tmp_path / "report.html"
    rc = main(["run", "--op", "gemm", "--op", "rmsnorm_fwd", "--backend", "torch",
               "--backend", wrong_gemm, "--examples", "1", "--html", str(path)])
    assert rc == 1  # the wrong backend fails
    text = path.read_text()
    capsys.readouterr()

    assert outside_references(text) == []
    pngs = image_payloads(text)
    assert len(pngs) == 3 and all(p.startswith(PNG_MAGIC) for p in pngs)  # headroom, K, ULP
    assert text.count("<img ") == len(pngs)
    for sid, title in page.SECTIONS:
        assert f'<section id="{sid}"><h2>{html.escape(title)}</h2>' in text

    versions = {c[0]: c[1] for _, c in rows_of(text, "versions") if c}
    assert {"python", "torch", "triton", "numpy", "hypothesis", "aiter"} <= set(versions)
    assert versions["torch"] == torch.__version__
    assert "device: <b>cpu</b>" in text

    coverage = {c[0]: c[1:] for _, c in rows_of(text, "coverage") if c}
    assert set(coverage) == {"gemm", "rmsnorm_fwd"}
    assert "failed" in " ".join(coverage["gemm"]) and "ran" in " ".join(coverage["rmsnorm_fwd"])

    skipped = [c for _, c in rows_of(text, "skips") if c]
    assert any(c[0] == "rmsnorm_fwd" and c[1] == wrong_gemm and "not implemented" in c[4]
               for c in skipped)

    worst = rows_of(text, "worst")
    failing = [c for cls, c in worst if cls == "fail"]
    assert failing and {c[2] for c in failing} == {wrong_gemm}  # torch is never listed failing
    assert all(c[0] == "pass" for cls, c in worst if c and c[2] == "torch")
    # The listed repro re-runs the case on the wrong backend and fails again.
    repro = shlex.split(failing[0][6].split("#", 1)[0])
    case = repro[repro.index("--case") + 1]
    assert repro[repro.index("--op") + 1] == "gemm" and repro[-1] == wrong_gemm
    assert main(["repro", "--op", "gemm", "--case", case, "--backend", wrong_gemm]) == 1
    assert f"FAIL {wrong_gemm} vs reference" in capsys.readouterr().out
    assert json.loads(case)["k"] >= 1


def test_ratio_bins_put_the_bound_between_two_bins():
    assert ratio_bin(0.0) == ZERO_BIN
    assert bin_upper_edge(ratio_bin(1.0)) == pytest.approx(1.0)  # at the bound: within
    assert bin_upper_edge(ratio_bin(1.0001)) > 1.0 > bin_upper_edge(ratio_bin(1.0)) - 1e-12
    assert ratio_bin(math.inf) == ratio_bin(math.nan) == ratio_bin(1e9) == TOP_BIN
    assert ratio_bin(1e-30) == 0
    h = Headroom()
    for r in (0.0, 0.5, 1.0, 1.5, math.inf):
        h.add(r)
    assert h.samples == 5 and h.max_ratio == math.inf and bins_above_one(h.counts) == 2


def test_fuzz_page_lists_findings_with_their_replay():
    """A campaign's page from its statistics and findings (no worker spawned)."""
    st = Stats()
    for r in (0.1, 0.2, 3.0):
        st.add_case({"op": "gemm", "verdict": "pass" if r < 1 else "fail",
                     "backends": {"torch": {"status": "ok", "ratio": 0.1},
                                  "triton": {"status": "ok", "ratio": r},
                                  "sdpa": {"status": "unavailable"}}})
    case = {"m": 2, "n": 3, "k": 4, "layout": "TN", "dtype": "float32"}
    f = new_finding("mismatch", "gemm", ["triton"], case, "cpu", output="out",
                    detail="triton vs reference [out]: 3 mismatched", metrics={"max_ratio": 3.0})
    f.repro = "python -m tealite_verify replay findings/abc.json"
    st.findings[f.signature] = {"finding": f, "path": "findings/abc.json", "new": True,
                                "hits": 1}
    data = fuzz_report.from_campaign(st, st.findings, device="cpu", settings={"seed": 0},
                                     versions={"python": "3.x"}, notes=["a note"],
                                     elapsed_s=1.0)
    text = page.render(data)
    assert outside_references(text) == [] and len(image_payloads(text)) == 1  # headroom only
    assert data.headroom[("gemm", "triton")].max_ratio == 3.0
    assert bins_above_one(data.headroom[("gemm", "triton")].counts) == 1
    worst = [c for cls, c in rows_of(text, "worst") if cls == "mismatch"]
    assert worst and worst[0][2] == "triton" and f.repro in worst[0][6]
    assert "python -m tealite_verify repro --op gemm" in worst[0][6]
    coverage = {c[0]: c[1:] for _, c in rows_of(text, "coverage") if c}
    assert coverage["gemm"] == ["3 unsupported", "3 ran", "3 ran, 1 failed"]
    assert "a note" in text


def test_fuzz_html_is_written_from_a_campaign(tmp_path):
    """``fuzz --html``'s call, on a campaign whose workers never started (no process)."""
    from tealite_verify.fuzz.supervisor import Campaign, FuzzConfig
    from tealite_verify.report.write import write_fuzz
    cfg = FuzzConfig(ops=["gemm"], backends=["torch"], dtypes=None, recipe=None, seconds=1.0,
                     corpus=str(tmp_path / "corpus"))
    campaign = Campaign(cfg, [], ["planner note"])
    campaign.stats.add_case({"op": "gemm", "verdict": "pass",
                             "backends": {"torch": {"status": "ok", "ratio": 0.25}}})
    text = write_fuzz(tmp_path / "f.html", campaign).read_text()
    assert outside_references(text) == [] and len(image_payloads(text)) == 1
    assert "planner note" in text and "tealite_verify fuzz" in text
    versions = {c[0]: c[1] for _, c in rows_of(text, "versions") if c}
    assert versions["torch"] == torch.__version__  # collected here: no worker said hello


def test_html_without_matplotlib_is_refused_before_the_run(monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        main(["run", "--op", "gemm", "--html", "report.html"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--html" in err and "needs matplotlib" in err and "tealite[report]" in err
