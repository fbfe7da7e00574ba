"""Plain-text tables for the command-line reports (one helper for every command)."""
from __future__ import annotations

import textwrap

# ``list``'s sections wrap their last column here: they fit a 100-column terminal.
LIST_WIDTH = 100


def table(rows: list[list], header: list[str], max_width: int | None = None) -> str:
    """Left-aligned columns, a dashed rule under the header.  With ``max_width``, a last
    column that would make a line longer is wrapped onto continuation lines (its words are
    kept whole; the other columns are never cut)."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if max_width is not None and lead + widths[-1] > max_width:
        widths[-1] = max(len(header[-1]), max_width - lead, 20)
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    for r in rows:
        last = [str(r[-1])]
        if len(last[0]) > widths[-1]:  # only with max_width: other tables print as they were
            last = textwrap.wrap(last[0], widths[-1], break_on_hyphens=False)
        lines.append(fmt.format(*[str(c) for c in r[:-1]], last[0]))
        lines += [fmt.format(*[""] * (len(r) - 1), more) for more in last[1:]]
    return "\n".join(lines)
