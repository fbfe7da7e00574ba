"""The report's figures, drawn with matplotlib, each returned as PNG bytes (the page embeds
them as data URIs).

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never through pyplot:
no global figure state, no GUI backend chosen behind the caller's back, nothing left open.
"""
from __future__ import annotations

import collections
import io
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from tealite_verify.report.model import (BIN_STEP, HIGH_EXP, LOW_EXP, TOP_BIN, ZERO_BIN,
                                         Headroom, KPoint, UlpPoint)

DPI = 100
MAX_PANELS = 16  # ULP map panels (op x backend); the rest are listed as left out


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def headroom_png(headroom: dict) -> bytes:
    """One row per op x backend, one column per err/tol bin (quarter decades; the first
    column is err == 0, the last > 1e2): the share of that row's cases in the bin.  The line
    marks err/tol = 1, the tier's bound: anything right of it failed."""
    keys = list(headroom)
    cols = [ZERO_BIN] + list(range(TOP_BIN + 1))
    grid = np.zeros((len(keys), len(cols)))
    for i, key in enumerate(keys):
        h: Headroom = headroom[key]
        for j, k in enumerate(cols):
            grid[i, j] = h.counts.get(k, 0) / max(1, h.samples)
    fig = Figure(figsize=(10, 1.2 + 0.22 * len(keys)))
    ax = fig.add_subplot()
    shown = np.ma.masked_equal(grid, 0.0)  # empty bins stay white
    im = ax.imshow(shown, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0,
                   interpolation="nearest")
    ax.set_yticks(range(len(keys)), [f"{op} / {b}  (n={headroom[(op, b)].samples})"
                                     for op, b in keys], fontsize=8)
    # Column 0 is err == 0 and column j >= 1 bin j - 1, whose upper edge, 10^(LOW + j STEP),
    # is at x = j + 0.5: decade 10^e sits at (e - LOW) / STEP + 0.5.
    decades = range(int(LOW_EXP) + 1, int(HIGH_EXP))
    ax.set_xticks([0.0] + [(e - LOW_EXP) / BIN_STEP + 0.5 for e in decades] + [TOP_BIN + 1],
                  ["0"] + [f"1e{e}" for e in decades] + [f">1e{int(HIGH_EXP)}"], fontsize=8)
    ax.axvline((0 - LOW_EXP) / BIN_STEP + 0.5, color="red", linewidth=1.5)
    ax.set_xlabel("max err / tolerance of a case (worst output against the reference); "
                  "red line: the tier's bound")
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="share of the row's cases")
    return _png(fig)


def _grouped(points, key) -> dict:
    out: dict = collections.defaultdict(list)
    for p in points:
        out[key(p)].append(p)
    return dict(sorted(out.items()))


def k_png(points: list[KPoint]) -> bytes:
    """One panel per GEMM-tier op: for each case and backend, the worst element's |error|
    (filled dot; a cross where it is beyond the bound) and the tier's bound at that element
    (hollow), joined by a faint segment, against K, log-log."""
    by_op = _grouped(points, lambda p: p.op)
    ncols = min(2, len(by_op))
    nrows = math.ceil(len(by_op) / ncols)
    fig = Figure(figsize=(7.5 * ncols, 4.5 * nrows))
    floor = 1e-12  # an exact element (err 0) is drawn at the floor, not dropped
    for i, (op, pts) in enumerate(by_op.items()):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for j, (backend, bp) in enumerate(_grouped(pts, lambda p: p.backend).items()):
            colour = f"C{j % 10}"
            err = np.maximum([p.err for p in bp], floor)
            bound = np.maximum([p.bound for p in bp], floor)
            k = np.array([p.k for p in bp])
            over = err > bound
            ax.scatter(k[~over], err[~over], color=colour, s=14, label=f"{backend}: |err|")
            if over.any():
                ax.scatter(k[over], err[over], color=colour, marker="x", s=40,
                           label=f"{backend}: |err| beyond the bound")
            ax.scatter(k, bound, facecolors="none", edgecolors=colour, s=22,
                       label=f"{backend}: bound")
            # each error joined to its own bound: a segment reaching up is headroom
            ax.vlines(k, err, bound, colors=colour, linewidths=0.6, alpha=0.35)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op, fontsize=10)
        ax.set_xlabel("K (reduction length)")
        ax.set_ylabel("worst element: |error| and bound")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _png(fig)


def ulp_png(points: list[UlpPoint]) -> tuple[bytes, list[str]]:
    """One panel per op x backend (at most MAX_PANELS): each case at (last dim, rows), coloured
    by its worst element's error in output ulps (the largest over the case's outputs).
    Returns the PNG and the panels left out."""
    cells: dict = {}
    for p in points:
        key = (p.op, p.backend)
        at = (p.cols, p.rows)
        cells.setdefault(key, {})[at] = max(cells.get(key, {}).get(at, 0.0), p.ulps)
    keys = sorted(cells)
    shown, left_out = keys[:MAX_PANELS], [f"{op} / {b}" for op, b in keys[MAX_PANELS:]]
    values = [u for k in shown for u in cells[k].values()]
    positive = [u for u in values if u > 0]
    norm = LogNorm(vmin=min(positive, default=0.1), vmax=max(max(positive, default=1.0), 1.0))
    ncols = min(4, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = Figure(figsize=(3.6 * ncols + 1.0, 3.0 * nrows))
    sc = None
    for i, key in enumerate(shown):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        pts = cells[key]
        xs, ys = zip(*pts)
        # an exact worst element (0 ulps) is drawn at the colour scale's floor
        cs = [max(u, norm.vmin) for u in pts.values()]
        sc = ax.scatter(xs, ys, c=cs, norm=norm, cmap="plasma", s=28, edgecolors="k",
                        linewidths=0.3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(f"{key[0]} / {key[1]}", fontsize=9)
        ax.set_xlabel("last dim", fontsize=8)
        ax.set_ylabel("rows", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    if sc is not None:
        fig.colorbar(sc, ax=fig.axes, fraction=0.02, pad=0.01,
                     label="worst element's error (output ulps)")
    return _png(fig), left_out
