"""`tuneloop services up`: real Kafka and a real Kubernetes API on 127.0.0.1, for development.

The same launchers the tests and `tuneloop demo` use (`devservices/`). It prints
the environment a worker needs to reach them, then holds them until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
from pathlib import Path
from typing import Annotated

import typer

services = typer.Typer(help="Local Kafka and Kubernetes API for development.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the `services` group to *app*."""
    app.add_typer(services, name="services")


@services.command("up")
def up(
    kafka: Annotated[bool, typer.Option(help="Start a Kafka broker.")] = True,
    kubernetes: Annotated[bool, typer.Option(help="Start a Kubernetes API server.")] = False,
    work_dir: Annotated[
        Path | None, typer.Option(help="Where their data and logs go (default: a temp dir).")
    ] = None,
) -> None:
    """Start the local services and keep them up until interrupted."""
    from devservices import kafka as kafka_service
    from devservices import kubernetes as kube_service
    from orchestrator.errors import ConfigError

    root = work_dir or Path(tempfile.mkdtemp(prefix="tuneloop-services-"))
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.ExitStack() as stack:
        try:
            if kafka:
                broker = stack.enter_context(kafka_service.kafka_for_tests(root / "kafka"))
                typer.echo(f"export TUNELOOP_KAFKA_BOOTSTRAP={broker.bootstrap}")
            if kubernetes:
                api = stack.enter_context(kube_service.connect(root / "kubernetes"))
                typer.echo(f"export TUNELOOP_KUBECONFIG={api.kubeconfig}")
        except ConfigError as exc:
            typer.echo(f"tuneloop services: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"# services are up (logs under {root}); Ctrl-C stops them", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    typer.echo("# services stopped", err=True)
