#!/usr/bin/env python3
"""Did ``pip install --report`` keep the user's packages?  (issue 18: tealite installs into an
existing torch stack and must not replace its torch or Triton.)

    python ci/pip_report.py REPORT.json torch=2.11.0 triton=3.6.0

REPORT.json is pip's installation report (``pip install --report FILE``, also with
``--dry-run``): its ``install`` list names every distribution pip installs or would install.
Each ``NAME=VERSION`` is a package the environment holds before the install; it is kept when
the report does not list it.  Exit 0 when every one is kept, 1 (one line per replaced package)
otherwise, 2 on bad arguments.  Used by ci/install_proof.sh and tests/test_install_metadata.py.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _canonical(name: str) -> str:
    """PEP 503 name normalization: pip reports ``Typing_Extensions`` as it is spelled."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installs(report: dict) -> dict[str, str]:
    """The distributions pip's report installs: canonical name -> version."""
    if report.get("version") != "1":
        raise ValueError(f"report: version {report.get('version')!r}, expected pip's format '1'")
    return {_canonical(item["metadata"]["name"]): item["metadata"]["version"]
            for item in report["install"]}


def replaced(report: dict, held: dict[str, str]) -> list[str]:
    """One line per held package the report (re)installs: name, held version -> new version."""
    new = installs(report)
    return [f"{name} {version} -> {new[_canonical(name)]}" for name, version in held.items()
            if _canonical(name) in new]


def _held(arg: str) -> tuple[str, str]:
    name, sep, version = arg.partition("=")
    if not sep or not name or not version:
        raise ValueError(f"held package {arg!r}: expected NAME=VERSION, e.g. torch=2.11.0")
    return name, version


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        held = dict(_held(a) for a in argv[1:])
        report = json.loads(Path(argv[0]).read_text())
        lost = replaced(report, held)
        added = sorted(installs(report))
    except (OSError, ValueError, KeyError) as exc:
        print(f"pip_report: {exc}", file=sys.stderr)
        return 2
    print(f"pip installs: {', '.join(added) or 'nothing'}")
    for line in lost:
        print(f"REPLACED: {line}")
    if not lost:
        print(f"kept: {', '.join(f'{n} {v}' for n, v in held.items())}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
