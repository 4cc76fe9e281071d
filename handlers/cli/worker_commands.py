"""`tuneloop run`: start a worker (intake, rules, backend, completion events) in the foreground.

Settings come from `Settings.from_env()` alone (`orchestrator/settings.py`: `TUNELOOP_*`);
each option given on the command line replaces that one field (`dataclasses.replace`), so
the environment is read in one place and a flag always wins over a variable.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.errors import ConfigError
from orchestrator.settings import BackendKind, Settings


def with_options(
    settings: Settings,
    *,
    rules: tuple[Path, ...] | None = None,
    backend: BackendKind | None = None,
    local_root: Path | None = None,
    local_max_jobs: int | None = None,
    kubeconfig: Path | None = None,
    namespace: str | None = None,
    web_port: int | None = None,
) -> Settings:
    """*settings* with each option that was given (not None) in place of its variable.

    Raises:
        ConfigError: an option's value is invalid (as the variable's would be).
    """
    old = settings.worker
    worker = replace(
        old,
        rules=old.rules if rules is None else rules,
        backend=old.backend if backend is None else backend,
        local_root=old.local_root if local_root is None else local_root,
        local_max_jobs=old.local_max_jobs if local_max_jobs is None else local_max_jobs,
        kubeconfig=old.kubeconfig if kubeconfig is None else kubeconfig,
        web_port=old.web_port if web_port is None else web_port,
    )
    kubernetes = settings.kubernetes
    if namespace:
        kubernetes = replace(kubernetes, namespace=namespace)
    return replace(settings, worker=worker, kubernetes=kubernetes)


def register(app: typer.Typer) -> None:
    """Add `run` to *app*."""

    @app.command()
    def run(
        rules: Annotated[
            list[Path] | None,
            typer.Option(
                "--rules",
                help="Rule file or directory (repeatable); watched and reloaded while running."
                " (env TUNELOOP_RULES, space-separated; required)",
            ),
        ] = None,
        backend: Annotated[
            str | None,
            typer.Option(
                help="Where training runs: local | kubernetes. (env TUNELOOP_BACKEND;"
                " default local)"
            ),
        ] = None,
        local_root: Annotated[
            Path | None,
            typer.Option(
                help="local backend: job directories. (env TUNELOOP_LOCAL_ROOT;"
                " default ~/.cache/tuneloop/jobs)",
            ),
        ] = None,
        local_max_jobs: Annotated[
            int | None,
            typer.Option(
                help="local backend: jobs at once. (env TUNELOOP_LOCAL_MAX_JOBS; default 1)"
            ),
        ] = None,
        kubeconfig: Annotated[
            Path | None,
            typer.Option(
                help="kubernetes backend: the cluster. (env TUNELOOP_KUBECONFIG;"
                " default: the pod's ServiceAccount)"
            ),
        ] = None,
        namespace: Annotated[
            str | None,
            typer.Option(
                help="kubernetes backend: where TrainJobs go."
                " (env TUNELOOP_KUBERNETES_NAMESPACE; default default)",
            ),
        ] = None,
        web_port: Annotated[
            int | None,
            typer.Option(
                "--web-port",
                "--metrics-port",
                help="Serve /healthz, /readyz, /metrics and POST /events on this port."
                " (env TUNELOOP_WEB_PORT, or TUNELOOP_METRICS_PORT; default: none)",
            ),
        ] = None,
        log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
    ) -> None:
        """Run a tuneloop worker until interrupted (Kafka settings: TUNELOOP_KAFKA_*)."""
        from handlers.app import build_worker, make_backend, run_worker
        from handlers.logs import configure as configure_logging
        from handlers.partitions.guard import refuse_changed_partitions
        from orchestrator.clock import SystemClock

        configure_logging(log_level)
        clock = SystemClock()
        try:
            kind = BackendKind(backend.lower()) if backend else None
        except ValueError:
            typer.echo(f"unknown backend {backend!r}: use local or kubernetes", err=True)
            raise typer.Exit(2) from None
        try:
            settings = with_options(
                Settings.from_env(),
                rules=tuple(rules) if rules else None,
                backend=kind,
                local_root=local_root,
                local_max_jobs=local_max_jobs,
                kubeconfig=kubeconfig,
                namespace=namespace,
                web_port=web_port,
            )
            # A group's internal partition count is fixed (docs/partitions.md).
            refuse_changed_partitions(settings.kafka)
            training = make_backend(settings, clock=clock)
            worker = build_worker(settings, backend=training, clock=clock)
        except ConfigError as exc:
            typer.echo(f"tuneloop run: refusing to start: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(
            f"tuneloop worker: group {settings.kafka.group_id} on {settings.kafka.bootstrap}, "
            f"rules {worker.orchestrator.rules.version[:12]} "
            f"({len(worker.orchestrator.rules.rules)} rules), "
            f"backend {settings.worker.backend}",
            err=True,
        )
        run_worker(worker, settings, log_level=log_level)
