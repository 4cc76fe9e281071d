"""`tuneloop settings`: print the settings reference (every variable, default and meaning)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `settings` to *app*."""

    @app.command()
    def settings() -> None:
        """Print the settings reference as Markdown (docs/reference/settings.md)."""
        from handlers.settings_reference import render

        typer.echo(render(), nl=False)
