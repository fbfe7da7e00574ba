"""Plain-text tables for the command-line reports (one helper for every command)."""
from __future__ import annotations


def table(rows: list[list], header: list[str]) -> str:
    """Left-aligned columns, a dashed rule under the header."""
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(lines)
