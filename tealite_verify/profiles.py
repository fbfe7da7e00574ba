"""Hypothesis settings profiles.

``ci``     deterministic (derandomized, no example database), few examples, small shapes.
``local``  random, many more examples, larger shapes.
``large``  for a GPU: big shapes, fewer examples.

Select with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE``; the shape budget of a
profile is ``SHAPE_SIZE[profile]`` (a key of tealite_verify.specs.SIZES).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("ci", max_examples=12, derandomize=True, database=None, **_COMMON)
settings.register_profile("local", max_examples=150, **_COMMON)
settings.register_profile("large", max_examples=20, **_COMMON)

SHAPE_SIZE = {"ci": "ci", "local": "local", "large": "large", "default": "ci"}


def active_profile() -> str:
    return os.environ.get("HYPOTHESIS_PROFILE", "ci")


def load(name: str | None = None) -> str:
    name = name or active_profile()
    settings.load_profile(name)
    return name


def shape_size() -> str:
    return SHAPE_SIZE.get(settings._current_profile, "ci")
