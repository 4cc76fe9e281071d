"""What can go wrong handing an adapter to a server, named for what happens next.

    TuneloopError
      HandoffError
        TargetUnavailableError   retry this target with backoff (`steps.RetryPolicy`); after
                                 `report_after` attempts publish `handoff_failed` with
                                 `will_retry: true`, and keep retrying until it answers
        AdapterRejectedError     the server refused this version for good: undo what was
                                 done (`steps.rollback_for`), publish `handoff_failed` with
                                 `will_retry: false`, keep what was served before

The vLLM client (`handlers/handoff/vllm.py`) translates HTTP outcomes into these; the
hand-off's per-target loop (`handlers/handoff/service.py`) is the one place that retries.
`FailureReason` is the stable `reason` of a `handoff_failed` event (docs/inference.md); which
one a refusal is depends on the step refused (`steps.reason_for`).
"""

from __future__ import annotations

import enum

from orchestrator.errors import TuneloopError


class FailureReason(enum.StrEnum):
    """The `reason` of `io.tuneloop.adapter.handoff_failed.v1`."""

    TARGET_UNAVAILABLE = "target-unavailable"
    """No answer, a timeout, or a 502/503/504: the server is down, starting or overloaded."""
    ADAPTER_REJECTED = "adapter-rejected"
    """`load_lora_adapter` refused it: no adapter at the path (404), a rank above the server's
    `--max-lora-rank` or another engine error (500), a name conflict (400), or the runtime
    LoRA routes are off (`VLLM_ALLOW_RUNTIME_LORA_UPDATING` unset: 404 on the route)."""
    NOT_LISTED = "not-listed"
    """Loaded, but `/v1/models` does not list it from its path."""
    SMOKE_TEST_FAILED = "smoke-test-failed"
    """A completion with `model=<lora_name>` failed."""
    NO_ADAPTER = "no-adapter"
    """The promoted completion names no `adapter_uri`."""
    ADAPTER_NOT_REACHABLE = "adapter-not-reachable"
    """`adapter_uri` maps to no path a server can read (set `TUNELOOP_HANDOFF_PATHS`)."""


class HandoffError(TuneloopError):
    """One call of the hand-off to one serving target failed."""


class TargetUnavailableError(HandoffError):
    """The target did not answer usefully; the same call may work later."""


class AdapterRejectedError(HandoffError):
    """The target answered, and the answer means this version will not be served there."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status of the refusal; None when a 200 said something unusable."""
