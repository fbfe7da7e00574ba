"""AITER (ROCm/aiter) support, not yet a tealite backend.

Nothing here registers a backend, and ``tealite.backends`` does not import this package.
:mod:`tealite.backends.aiter._triton_loader` loads AITER's Triton kernels
(``aiter/ops/triton``) from an installed ``amd-aiter``, an unpacked wheel or source tree, or
the wheel file itself, without ROCm: the benchmarks put them side by side with tealite's own
kernels, and the AITER backend (issue 6) will be built on the same loader.
"""
