"""``run``'s progress display on stderr: ops done / total, cases, failures so far, elapsed.

On a terminal one line is rewritten in place (at most every ``TTY_INTERVAL_S``); anywhere else
(a log, CI) a plain line is written every ``PLAIN_INTERVAL_S``, so a run shorter than that
writes nothing and its log reads as before.  Failure reports written to stderr meanwhile go
through :meth:`RunProgress.above`, which keeps them off the progress line.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

TTY_INTERVAL_S = 0.2
PLAIN_INTERVAL_S = 30.0


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on), as fuzz's progress line writes elapsed time."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


@dataclass
class RunProgress:
    ops_total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    enabled: bool = True
    now: Callable[[], float] = time.monotonic
    ops_done: int = 0
    cases: int = 0
    failures: int = 0
    op: str = ""

    def __post_init__(self):
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.start = self.now()
        self._last = self.start     # when a line was last written (or the run started)
        self._shown = False         # a line is on the terminal now (tty) / was written (plain)

    def line(self) -> str:
        return (f"[run] {self.ops_done}/{self.ops_total} ops"
                + (f", at {self.op}" if self.op and self.ops_done < self.ops_total else "")
                + f" | {self.cases} cases | {self.failures} failing | "
                f"{clock(self.now() - self.start)} elapsed")

    def begin_op(self, op: str) -> None:
        self.op = op
        self._tick()

    def case_done(self, failed: bool) -> None:
        self.cases += 1
        self.failures += failed
        self._tick()

    def op_done(self) -> None:
        self.ops_done += 1
        self._tick()

    def above(self, text: str) -> None:
        """Write ``text`` (a failure report) to the stream, not into the progress line."""
        self._erase()
        print(text, file=self.stream, flush=True)
        if self.tty and self.enabled:
            self._write()

    def finish(self) -> None:
        """The final state, on its own line, where a progress line was shown; else nothing."""
        if self.enabled and self._shown:
            self._erase()
            print(self.line(), file=self.stream, flush=True)

    def _tick(self) -> None:
        if not self.enabled:
            return
        interval = TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
        if self.now() - self._last >= interval:
            self._write()

    def _write(self) -> None:
        self._last = self.now()
        if self.tty:
            print("\r\033[K" + self.line(), end="", file=self.stream, flush=True)
        else:
            print(self.line(), file=self.stream, flush=True)
        self._shown = True

    def _erase(self) -> None:
        if self.tty and self._shown:
            print("\r\033[K", end="", file=self.stream, flush=True)
