"""The worker's producers gather up to 256 KiB per partition into one batch, not aiokafka's
16 KiB, which moved a busy partition 16 KiB per round trip to the broker; never more than the
largest record the settings allow, which the broker must accept anyway. Stage 1 hands over a
whole batch before it waits for it, so its producer does not linger."""

from __future__ import annotations

from typing import Any

import pytest

from handlers import input_batches
from handlers.faust_app import new_app
from handlers.input_batches import InputBatches
from orchestrator.settings import KafkaSettings

KIB = 1024


def test_a_workers_faust_producer_gathers_256_kib_per_partition() -> None:
    app = new_app(KafkaSettings(group_id="batches-unit"))
    assert app.conf.producer_max_batch_size == 256 * KIB


def test_a_smaller_event_limit_makes_the_batches_no_larger_than_its_largest_record() -> None:
    kafka = KafkaSettings(group_id="batches-unit", max_event_bytes=100_000)
    # the event limit and the 64 KiB of headers a forward or a dead letter may add
    assert new_app(kafka).conf.producer_max_batch_size == 100_000 + 64 * KIB


async def _stage_1s_producer_options(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    """The options stage 1 builds its transactional producer with, and its transactional id."""
    made: list[dict[str, Any]] = []

    class StandInProducer:
        """Stands in for aiokafka's producer: keeps the options stage 1 builds it with."""

        def __init__(self, **options: Any) -> None:
            made.append(options)

        async def start(self) -> None:
            pass

    monkeypatch.setattr(input_batches, "AIOKafkaProducer", StandInProducer)
    reader = InputBatches(KafkaSettings(group_id="batches-unit"), sort=None, count=None)  # type: ignore[arg-type]
    await reader._start_producer()
    (options,) = made
    return options, reader.transactional_id


async def test_stage_1s_transactional_producer_gathers_256_kib_per_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options, transactional_id = await _stage_1s_producer_options(monkeypatch)
    assert options["max_batch_size"] == 256 * KIB
    assert options["transactional_id"] == transactional_id


async def test_stage_1s_transactional_producer_does_not_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # it hands over a whole batch before it waits, so a linger would only hold back the last
    # request of each transaction
    options, _ = await _stage_1s_producer_options(monkeypatch)
    assert options["linger_ms"] == 0
