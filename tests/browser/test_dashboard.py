"""The dashboard in a real browser, served by a worker on the real broker.

The worker runs in the test's process with its one web server on a free port and the
local-process backend (the real LoRA trainer on the tiny offline model, as
tests/e2e/test_local_loop.py runs it), so a launch has a real job whose progress the trainer
reports. Events go in on Kafka; chromium watches the pages change without being reloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from handlers.app import Worker
from handlers.codec import KafkaRecord
from orchestrator.events import CloudEvent
from orchestrator.settings import WorkerSettings
from runtimes.localprocess.backend import LocalProcessBackend
from tests.browser.chromium import Browser
from tests.fixtures.events import drift_alarm
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import send_events, send_records
from tests.fixtures.worker import build_test_worker, running, worker_settings, worker_topics

pytestmark = [pytest.mark.browser, pytest.mark.kafka, pytest.mark.timeout(300)]

RULES = """
runtimes: [local]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
      where: "event.data.value > event.data.threshold"
    key: "event.data.model_id"
    window: 6h
    count: 2
    cooldown: 1h
    concurrency: forbid
    max_launches_per_day: 4
    launch:
      runtime: local
      base_model: tiny
      dataset: "file://{dataset}"
      training: {{max_steps: 24, batch_size: 4, max_seq_length: 64}}
  - name: drift-shadow
    mode: shadow
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 1h
    count: 1
    launch:
      runtime: local
      base_model: tiny
      dataset: "file://{dataset}"
"""
"""Two alarms above threshold launch a short fine-tune; a shadow rule records, on every alarm,
what it would have done (`suppress`, reason `shadow`) and launches nothing."""


def drift(name: str, n: int, *, model: str, value: float) -> CloudEvent:
    return drift_alarm(f"{name}-{n}", model=model, value=value, n=n, minutes_ago=5)


@dataclasses.dataclass
class Served:
    worker: Worker
    url: str
    bootstrap: str
    topics: dict[str, str]

    async def send(self, *events: CloudEvent) -> None:
        await send_events(self.bootstrap, self.topics["in"], list(events))


@pytest.fixture
async def served(
    kafka_bootstrap: str,
    new_topic: TopicFactory,
    tmp_path: Path,
    tiny_model_dir: Path,  # built into the cache before the worker starts
    reverse_dataset: Path,
    browser: Browser,
) -> AsyncIterator[Served]:
    topics = worker_topics(new_topic, "dash")
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(dataset=reverse_dataset))
    # Port 0: the system picks a free one; the server says which once it runs.
    settings = worker_settings(kafka_bootstrap, topics, worker=WorkerSettings(web_port=0))
    async with LocalProcessBackend(
        tmp_path / "jobs", poll_interval=0.2, trainer_overrides={"cpu_threads": 1}
    ) as backend:
        worker = build_test_worker(settings, rules=rules, backend=backend)
        async with running(worker):
            assert worker.web is not None
            yield Served(worker, worker.web.url, kafka_bootstrap, topics)
            crash = worker.app._crash_reason
            # Leave the page first: its event stream would hold the server open as it stops.
            await browser.open("about:blank")
    assert crash is None, crash


async def test_the_dashboard_loads_and_every_page_says_it_is_read_only(
    served: Served, browser: Browser, tmp_path: Path
) -> None:
    await browser.open(served.url + "/dashboard")
    body = await browser.wait_for_text("drift-retrain", "drift-shadow")
    assert "Read-only" in body
    for page in ("decisions", "jobs", "dead-letters"):
        await browser.open(f"{served.url}/dashboard/{page}")
        assert "Read-only" in await browser.text(), page
        assert (
            await browser.run("return document.querySelectorAll('form[method=post]').length") == 0
        )


async def test_an_emitted_event_appears_live_as_a_decision_with_its_reason(
    served: Served, browser: Browser, tmp_path: Path
) -> None:
    await browser.open(served.url + "/dashboard/decisions")
    await browser.wait_for_text("No decision records yet")
    await browser.run("window.stillTheSamePage = true")

    await served.send(drift("live", 1, model="m-live", value=0.05))

    body = await browser.wait_for_text("live-1", "drift-shadow", "suppress", "shadow")
    assert await browser.run("return window.stillTheSamePage === true"), "the page was reloaded"
    assert "m-live" in body
    await browser.screenshot(tmp_path, "dashboard-decisions")


async def test_a_launch_shows_its_job_progress_and_completion(
    served: Served, browser: Browser, tmp_path: Path
) -> None:
    await browser.open(served.url + "/dashboard/jobs")
    await served.send(
        drift("job", 1, model="m-job", value=0.31), drift("job", 2, model="m-job", value=0.42)
    )

    await browser.wait_for_text("drift-retrain", "m-job", timeout=60)
    body = await browser.wait_until(
        lambda body: "%" in body or "Failed" in body, timeout=150, what="the job's progress"
    )
    assert "Failed" not in body, f"the job failed: see its folder under {tmp_path}/jobs"
    await browser.screenshot(tmp_path, "dashboard-job-running")
    # The phase and metrics come from the backend's observation, the completion event's link
    # from the output topic a moment later (seen in CI: the page between the two).
    await browser.wait_for_text("Succeeded", "eval_loss", ".completed", timeout=180)
    await browser.screenshot(tmp_path, "dashboard-jobs")

    await browser.open(served.url + "/dashboard/rules")
    await browser.wait_for_text("m-job")
    left = await browser.run(
        "return [...document.querySelectorAll('#rule-drift-retrain tr')]"
        ".find(row => row.cells[0].textContent === 'm-job').cells[5].textContent"
    )
    assert left == "3"  # launches left today: four a day, one used
    await browser.screenshot(tmp_path, "dashboard-rules")


async def test_a_dead_lettered_record_shows_its_code(
    served: Served, browser: Browser, tmp_path: Path
) -> None:
    await browser.open(served.url + "/dashboard/dead-letters")
    await browser.wait_for_text("No dead letters")
    # no CloudEvents headers and no CloudEvents content type
    await send_records(
        served.bootstrap, served.topics["in"], [KafkaRecord(value=b"plain text, not an event")]
    )

    body = await browser.wait_for_text("record.not_cloudevent", timeout=60)
    assert f"{served.topics['in']}/0@0" in body
    await browser.screenshot(tmp_path, "dashboard-dead-letters")
