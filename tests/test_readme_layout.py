"""The README's "Layout of the code" table names every module and package that exists (issue 14:
the layout table must match the code).  A backend's family modules are covered by the backend
package row (they differ per backend); everything else is named, by file or by a pattern such
as ``operators_*.py``.  A module the table does not name, or a name it keeps after the module is
gone, fails here."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tealite", "tealite_verify")


def layout_names(readme: str) -> set[str]:
    section = readme.split("## Layout of the code", 1)[1].split("\n### ", 1)[0]
    names = set()
    for token in re.findall(r"`([^`]+)`", section):
        token = token.strip()
        names.add(token)
        names.add(token.rstrip("/").rsplit("/", 1)[-1] + ("/" if token.endswith("/") else ""))
    return names


def _covered(rel: str, names: set[str]) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(base, n) or fnmatch.fnmatch(rel, n) for n in names)


def uncovered(root: Path, names: set[str]) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            parts = rel.split("/")
            if path.name == "__init__.py":
                if len(parts) > 2 and not _covered(f"{'/'.join(parts[:-1])}/", names) \
                        and f"{parts[-2]}/" not in names:
                    out.append("/".join(parts[:-1]) + "/")
                continue
            if parts[:2] == ["tealite", "backends"] and len(parts) > 3 \
                    and parts[2] != "aiter_common":
                continue  # a backend's family modules: the backend package row covers them
            if not _covered(rel, names):
                out.append(rel)
    return out


def test_the_layout_table_names_every_module():
    names = layout_names((ROOT / "README.md").read_text())
    assert not uncovered(ROOT, names)


def test_every_python_name_in_the_table_exists():
    section = (ROOT / "README.md").read_text().split("## Layout of the code", 1)[1]
    tokens = re.findall(r"`([^`/]+\.py)`", section.split("\n### ", 1)[0])
    files = {p.name for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    assert tokens and not [t for t in tokens if "*" not in t and t not in files]


def test_a_module_missing_from_the_table_is_caught(tmp_path):
    for rel in ("tealite/__init__.py", "tealite/types.py", "tealite/newmod.py",
                "tealite/backends/torch/__init__.py", "tealite/backends/torch/gemm.py",
                "tealite_verify/__init__.py", "tealite_verify/tiers/__init__.py",
                "tealite_verify/tiers/exact.py", "tealite_verify/mutate/__init__.py",
                "tealite_verify/mutate/operators_x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    names = layout_names("## Layout of the code\n`types.py`, `torch/`, `tealite_verify/tiers/` "
                         "`exact.py`, `operators_*.py`\n### next")
    assert uncovered(tmp_path, names) == ["tealite/newmod.py", "tealite_verify/mutate/"]
