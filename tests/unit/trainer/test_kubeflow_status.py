"""Progress and metrics through Kubeflow's status server, against a named STAND-IN for it
(`stand_in_status_server.py`: HTTPS with its own CA, records what it is sent).

What a body may hold is written here by hand from the Go types of Kubeflow Trainer v2.3.0
(`pkg/apis/trainer/v1alpha1/trainjob_types.go`: `UpdateTrainJobStatusRequest`,
`TrainerStatus`, `Metric`), not taken from the code under test.
"""

from __future__ import annotations

import io
import re
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runtimes.trainer import kubeflow_status
from runtimes.trainer.kubeflow_status import KubeflowStatusReporter, StatusServer
from tests.unit.trainer.stand_in_status_server import STATUS_PATH, StandInStatusServer

WALL = datetime(2026, 12, 3, 16, 30, 5, 123456, tzinfo=UTC)


def assert_is_an_update_trainjob_status_request(body: dict[str, Any]) -> None:
    assert set(body) == {"trainerStatus"}
    status = body["trainerStatus"]
    assert set(status) <= {
        "progressPercentage",
        "estimatedRemainingSeconds",
        "metrics",
        "lastUpdatedTime",
    }
    # lastUpdatedTime: metav1.Time, which Go parses as time.RFC3339; the CRD requires it.
    stamp = status["lastUpdatedTime"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp)
    if "progressPercentage" in status:  # *int32, Minimum=0, Maximum=100
        value = status["progressPercentage"]
        assert type(value) is int
        assert 0 <= value <= 100
    if "estimatedRemainingSeconds" in status:  # *int32, Minimum=0
        value = status["estimatedRemainingSeconds"]
        assert type(value) is int
        assert 0 <= value < 2**31
    metrics = status.get("metrics", [])
    assert len(metrics) <= 256  # MaxItems=256
    for metric in metrics:
        assert set(metric) == {"name", "value"}
        for text in metric.values():  # string, MinLength=1, MaxLength=64
            assert isinstance(text, str)
            assert 1 <= len(text) <= 64


class Recording:
    def __init__(self) -> None:
        self.events: list[str] = []

    def emit(self, event: str, /, **fields: Any) -> None:
        self.events.append(event)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server(tmp_path: Path):
    stand_in = StandInStatusServer().start(tmp_path)
    yield stand_in
    stand_in.stop()


def _reporter(server: StandInStatusServer, clock: Clock, log: io.StringIO | None = None):
    inner = Recording()
    channel = StatusServer.from_environ(server.environ())
    assert channel is not None
    reporter = KubeflowStatusReporter(
        inner,
        channel,
        interval=5.0,
        monotonic=clock,
        wall_clock=lambda: WALL,
        log=log or io.StringIO(),
    )
    return reporter, inner


def _metrics(body: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["value"] for m in body["trainerStatus"].get("metrics", [])}


def test_a_run_reports_its_progress_and_then_its_final_metrics(server):
    clock = Clock()
    reporter, inner = _reporter(server, clock)

    reporter.emit("started", total_steps=4, world_size=1)
    reporter.emit("eval", stage="before", loss=3.5)
    clock.now = 6.0
    reporter.emit(
        "progress", step=1, total_steps=4, loss=2.5, epoch=0.25, eta_seconds=18.4, final=False
    )
    clock.now = 12.0
    reporter.emit("progress", step=4, total_steps=4, loss=1.25, eta_seconds=0.0, final=True)
    reporter.emit("eval", stage="after", loss=0.75)
    reporter.emit(
        "completed",
        result="/out/result.json",
        metrics={
            "train_loss_first": 2.5,
            "train_loss_last": 1.5,
            "eval_loss_before": 3.5,
            "eval_loss_after": 0.75,
            "steps": 4,
            "tokens_seen": 1200,
            "resumed_from": None,
        },
    )

    assert inner.events == ["started", "eval", "progress", "progress", "eval", "completed"]
    bodies = [request.body for request in server.received]
    for request in server.received:
        assert request.path == STATUS_PATH
        assert request.authorization == "Bearer stand-in-token"
        assert request.content_type == "application/json"
    for body in bodies:
        assert_is_an_update_trainjob_status_request(body)
    assert [b["trainerStatus"].get("progressPercentage") for b in bodies] == [0, 25, 99, 100]
    assert [b["trainerStatus"].get("estimatedRemainingSeconds") for b in bodies] == [
        None,
        18,
        0,
        0,
    ]
    assert bodies[0]["trainerStatus"]["lastUpdatedTime"] == "2026-12-03T16:30:05Z"
    assert _metrics(bodies[1])["train_loss"] == "2.5"
    assert _metrics(bodies[1])["eval_loss"] == "3.5"
    final = _metrics(bodies[-1])
    assert final["train_loss"] == "1.5"  # the run's last losses, from result.json
    assert final["eval_loss"] == "0.75"
    assert final["eval_loss_before"] == "3.5"
    assert final["steps"] == "4"
    assert final["tokens_seen"] == "1200"
    assert "resumed_from" not in final


def test_progress_is_rate_limited_but_the_start_and_the_end_always_go(server):
    clock = Clock()
    reporter, _ = _reporter(server, clock)
    reporter.emit("started", total_steps=100)
    for step in range(1, 11):
        clock.now = float(step)
        reporter.emit("progress", step=step, total_steps=100, loss=1.0, final=False)
    clock.now = 10.5
    reporter.emit("completed", metrics={"steps": 100})

    progress = [r.body["trainerStatus"]["progressPercentage"] for r in server.received]
    assert progress == [0, 5, 10, 100]


def test_a_refused_report_is_logged_and_training_goes_on(server):
    server.answer = 403
    clock, log = Clock(), io.StringIO()
    reporter, inner = _reporter(server, clock, log)

    reporter.emit("started", total_steps=4)
    clock.now = 30.0
    reporter.emit("progress", step=2, total_steps=4, loss=1.0, final=False)
    reporter.emit("completed", metrics={"steps": 4})

    assert inner.events == ["started", "progress", "completed"]
    assert len(server.received) == 3
    lines = log.getvalue().splitlines()
    assert len(lines) == 3
    assert all("HTTP 403" in line and "training goes on" in line for line in lines)
    assert "stand-in-token" not in log.getvalue()


def test_an_unreachable_server_is_tried_less_often_and_never_fails_training(tmp_path: Path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "token").write_text("t")
    channel = StatusServer(
        url=f"https://127.0.0.1:{port}{STATUS_PATH}", token_file=tmp_path / "token", ca_file=None
    )
    clock, log = Clock(), io.StringIO()
    reporter = KubeflowStatusReporter(Recording(), channel, interval=5.0, monotonic=clock, log=log)

    reporter.emit("started", total_steps=100)  # fails: the next try waits 10 s
    for step in range(1, 10):
        clock.now = float(step)
        reporter.emit("progress", step=step, total_steps=100, final=False)
    clock.now = 10.0
    reporter.emit("progress", step=10, total_steps=100, final=False)  # fails: waits 20 s
    clock.now = 29.0
    reporter.emit("progress", step=29, total_steps=100, final=False)
    reporter.emit("completed", metrics={})  # the end always tries

    assert len(log.getvalue().splitlines()) == 3
    assert "next try in 10 s" in log.getvalue()
    assert "next try in 20 s" in log.getvalue()


def test_a_server_the_named_ca_did_not_sign_gets_nothing(server, tmp_path: Path):
    (tmp_path / "other").mkdir()
    other = StandInStatusServer().start(tmp_path / "other")  # another CA
    other.stop()
    environ = {**server.environ(), "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(other.ca_file)}
    channel = StatusServer.from_environ(environ)
    assert channel is not None
    log = io.StringIO()
    KubeflowStatusReporter(Recording(), channel, log=log).emit("started", total_steps=1)
    assert server.received == []
    assert "CERTIFICATE_VERIFY_FAILED" in log.getvalue()


def test_only_rank_zero_of_a_trainjob_with_a_status_server_reports(server):
    inner = Recording()
    assert kubeflow_status.wrap(inner, server.environ(), is_main=False) is inner
    assert kubeflow_status.wrap(inner, {}, is_main=True) is inner
    wrapped = kubeflow_status.wrap(inner, server.environ(), is_main=True)
    assert isinstance(wrapped, KubeflowStatusReporter)


def test_a_metric_the_api_would_refuse_is_left_out_rather_than_failing_the_report():
    body = kubeflow_status.trainer_status(
        progress=150,
        remaining_seconds=1e12,
        metrics={
            "x" * 65: 1.0,
            "tiny": 1e-300,
            "big": 2**62,
            "nan": float("nan"),
            "huge": 10**70,
        },
        now=WALL,
    )
    assert_is_an_update_trainjob_status_request(body)
    assert body["trainerStatus"]["progressPercentage"] == 100
    assert body["trainerStatus"]["estimatedRemainingSeconds"] == 2**31 - 1
    assert [m["name"] for m in body["trainerStatus"]["metrics"]] == ["tiny", "big"]


def test_only_the_final_report_of_a_published_run_names_its_adapter(server):
    reporter, _ = _reporter(server, Clock())
    reporter.emit("started", total_steps=1)
    reporter.emit(
        "completed",
        adapter_uri="s3://adapters/ft-a",
        metrics={"steps": 1},
    )
    bodies = [request.body for request in server.received]
    for body in bodies:
        assert_is_an_update_trainjob_status_request(body)
    assert [_metrics(body).get("adapter_uri") for body in bodies] == [None, "s3://adapters/ft-a"]


def test_a_run_without_a_published_adapter_names_none():
    body = kubeflow_status.trainer_status(
        progress=100, remaining_seconds=0, metrics={"steps": 1}, now=WALL
    )
    assert kubeflow_status.adapter_uri_of(body["trainerStatus"]["metrics"]) is None


def test_an_adapter_uri_longer_than_a_metric_value_goes_in_pieces_and_comes_back_whole():
    uri = "s3://a-bucket-with-a-long-name/adapters/support-bot/" + "x" * 100 + "/ft-0123456789"
    body = kubeflow_status.trainer_status(
        progress=100, remaining_seconds=0, metrics={"steps": 3}, now=WALL, adapter_uri=uri
    )
    assert_is_an_update_trainjob_status_request(body)
    metrics = body["trainerStatus"]["metrics"]
    assert [m["name"] for m in metrics] == [
        "adapter_uri.1",
        "adapter_uri.2",
        "adapter_uri.3",
        "steps",
    ]
    assert all(len(m["value"]) <= 64 for m in metrics)
    assert kubeflow_status.adapter_uri_of(metrics) == uri
    assert kubeflow_status.adapter_uri_of(metrics[1:]) is None, "a missing piece is no URI"
