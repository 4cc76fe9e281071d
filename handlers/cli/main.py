"""The `tuneloop` console script.

Each area of the CLI lives in its own module with a `register(app)` function, so that the
rule commands, the event commands and the service commands can grow independently.
"""

from __future__ import annotations

import typer

from handlers.cli import (
    demo_commands,
    event_commands,
    handoff_commands,
    partition_commands,
    reference_commands,
    rule_commands,
    service_commands,
    tail_commands,
    worker_commands,
)

app = typer.Typer(
    name="tuneloop",
    help="Event-driven LoRA fine-tuning: CloudEvents in, training jobs out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def tuneloop() -> None:
    """Event-driven LoRA fine-tuning: CloudEvents in, training jobs out."""


for module in (
    rule_commands,
    event_commands,
    tail_commands,
    worker_commands,
    handoff_commands,
    demo_commands,
    service_commands,
    partition_commands,
    reference_commands,
):
    module.register(app)


if __name__ == "__main__":  # pragma: no cover - `python -m handlers.cli.main`
    app()
