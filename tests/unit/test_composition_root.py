"""The composition root wires one App, and picks the backend the settings name.

Building a worker connects to nothing (faust connects when the App starts), so the wiring is
checked here without a broker; tests/e2e/test_worker_loop.py runs a wired worker for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faust.serializers import codecs

from handlers.app import build_worker, make_backend
from handlers.partition_lanes import lanes_of
from orchestrator.clock import FixedClock
from orchestrator.errors import ConfigError
from orchestrator.rules import state_encoding
from orchestrator.rules.state import KeyState
from orchestrator.settings import BackendKind, KafkaSettings, Settings, WorkerSettings
from orchestrator.testing import InMemoryBackend
from runtimes.localprocess.backend import LocalProcessBackend
from tests.unit.rules.builders import at

RULES = """
runtimes: [torch-distributed]
rules:
  - name: drift-retrain
    on:
      type: io.tuneloop.drift.detected.v1
    key: "event.data.model_id"
    window: 6h
    count: 2
    launch:
      runtime: torch-distributed
      base_model: "tiny"
      dataset: "file:///data/${ key }.jsonl"
"""


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


def settings(**worker: Any) -> Settings:
    return Settings(kafka=KafkaSettings(group_id="root-test"), worker=WorkerSettings(**worker))


def test_the_intake_stages_and_the_worker_tables_share_one_app(rules: Path) -> None:
    clock = FixedClock(at(0))
    worker = build_worker(settings(rules=(rules,)), backend=InMemoryBackend(clock), clock=clock)

    assert worker.intake.app is worker.app
    agents = {agent.name for agent in worker.app.agents.values()}
    # stage 1 reads the input topics itself, as a service the App starts and stops; stage 2
    # is fed by the App's consumer in lanes, no agent either
    assert not agents
    assert lanes_of(worker.app) == {worker.intake.keyed_topic: worker.intake.lanes}
    subscribed = {name: topic.acks for topic in worker.app.topics for name in topic.topics}
    assert subscribed[worker.intake.keyed_topic] is True  # faust commits only what was handled
    assert worker.intake.input_batches in worker.app._extra_services
    assert {"tuneloop-rule-state", "tuneloop-jobs", "tuneloop-seen"} <= set(worker.app.tables)
    assert worker.orchestrator.rules.rules[0].name == "drift-retrain"


def test_rule_paths_given_to_build_worker_win_over_the_settings(rules: Path) -> None:
    clock = FixedClock(at(0))
    worker = build_worker(
        settings(rules=(Path("/nonexistent/rules.yaml"),)),
        backend=InMemoryBackend(clock),
        clock=clock,
        rule_paths=[rules],
    )
    assert worker.orchestrator.rules.rules[0].name == "drift-retrain"


def test_a_worker_without_rule_files_refuses_to_start() -> None:
    clock = FixedClock(at(0))
    with pytest.raises(ConfigError, match="TUNELOOP_RULES"):
        build_worker(settings(), backend=InMemoryBackend(clock), clock=clock)


def test_the_local_backend_runs_jobs_under_the_configured_root(tmp_path: Path) -> None:
    backend = make_backend(
        settings(backend=BackendKind.LOCAL, local_root=tmp_path / "jobs"), clock=FixedClock(at(0))
    )
    assert isinstance(backend, LocalProcessBackend)


def test_the_kubernetes_backend_outside_a_pod_without_a_kubeconfig_refuses_to_start(
    monkeypatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="TUNELOOP_KUBECONFIG"):
        make_backend(settings(backend=BackendKind.KUBERNETES), clock=FixedClock(at(0)))


def test_the_rule_state_changelog_carries_each_key_s_encoded_state_as_it_is(
    rules: Path,
) -> None:
    clock = FixedClock(at(0))
    worker = build_worker(settings(rules=(rules,)), backend=InMemoryBackend(clock), clock=clock)
    table = worker.app.tables["tuneloop-rule-state"]
    encoded = b'[2,1772352000000000,{"drift-retrain":[[["d1","/monitors/eval",1772352000000000]]]}]'

    payload, _ = table.changelog_topic.prepare_value(encoded, table.value_serializer)

    assert payload == encoded


def test_a_rule_state_an_earlier_worker_wrote_on_the_changelog_still_loads(rules: Path) -> None:
    clock = FixedClock(at(0))
    worker = build_worker(settings(rules=(rules,)), backend=InMemoryBackend(clock), clock=clock)
    table = worker.app.tables["tuneloop-rule-state"]
    # What the worker wrote before format 2: `KeyState.to_json()` through faust's json codec.
    written = codecs.dumps("json", {"format": 1, "horizon": "2026-03-01T08:00:00Z"})

    value = worker.app.serializers.loads_value(
        table.changelog_topic.value_type, written, serializer=table.value_serializer
    )

    assert state_encoding.decode(value) == KeyState(horizon=at(0))


class ClosingBackend(InMemoryBackend):
    """A stand-in backend that notes when it is closed (the Kubernetes backend closes its
    pooled HTTP session there)."""

    closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_the_worker_closes_its_backend_when_it_shuts_down(rules: Path) -> None:
    clock = FixedClock(at(0))
    backend = ClosingBackend(clock)
    worker = build_worker(settings(rules=(rules,)), backend=backend, clock=clock)
    assert backend.closed == 0

    # What faust's App.on_stop sends once its consumer has stopped.
    await worker.app.on_before_shutdown.send()

    assert backend.closed == 1
