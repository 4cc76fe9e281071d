"""`SweepTracker`: where a sweep is recorded as a whole, beside its trials' own tracking.

A port of the service (`orchestrator/service.py`), kept with the sweeps because it speaks of
their state; `runtimes/tracking/sweeps.py` implements it on MLflow (one parent run whose
children are the trials' runs), and the composition root wires it when tracking is configured.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.sweeps.state import SweepState


class SweepTracker(Protocol):
    """Records sweeps where their trials are tracked.

    The service calls `started` before it launches trials of a sweep (every time: a replay
    after a crash calls it again) and `ended` after the sweep's result went out. Both are best
    effort: they never raise, and a tracker that cannot reach its server leaves the sweep to
    run untracked rather than hold the key's inputs.
    """

    async def started(self, sweep: SweepState) -> None:
        """*sweep* is launching trials: record it (once, however often this is called)."""
        ...

    async def ended(self, sweep: SweepState) -> None:
        """*sweep* ended (`sweep.end` is set): record how, and its best trial."""
        ...
