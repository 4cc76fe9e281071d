"""LocalProcessBackend with real subprocesses: the real trainer for the success and failure
paths, and a stand-in trainer program (a script that sleeps) where the test is about process
management: cancel, the concurrency limit, idempotent launch and restarts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from orchestrator.errors import JobRejectedError
from orchestrator.jobs.model import JobPhase, JobRef, Observation, TrainingRequest, TrainingSettings
from runtimes.localprocess.backend import LocalProcessBackend
from runtimes.storage import StorageSettings, adapter_exists
from tests.fixtures.waiting import wait_for

STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    config = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    with open("runs", "a") as runs:
        runs.write("run\\n")
    print(json.dumps({"event": "progress", "step": 1, "total_steps": 2}), flush=True)
    time.sleep(float(os.environ.get("STAND_IN_SECONDS", "0")))
    out = Path(config["output_dir"])
    (out / "adapter").mkdir(parents=True, exist_ok=True)
    published = {}
    if config.get("output_uri"):  # the real trainer publishes there first
        published["adapter_uri"] = config["output_uri"] + "/" + config["job_name"]
    (out / "result.json").write_text(json.dumps({
        "adapter_dir": str(out / "adapter"), "base_model": config["base_model"],
        "metrics": {"eval_loss_before": 2.0, "eval_loss_after": 1.0},
        "data": {"fingerprint": "sha256:x"}, **published,
    }))
    print(json.dumps({"event": "progress", "step": 2, "total_steps": 2, "final": True}), flush=True)
    """
)


def _request(
    name: str, *, base_model: str = "tiny", dataset: str = "data.jsonl", **training
) -> TrainingRequest:
    return TrainingRequest(
        name=name,
        rule="retrain",
        rule_version="1",
        key="m1",
        decision_id=f"d-{name}",
        causing_event_ids=("e1",),
        runtime="local",
        base_model=base_model,
        dataset=dataset,
        training=TrainingSettings(**training),
    )


@pytest.fixture
def stand_in(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "stand_in_trainer.py"
    script.write_text(STAND_IN)
    return (sys.executable, str(script))


def _backend(
    root: Path, command: tuple[str, ...] | None = None, seconds: float = 0.0, **kw
) -> LocalProcessBackend:
    extra = {} if command is None else {"trainer_command": command}
    return LocalProcessBackend(
        root, poll_interval=0.05, environment={"STAND_IN_SECONDS": str(seconds)}, **extra, **kw
    )


async def _collect(
    backend: LocalProcessBackend,
    until: Callable[[list[Observation]], bool],
    *,
    timeout: float = 60.0,
    into: list[Observation] | None = None,
) -> list[Observation]:
    seen: list[Observation] = [] if into is None else into

    async def consume() -> None:
        async with contextlib.aclosing(backend.observe()) as observations:
            async for observation in observations:
                seen.append(observation)
                if until(seen):
                    return

    await asyncio.wait_for(consume(), timeout)
    return seen


def _final(name: str) -> Callable[[list[Observation]], bool]:
    return lambda seen: any(o.job.name == name and o.phase.is_final for o in seen)


def _phases(seen: list[Observation], name: str) -> list[JobPhase]:
    phases: list[JobPhase] = []
    for o in seen:
        if o.job.name == name and (not phases or phases[-1] is not o.phase):
            phases.append(o.phase)
    return phases


@pytest.mark.training
async def test_real_trainer_job_goes_pending_running_succeeded_with_its_result(
    tmp_path: Path, tiny_model_dir: Path, reverse_dataset: Path
):
    async with _backend(tmp_path / "jobs", trainer_overrides={"cpu_threads": 1}) as backend:
        request = _request(
            "tl-real",
            base_model=str(tiny_model_dir),
            dataset=str(reverse_dataset),
            max_steps=3,
            batch_size=4,
        )
        ref = await backend.launch(request)
        seen = await _collect(backend, _final("tl-real"), timeout=240)
    assert ref == JobRef(name="tl-real", backend="local")
    assert _phases(seen, "tl-real") == [JobPhase.PENDING, JobPhase.RUNNING, JobPhase.SUCCEEDED]
    progress = [o.progress for o in seen if o.progress]
    assert progress
    assert progress[-1]["step"] == 3
    final = seen[-1]
    assert final.result is not None
    assert final.result.adapter_uri is not None
    adapter = Path(final.result.adapter_uri.removeprefix("file://"))
    assert (adapter / "adapter_model.safetensors").is_file()
    assert final.result.metrics["eval_loss_after"] is not None
    assert final.result.metrics["data_fingerprint"].startswith("sha256:")


@pytest.mark.training
async def test_real_trainer_publishes_to_the_output_uri_and_the_result_names_that_folder(
    tmp_path: Path, tiny_model_dir: Path, reverse_dataset: Path
):
    adapters = tmp_path / "adapters"
    async with _backend(tmp_path / "jobs", trainer_overrides={"cpu_threads": 1}) as backend:
        request = dataclasses.replace(
            _request(
                "tl-pub",
                base_model=str(tiny_model_dir),
                dataset=str(reverse_dataset),
                max_steps=2,
                batch_size=4,
            ),
            output_uri=adapters.as_uri(),
        )
        await backend.launch(request)
        seen = await _collect(backend, _final("tl-pub"), timeout=240)
    final = seen[-1]
    assert final.phase is JobPhase.SUCCEEDED, final.message
    assert final.result is not None
    assert final.result.adapter_uri == f"{adapters.as_uri()}/tl-pub"
    assert adapter_exists(final.result.adapter_uri, StorageSettings())
    assert (adapters / "tl-pub" / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.training
async def test_a_publish_that_fails_fails_the_job_with_the_storage_error(
    tmp_path: Path, tiny_model_dir: Path, reverse_dataset: Path
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = {
        "TUNELOOP_S3_ENDPOINT_URL": f"http://127.0.0.1:{closed_port}",
        "AWS_ACCESS_KEY_ID": "nobody",
        "AWS_SECRET_ACCESS_KEY": "nothing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    async with LocalProcessBackend(
        tmp_path / "jobs",
        poll_interval=0.05,
        trainer_overrides={"cpu_threads": 1},
        environment=unreachable,
    ) as backend:
        request = dataclasses.replace(
            _request(
                "tl-nopub",
                base_model=str(tiny_model_dir),
                dataset=str(reverse_dataset),
                max_steps=2,
                batch_size=4,
            ),
            output_uri="s3://nowhere/adapters",
        )
        await backend.launch(request)
        seen = await _collect(backend, _final("tl-nopub"), timeout=240)
    final = seen[-1]
    assert final.phase is JobPhase.FAILED
    assert final.result is None
    assert final.reason in ("StorageError", "AdapterUploadFailedError")
    assert "s3://nowhere/adapters/tl-nopub" in str(final.message)
    assert not (tmp_path / "jobs" / "tl-nopub" / "output" / "result.json").exists()


async def test_bad_dataset_fails_the_job_with_the_trainers_reason(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\nnot json\n')
    async with _backend(tmp_path / "jobs") as backend:
        await backend.launch(_request("tl-bad", dataset=str(bad)))
        seen = await _collect(backend, _final("tl-bad"))
    final = seen[-1]
    assert final.phase is JobPhase.FAILED
    assert final.reason == "MalformedDatasetError"
    assert final.message is not None
    assert ":2:" in final.message


async def test_launching_the_same_name_twice_runs_one_process(tmp_path: Path, stand_in):
    async with _backend(tmp_path / "jobs", stand_in) as backend:
        first = await backend.launch(_request("tl-once"))
        second = await backend.launch(_request("tl-once"))
        seen = await _collect(backend, _final("tl-once"))
    assert first == second
    assert [o.phase for o in seen if o.phase.is_final] == [JobPhase.SUCCEEDED]
    assert (tmp_path / "jobs" / "tl-once" / "runs").read_text() == "run\n"


async def test_cancel_terminates_a_running_job_and_reports_it_cancelled(tmp_path: Path, stand_in):
    async with _backend(tmp_path / "jobs", stand_in, seconds=60) as backend:
        ref = await backend.launch(_request("tl-cancel"))
        seen = await _collect(backend, lambda s: JobPhase.RUNNING in _phases(s, "tl-cancel"))
        await backend.cancel(ref)
        await _collect(backend, _final("tl-cancel"), timeout=20, into=seen)
        await backend.cancel(ref)  # cancelling a finished job does nothing
    final = seen[-1]
    assert (final.phase, final.reason) == (JobPhase.FAILED, "Cancelled")
    assert not (tmp_path / "jobs" / "tl-cancel" / "output" / "result.json").exists()


async def test_cancelling_an_unknown_job_does_nothing(tmp_path: Path):
    async with _backend(tmp_path / "jobs") as backend:
        await backend.cancel(JobRef(name="tl-never", backend="local"))


async def test_jobs_beyond_the_concurrency_limit_wait_their_turn(tmp_path: Path, stand_in):
    async with _backend(tmp_path / "jobs", stand_in, seconds=0.5, max_concurrent=1) as backend:
        await backend.launch(_request("tl-first"))
        await backend.launch(_request("tl-second"))
        seen = await _collect(backend, _final("tl-second"))
    order = [
        (o.job.name, o.phase) for o in seen if o.phase is not JobPhase.PENDING and not o.progress
    ]
    assert order.index(("tl-first", JobPhase.SUCCEEDED)) < order.index(
        ("tl-second", JobPhase.RUNNING)
    )


async def test_cancelling_a_queued_job_means_it_never_starts(tmp_path: Path, stand_in):
    async with _backend(tmp_path / "jobs", stand_in, seconds=1, max_concurrent=1) as backend:
        await backend.launch(_request("tl-busy"))
        queued = await backend.launch(_request("tl-queued"))
        await backend.cancel(queued)
        seen = await _collect(backend, lambda s: _final("tl-busy")(s) and _final("tl-queued")(s))
    assert _phases(seen, "tl-queued") == [JobPhase.PENDING, JobPhase.FAILED]
    assert not (tmp_path / "jobs" / "tl-queued" / "runs").exists()


async def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    async def poll() -> None:
        while not path.exists():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def test_new_instance_reports_a_finished_job_once_and_relaunches_nothing(
    tmp_path: Path, stand_in
):
    root = tmp_path / "jobs"
    before_restart = _backend(root, stand_in)
    await before_restart.launch(_request("tl-done"))
    await _wait_for_file(root / "tl-done" / "exit.json")
    await before_restart.aclose()  # the orchestrator went away before it reported the end

    async with _backend(root, stand_in) as after_restart:
        seen = await _collect(after_restart, _final("tl-done"))
        again = await after_restart.launch(_request("tl-done"))
    assert [o.phase for o in seen] == [JobPhase.SUCCEEDED]
    assert again == JobRef(name="tl-done", backend="local")

    async with _backend(root, stand_in) as third:
        with pytest.raises(TimeoutError):
            await _collect(third, lambda s: True, timeout=0.5)
        await third.launch(_request("tl-done"))
    assert (root / "tl-done" / "runs").read_text() == "run\n"


async def test_job_running_across_an_orchestrator_restart_is_adopted_and_reported_once(
    tmp_path: Path, stand_in
):
    root = tmp_path / "jobs"
    crashed = _backend(root, stand_in, seconds=1.5)
    await crashed.launch(_request("tl-long"))
    await _collect(crashed, lambda s: JobPhase.RUNNING in _phases(s, "tl-long"))
    await crashed.aclose()

    async with _backend(root, stand_in) as restarted:
        seen = await _collect(restarted, _final("tl-long"))
    assert [o.phase for o in seen if o.phase.is_final] == [JobPhase.SUCCEEDED]
    assert (root / "tl-long" / "runs").read_text() == "run\n"
    assert json.loads((root / "tl-long" / "exit.json").read_text())["returncode"] == 0


async def test_an_output_uri_the_storage_layer_cannot_write_is_rejected(tmp_path: Path):
    async with _backend(tmp_path / "jobs") as backend:
        request = dataclasses.replace(_request("tl-ftp"), output_uri="ftp://host/adapters")
        with pytest.raises(JobRejectedError) as caught:
            await backend.launch(request)
    assert caught.value.reason == "UnsupportedOutputUri"
    assert not (tmp_path / "jobs" / "tl-ftp").exists()


async def test_an_s3_output_uri_is_published_by_the_trainer_and_its_location_reported(
    tmp_path: Path, stand_in
):
    async with _backend(tmp_path / "jobs", stand_in) as backend:
        request = dataclasses.replace(_request("tl-s3"), output_uri="s3://bucket/adapters")
        await backend.launch(request)
        seen = await _collect(backend, _final("tl-s3"))
    config = json.loads((tmp_path / "jobs" / "tl-s3" / "config.json").read_text())
    assert config["output_uri"] == "s3://bucket/adapters"
    assert config["output_dir"] == str(tmp_path / "jobs" / "tl-s3" / "output")
    (final,) = [o for o in seen if o.phase.is_final]
    assert final.phase is JobPhase.SUCCEEDED
    assert final.result is not None
    assert final.result.adapter_uri == "s3://bucket/adapters/tl-s3"


LAUNCHING_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from orchestrator.jobs.model import TrainingRequest, TrainingSettings
    from runtimes.localprocess.backend import LocalProcessBackend

    async def main():
        root, *trainer = sys.argv[1:]
        backend = LocalProcessBackend(Path(root), trainer_command=tuple(trainer))
        await backend.launch(TrainingRequest(
            name="tl-killed-launcher", rule="retrain", rule_version="1", key="m1",
            decision_id="d-1", causing_event_ids=("e1",), runtime="local",
            base_model="tiny", dataset="data.jsonl", training=TrainingSettings(),
        ))
        await asyncio.sleep(600)  # killed with its process group long before

    asyncio.run(main())
    """
)


def _launcher_started(pid: int) -> bool:
    """Whether process *pid* has a child running the supervisor's launcher."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                if "runtimes.localprocess.supervisor" in child.cmdline():
                    return True
    return False


async def test_a_worker_killed_with_its_process_group_just_after_a_launch_leaves_the_job_running(
    tmp_path: Path, stand_in
):
    # Seen in the kill-mid-sweep fault test: the group was killed 19 ms after launched.json,
    # while the supervisor's launcher was still starting, and the job was reported lost a
    # minute later. The killed process here is a worker of its own, in its own process group
    # as the fault suites run theirs, killed while the launcher it spawned is starting.
    root = tmp_path / "jobs"
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LAUNCHING_WORKER,
        str(root),
        *stand_in,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        start_new_session=True,
    )
    try:
        await wait_for(
            lambda: _launcher_started(worker.pid),
            what="the worker to spawn the supervisor's launcher",
            timeout=60,
            interval=0.001,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        await worker.wait()
    await wait_for(
        (root / "tl-killed-launcher" / "exit.json").exists,
        what="the job to end (the killed worker took its launcher along: it never started)",
        timeout=30,
        interval=0.05,
    )
    assert json.loads((root / "tl-killed-launcher" / "exit.json").read_text())["returncode"] == 0
    assert (root / "tl-killed-launcher" / "runs").read_text() == "run\n"
