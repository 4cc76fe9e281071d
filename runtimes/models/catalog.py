"""Where the offline models live in the cache (being written)."""

from __future__ import annotations


def prepare() -> None:
    """Build or convert every offline model into the cache."""
