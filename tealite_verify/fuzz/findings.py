"""The findings corpus: one JSON file per distinct finding, written atomically, deduplicated.

A finding is what a fuzz campaign keeps of a failing case: the op, the backend(s) involved,
the full (replayable) case, metrics, versions and one-line repro commands.  Its ``signature``
(kind, op, backends, output, error type and, for a mismatch, the case class: recipe family
with its roundings, formats, saturation, dtype, tier, edge class; see ``coverage.case_class``)
names the bug, not
the case: a rerun that hits the same bug again bumps ``count``/``last_seen`` of the stored file
instead of adding a new one, while a mismatch of the same output in another class of cases (a
different bug, e.g. NaN codes of an all-zero row vs a delayed-scaling rounding error) is a new
finding.

The default corpus directory is ``$TEALITE_FINDINGS`` or ``./findings``; the repository's
``findings/`` holds committed regression findings, which ``pytest -m differential`` replays.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tealite import registry
from tealite_verify import coverage

ENV_VAR = "TEALITE_FINDINGS"
# "parity": a grouped op's fused path disagrees with the same backend's split per-group path
# (tealite_verify/tiers/parity.py), reported apart from a mismatch with the reference.
KINDS = ("mismatch", "error", "crash", "hang", "parity")
# The kinds whose case a worker replays in its own process (crash / hang could take it down).
REPLAYED_KINDS = ("mismatch", "error", "parity")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def make_signature(kind: str, op: str, backends, output: str | None,
                   error_type: str | None, case_class: dict | None = None) -> str:
    """Dedupe key: the same bug found again (on any case of its class) has the same
    signature."""
    key = json.dumps([kind, op, list(backends), output, error_type,
                      sorted((case_class or {}).items())])
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def signature_class(kind: str, case: dict, metrics: dict) -> dict:
    """The case class that is part of a finding's signature: for a mismatch, where numerics
    bugs live (recipe, roundings, format, dtype, tier, edge class); for an error, crash or
    hang none (the exception type or the signal names those, and a crashing kernel crashes on
    every class the shrinker walks through)."""
    return coverage.case_class(case, metrics.get("tier")) if kind in ("mismatch", "parity") \
        else {}


def recipe_description(case: dict) -> str:
    """The case's recipe(s) as ``tealite.recipes.describe`` names them ("" when none)."""
    from tealite.recipes import describe
    from tealite_verify.strategies.recipes import recipe_from_json
    names = []
    for key in ("recipe", "recipe_a", "recipe_b"):
        r = case.get(key)
        if isinstance(r, dict):
            try:
                names.append(describe(recipe_from_json(r)))
            except Exception:  # an unknown recipe dict still gets a stable name
                names.append(json.dumps(r, sort_keys=True))
    return " x ".join(names)


def shape_summary(case: dict) -> str:
    if "shape" in case:
        return "x".join(str(s) for s in case["shape"])
    dims = [f"{k}={case[k]}" for k in ("m", "n", "k", "s") if k in case]
    return ",".join(dims)


@dataclass
class Finding:
    kind: str              # one of KINDS: "mismatch" | "error" | "crash" | "hang" | "parity"
    op: str
    backends: list[str]    # the backend(s) involved, e.g. ["triton"] or ["triton", "torch"]
    output: str | None     # failing output name (mismatch) else None
    case: dict             # full case JSON (replayable through the op's spec)
    device: str            # "cpu" | "cuda"
    detail: str            # one-line summary: metrics line, exception line, signal name
    metrics: dict          # max_ratio, mismatched, numel, worst index ... (may be empty)
    versions: dict
    seed: int | None
    repro: str             # one line: python -m tealite_verify replay <path>
    signature: str         # dedupe key (hash of kind, op, backends, output, error type, class)
    count: int = 1
    first_seen: str = ""   # ISO time
    last_seen: str = ""
    # Convenience copies of what the case says, for humans and report tables.
    recipe: str = ""
    dtype: str = ""
    shape: str = ""
    repro_case: str = ""   # the ``python -m tealite_verify repro --case ...`` form
    stderr_tail: str = ""  # crash / hang: the worker's last stderr lines
    case_class: dict = dataclasses.field(default_factory=dict)  # coverage.case_class
    error_type: str | None = None  # error findings: the exception type (in the signature)

    @property
    def id(self) -> str:
        return self.signature[:12]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Finding":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def new_finding(kind: str, op: str, backends, case: dict, device: str, *, output=None,
                detail: str = "", metrics: dict | None = None, versions: dict | None = None,
                seed: int | None = None, error_type: str | None = None,
                stderr_tail: str = "") -> Finding:
    """A Finding with its signature, case summaries and ``repro --case`` command filled in."""
    backends = list(backends)
    t = now_iso()
    versions = _with_plugin_setup(dict(versions or {}), backends)
    cls = signature_class(kind, case, metrics or {})
    return Finding(
        kind=kind, op=op, backends=backends, output=output, case=case, device=device,
        detail=detail, metrics=dict(metrics or {}), versions=versions, seed=seed,
        repro="", signature=make_signature(kind, op, backends, output, error_type, cls),
        case_class=cls, error_type=error_type,
        first_seen=t, last_seen=t, recipe=recipe_description(case),
        dtype=str(case.get("dtype", "")), shape=shape_summary(case),
        repro_case=_repro_case(op, case, device, backends), stderr_tail=stderr_tail)


def _repro_case(op: str, case: dict, device: str, backends: list[str]) -> str:
    from tealite_verify.runner import repro_command
    return repro_command(op, case, device, backends or None)


def _with_plugin_setup(versions: dict, backends: list[str]) -> dict:
    """``versions`` with what a fresh process needs for the finding's plug-in backends:
    "backend_modules" (every module to import: $TEALITE_BACKEND_MODULES plus the module that
    registered a backend in-process) and "backend_needs" (distributions to install, for
    entry-point plug-ins).  The replay command, ``replay`` and the finding replay tests read
    them; versions.collect only sees the environment variable."""
    from tealite_verify.runner import plugin_setup
    modules, needs = plugin_setup(backends)
    recorded = [m for m in (versions.get("backend_modules") or "").split(",") if m.strip()]
    extra = [m for m in modules if m not in recorded]
    if extra:
        versions["backend_modules"] = ",".join(recorded + extra)
    if needs:
        versions["backend_needs"] = "; ".join(needs)
    return versions


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def replay_command(path: Path, versions: dict) -> str:
    mods = versions.get("backend_modules")
    prefix = f"{registry.PLUGIN_ENV_VAR}={shlex.quote(mods)} " if mods else ""
    needs = versions.get("backend_needs")
    # A shell comment, as in runner.repro_command: what the command itself cannot carry.
    suffix = f"  # needs: {needs}" if needs else ""
    return f"{prefix}python -m tealite_verify replay {shlex.quote(_display_path(path))}{suffix}"


def _write_atomic(path: Path, data: dict) -> None:
    """tmp file in the same directory + fsync + os.replace: a kill never leaves half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Corpus:
    """A directory of findings, ``<op>-<kind>-<id>.json`` each."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, f: Finding) -> Path:
        return self.root / f"{f.op}-{f.kind}-{f.id}.json"

    def add(self, f: Finding) -> tuple[Path, bool]:
        """Save ``f``; a known signature bumps the stored count.  Returns (path, is_new)."""
        path = self.path_for(f)
        old = self._load(path)
        if old is not None and old.signature == f.signature:
            old.count += max(1, f.count)
            old.last_seen = f.last_seen or now_iso()
            old.repro = replay_command(path, old.versions)
            _write_atomic(path, old.to_json())
            return path, False
        f.repro = replay_command(path, f.versions)
        _write_atomic(path, f.to_json())
        return path, True

    def retriage(self) -> list[tuple[str, str]]:
        """Re-name every stored finding with the current signature (case class included):
        files whose signature changed are rewritten under their new name; two that now share
        one are merged (counts added).  Returns (old file name, new file name) pairs."""
        moves = []
        for path, f in self.all():
            cls = signature_class(f.kind, f.case, f.metrics)
            sig = make_signature(f.kind, f.op, f.backends, f.output, f.error_type, cls)
            if sig == f.signature and f.case_class == cls:
                continue
            f.signature, f.case_class = sig, cls
            path.unlink()
            new_path, _ = self.add(f)
            moves.append((path.name, new_path.name))
        return moves

    def get(self, signature: str) -> Finding | None:
        for _, f in self.all():
            if f.signature == signature:
                return f
        return None

    @staticmethod
    def _load(path: Path) -> Finding | None:
        try:
            with open(path) as fh:
                return Finding.from_json(json.load(fh))
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[tuple[Path, Finding]]:
        out = []
        for path in sorted(self.root.glob("*.json")):
            f = self._load(path)
            if f is not None:
                out.append((path, f))
        return out


def default_corpus_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or "findings")


def load_finding(path: str | os.PathLike) -> Finding:
    with open(path) as fh:
        return Finding.from_json(json.load(fh))


def _ensure_backends(names, versions: dict) -> None:
    """Import the plugin modules recorded with a finding when its backends are not known."""
    registry.load_plugins()
    known = registry.backends()
    if all(n in known for n in names):
        return
    for mod in (versions.get("backend_modules") or "").split(","):
        if mod.strip():
            try:
                importlib.import_module(mod.strip().split(":")[0])
            except Exception:  # run_case then reports the backend as missing / erroring
                pass


def replay(path_or_finding, *, backends=None, device: str | None = None):
    """Re-run a finding's case in this process via ``runner.run_case`` -> CaseReport.

    ``backends`` defaults to the finding's; ``device`` to the device it was found on.
    Crash and hang findings are better replayed out of process (``replay`` CLI does).
    """
    from tealite_verify.runner import run_case
    from tealite_verify.specs import get_spec
    f = path_or_finding if isinstance(path_or_finding, Finding) else \
        load_finding(path_or_finding)
    names = list(backends) if backends is not None else list(f.backends)
    _ensure_backends(names, f.versions)
    return run_case(get_spec(f.op), f.case, backends=names, device=device or f.device)
