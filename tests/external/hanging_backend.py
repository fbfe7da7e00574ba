"""A third-party backend that never returns on some inputs (per-case timeout tests).

Its ``amax`` is torch's, except that when the input's element count is 5 modulo 16 it sleeps
forever, like a kernel spinning on a lost barrier.  Only a watchdog outside the process can
end such a case.
"""
import os
import time

import torch

from tealite.registry import Backend, get_backend, register_backend


def _log(event: str) -> None:
    """Append one line per call to $TEALITE_TEST_CALL_LOG: tests count calls after the event."""
    path = os.environ.get("TEALITE_TEST_CALL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(event + "\n")


BACKEND = register_backend(Backend(name="hanging", description="hangs on some inputs"),
                           replace=True)


def hangs_on(numel: int) -> bool:
    return numel % 16 == 5


@BACKEND.implements("amax", dtypes=(torch.float32, torch.bfloat16, torch.float16))
def amax(x):
    if hangs_on(x.numel()):
        _log("hang")
        while True:
            time.sleep(3600)
    _log("ok")
    return get_backend("torch").impls["amax"].fn(x)
