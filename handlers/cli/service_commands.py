"""`tuneloop services up`: real Kafka and a local Kubernetes cluster on 127.0.0.1, for development.

The same launchers the tests and `tuneloop demo` use (`devservices/`). `--kubernetes` starts
the local control plane with the real controllers (kube-apiserver, kube-controller-manager,
JobSet, Kubeflow Trainer) and the node agent that runs pods as local processes
(`devservices/control_plane.py`, docs/kubernetes.md). It prints the environment a worker needs
to reach them, then holds them until Ctrl-C.
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
    kubernetes: Annotated[
        bool,
        typer.Option(help="Start the local Kubernetes cluster (control plane and node agent)."),
    ] = False,
    work_dir: Annotated[
        Path | None, typer.Option(help="Where their data and logs go (default: a temp dir).")
    ] = None,
) -> None:
    """Start the local services and keep them up until interrupted."""
    from devservices import control_plane
    from devservices import kafka as kafka_service
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
                plane = stack.enter_context(control_plane.local_control_plane(root / "kubernetes"))
                # TUNELOOP_KUBECONFIG last: a script that waits for it finds both.
                typer.echo(f"export KUBECONFIG={plane.kubeconfig}")
                typer.echo(f"export TUNELOOP_KUBECONFIG={plane.kubeconfig}")
                typer.echo(f"# pods' volumes and container logs: {plane.pods_dir}/pods/", err=True)
        except ConfigError as exc:
            typer.echo(f"tuneloop services: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"# services are up (logs under {root}); Ctrl-C stops them", err=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    typer.echo("# services stopped", err=True)
