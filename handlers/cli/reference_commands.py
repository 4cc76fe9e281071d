"""`tuneloop reference settings|cli`: print a reference page generated from the code."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `reference` to *app*."""

    @app.command()
    def reference(
        page: Annotated[str, typer.Argument(help="settings or cli")] = "settings",
    ) -> None:
        """Print the settings or CLI reference as Markdown (docs/reference/)."""
        from handlers.reference_pages import cli_page, settings_page

        pages = {"settings": settings_page, "cli": cli_page}
        if page not in pages:
            typer.echo(f"unknown page {page!r}: use settings or cli", err=True)
            raise typer.Exit(2)
        # The page is rendered from the very app this command is registered on, passed in
        # rather than imported (handlers.cli.main imports this module).
        typer.echo(pages[page](app), nl=False)
