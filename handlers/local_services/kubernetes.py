"""The local kubernetes service (being written)."""

from __future__ import annotations


def prepare() -> None:
    """Fetch and build what the local kubernetes service needs, into the cache."""
