"""The local kafka service (being written)."""

from __future__ import annotations


def prepare() -> None:
    """Fetch and build what the local kafka service needs, into the cache."""
