"""``Scoped``: a backend's platform facts or options, read through one place, overridable for a
block.

A backend acts on facts about where it runs (whether its CUDA device is NVIDIA's, which FP8
formats its tensor cores multiply, which rounding a vendor kernel's scale follows) and on
options (which of several entry points a route prefers).  Tests simulate another platform to
prove a rejection or an adapter there, and the AITER gate's probes lift a rejection to record
what runs.  If those values were module globals, a test or probe would assign them and every
later case in the process would see the change until someone remembered to put it back.

So a backend keeps them in a frozen dataclass held by a :class:`Scoped`: its code reads
``HOLDER.get().field``; a test writes ``with HOLDER.override(field=value): ...``.  The override
lives in a context variable, so it ends with the block and is seen only by the thread (or
asyncio task) that entered it: the fuzzer's input thread and any later case keep the real
facts.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Callable, Generic, Iterator, TypeVar

from tealite.errors import TealiteArgumentError

T = TypeVar("T")


class Scoped(Generic[T]):
    """A frozen dataclass value: ``detect()`` outside any override, else the innermost
    override's value.  ``detect`` is called on every read outside an override, so a fact
    detected from the running process (``torch.version.hip``) is never stale."""

    def __init__(self, name: str, detect: Callable[[], T]):
        self.name = name
        self._detect = detect
        self._var: contextvars.ContextVar[T | None] = contextvars.ContextVar(name, default=None)

    def get(self) -> T:
        now = self._var.get()
        return self._detect() if now is None else now

    @contextlib.contextmanager
    def override(self, **fields) -> Iterator[T]:
        """Inside the block, the named fields take the given values (the others keep theirs,
        an enclosing override's included)."""
        now = self.get()
        valid = [f.name for f in dataclasses.fields(now)]
        unknown = sorted(set(fields) - set(valid))
        if unknown:
            raise TealiteArgumentError(
                f"{self.name}.override: unknown field(s) {unknown}; the fields are {valid}")
        token = self._var.set(dataclasses.replace(now, **fields))
        try:
            yield self._var.get()
        finally:
            self._var.reset(token)
