"""`tuneloop demo`: the whole loop on one machine (placeholder until the demo lands)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `demo` to *app*."""

    @app.command()
    def demo() -> None:
        """Run the end-to-end demo: events in, a LoRA fine-tune, a completion event out."""
        typer.echo("tuneloop demo: not yet implemented")
