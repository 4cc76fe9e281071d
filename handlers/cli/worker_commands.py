"""`tuneloop run`: start a worker (intake, rules, backend, completion events) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.errors import ConfigError


def register(app: typer.Typer) -> None:
    """Add `run` to *app*."""

    @app.command()
    def run(
        rules: Annotated[
            list[Path],
            typer.Option(
                "--rules",
                envvar="TUNELOOP_RULES",
                help="Rule file or directory (repeatable); watched and reloaded while running.",
            ),
        ],
        backend: Annotated[
            str,
            typer.Option(
                envvar="TUNELOOP_BACKEND", help="Where training runs: local | kubernetes."
            ),
        ] = "local",
        local_root: Annotated[
            Path | None,
            typer.Option(
                envvar="TUNELOOP_LOCAL_ROOT",
                help="local backend: job directories (default ~/.cache/tuneloop/jobs).",
            ),
        ] = None,
        local_max_jobs: Annotated[
            int,
            typer.Option(envvar="TUNELOOP_LOCAL_MAX_JOBS", help="local backend: jobs at once."),
        ] = 1,
        kubeconfig: Annotated[
            Path | None,
            typer.Option(envvar="TUNELOOP_KUBECONFIG", help="kubernetes backend: the cluster."),
        ] = None,
        namespace: Annotated[
            str | None,
            typer.Option(
                envvar="TUNELOOP_KUBERNETES_NAMESPACE",
                help="kubernetes backend: where TrainJobs go (default: default).",
            ),
        ] = None,
        metrics_port: Annotated[
            int | None,
            typer.Option(
                envvar="TUNELOOP_METRICS_PORT", help="Serve Prometheus /metrics on this port."
            ),
        ] = None,
        log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
    ) -> None:
        """Run a tuneloop worker until interrupted (Kafka settings: TUNELOOP_KAFKA_*)."""
        import faust

        from handlers import metrics
        from handlers.app import BackendKind, build_worker, make_backend
        from handlers.logs import configure as configure_logging
        from orchestrator.clock import SystemClock
        from orchestrator.settings import Settings

        configure_logging(log_level)
        try:
            kind = BackendKind(backend)
        except ValueError:
            typer.echo(f"unknown backend {backend!r}: use local or kubernetes", err=True)
            raise typer.Exit(2) from None
        clock = SystemClock()
        try:
            settings = Settings.from_env()
            training = make_backend(
                kind,
                clock=clock,
                local_root=local_root,
                local_max_concurrent=local_max_jobs,
                kubeconfig=kubeconfig,
                namespace=namespace,
            )
            worker = build_worker(settings, rule_paths=rules, backend=training, clock=clock)
        except ConfigError as exc:
            typer.echo(f"tuneloop run: refusing to start: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(
            f"tuneloop worker: group {settings.kafka.group_id} on {settings.kafka.bootstrap}, "
            f"rules {worker.orchestrator.rules.version[:12]} "
            f"({len(worker.orchestrator.rules.rules)} rules), backend {kind}",
            err=True,
        )
        if metrics_port is not None:
            metrics.serve(
                metrics_port,
                worker.intake.stats,
                worker.counts,
                retries=lambda: worker.orchestrator.retries,
            )
        faust.Worker(worker.app, loglevel=log_level.upper(), quiet=True).execute_from_commandline()
