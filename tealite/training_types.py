"""Shared types of the training utilities (issue 17; bottom floor: plain data).

Multi-tensor ops, the bulk delayed-scaling update, dropout and transpose: each family keeps its
small shared types (typed option objects, flags) in a section of its own below, so that both
its front-end (tealite/ops/) and its backends may import them.
"""
from __future__ import annotations
