"""`tuneloop partitions show | grow`: a worker group's internal partitions, and growing them
under a new group (docs/partitions.md).

Both read the Kafka settings from `Settings.from_env()` (`TUNELOOP_KAFKA_*`); the group they
look at is `TUNELOOP_KAFKA_GROUP_ID`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from orchestrator.errors import ConfigError
from orchestrator.settings import KafkaSettings, Settings

partitions = typer.Typer(
    help="A worker group's internal partitions: show them, grow them under a new group.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the `partitions` group to *app*."""
    app.add_typer(partitions, name="partitions")


@partitions.command("show")
def show() -> None:
    """Print the group's internal topics with their partition counts, and its members."""
    from handlers.partitions.showing import describe

    try:
        lines = asyncio.run(describe(_kafka_settings("show")))
    except ConfigError as exc:
        typer.echo(f"tuneloop partitions show: {exc}", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)


@partitions.command("grow")
def grow(
    to_group: Annotated[
        str,
        typer.Option(
            "--to-group", help="The new group (TUNELOOP_KAFKA_GROUP_ID of the workers after)."
        ),
    ],
    count: Annotated[
        int, typer.Option("--partitions", help="Internal partitions of the new group.")
    ],
) -> None:
    """Move the stopped group TUNELOOP_KAFKA_GROUP_ID to a new group with another number of
    internal partitions: its Tables' state, the keyed records not yet handled and the input
    offsets. Safe to run again."""
    from handlers.partitions.growing import grow as grow_group

    kafka = _kafka_settings("grow")
    try:
        growth = asyncio.run(grow_group(kafka, to_group=to_group, partitions=count, say=typer.echo))
    except ConfigError as exc:
        typer.echo(f"tuneloop partitions grow: refused: {exc}", err=True)
        raise typer.Exit(1) from None
    written = sum(table.written for table in growth.tables)
    unplaced = sum(len(table.unplaced) for table in growth.tables)
    typer.echo(
        f"done: {growth.old_group} -> {growth.new_group} ({growth.new_partitions} partitions); "
        f"{written} table records written, {growth.reforwarded} keyed records re-forwarded, "
        f"{len(growth.offsets)} input offsets copied"
        + (f", {unplaced} entries not placed" if unplaced else "")
    )
    typer.echo(
        f"next: start the workers with TUNELOOP_KAFKA_GROUP_ID={growth.new_group} "
        f"TUNELOOP_KAFKA_INTERNAL_PARTITIONS={growth.new_partitions}"
    )


def _kafka_settings(command: str) -> KafkaSettings:
    try:
        return Settings.from_env().kafka
    except ConfigError as exc:
        typer.echo(f"tuneloop partitions {command}: {exc}", err=True)
        raise typer.Exit(1) from None
