"""The HTML report of a ``run`` or a ``fuzz`` campaign (``--html FILE``): ``model.py`` (what
the page shows, typed), ``extract.py`` (a run's CaseReports -> model), ``fuzz.py`` (a
campaign's statistics and findings -> model), ``plots.py`` (matplotlib figures), ``page.py``
(the self-contained HTML), ``write.py`` (the two entry points the CLI calls).  See
docs/report.md.

Only ``html_path`` (the CLI option's check) lives here, importing nothing of the package:
``tealite_verify.fuzz.report`` imports ``model``, and ``fuzz.py`` imports it back.
"""
from __future__ import annotations

import argparse
import importlib.util

INSTALL_HINT = "pip install 'tealite[report]' (matplotlib)"


def html_path(text: str) -> str:
    """``--html FILE``'s argparse type: refuses the option up front where matplotlib is
    missing, rather than after a long run."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(f"the HTML report needs matplotlib: {INSTALL_HINT}")
    return text
