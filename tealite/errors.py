"""Exceptions raised by tealite's op front-ends and backend registry."""


class TealiteArgumentError(ValueError):
    """An argument violates an op's documented contract (rank, shape, dtype, device, value)."""


class BackendUnavailable(RuntimeError):
    """A backend cannot run on this machine (no GPU, missing package, wrong arch)."""


class UnsupportedCase(RuntimeError):
    """A backend is available but declares that it does not support this particular case."""


class DryRunStop(Exception):
    """Raised by the registry inside :func:`tealite.registry.dry_run` once an op's arguments
    passed validation and a backend accepted the case, before the kernel runs."""
