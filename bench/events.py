"""The drift events the worker benchmarks produce, as a producer using the Kafka binding would.

Each is an `io.tuneloop.drift.detected.v1` CloudEvent in binary mode (`handlers.codec`), its
`time` now (so none is too old for the intake), keyed by its model id when *keyed*: the
binding writes the `partitionkey` attribute as the record key, which is how producers say
that their input is partitioned by model.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from bench.topics import Record

TYPE = "io.tuneloop.drift.detected.v1"
SOURCE = "/monitors/evidently/prod"


def drift_record(
    event_id: str,
    model: str,
    *,
    keyed: bool,
    value: float = 0.17,
    at: datetime | None = None,
) -> Record:
    """One drift event of *model* as (key, value, headers)."""
    from handlers.codec import encode_event
    from orchestrator.events import CloudEvent

    record = encode_event(
        CloudEvent(
            id=event_id,
            source=SOURCE,
            type=TYPE,
            time=at or datetime.now(UTC),
            datacontenttype="application/json",
            data={"model_id": model, "metric": "psi", "value": value, "threshold": 0.1},
            extensions={"partitionkey": model} if keyed else {},
        )
    )
    return (record.key, record.value, record.headers)


def drift_records(prefix: str, models: Sequence[str], *, keyed: bool) -> list[Record]:
    """One event per item of *models*, in order, with ids `<prefix>-00000000`, ..."""
    now = datetime.now(UTC)
    return [
        drift_record(f"{prefix}-{index:08d}", model, keyed=keyed, at=now)
        for index, model in enumerate(models)
    ]
