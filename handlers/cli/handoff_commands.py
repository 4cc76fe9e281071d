"""`tuneloop handoff`: load each promoted adapter into the vLLM servers of its model.

Settings come from `Settings.from_env()` alone: `TUNELOOP_HANDOFF_*` (the targets, the path
map, the ledger topic) and `TUNELOOP_KAFKA_*` (the brokers; the completions are read from
`TUNELOOP_KAFKA_TOPIC_OUT` unless `TUNELOOP_HANDOFF_TOPIC_IN` says otherwise). Runs in the
foreground until SIGTERM or SIGINT; docs/inference.md explains it.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `handoff` to *app*."""

    @app.command()
    def handoff(
        log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
    ) -> None:
        """Load promoted adapters into vLLM servers (TUNELOOP_HANDOFF_TARGETS) until stopped."""
        from handlers.handoff.consumer import run_handoff
        from handlers.logs import configure as configure_logging
        from orchestrator.errors import ConfigError, TransientBackendError
        from orchestrator.settings import Settings

        try:
            settings = Settings.from_env()
            if not settings.handoff.targets:
                raise ConfigError("TUNELOOP_HANDOFF_TARGETS names no server")
        except ConfigError as exc:
            typer.echo(f"tuneloop handoff: refusing to start: {exc}", err=True)
            raise typer.Exit(1) from None
        configure_logging(log_level)

        async def main() -> None:
            stopping = asyncio.Event()
            loop = asyncio.get_running_loop()
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(number, stopping.set)
            await run_handoff(settings, stopping=stopping)

        typer.echo(
            f"tuneloop handoff: group {settings.handoff.group_id} on {settings.kafka.bootstrap}",
            err=True,
        )
        try:
            asyncio.run(main())
        except TransientBackendError as exc:
            typer.echo(f"tuneloop handoff: {exc}", err=True)
            raise typer.Exit(1) from None
