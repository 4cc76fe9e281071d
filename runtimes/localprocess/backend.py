"""`LocalProcessBackend`: training jobs as processes on this machine, behind `TrainingBackend`.

The embedded default for a user with one machine; `handlers/app.py` wires it. Each job gets a
work directory `<root>/<job name>/` that holds everything needed to find it again:

    request.json     the TrainingRequest, as launched
    config.json      the resolved TrainerConfig (the trainer reads it)
    environment.json variables for the trainer besides the worker's own (with tracking: the
                     MLflow server and the run's context, runtimes/tracking/context.py)
    launched.json    written just before the supervisor is spawned: never start it again
    started.json     written by the supervisor once the trainer runs
    stdout.log       the trainer's JSON progress lines (parsed into Observations)
    exit.json        how the trainer ended (supervisor)
    reported         the final Observation was handed to a consumer: never report it again
    output/          the trainer's output_dir

With a request's `output_uri` (a path, `file://` or `s3://`, reached with the worker's own
S3 settings, docs/storage.md), the trainer publishes to `<output_uri>/<job>/`, manifest
last, and the completion's `adapter_uri` is that published location; else it is
`output/adapter`. Either way it names something that exists: a failed publish fails the job.

For a rule with `promote:` the request names the champion to compare with
(`champion_uri`), which goes into `config.json` like every other setting: the trainer scores
it beside the new adapter on the same held-out split, and the completion's metrics carry both
(`eval_loss`, ..., `champion_eval_loss`, ...), which the service's promotion gate judges.

A launch starts `python -m runtimes.localprocess.supervisor` (in its own session, so it
outlives an orchestrator crash), which runs `python -m runtimes.trainer --config config.json`.
At most `max_concurrent` jobs run at once; the rest wait, in launch order, in `Pending`.
Launching a name that has a directory returns the same JobRef and starts nothing. A new
instance on the same root adopts running jobs, starts queued ones, and reports each finished
but unreported job exactly once; it never relaunches a job that has started.

The pump task polls the job directories every `poll_interval` seconds: plain files are what
survives a restart, and a poll of a few small files is cheap next to a training step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import ConfigError, JobRejectedError, TransientBackendError
from orchestrator.jobs.model import (
    JobPhase,
    JobRef,
    JobResult,
    Observation,
    TrainingRequest,
)
from runtimes import storage, tracking
from runtimes.localprocess.supervisor import CANCEL_MARKER, write_json_atomically
from runtimes.trainer.config import ProgressMode, TrainerConfig

BACKEND_NAME = "local"
REPORTED_MARKER = "reported"
SUPERVISOR_START_GRACE = 60.0
"""Seconds a launched job may take to write started.json before it counts as lost."""
TRAINER_COMMAND: tuple[str, ...] = (sys.executable, "-m", "runtimes.trainer")


@dataclass(slots=True)
class _Job:
    """What this instance knows about one job directory (mutable, private)."""

    name: str
    directory: Path
    sequence: int
    phase: JobPhase | None = None
    """The last phase reported to consumers by this instance."""
    launched: bool = False
    """This instance started the supervisor (it may not have written started.json yet)."""
    stdout_offset: int = 0
    decision_id: str | None = None
    final_emitted: bool = False
    history: list[Observation] = dataclasses.field(default_factory=list)
    """Phase changes so far (no progress): what a new observer is told first."""
    cancel_signalled: bool = False

    @property
    def ref(self) -> JobRef:
        return JobRef(name=self.name, backend=BACKEND_NAME)

    def has(self, file: str) -> bool:
        return (self.directory / file).exists()


class LocalProcessBackend:
    """Runs each training job as a local subprocess; see the module docstring."""

    def __init__(
        self,
        root: Path,
        *,
        max_concurrent: int = 1,
        clock: Clock | None = None,
        poll_interval: float = 0.2,
        trainer_command: Sequence[str] = TRAINER_COMMAND,
        trainer_overrides: Mapping[str, Any] | None = None,
        environment: Mapping[str, str] | None = None,
        runtimes: Mapping[str, Mapping[str, Any]] | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        """
        Args:
            root: directory of the per-job work directories (created if missing).
            max_concurrent: jobs running at once on this machine; the rest queue.
            clock: where Observation times come from.
            poll_interval: seconds between looks at the job directories.
            trainer_command: the program run with `--config <job>/config.json`.
            trainer_overrides: TrainerConfig fields set on every job (e.g. `save_steps`).
            environment: extra variables for the trainer process.
            runtimes: local runtime profiles by name, each a mapping of TrainerConfig
                overrides; a request naming another runtime is rejected (`RuntimeNotFound`).
                None accepts every runtime name, so rule files written for a cluster run
                unchanged on one machine.
            tracking_uri: the MLflow server each trainer logs its run to (docs/tracking.md);
                None: runs are not tracked.
        """
        if max_concurrent < 1:
            raise ConfigError("max_concurrent must be at least 1")
        self._root = root
        self._max_concurrent = max_concurrent
        self._clock = clock or SystemClock()
        self._poll_interval = poll_interval
        self._trainer_command = tuple(trainer_command)
        self._overrides = dict(trainer_overrides or {})
        self._environment = dict(environment or {})
        self._runtimes = None if runtimes is None else {k: dict(v) for k, v in runtimes.items()}
        self._tracking_uri = tracking_uri
        self._jobs: dict[str, _Job] = {}
        self._observers: set[asyncio.Queue[tuple[_Job, Observation]]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._scanned = False
        self._lock = asyncio.Lock()

    # -- the TrainingBackend protocol -------------------------------------------------------

    async def launch(self, request: TrainingRequest) -> JobRef:
        await self._ensure_started()
        async with self._lock:
            directory = self._root / request.name
            stored = _read_json(directory / "request.json")
            if stored is not None:
                # Launched before (perhaps by an earlier instance): the same job, unless
                # another decision produced the same name.
                if stored.get("request", {}).get("decision_id") != request.decision_id:
                    raise JobRejectedError(
                        f"job name {request.name} is taken by another decision",
                        reason="NameTaken",
                    )
                return JobRef(name=request.name, backend=BACKEND_NAME)
            if self._runtimes is not None and request.runtime not in self._runtimes:
                raise JobRejectedError(
                    f"runtime {request.runtime!r} is not a local runtime profile "
                    f"(known: {', '.join(sorted(self._runtimes)) or 'none'})",
                    reason="RuntimeNotFound",
                )
            config = self._config_for(request, directory)
            try:
                directory.mkdir(parents=True, exist_ok=False)
                (directory / "config.json").write_text(config.to_json())
                write_json_atomically(
                    directory / "environment.json",
                    tracking.trainer_environment(request, self._tracking_uri),
                )
                sequence = self._next_sequence()
                write_json_atomically(
                    directory / "request.json",
                    {"sequence": sequence, "request": _request_mapping(request)},
                )
            except FileExistsError as exc:
                raise TransientBackendError(
                    f"job directory {directory} is being created by someone else", delay=1.0
                ) from exc
            except OSError as exc:
                raise TransientBackendError(
                    f"cannot create job directory {directory}: {exc}", delay=5.0
                ) from exc
            job = _Job(
                name=request.name,
                directory=directory,
                sequence=sequence,
                decision_id=request.decision_id,
            )
            self._jobs[job.name] = job
            self._emit(job, JobPhase.PENDING, reason="Queued")
            await self._start_queued()
            return job.ref

    async def cancel(self, job: JobRef) -> None:
        await self._ensure_started()
        async with self._lock:
            known = self._jobs.get(job.name)
            if known is None or known.final_emitted or known.has("exit.json"):
                return
            (known.directory / CANCEL_MARKER).write_text("cancel\n")
            if not known.launched and not known.has("launched.json"):
                # Never started: record the end ourselves; the pump reports it.
                write_json_atomically(
                    known.directory / "exit.json",
                    {"returncode": None, "cancelled": True, "finished_at": None},
                )
                return
            self._signal_cancel(known)

    def _signal_cancel(self, job: _Job) -> None:
        """SIGTERM the supervisor once it runs (it forwards it to the trainer). A job still
        being launched sees the marker itself, or the pump signals it once started.json
        appears."""
        started = _read_json(job.directory / "started.json")
        if started is None or job.cancel_signalled:
            return
        job.cancel_signalled = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(started["supervisor_pid"]), signal.SIGTERM)

    async def observe(self) -> AsyncIterator[Observation]:
        """Each call first replays the phase changes of every job this instance knows, then
        follows new ones (as a Kubernetes list-then-watch does). A final observation counts
        as delivered once the consumer asks for the next one or closes the iterator; from
        then on a later instance on the same root never reports that job again."""
        await self._ensure_started()
        inbox: asyncio.Queue[tuple[_Job, Observation]] = asyncio.Queue()
        for job in sorted(self._jobs.values(), key=lambda j: j.sequence):
            for past in job.history:
                inbox.put_nowait((job, past))
        self._observers.add(inbox)
        try:
            while True:
                job, observation = await inbox.get()
                try:
                    yield observation
                finally:
                    if observation.phase.is_final:
                        with contextlib.suppress(OSError):  # the directory was removed
                            (job.directory / REPORTED_MARKER).write_text("reported\n")
        finally:
            self._observers.discard(inbox)

    # -- lifecycle ----------------------------------------------------------------------------

    async def active_jobs(self) -> frozenset[str]:
        """Jobs in the work directory that have not exited: queued and running alike."""
        await self._ensure_started()
        async with self._lock:
            return frozenset(
                job.name
                for job in self._jobs.values()
                if not job.final_emitted and not job.has("exit.json")
            )

    async def aclose(self) -> None:
        """Stop watching. Running trainers keep running; a new instance adopts them."""
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None

    async def __aenter__(self) -> LocalProcessBackend:
        await self._ensure_started()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- internals ----------------------------------------------------------------------------

    def _config_for(self, request: TrainingRequest, directory: Path) -> TrainerConfig:
        # The trainer always works in the job directory; an output_uri (a path, file:// or
        # s3://) is where it then publishes `<output_uri>/<job>/`, manifest last.
        output_uri = None
        if request.output_uri:
            try:
                output_uri = storage.parse_location(request.output_uri).uri
            except storage.InvalidLocationError as exc:
                raise JobRejectedError(str(exc), reason="UnsupportedOutputUri") from exc
        profile = (self._runtimes or {}).get(request.runtime, {})
        overrides = {"progress": ProgressMode.JSON, **self._overrides, **profile}
        try:
            return TrainerConfig.from_training_request(
                request, output_dir=directory / "output", output_uri=output_uri, **overrides
            )
        except (ConfigError, TypeError) as exc:
            raise JobRejectedError(str(exc), reason="InvalidTrainerConfig") from exc

    def _next_sequence(self) -> int:
        return 1 + max((job.sequence for job in self._jobs.values()), default=0)

    async def _ensure_started(self) -> None:
        if not self._scanned:
            self._scanned = True
            self._root.mkdir(parents=True, exist_ok=True)
            self._scan()
        if self._pump is None:
            self._pump = asyncio.create_task(self._pump_forever(), name="local-backend-pump")

    def _scan(self) -> None:
        """Find the job directories of earlier instances (restart safety)."""
        for directory in sorted(self._root.iterdir()):
            stored = _read_json(directory / "request.json")
            if stored is None or (directory / REPORTED_MARKER).exists():
                continue
            job = _Job(
                name=directory.name,
                directory=directory,
                sequence=int(stored.get("sequence", 0)),
                decision_id=stored.get("request", {}).get("decision_id"),
            )
            self._jobs[job.name] = job
            # Progress printed before we looked is history, not news.
            with contextlib.suppress(OSError):
                job.stdout_offset = (directory / "stdout.log").stat().st_size
            if job.has("exit.json"):
                # Finished while no instance watched: only its final state is news.
                job.phase = JobPhase.RUNNING
            elif job.has("started.json"):
                self._emit(job, JobPhase.RUNNING, reason="Adopted")
            else:
                self._emit(job, JobPhase.PENDING, reason="Queued")

    async def _pump_forever(self) -> None:
        while True:
            async with self._lock:
                for job in sorted(self._jobs.values(), key=lambda j: j.sequence):
                    self._poll(job)
                await self._start_queued()
            await asyncio.sleep(self._poll_interval)

    def _running(self) -> list[_Job]:
        return [
            job
            for job in self._jobs.values()
            if not job.final_emitted
            and (job.launched or job.has("launched.json"))
            and not job.has("exit.json")
        ]

    async def _start_queued(self) -> None:
        free = self._max_concurrent - len(self._running())
        queued = sorted(
            (
                job
                for job in self._jobs.values()
                if not job.launched
                and not job.final_emitted
                and not job.has("launched.json")
                and not job.has("exit.json")
            ),
            key=lambda j: j.sequence,
        )
        for job in queued[: max(0, free)]:
            await self._start(job)

    async def _start(self, job: _Job) -> None:
        command = [
            sys.executable,
            "-m",
            "runtimes.localprocess.supervisor",
            str(job.directory),
            "--",
            *self._trainer_command,
            "--config",
            str(job.directory / "config.json"),
        ]
        stored_environment = _read_json(job.directory / "environment.json") or {}
        environment = {
            **os.environ,
            **self._environment,
            **{str(name): str(value) for name, value in stored_environment.items()},
        }
        # The trainer must import this project even when started from elsewhere.
        project_root = str(Path(__file__).resolve().parents[2])
        environment["PYTHONPATH"] = os.pathsep.join(
            part for part in (project_root, environment.get("PYTHONPATH")) if part
        )
        environment.setdefault("PYTHONUNBUFFERED", "1")
        # Written before the spawn: a later instance must never start this job again.
        write_json_atomically(job.directory / "launched.json", {"at": time.time()})
        job.launched = True
        try:
            launcher = await asyncio.create_subprocess_exec(
                *command,
                cwd=job.directory,
                env=environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                # Out of the worker's process group from the start: a kill of the worker's
                # group (a fault suite's kill -9, a terminal's) while the launcher was still
                # starting took it along, and the job was lost (seen 19 ms after a launch).
                start_new_session=True,
            )
            # The launcher forks the supervisor off and exits at once (see supervisor.py).
            returncode = await launcher.wait()
        except OSError as exc:
            returncode, error = None, f"cannot start the supervisor: {exc}"
        else:
            error = f"the supervisor launcher exited with {returncode}"
        if returncode != 0:
            write_json_atomically(
                job.directory / "exit.json",
                {"returncode": None, "cancelled": False, "error": error},
            )

    def _poll(self, job: _Job) -> None:
        if job.final_emitted:
            return
        started = job.has("started.json")
        if started and job.phase in (None, JobPhase.PENDING):
            self._emit(job, JobPhase.RUNNING, reason="Started")
        if started and job.has(CANCEL_MARKER):
            self._signal_cancel(job)
        for line in self._new_lines(job):
            self._on_line(job, line)
        exit_info = _read_json(job.directory / "exit.json")
        if exit_info is None:
            exit_info = self._check_supervisor(job)
        if exit_info is not None:
            self._finish(job, exit_info)

    def _check_supervisor(self, job: _Job) -> dict[str, Any] | None:
        """Is the supervisor of a launched, unfinished job still there? If not, the job is
        lost: record that (it is never relaunched)."""
        started = _read_json(job.directory / "started.json")
        if started is None:
            launched = _read_json(job.directory / "launched.json")
            if launched is None or time.time() - float(launched["at"]) < SUPERVISOR_START_GRACE:
                return None
            error = "the supervisor never started the trainer"
        else:
            pid = int(started.get("supervisor_pid", 0))
            if pid and _alive(pid):
                return None
            exit_info = _read_json(job.directory / "exit.json")
            if exit_info is not None:  # it finished between our two looks
                return exit_info
            error = "the supervisor died without recording the trainer's exit"
        lost = {"returncode": None, "cancelled": False, "error": error}
        write_json_atomically(job.directory / "exit.json", lost)
        return lost

    def _new_lines(self, job: _Job) -> list[str]:
        path = job.directory / "stdout.log"
        try:
            with path.open("rb") as stream:
                stream.seek(job.stdout_offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return []
        job.stdout_offset += len(complete) + 1
        return complete.decode("utf-8", errors="replace").splitlines()

    def _on_line(self, job: _Job, line: str) -> None:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            return  # not one of our lines (a library printing): ignore
        if not isinstance(event, dict) or event.get("event") != "progress":
            return
        progress = {key: value for key, value in event.items() if key != "event"}
        self._emit(job, JobPhase.RUNNING, reason="Progress", progress=progress)

    def _finish(self, job: _Job, exit_info: Mapping[str, Any]) -> None:
        output = Path(_read_config_output(job.directory))
        result = _read_json(output / "result.json")
        returncode = exit_info.get("returncode")
        if exit_info.get("cancelled"):
            self._emit(job, JobPhase.FAILED, reason="Cancelled", message="cancelled on request")
        elif returncode == 0 and result is not None:
            self._emit(
                job,
                JobPhase.SUCCEEDED,
                reason="Completed",
                result=_job_result(result),
            )
        else:
            failure = _read_json(output / "failure.json") or {}
            reason = str(failure.get("kind") or ("Lost" if returncode is None else "ExitCode"))
            message = str(
                failure.get("message")
                or exit_info.get("error")
                or f"trainer exited with code {returncode}; see {job.directory / 'stderr.log'}"
            )
            self._emit(job, JobPhase.FAILED, reason=reason, message=message)
        job.final_emitted = True

    def _emit(
        self,
        job: _Job,
        phase: JobPhase,
        *,
        reason: str,
        message: str | None = None,
        result: JobResult | None = None,
        progress: Mapping[str, Any] | None = None,
    ) -> None:
        if progress is None:
            job.phase = phase
        observation = Observation(
            job=job.ref,
            phase=phase,
            at=self._clock.now(),
            reason=reason,
            message=message,
            result=result,
            **({"progress": dict(progress)} if progress else {}),
        )
        if progress is None:
            job.history.append(observation)
        for inbox in self._observers:
            inbox.put_nowait((job, observation))


def _job_result(result: Mapping[str, Any]) -> JobResult:
    """The completion's result from `result.json`, which the trainer leaves only on success:
    a published run's `adapter_uri` (written by the trainer only after `publish_adapter`
    succeeded), else the adapter directory the trainer wrote, which exists on this machine."""
    published = result.get("adapter_uri")
    adapter = result.get("adapter_dir")
    metrics = dict(result.get("metrics") or {})
    metrics["base_model"] = result.get("base_model")
    metrics["data_fingerprint"] = (result.get("data") or {}).get("fingerprint")
    metrics["peft_config"] = result.get("peft_config")
    if isinstance(published, str) and published:
        adapter_uri: str | None = published
    else:
        adapter_uri = Path(adapter).as_uri() if adapter else None
    return JobResult(adapter_uri=adapter_uri, metrics=metrics)


def _read_config_output(directory: Path) -> str:
    config = _read_json(directory / "config.json") or {}
    return str(config.get("output_dir", directory / "output"))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not running any more.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text()
        if status.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def _request_mapping(request: TrainingRequest) -> dict[str, Any]:
    mapping: dict[str, Any] = _plain(dataclasses.asdict(request))
    return mapping


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
