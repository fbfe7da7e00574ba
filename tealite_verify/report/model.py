"""What an HTML report shows, as typed records: the extraction functions (``extract.py`` for a
``run``, ``fuzz.py`` for a fuzz campaign) build a :class:`ReportData`, the plots and the page
read only that.  Nothing here is serialized except by ``page.py`` (the edge).

Headroom samples are binned on a log scale as they arrive (:func:`ratio_bin`), so that a
campaign of millions of cases keeps a few dozen counters per op x backend, and a run and a
campaign are plotted by the same code.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

# Headroom bins: err/tol in quarter decades from 1e-8 to 1e2; an exact match (ratio 0) and
# anything above 1e2 (inf included: a NaN where a number was due) get bins of their own.
BIN_STEP = 0.25
LOW_EXP, HIGH_EXP = -8.0, 2.0
ZERO_BIN = -1                                   # err/tol == 0
TOP_BIN = int(round((HIGH_EXP - LOW_EXP) / BIN_STEP))  # > 10**HIGH_EXP


def ratio_bin(r: float) -> int:
    """The headroom bin of one err/tol ratio: ZERO_BIN for 0, 0 for (0, 1e-8], then quarter
    decades, TOP_BIN above 1e2 (inf and NaN there too: they are failures to show, not hide)."""
    if r == 0.0:
        return ZERO_BIN
    if not r > 0.0 or not math.isfinite(r):
        return TOP_BIN
    k = math.ceil((math.log10(r) - LOW_EXP) / BIN_STEP) - 1
    return min(max(k, 0), TOP_BIN)


def bin_upper_edge(k: int) -> float:
    """The upper edge of bin ``k`` (0 for ZERO_BIN, inf for TOP_BIN)."""
    if k == ZERO_BIN:
        return 0.0
    if k >= TOP_BIN:
        return math.inf
    return 10.0 ** (LOW_EXP + (k + 1) * BIN_STEP)


def bins_above_one(counts: collections.Counter) -> int:
    """Samples in bins whose ratio exceeds 1 (the tier's bound): failures."""
    return sum(n for k, n in counts.items() if k != ZERO_BIN and bin_upper_edge(k) > 1.0)


@dataclass
class Headroom:
    """One op x backend: the binned err/tol of each case it ran (the worst output against the
    reference), the exact maximum and the sample count."""
    counts: collections.Counter = field(default_factory=collections.Counter)
    samples: int = 0
    max_ratio: float = 0.0

    def add(self, r: float) -> None:
        self.counts[ratio_bin(r)] += 1
        self.samples += 1
        if not r <= self.max_ratio:  # NaN compares false: it is kept as the maximum
            self.max_ratio = r


@dataclass
class Cell:
    """Coverage matrix cell (op x backend): how its cases went."""
    ran: int = 0          # status ok (passing or not)
    failed: int = 0       # ran, and some comparison with the reference failed
    errors: int = 0       # raised (a crash is a finding, not a skip)
    unsupported: int = 0
    unavailable: int = 0

    @property
    def state(self) -> str:
        """One word for the cell's colour: what dominates it."""
        if self.errors or self.failed:
            return "fail"
        if self.ran:
            return "ran"
        if self.unsupported:
            return "unsupported"
        return "unavailable" if self.unavailable else "none"


@dataclass(frozen=True)
class Skip:
    op: str
    backend: str
    status: str   # "unsupported" | "unavailable"
    reason: str
    count: int


@dataclass(frozen=True)
class Worst:
    """One backend's worst result on one case (or one fuzz finding), with its repro line."""
    op: str
    backend: str
    output: str
    ratio: float
    verdict: str   # "fail" | "error" | "pass", or a finding's kind
    detail: str
    repro: str


@dataclass(frozen=True)
class KPoint:
    """A GEMM case's worst element (by err/tol): its error and the bound there, at its K."""
    op: str
    backend: str
    k: int
    err: float
    bound: float


@dataclass(frozen=True)
class UlpPoint:
    """An elementwise / row-wise case's worst element (by err/tol) in ulps of the output dtype
    at the reference value, at the case's shape (rows = product of the leading dims)."""
    op: str
    backend: str
    output: str
    rows: int
    cols: int
    ulps: float


@dataclass
class ReportData:
    title: str
    kind: str                       # "run" | "fuzz"
    device: str
    settings: dict                  # what the command was asked (shown as given)
    versions: dict
    totals: dict                    # a few headline counts, label -> value
    headroom: dict = field(default_factory=dict)   # (op, backend) -> Headroom
    coverage: dict = field(default_factory=dict)   # (op, backend) -> Cell
    skips: list = field(default_factory=list)      # [Skip]
    worst: list = field(default_factory=list)      # [Worst], worst first
    k_points: list = field(default_factory=list)   # [KPoint]
    ulp_points: list = field(default_factory=list)  # [UlpPoint]
    notes: list = field(default_factory=list)      # strings: what is missing and why
