"""The faust App of a worker: the one place one is constructed, with tuneloop's options.

Called first by the composition root (`handlers/app.py`, `build_worker`), before anything is
registered on the App, and by `handlers/intake.py`'s `build_intake` for an intake without the
rule engine (tests, the intake benchmark). Nothing else calls `faust.App(...)`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import faust
from faust.tables import TableManager

from handlers.changelog_batches import BatchedChangelogTable
from handlers.publishing import produce_batch_bytes, tls_context
from handlers.seek_safe_consumer import use_seek_safe_consumer
from orchestrator.settings import KafkaSettings, SecurityProtocol


def new_app(kafka: KafkaSettings, **faust_options: Any) -> faust.App:
    """A faust App for *kafka*'s brokers and group, with the seek-safe consumer installed.

    Args:
        kafka: brokers, group id (the App id), partitions of internal topics, credentials.
        **faust_options: passed to `faust.App`, overriding ours (e.g. `broker_commit_interval`
            in tests).
    """
    options: dict[str, Any] = {
        "broker": [f"kafka://{host.strip()}" for host in kafka.bootstrap.split(",")],
        "store": "memory://",
        # faust creates a data folder even for in-memory tables; by default in the current
        # directory, which left a `<group>-data` folder wherever a worker was started.
        "datadir": _faust_data_folder(kafka.group_id),
        "topic_partitions": kafka.internal_partitions,
        "web_enabled": False,
        "autodiscover": False,
        "processing_guarantee": "at_least_once",
        # A topic faust has just created can be missing from the first metadata the consumer
        # reads (the broker creates partitions asynchronously); the group is then assigned
        # without the internal keyed topic, and faust's default (5 min) leaves every keyed
        # partition unconsumed that long. Refreshing often makes the group rebalance onto it
        # within seconds.
        "consumer_metadata_max_age_ms": 3_000,
        # Let forwards and seen-set changelog writes gather for up to 5 ms into one produce
        # request. With faust's default of 0 the producer sent a request per ~2 records; with
        # 5 ms, far fewer requests and Python calls per event (measured once: docs/delivery.md).
        # Delivery is unchanged: faust flushes the producer before it commits any offset.
        "producer_linger": 0.005,
        # a batch per partition of up to 256 KiB, not 16 KiB (`PRODUCE_BATCH_BYTES`)
        "producer_max_batch_size": produce_batch_bytes(kafka),
        # faust's own waits a second before its tables start; ours are all declared by then.
        "TableManager": PromptTableManager,
        # a Table written by stage 2's lanes sends one changelog record per key per batch,
        # straight to the producer (handlers/changelog_batches.py); elsewhere, faust's Table
        "Table": BatchedChangelogTable,
    }
    credentials = faust_credentials(kafka)
    if credentials is not None:
        options["broker_credentials"] = credentials
    options.update(faust_options)
    app = faust.App(kafka.group_id, **options)
    use_seek_safe_consumer(app)
    return app


class PromptTableManager(TableManager):
    """faust's TableManager without the one-second pause it takes before starting its tables.

    faust 0.15.3 sleeps 1 s in `TableManager.on_start` so that tables declared while the App
    starts can still join the first subscription; the pause was more than half of a worker's
    cold start. Every table of a tuneloop worker is declared before its App starts (in
    `build_worker` and `build_intake`), and a table declared later would fail loudly ("Too
    late to add tables"), so nothing waits for it. The rest is faust's `on_start` as it is.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


def faust_credentials(kafka: KafkaSettings) -> Any:
    """faust's broker credentials for the configured protocol; None for PLAINTEXT."""
    context = tls_context(kafka) if kafka.uses_tls else None
    if kafka.security_protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL):
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password,
            ssl_context=context,
            mechanism=str(kafka.sasl_mechanism),
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def raw_topic(app: faust.App, *names: str, **options: Any) -> Any:
    """A topic of raw bytes keys and values: the codec, not faust, interprets them."""
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        **options,
    )


def _faust_data_folder(group_id: str) -> Path:
    """Where faust may keep its per-app folder: the system's temporary directory (nothing
    durable lives there; tables are in memory, backed by changelog topics)."""
    parent = Path(tempfile.gettempdir()) / "tuneloop-faust"
    parent.mkdir(parents=True, exist_ok=True)
    return parent / f"{group_id}-data"
