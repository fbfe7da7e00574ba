"""What the two AITER backends share (``aiter``: AMD's package on ROCm; ``aiter_triton``: its
Triton kernels anywhere): the loader of AITER's Triton kernels (:mod:`.loader`, the public
surface; its ``_loader_*`` helpers are private), facts read from the loaded kernels
(:mod:`.kernel_facts`) and the per-entry-point contracts both declare (:mod:`.contracts`).

No backend: nothing here registers, so the registry's IN_TREE_BACKENDS does not name it, and
both backend packages import it without importing each other.  Importing it never imports
AITER.
"""
