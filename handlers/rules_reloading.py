"""Hot reload of rule files for the running service.

The service wiring creates one `RulesReloader` with the rule paths and a callback that swaps
the `RuleSet` it evaluates with, then runs `watch()` as a background task. Polling a content
hash is portable (no inotify needed) and notices edits, new files and renames alike. A new
valid version is handed to the callback, so later decisions carry its rule versions; an
invalid one is logged with every problem and the old rules stay in force. Reloading never
touches running jobs: it only changes what future decisions use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from orchestrator.rules import loading
from orchestrator.rules.model import RuleSet
from orchestrator.rules.parsing import RuleFileError

log = structlog.get_logger(__name__)


class RulesReloader:
    """Watches rule files and hands each new valid `RuleSet` to `on_change`."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        on_change: Callable[[RuleSet], None],
        current: RuleSet | None = None,
    ) -> None:
        self.paths = tuple(Path(p) for p in paths)
        self.on_change = on_change
        self.current = current
        self.applied = 0
        """New rule sets that took effect (for `/metrics`)."""
        self.rejected = 0
        """Changed rule files refused as invalid, the old rules kept (for `/metrics`)."""
        self._seen_hash: str | None = loading.content_hash(self.paths) if current else None

    def poll(self) -> bool:
        """Check the files once; True when a new rule set took effect."""
        digest = loading.content_hash(self.paths)
        if digest == self._seen_hash:
            return False
        self._seen_hash = digest
        try:
            rules = loading.load_rules(self.paths)
        except RuleFileError as exc:
            self.rejected += 1
            log.error(
                "rules_reload_rejected",
                problems=[str(p) for p in exc.problems],
                kept_version=self.current.version if self.current else None,
            )
            return False
        if self.current is not None and rules.version == self.current.version:
            return False
        previous = self.current.version if self.current else None
        self.current = rules
        log.info(
            "rules_reloaded",
            version=rules.version,
            previous=previous,
            rules=[f"{r.name}@{r.version}" for r in rules.rules],
        )
        self.on_change(rules)
        self.applied += 1
        return True

    async def watch(self, *, interval: float = 2.0) -> None:
        """Poll every *interval* seconds until cancelled."""
        while True:
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(interval)
