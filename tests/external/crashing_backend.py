"""A third-party backend that kills its own process on some inputs (crash isolation tests).

Its ``amax`` is torch's, except that when the input's element count is 5 modulo 16 it dies
the way a faulting native kernel does: SIGSEGV (default) or ``abort()`` (SIGABRT), chosen by
``TEALITE_TEST_CRASH=segv|abort``.  Most cases therefore succeed, so a fuzzing campaign that
isolates the crash must keep running cases after it.
"""
import os
import signal

import torch

from tealite.registry import Backend, get_backend, register_backend


def _log(event: str) -> None:
    """Append one line per call to $TEALITE_TEST_CALL_LOG: tests count calls after the event."""
    path = os.environ.get("TEALITE_TEST_CALL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(event + "\n")


BACKEND = register_backend(Backend(name="crashing", description="dies on some inputs"),
                           replace=True)


def crashes_on(numel: int) -> bool:
    return numel % 16 == 5


@BACKEND.implements("amax", dtypes=(torch.float32, torch.bfloat16, torch.float16))
def amax(x):
    if crashes_on(x.numel()):
        _log("crash")
        if os.environ.get("TEALITE_TEST_CRASH", "segv") == "abort":
            os.abort()
        os.kill(os.getpid(), signal.SIGSEGV)
    _log("ok")
    return get_backend("torch").impls["amax"].fn(x)
