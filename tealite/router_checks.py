"""The router backward's check of the routing map's values, shared by the front end
(tealite/ops/router.py) and the backends that run it themselves (a bottom-floor module: the
two floors never import each other)."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

from tealite._checks import capturing, require

# False while the front end runs a call whose caller vouches for the map (``router_bwd(...,
# check_values=False)``, TE's convention): a backend that counts the map itself skips it then.
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("router_map_checks",
                                                                 default=True)


def checking_maps() -> bool:
    """Whether this call's routing map is to be checked (see ``vouched``)."""
    return _CHECKING.get()


@contextlib.contextmanager
def vouched() -> Iterator[None]:
    """The block's router backward calls take the map as given (no count check, no read)."""
    token = _CHECKING.set(False)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def check_map_counts(routing_map, topk: int) -> None:
    """The map marks exactly ``topk`` experts in every row (a value check: a read back to the
    host, skipped while a CUDA graph is being captured)."""
    if capturing(routing_map) or not routing_map.numel():
        return
    # One reduction and one scalar read (a per-row list read back to Python cost ~0.8 ms per
    # call at 16384 tokens on an H100, more than the kernel); the row is found only on error.
    counts = routing_map.sum(dim=1)
    wrong = counts != topk
    if bool(wrong.any()):
        bad = int(wrong.nonzero()[0, 0])
        require(False, f"routing_map must mark exactly topk = {topk} experts per token; "
                       f"row {bad} marks {int(counts[bad])}")


# ROUTER_BWD implementations that check the map's counts themselves (check_map_counts' error,
# raised after their kernel): the Triton backward counts each row's marks in the kernel it runs
# anyway and reads one flag back, where the check above runs three reduction kernels and a
# read before the launch (H100: the op at 6 % of copy bandwidth with a kernel at 85 %).
COUNTS_THE_MAP: set[Callable] = set()


def counts_the_map(fn):
    """Marks a ROUTER_BWD implementation as checking the map's counts itself (a decorator,
    applied under ``implements`` so that the registered function is the one marked)."""
    COUNTS_THE_MAP.add(fn)
    return fn
