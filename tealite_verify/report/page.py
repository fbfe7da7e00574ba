"""ReportData -> one self-contained HTML page: inline CSS, figures as base64 PNG data URIs, no
script, no font, no link to anything outside the file (it is mailed, attached to CI runs and
opened offline).  Every string from a report is escaped here, the one place text becomes HTML.
"""
from __future__ import annotations

import base64
import html
import math
import time

from tealite_verify.report import plots
from tealite_verify.report.model import ReportData, Worst, bins_above_one

# Section ids, in page order: the test and docs/report.md name them.
SECTIONS = (("summary", "Summary"), ("coverage", "Coverage matrix"),
            ("headroom", "Headroom: error / tolerance"), ("worst", "Worst cases"),
            ("gemm-k", "GEMM error vs K"), ("ulp", "ULP error over shapes"),
            ("skips", "Skipped and unsupported"), ("versions", "Versions and device"))

VERSION_KEYS = ("python", "torch", "triton", "numpy", "hypothesis", "ml_dtypes", "aiter",
                "platform", "triton_interpret", "backend_modules", "cuda_runtime", "hip", "gpu",
                "gpu_capability", "gpu_arch", "cuda_driver")

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.5em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.ran{background:#d8f0d8}td.fail{background:#f6c6c6}td.unsupported{background:#f4ecc8}
td.unavailable{background:#e4e4e4;color:#666}td.none{color:#aaa}
tr.fail td,tr.error td,tr.mismatch td,tr.crash td,tr.hang td{background:#fbe3e3}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:.8em;background:#f7f7f7;margin:0;
padding:2px 4px;max-width:60em}
img{max-width:100%;border:1px solid #eee}
.note{color:#555;font-size:.9em}nav a{margin-right:1em}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _ratio(r: float) -> str:
    return "nan" if math.isnan(r) else "inf" if math.isinf(r) else f"{r:.4g}"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[str]], row_classes=None) -> str:
    """``rows``: cells already HTML (escape them before)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{_e(row_classes[i])}"' if row_classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


def summary(d: ReportData) -> str:
    rows = [[_e(k), _e(v)] for k, v in d.totals.items()]
    rows += [[_e(f"setting: {k}"), _e(v)] for k, v in d.settings.items() if v not in (None, [])]
    return (f"<p>{_e(d.kind)} on <b>{_e(d.device)}</b>, written "
            f"{_e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>" + _table(["", ""], rows)
            + "".join(_note(n) for n in d.notes))


def _coverage_td(cell) -> str:
    if cell is None:
        return '<td class="none">-</td>'
    parts = [f"{n} {label}" for n, label in
             ((cell.ran, "ran"), (cell.failed, "failed"), (cell.errors, "error"),
              (cell.unsupported, "unsupported"), (cell.unavailable, "unavailable")) if n]
    return f'<td class="{cell.state}">{_e(", ".join(parts) or "-")}</td>'


def coverage(d: ReportData) -> str:
    ops = sorted({op for op, _ in d.coverage})
    backends = sorted({b for _, b in d.coverage})
    head = "".join(f"<th>{_e(h)}</th>" for h in ["op"] + backends)
    rows = "".join(f"<tr><td>{_e(op)}</td>"
                   + "".join(_coverage_td(d.coverage.get((op, b))) for b in backends)
                   + "</tr>" for op in ops)
    legend = _note("Cases per op x backend: ran (failed: some output beyond its tier's bound), "
                   "error (the backend raised), unsupported (outside its declared support), "
                   "unavailable (the backend cannot run here). '-': no case of the op asked "
                   "this backend.")
    return f"<table><tr>{head}</tr>{rows}</table>" + legend


def headroom(d: ReportData) -> str:
    if not d.headroom:
        return _note("no backend ran a case")
    rows = []
    for (op, b), h in d.headroom.items():
        rows.append([_e(op), _e(b), _e(h.samples), _e(_ratio(h.max_ratio)),
                     _e(bins_above_one(h.counts))])
    return (_img(plots.headroom_png(d.headroom), "headroom histograms")
            + _note("Each row: the cases one backend ran of one op; each case contributes its "
                    "largest err/tol over its outputs against the float64 reference. Left of "
                    "the red line is headroom under the tier's bound.")
            + _table(["op", "backend", "cases", "max err/tol", "cases beyond the bound"], rows))


def _worst_row(w: Worst) -> list[str]:
    return [_e(w.verdict), _e(w.op), _e(w.backend), _e(w.output), _e(_ratio(w.ratio)),
            f"<pre>{_e(w.detail)}</pre>", f"<pre>{_e(w.repro)}</pre>"]


def worst(d: ReportData) -> str:
    if not d.worst:
        return _note("nothing to list: no case ran and no finding was made")
    what = ("the campaign's findings (fix the bug, then replay)" if d.kind == "fuzz" else
            "each backend's worst case by err/tol, failures and errors first")
    return _note(f"Listed: {what}; the last column re-runs it.") + _table(
        ["verdict", "op", "backend", "output", "err/tol", "detail", "repro"],
        [_worst_row(w) for w in d.worst], [w.verdict for w in d.worst])


def gemm_k(d: ReportData) -> str:
    if not d.k_points:
        return _note("no data: no GEMM-tier comparison (or a fuzz campaign, which keeps no "
                     "per-case worst element)")
    return (_img(plots.k_png(d.k_points), "GEMM error vs K")
            + _note("Per case and backend, the element with the largest err/tol: its |error| "
                    "against the float64 reference (filled; a cross when beyond the bound) and "
                    "the gemm tier's bound at that element (hollow). Errors drawn at 1e-12 are "
                    "exact."))


def ulp(d: ReportData) -> str:
    if not d.ulp_points:
        return _note("no data: no ULP-tier comparison (or a fuzz campaign)")
    png, left_out = plots.ulp_png(d.ulp_points)
    out = _img(png, "ULP error over shapes") + _note(
        "Cases of ULP-tier ops (norms, activations, ...) at (last dim, rows = product of the "
        "leading dims), coloured by the error of the worst element (by err/tol, the largest "
        "over the case's outputs) in ulps of the output's dtype at the reference value.")
    if left_out:
        out += _note(f"panels left out: {', '.join(left_out)}")
    return out


def skips(d: ReportData) -> str:
    if d.kind == "fuzz" and not d.skips:
        return _note("fuzz campaigns count skips per cell (coverage matrix) without reasons; "
                     "see the notes in the summary")
    if not d.skips:
        return _note("no case was skipped")
    return _table(["op", "backend", "status", "cases", "reason"],
                  [[_e(s.op), _e(s.backend), _e(s.status), _e(s.count), f"<pre>{_e(s.reason)}"
                    "</pre>"] for s in d.skips])


def versions(d: ReportData) -> str:
    keys = [k for k in VERSION_KEYS if k in d.versions] + \
        sorted(k for k in d.versions if k not in VERSION_KEYS)
    return (f"<p>device: <b>{_e(d.device)}</b></p>"
            + _table(["", "version"], [[_e(k), _e(d.versions[k])] for k in keys]))


_RENDER = {"summary": summary, "coverage": coverage, "headroom": headroom, "worst": worst,
           "gemm-k": gemm_k, "ulp": ulp, "skips": skips, "versions": versions}


def render(d: ReportData) -> str:
    """The whole page."""
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title in SECTIONS)
    body = "".join(f'<section id="{sid}"><h2>{_e(title)}</h2>{_RENDER[sid](d)}</section>'
                   for sid, title in SECTIONS)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(d.title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(d.title)}</h1><nav>{nav}</nav>{body}</body></html>\n")
