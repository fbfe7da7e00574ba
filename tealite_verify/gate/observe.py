"""Contracts observed by probing (filled in below)."""
from __future__ import annotations


def observe_all(device: str) -> dict:
    return {}
