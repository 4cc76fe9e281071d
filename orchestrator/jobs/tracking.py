"""Which phase changes of a job count, so that each job is reported once per step.

Backends see the same phase many times (a watch re-lists, a poll repeats, a restarted
orchestrator finds every job again) and sometimes out of order (a stale cache answers after
a fresh one). `next_transition` is the one rule all of them, and the completion publisher in
`orchestrator/jobs/completion.py`, apply to decide whether an observed phase is news:

* the first phase ever seen is news;
* a repeat of the current phase is not (duplicates collapse);
* a final phase (`Succeeded`, `Failed`) never changes again;
* otherwise only forward moves count: `Pending` -> `Running` -> final. `Suspended` sits
  beside that line: any live phase may be suspended, and a suspended job may resume to
  `Pending` or `Running`.

Pure: no clock, no I/O. Called by `runtimes/*/backend.py` and `orchestrator/jobs/completion.py`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from orchestrator.jobs.model import JobPhase


class Milestone(enum.Enum):
    """The steps of a job that tuneloop announces with a CloudEvent."""

    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Transition:
    """A job moved from `before` (None: never seen) to `after`."""

    before: JobPhase | None
    after: JobPhase

    @property
    def milestone(self) -> Milestone | None:
        """The announced step this move reaches, if any."""
        return _MILESTONE_OF.get(self.after)


_MILESTONE_OF = {
    JobPhase.RUNNING: Milestone.STARTED,
    JobPhase.SUCCEEDED: Milestone.COMPLETED,
    JobPhase.FAILED: Milestone.FAILED,
}

# Position on the forward line; Suspended is handled on its own (see the module docstring).
_RANK = {JobPhase.PENDING: 0, JobPhase.RUNNING: 1, JobPhase.SUCCEEDED: 2, JobPhase.FAILED: 2}


def next_transition(before: JobPhase | None, observed: JobPhase) -> Transition | None:
    """Whether seeing *observed* for a job last known in *before* is a change to act on.

    Args:
        before: the phase last accepted for the job, None if it was never seen.
        observed: the phase just seen.

    Returns:
        The transition to record and act on, or None when the observation is a duplicate,
        a step backwards or a change after the job finished.
    """
    if before is None:
        return Transition(None, observed)
    if before is observed or before.is_final:
        return None
    if observed is JobPhase.SUSPENDED or before is JobPhase.SUSPENDED:
        return Transition(before, observed)
    if _RANK[observed] > _RANK[before]:
        return Transition(before, observed)
    return None
