"""pytest plug-in: the differential suite against a backend registered from another
repository (entry point ``pytest11``, loaded wherever tealite is installed).

In a kernel team's repository, with its backend registered through the ``tealite.backends``
entry point (docs/plugins.md)::

    pytest --tealite-backend mykernels -m differential

adds, for every op the backend implements and every dtype of the op's spec, one item that runs
the project's differential check (``tealite_verify.differential.check_suite``: the spec's
smoke cases and the stratified Hypothesis-drawn cases of the active profile, each judged
against the float64 reference and every other available backend), and one item per stored
finding (``--tealite-findings DIR``, default ``$TEALITE_FINDINGS`` or ``./findings``) re-run on
the backend.  A failing item prints the first failing case's report with its repro command.

Without ``--tealite-backend`` the plug-in does nothing: it adds no item, registers nothing
and imports neither torch nor the harness (it is loaded in every pytest run of an environment
that has tealite installed).
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

# The marker every item carries (``-m differential`` selects them), as in tealite's own tests.
MARKER = "differential"
MARKER_HELP = ("differential: Hypothesis-driven op x backend x dtype checks against float64 "
               "references and other backends")
NO_PEERS = "none"


@dataclass(frozen=True)
class Selection:
    """What ``--tealite-*`` asked for, validated."""
    backends: tuple[str, ...]
    ops: tuple[str, ...]             # empty: every op the backend implements
    dtypes: tuple[str, ...]          # empty: every dtype of the op's spec
    device: str
    peers: tuple[str, ...] | None    # None: every available backend implementing the op
    findings: Path | None            # the corpus replayed on the backend; None: none
    replay_timeout: float            # seconds for a crash / hang finding's replay


_SELECTION = pytest.StashKey[Selection]()


def pytest_addoption(parser):
    group = parser.getgroup("tealite", "tealite differential suite for a backend "
                                       "(tealite_verify/pytest_plugin.py)")
    group.addoption("--tealite-backend", action="append", default=[], metavar="NAME",
                    help="run tealite's differential suite against this registered backend "
                         "(repeatable); without it this plug-in adds nothing")
    group.addoption("--tealite-op", action="append", default=[], metavar="OP",
                    help="only this op (repeatable; default: every op the backend implements)")
    group.addoption("--tealite-dtype", action="append", default=[], metavar="DTYPE",
                    help="only this input dtype, e.g. float32 (repeatable; default: the spec's)")
    group.addoption("--tealite-device", default=None, metavar="DEVICE",
                    help="device the cases run on: cpu or cuda (default "
                         "$TEALITE_VERIFY_DEVICE, else cpu)")
    group.addoption("--tealite-peer", action="append", default=[], metavar="NAME",
                    help="compare with only this other backend (repeatable; 'none': the "
                         "reference only; default: every available backend with the op)")
    group.addoption("--tealite-findings", default=None, metavar="DIR",
                    help="replay the stored findings in DIR on the backend (default "
                         "$TEALITE_FINDINGS, else ./findings when it exists)")


@pytest.hookimpl(tryfirst=True)  # before hypothesis's: its --hypothesis-profile may name ours
def pytest_configure(config):
    if not config.getoption("tealite_backend"):
        _refuse_orphan_options(config)
        return
    from tealite_verify import profiles
    profiles.load()  # $HYPOTHESIS_PROFILE, else ci; --hypothesis-profile overrides it after
    config.addinivalue_line("markers", MARKER_HELP)
    config.stash[_SELECTION] = _selection(config)


def _refuse_orphan_options(config) -> None:
    given = [name for name, dest in (("--tealite-op", "tealite_op"),
                                     ("--tealite-dtype", "tealite_dtype"),
                                     ("--tealite-device", "tealite_device"),
                                     ("--tealite-peer", "tealite_peer"),
                                     ("--tealite-findings", "tealite_findings"))
             if config.getoption(dest)]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise pytest.UsageError(f"{', '.join(given)} {verb} --tealite-backend NAME (the "
                                f"backend to run tealite's differential suite against)")


def _selection(config) -> Selection:
    """The options, checked against the registry and the specs; bad ones are a UsageError
    naming the option and what it accepts."""
    from tealite import registry
    from tealite_verify.specs import all_specs
    known = registry.backends()
    specs = all_specs()
    backends = tuple(dict.fromkeys(config.getoption("tealite_backend")))
    for name in backends:
        if name not in known:
            errors = "".join(f"\n  plug-in failed to load: {e}"
                             for e in registry.plugin_load_errors())
            raise pytest.UsageError(f"--tealite-backend {name!r}: no such backend; registered: "
                                    f"{sorted(known)}{errors}")
    ops = tuple(config.getoption("tealite_op"))
    for op in ops:
        if op not in specs:
            raise pytest.UsageError(f"--tealite-op {op!r}: no such op; known: {sorted(specs)}")
        missing = [b for b in backends if not specs[op].implemented_by(known[b])]
        if missing:
            raise pytest.UsageError(f"--tealite-op {op!r}: backend(s) {missing} do not "
                                    f"implement it")
    dtypes = tuple(config.getoption("tealite_dtype"))
    all_dtypes = sorted({d for s in specs.values() for d in s.dtypes})
    for dtype in dtypes:
        if dtype not in all_dtypes:
            raise pytest.UsageError(f"--tealite-dtype {dtype!r}: must be one of {all_dtypes}")
    device = config.getoption("tealite_device") or \
        os.environ.get("TEALITE_VERIFY_DEVICE", "cpu")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise pytest.UsageError(f"--tealite-device {device!r}: must be cpu or cuda[:N]")
    peers = config.getoption("tealite_peer")
    for name in peers:
        if name != NO_PEERS and name not in known:
            raise pytest.UsageError(f"--tealite-peer {name!r}: no such backend; registered: "
                                    f"{sorted(known)} (or {NO_PEERS!r})")
    return Selection(backends, ops, dtypes, device,
                     tuple(p for p in peers if p != NO_PEERS) if peers else None,
                     _findings_dir(config), float(os.environ.get("TEALITE_REPLAY_TIMEOUT",
                                                                 "120")))


def _findings_dir(config) -> Path | None:
    """The findings corpus to replay: the option's (which must exist), else the fuzzer's
    default corpus when it exists (``$TEALITE_FINDINGS`` or ./findings), else none."""
    from tealite_verify.fuzz import findings as fz
    given = config.getoption("tealite_findings")
    if given is not None:
        path = Path(given)
        if not path.is_dir():
            raise pytest.UsageError(f"--tealite-findings {given!r}: not a directory")
        return path
    path = fz.default_corpus_dir()
    return path if path.is_dir() else None


def pytest_report_header(config):
    sel = config.stash.get(_SELECTION, None)
    if sel is None:
        return None
    peers = "every available backend" if sel.peers is None else \
        (", ".join(sel.peers) or "the reference only")
    from tealite import registry
    from tealite_verify import profiles
    # A peer plug-in that failed to import is not compared with: say so where it shows.
    return [f"tealite: differential suite for {', '.join(sel.backends)} on {sel.device} "
            f"(the Hypothesis profile's shape size {profiles.shape_size()!r}; peers: "
            f"{peers}); findings replayed from {sel.findings or 'nowhere'}"] + \
        [f"tealite: plug-in failed to load: {e}" for e in registry.plugin_load_errors()]


@pytest.hookimpl(tryfirst=True)  # before -m / -k deselect: they must see these items
def pytest_collection_modifyitems(session, config, items):
    sel = config.stash.get(_SELECTION, None)
    if sel is None:
        return
    suite = TealiteSuite.from_parent(session, name="tealite", nodeid="tealite")
    # Through the session, as a collected file's items go: counted in "collected N items",
    # and an exception while collecting is a collection error, not an internal one.
    items.extend(session.genitems(suite))


class TealiteSuite(pytest.Collector):
    """The items of the selection: stored findings first (known bugs before new cases, as in
    tealite's own run), then one differential item per (op, backend, dtype)."""

    def collect(self):
        from tealite import registry
        from tealite_verify.specs import all_specs
        sel = self.config.stash[_SELECTION]
        specs = all_specs()
        out: list[pytest.Item] = []
        for backend in sel.backends:
            b = registry.get_backend(backend)
            out += [FindingItem.from_parent(self, name=f"finding[{backend}-{path.stem}]",
                                            finding=path, backend=backend, sel=sel)
                    for path, f in _stored(sel.findings)
                    if f.op in specs and specs[f.op].implemented_by(b)
                    and (not sel.ops or f.op in sel.ops)
                    and (not sel.dtypes or f.dtype in sel.dtypes)]
        for backend in sel.backends:
            b = registry.get_backend(backend)
            for op, spec in specs.items():
                if (sel.ops and op not in sel.ops) or not spec.implemented_by(b):
                    continue
                out += [SuiteItem.from_parent(self, name=f"differential[{op}-{backend}-{dt}]",
                                              op=op, backend=backend, dtype=dt, sel=sel)
                        for dt in spec.dtypes if not sel.dtypes or dt in sel.dtypes]
        for item in out:
            item.add_marker(MARKER)
        return out


def _stored(root: Path | None) -> list:
    """(path, Finding) of every finding stored in ``root`` (none when None)."""
    from tealite_verify.fuzz import findings as fz
    return fz.Corpus(root).all() if root is not None else []


class _TealiteItem(pytest.Item):
    def __init__(self, *, sel: Selection, backend: str, **kwargs):
        super().__init__(**kwargs)
        self.sel = sel
        self.backend = backend

    def reportinfo(self):
        return self.path, None, self.nodeid

    def _seed(self) -> None:
        # As tealite's own tests: torch's global generator seeded from the item's id, so a
        # draw does not depend on which items ran before.
        import torch
        torch.manual_seed(zlib.crc32(self.nodeid.encode()))

    @staticmethod
    def _conclude(verdict) -> None:
        from tealite_verify.differential import Status
        if verdict.status is Status.FAIL:
            pytest.fail(verdict.message, pytrace=False)
        if verdict.status is Status.SKIP:
            pytest.skip(verdict.message)


class SuiteItem(_TealiteItem):
    def __init__(self, *, op: str, dtype: str, **kwargs):
        super().__init__(**kwargs)
        self.op = op
        self.dtype = dtype

    def runtest(self):
        from tealite_verify import differential, profiles
        from tealite_verify.specs import get_spec
        self._seed()
        spec = get_spec(self.op)
        peers = differential.all_peers(spec, self.backend)
        if self.sel.peers is not None:
            peers = [p for p in peers if p in self.sel.peers]
        self._conclude(differential.check_suite(spec, self.backend, self.dtype,
                                                device=self.sel.device,
                                                size=profiles.shape_size(), peers=peers))


class FindingItem(_TealiteItem):
    def __init__(self, *, finding: Path, **kwargs):
        super().__init__(**kwargs)
        self.finding = finding

    def runtest(self):
        from tealite_verify import differential
        self._seed()
        device = self.config.getoption("tealite_device")  # default: the finding's own
        self._conclude(differential.replay_for_backend(self.finding, self.backend,
                                                       timeout=self.sel.replay_timeout,
                                                       device=device))
