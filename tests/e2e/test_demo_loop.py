"""The demo's last steps against the test session's real vLLM and broker, and its word on a
service that does not start.

`make demo` itself runs in test_getting_started.py, with the tiny model as the page says, which
vLLM cannot serve (so steps 7 and 8 say so and stop there), and training SmolLM2 for the whole
loop would take minutes more. So the serving steps run here on their own: `serve_and_ask`,
what the demo runs once its adapter is promoted, with a completion that the test writes by
hand in the worker's shape (docs/events.md). It names a published adapter on the demo's bucket,
`s3://tuneloop-demo/adapters/<job>`, whose files the test puts where s3proxy keeps that
object (`<work dir>/data/<bucket>/<key>`): a LoRA adapter for SmolLM2 from
tests/fixtures/serving.py. What is expected comes from that construction: the path vLLM must
list the adapter under, and the hand-off's events.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest

from devservices.object_storage import LocalObjectStorage
from devservices.serving import LocalVllmServer
from handlers.demo import Starting
from handlers.demo_run import BUCKET, MODEL_ID, PROMPT, DemoError, DemoRun, DemoTopics
from handlers.demo_serving import ServingRuntime, serve_and_ask
from handlers.demo_stream import demo_stream
from orchestrator.events import CloudEvent
from tests.fixtures.kafka import TopicFactory
from tests.fixtures.topics import send_events


def completion(job: str) -> CloudEvent:
    """The `finetune.completed` the worker publishes for the demo's first, promoted adapter."""
    adapter_uri = f"s3://{BUCKET}/adapters/{job}"
    return CloudEvent(
        id=f"{job}.completed",
        source="/tuneloop/orchestrator",
        type="io.tuneloop.finetune.completed.v1",
        subject=job,
        datacontenttype="application/json",
        data={
            "job": job,
            "backend": "local",
            "namespace": None,
            "phase": "Succeeded",
            "rule": "assistant-drift-retrain",
            "rule_version": "1",
            "key": MODEL_ID,
            "decision_id": f"decision-{job}",
            "causing_event_ids": ["demo-drift.detected-1", "demo-drift.detected-3"],
            "model": MODEL_ID,
            "base_model": "smollm2-135m",
            "dataset": f"s3://{BUCKET}/datasets/unit-conversions.jsonl",
            "runtime": "local",
            "adapter_uri": adapter_uri,
            "metrics": {"eval_loss": 1.4, "eval_loss_before": 2.1, "eval_loss_after": 1.4},
            "promoted": True,
            "promotion": {
                "metric": "eval_loss",
                "mode": "min",
                "min_delta": 0.0,
                "candidate": 1.4,
                "champion": None,
                "champion_uri": None,
                "candidate_uri": adapter_uri,
                "verdict": "no-champion",
                "reason": "no champion yet: the first adapter is promoted (eval_loss 1.4)",
            },
        },
    )


@pytest.fixture
def run(tmp_path: Path, new_topic: TopicFactory) -> DemoRun:
    topics = DemoTopics(
        events=new_topic("demo-events"),
        finetune=new_topic("demo-finetune"),
        audit=new_topic("demo-audit"),
        dlq=new_topic("demo-dlq"),
        ledger=f"demo-ledger-{uuid.uuid4().hex[:12]}",  # `tuneloop handoff` creates it
    )
    return DemoRun(root=tmp_path, model="smollm2-135m", topics=topics)


@pytest.mark.serving
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_promoted_adapter_is_handed_to_vllm_which_answers_with_it(
    run: DemoRun,
    kafka_bootstrap: str,
    vllm: LocalVllmServer,
    lora_adapters: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = f"assistant-d-units-assi-{uuid.uuid4().hex[:10]}"
    bucket = run.root / "s3" / "data" / BUCKET
    shutil.copytree(lora_adapters["v1"], bucket / "adapters" / job / "adapter")
    event = completion(job)
    await send_events(kafka_bootstrap, run.topics.finetune, [event])

    async with demo_stream(kafka_bootstrap, run.topics, deadline=time.monotonic() + 300) as stream:
        answers = await serve_and_ask(
            run,
            bootstrap=kafka_bootstrap,
            vllm=ServingRuntime(vllm.base_url, vllm.served_model_name, vllm.log_path),
            adapter_paths={f"s3://{BUCKET}/": f"{bucket}/"},
            stream=stream,
            completed=event,
            prompt=PROMPT,
        )

    adapter_dir = f"{bucket}/adapters/{job}/adapter"
    assert answers.adapter_root == adapter_dir  # vLLM read it where s3proxy keeps it
    # The fixture's adapter is random, not trained: it changes what the model says.
    assert answers.adapter != answers.base
    shown = capsys.readouterr().out
    assert f"← io.tuneloop.adapter.served.v1 lora_name={job}" in shown
    assert f"vLLM loaded it from {adapter_dir}" in shown
    assert "[8/8] vLLM answers one question as the base model and as the adapter" in shown
    assert f"      prompt : {PROMPT!r}" in shown
    assert f"(model={job})" in shown


@pytest.mark.serving
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_an_adapter_vllm_cannot_read_ends_the_demo_with_the_hand_offs_reason(
    run: DemoRun,
    kafka_bootstrap: str,
    vllm: LocalVllmServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = f"assistant-d-units-assi-{uuid.uuid4().hex[:10]}"
    bucket = run.root / "s3" / "data" / BUCKET  # nothing was published there
    event = completion(job)
    await send_events(kafka_bootstrap, run.topics.finetune, [event])

    async with demo_stream(kafka_bootstrap, run.topics, deadline=time.monotonic() + 300) as stream:
        with pytest.raises(DemoError, match="the hand-off failed"):
            await serve_and_ask(
                run,
                bootstrap=kafka_bootstrap,
                vllm=ServingRuntime(vllm.base_url, vllm.served_model_name, vllm.log_path),
                adapter_paths={f"s3://{BUCKET}/": f"{bucket}/"},
                stream=stream,
                completed=event,
                prompt=PROMPT,
            )

    assert (
        "io.tuneloop.adapter.handoff_failed.v1 reason=adapter-rejected" in capsys.readouterr().out
    )


@pytest.mark.storage
def test_a_service_that_does_not_start_is_named_with_its_log(tmp_path: Path) -> None:
    missing_jar = tmp_path / "no-such-s3proxy.jar"
    server = LocalObjectStorage(jar=missing_jar, work_dir=tmp_path / "s3", start_timeout=60)

    starting = Starting("the S3 server (s3proxy)", server, abort=server.stop)
    with starting, pytest.raises(DemoError) as failure:
        starting.wait(time.monotonic() + 60)

    message = str(failure.value)
    assert message.startswith("the S3 server (s3proxy) did not start: ")
    assert str(tmp_path / "s3" / "s3proxy.log") in message
    assert str(missing_jar) in message  # the JVM's own complaint, from the log's tail
    assert not server.running
