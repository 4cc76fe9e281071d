"""`tuneloop demo` (`make demo`): the whole loop on one machine, narrated in eight steps.

1. services on 127.0.0.1: a Kafka broker, an S3 server (s3proxy), an MLflow tracking server,
   and vLLM with runtime LoRA loading (started in the background: it takes the longest);
2. the dataset (`handlers/demo_data/`) is uploaded to the S3 server;
3. a real worker, `tuneloop run --backend local`, as a separate process, with the store's
   endpoint and keys and the MLflow server in its environment;
4. a `data.arrived` event naming the dataset's `s3://` location and drift alarms: the rule
   fires once, and the alarms that follow are suppressed (cooldown); every decision is read
   back from the audit topic;
5. the local backend runs the LoRA trainer on SmolLM2-135M (or the tiny model with
   `TUNELOOP_DEMO_MODEL=tiny`), reading the dataset from `s3://` and publishing the adapter
   there, tracked in MLflow, with a progress bar;
6. the `finetune.completed` event from the output topic: the rule's `promote: {}` gate made
   the adapter the champion (there was none), and the run's MLflow page;
7. `tuneloop handoff`, the real command, loads the promoted adapter into vLLM (which reads
   the bucket where s3proxy keeps it, as a server reads a mounted bucket);
8. vLLM answers one question (not in the dataset) as the base model and as the adapter.

vLLM cannot serve the tiny model (head size 16), so with `TUNELOOP_DEMO_MODEL=tiny` steps 7
and 8 are skipped and say why. Everything the run writes, service logs included, goes under
one run directory, printed at the start; it is removed at the end unless `--keep`, or kept
when the demo fails so that the logs it names are there to read.

It reads no repository file, so it runs from an installed wheel: its rules and data are
package data, the upload and the trainer's progress bar come from the composition root
(`handlers/app.py`), and the services from `devservices/`, imported when the demo starts.
The other demo modules do one step's work each: `demo_processes.py` (the two tuneloop
processes), `demo_stream.py` (Kafka), `demo_tracking.py` (MLflow), `demo_serving.py` (the
hand-off and vLLM's answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from handlers import demo_data, demo_processes
from handlers.demo_run import BUCKET, MODELS, NOT_SERVED, PROMPT, DemoError, DemoRun, say, step
from handlers.demo_serving import ServingRuntime, serve_and_ask
from handlers.demo_stream import DemoStream, create_topics, data_arrived, demo_stream, drift
from handlers.demo_stream import event_json as as_json
from handlers.demo_tracking import tracked_run
from orchestrator.errors import ConfigError
from orchestrator.events import CloudEvent

if TYPE_CHECKING:
    from devservices.object_storage import LocalObjectStorage
    from devservices.serving import LocalVllmServer

__all__ = ["DemoError", "run_demo"]

DATA = resources.files(demo_data)
"""The demo's rules (`rules.yaml`) and dataset (`unit-conversions.jsonl`), package data."""
DATASET_VARIABLE = "TUNELOOP_DEMO_DATASET"
"""Names a JSON Lines file to fine-tune on instead of the shipped dataset."""

T = TypeVar("T")


def run_demo(*, model: str, keep: bool, timeout: float = 900.0) -> int:
    """Run the demo; return the process exit code.

    Raises:
        DemoError: a step failed; the message says which, and where its log is.
    """
    if model not in MODELS:
        raise DemoError(f"unknown demo model {model!r}: use one of {sorted(MODELS)}")
    # A SIGTERM (a CI timeout, `kill`) must unwind like Ctrl-C, so that the services, the
    # worker and a running trainer are stopped by the clean-up below instead of being orphaned.
    signal.signal(signal.SIGTERM, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="tuneloop-demo-"))
    run = DemoRun(root=root, model=MODELS[model])
    deadline = time.monotonic() + timeout
    say(f"tuneloop demo — model {run.model}, files under {root}")
    failed = False
    try:
        with contextlib.ExitStack() as stack:
            services = _start_services(run, stack, deadline=deadline)
            step(2, "data: the dataset goes to the S3 server, where the rule reads it")
            _upload_dataset(run, services)
            step(3, "worker: tuneloop run --backend local (its log: worker.log)")
            worker = stack.enter_context(
                demo_processes.worker(
                    run,
                    bootstrap=services.bootstrap,
                    storage=services.storage_environment,
                    tracking_uri=services.tracking_uri,
                )
            )
            say(_topics_line(run))
            return asyncio.run(_drive(run, services, worker, deadline=deadline))
    except Exception:
        failed = True
        raise
    finally:
        if keep or failed:
            say(f"\nkept {root}" + (" (its logs are there)" if failed else ""))
        else:
            shutil.rmtree(root, ignore_errors=True)


def _topics_line(run: DemoRun) -> str:
    topics = run.topics
    return f"      in: {topics.events}; out: {topics.audit} (decisions), {topics.finetune} (jobs)"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --- step 1: the services -------------------------------------------------------------------


class _Services:
    """The services the demo started, as the steps after the first need them."""

    def __init__(
        self,
        *,
        bootstrap: str,
        storage: LocalObjectStorage,
        tracking_uri: str,
        vllm: Starting[LocalVllmServer] | None,
    ) -> None:
        from devservices.object_storage import LOCAL_CREDENTIAL, LOCAL_IDENTITY, LOCAL_REGION

        self.bootstrap = bootstrap
        self.storage = storage
        self.tracking_uri = tracking_uri
        self.vllm = vllm
        self.storage_environment: Mapping[str, str] = {
            "TUNELOOP_S3_ENDPOINT_URL": storage.endpoint_url,
            "AWS_REGION": LOCAL_REGION,
            "AWS_ACCESS_KEY_ID": LOCAL_IDENTITY,
            "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIAL,
        }


def _start_services(run: DemoRun, stack: contextlib.ExitStack, *, deadline: float) -> _Services:
    # Tooling, imported only when a demo runs (.importlinter: only the demo and the services
    # command import devservices).
    from devservices import kafka, mlflow_server, object_storage, serving

    step(1, "services: Kafka, an S3 server, MLflow and vLLM, each on 127.0.0.1")
    # All four start at once, each in a thread of its own (`Starting`); vLLM first, since it
    # takes from 30 s to minutes on two cores, and the demo waits for it only at step 7.
    vllm: Starting[LocalVllmServer] | None = None
    if run.serves:
        server = _prepared(
            "vLLM (the serving runtime)",
            lambda: serving.LocalVllmServer(
                python=serving.prepare_vllm(),
                model_dir=serving.default_model_dir(),
                work_dir=run.root / "vllm",
            ),
        )
        vllm = stack.enter_context(Starting("vLLM", server, abort=server.stop))
        say(f"      vLLM     starting in the background (log: {_shown(run, server.log_path)})")
    mlflow = _prepared(
        "the MLflow server",
        lambda: mlflow_server.LocalMlflowServer(
            python=mlflow_server.prepare_mlflow(), work_dir=run.root / "mlflow"
        ),
    )
    tracking = stack.enter_context(Starting("the MLflow server", mlflow, abort=mlflow.stop))
    s3 = _prepared(
        "the S3 server (s3proxy)",
        lambda: object_storage.LocalObjectStorage(
            jar=object_storage.prepare_s3proxy(), work_dir=run.root / "s3"
        ),
    )
    storage = stack.enter_context(Starting("the S3 server (s3proxy)", s3, abort=s3.stop))
    started = time.monotonic()
    broker = stack.enter_context(
        Starting("the Kafka broker", kafka.kafka_for_tests(run.root / "kafka"))
    ).wait(deadline)
    say(f"      Kafka    ready at {broker.bootstrap} in {time.monotonic() - started:.1f} s")
    create_topics(broker.bootstrap, run.topics)
    storage.wait(deadline)
    say(f"      S3       ready at {s3.endpoint_url} in {s3.last_start_seconds:.1f} s (s3proxy)")
    tracking.wait(deadline)
    say(f"      MLflow   ready at {mlflow.tracking_uri} in {mlflow.last_start_seconds:.1f} s")
    if not run.serves:
        say(f"      vLLM     not started: {NOT_SERVED[run.model]}")
    return _Services(
        bootstrap=broker.bootstrap, storage=s3, tracking_uri=mlflow.tracking_uri, vllm=vllm
    )


def _shown(run: DemoRun, path: Path) -> str:
    return str(path.relative_to(run.root))


def _prepared(what: str, make: Callable[[], T]) -> T:
    """*make()*, with a missing tool or a failed install named as the service's."""
    try:
        return make()
    except ConfigError as exc:
        raise DemoError(f"{what} cannot be prepared here: {exc}") from exc


class Starting(Generic[T]):
    """A service starting in a thread of its own while the demo goes on; stopped on exit.

    Every service of the demo starts this way, even one it waits for at once: Ctrl-C and
    SIGTERM interrupt only the main thread, so they never land inside the start of a server
    process, between its fork and the moment `subprocess.Popen` returns its id; a process
    interrupted there would run on, known to no one.

    Args:
        what: names the service in errors ("the S3 server (s3proxy)").
        service: entered in the thread (a `LocalServer` starts), exited on the way out.
        abort: makes a start still in progress end at once (a `LocalServer`'s `stop`), so
            that leaving the demo does not wait for vLLM to finish starting.
    """

    def __init__(
        self,
        what: str,
        service: AbstractContextManager[T],
        *,
        abort: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        self._service = service
        self._abort = abort
        self._value: T | None = None
        self._entered = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name=f"start {what}", daemon=True)

    def _start(self) -> None:
        try:
            self._value = self._service.__enter__()
            self._entered = True
        except BaseException as exc:  # reported by wait(), in the demo's own thread
            self._failure = exc

    def __enter__(self) -> Starting[T]:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        while self._thread.is_alive():
            if self._abort is not None:
                self._abort()  # again each second: a start may launch its process after one
            self._thread.join(timeout=1.0)
        if self._entered:
            self._service.__exit__(None, None, None)

    @property
    def done(self) -> bool:
        """Whether the start is over, for better or worse."""
        return not self._thread.is_alive()

    def wait(self, deadline: float) -> T:
        """The service, once it serves.

        Raises:
            DemoError: it failed to start (the message carries its log's path and last lines,
                `devservices/processes.py`), or the demo's time ran out.
        """
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            raise DemoError(f"timed out waiting for {self.what} to start")
        if self._failure is not None:
            raise DemoError(f"{self.what} did not start: {self._failure}") from self._failure
        assert self._value is not None, "a start that neither failed nor returned"
        return self._value


# --- step 2: the data -----------------------------------------------------------------------


def _upload_dataset(run: DemoRun, services: _Services) -> None:
    from handlers.app import upload_file

    own = os.environ.get(DATASET_VARIABLE)
    if own:
        shutil.copyfile(own, run.dataset)
    else:
        run.dataset.write_bytes(DATA.joinpath("unit-conversions.jsonl").read_bytes())
    _write_rules(run)
    services.storage.create_bucket(BUCKET)
    try:
        upload_file(run.dataset, run.dataset_uri, environ=services.storage_environment)
    except Exception as exc:  # the storage layer's errors live in runtimes/, not importable here
        raise DemoError(
            f"uploading the dataset to {run.dataset_uri} failed: {exc} "
            f"(the S3 server's log: {services.storage.log_path})"
        ) from exc
    rows = sum(1 for _ in run.dataset.open(encoding="utf-8"))
    say(f"      uploaded {rows} rows to {run.dataset_uri}")
    say(f"      the rule (rules.yaml) trains on it and publishes to s3://{BUCKET}/adapters/")


def _write_rules(run: DemoRun) -> None:
    text = DATA.joinpath("rules.yaml").read_text(encoding="utf-8")
    run.rules.write_text(
        text.replace("base_model: smollm2-135m", f"base_model: {run.model}"), encoding="utf-8"
    )


# --- steps 4 to 8: events in, training, the completion, the hand-off, the answers -----------


async def _drive(
    run: DemoRun, services: _Services, worker: demo_processes.DemoProcess, *, deadline: float
) -> int:
    async with demo_stream(services.bootstrap, run.topics, deadline=deadline) as stream:
        step(4, "events: fresh data, then drift alarms for the model 'units-assistant'")
        await stream.emit(data_arrived(run, 1))
        await stream.emit(drift(1, 0.31))
        await stream.emit(drift(2, 0.12))  # below threshold: the rule's `where` skips it
        await stream.emit(drift(3, 0.35))
        job = await stream.await_launch(worker)
        say("      while it trains, more data and two more alarms arrive:")
        await stream.emit(data_arrived(run, 2))
        await stream.emit(drift(4, 0.40))
        await stream.emit(drift(5, 0.42))
        await stream.await_decisions(worker, want=3)

        step(5, "training: LoRA on the local backend, the data read from S3")
        say(
            f"      job {job}: {run.model}, tracked in MLflow, published to s3://{BUCKET}/adapters/"
        )
        completed = await stream.follow_training(run, job, worker)

        step(6, "the finetune.completed event: the adapter on S3, promoted, tracked in MLflow")
        say(json.dumps(as_json(completed), indent=2))
        await _show_completion(completed, services)

        step(7, "hand-off: tuneloop handoff loads the promoted adapter into vLLM")
        if services.vllm is None:
            say(f"      skipped: {NOT_SERVED[run.model]}")
            step(8, "vLLM answers one question as the base model and as the adapter")
            say("      skipped: no server (step 7)")
        else:
            await _hand_off(run, services, services.vllm, stream, completed, deadline=deadline)
        say("\ndemo finished: stopping everything it started")
        return 0


async def _show_completion(completed: CloudEvent, services: _Services) -> None:
    data = completed.data
    if not data.get("adapter_uri"):
        raise DemoError("the completion event names no adapter")
    metrics = data.get("metrics") or {}
    say(f"      adapter  : {data['adapter_uri']} (its manifest, written last, lists every file)")
    before, after = _loss(metrics, "eval_loss_before"), _loss(metrics, "eval_loss_after")
    say(f"      eval loss: {before} before training, {after} after")
    promotion = data.get("promotion") or {}
    say(f"      promoted : {data.get('promoted')} ({promotion.get('reason', 'no gate')})")
    if not data.get("promoted"):
        raise DemoError("the gate did not promote the demo's first adapter; nothing to serve")
    try:
        tracked = await asyncio.to_thread(
            tracked_run,
            services.tracking_uri,
            rule=str(data["rule"]),
            job=str(data["job"]),
            wait_for_champion=30.0,
        )
    except Exception as exc:  # an answer MLflow should not give; the loop itself is done
        raise DemoError(f"MLflow at {services.tracking_uri} could not be read: {exc}") from exc
    if tracked is None:
        raise DemoError(f"MLflow at {services.tracking_uri} has no run of job {data['job']}")
    say(f"      MLflow   : {tracked.url}")
    if tracked.model is not None:
        alias = " (alias champion)" if tracked.champion else ""
        say(f"      registry : {tracked.model} version {tracked.version}{alias}")


def _loss(metrics: Mapping[str, Any], name: str) -> str:
    value = metrics.get(name)
    return f"{value:.4f}" if isinstance(value, int | float) else "?"


async def _hand_off(
    run: DemoRun,
    services: _Services,
    starting: Starting[LocalVllmServer],
    stream: DemoStream,
    completed: CloudEvent,
    *,
    deadline: float,
) -> None:
    if not starting.done:
        say("      waiting for vLLM to finish starting ...")
    vllm = await asyncio.to_thread(starting.wait, deadline)
    say(f"      vLLM     ready at {vllm.base_url} in {vllm.last_start_seconds:.0f} s")
    # vLLM reads adapters from its own disk. s3proxy keeps each bucket as a folder, so the
    # bucket's folder is to vLLM what a mounted bucket is to a server elsewhere
    # (TUNELOOP_HANDOFF_PATHS, docs/inference.md).
    await serve_and_ask(
        run,
        bootstrap=services.bootstrap,
        vllm=ServingRuntime(vllm.base_url, vllm.served_model_name, vllm.log_path),
        adapter_paths={f"s3://{BUCKET}/": f"{services.storage.data_dir / BUCKET}/"},
        stream=stream,
        completed=completed,
        prompt=_demo_prompt(run),
    )


def _demo_prompt(run: DemoRun) -> str:
    """The shipped dataset's question, or the first prompt of one's own dataset."""
    if not os.environ.get(DATASET_VARIABLE):
        return PROMPT
    with run.dataset.open(encoding="utf-8") as lines:
        first = json.loads(next(lines))
    return str(first.get("prompt") or first.get("text", "")[:80])
