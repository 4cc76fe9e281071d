"""Reference pages generated from the code itself: settings and CLI.

- docs/reference/settings.md: each settings field documents its unit, default and reason in an
  attribute docstring (kopf's habit); `settings_page()` reads those docstrings from the source
  with `ast` and renders one table per group, plus the options of `tuneloop run`.
- docs/reference/cli.md: `cli_page()` renders every command's usage, arguments and options
  from the typer app.

`tests/unit/test_reference_pages.py` fails when a committed page differs from what the code
renders. Regenerate with `tuneloop reference settings > docs/reference/settings.md` (and `cli`).
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from orchestrator import settings as core_settings


@dataclass(frozen=True, slots=True)
class Field:
    """One documented field of a settings class."""

    name: str
    default: str
    doc: str


def fields_of(module: ModuleType, class_name: str) -> dict[str, Field]:
    """The fields of *class_name* in *module*, with their defaults and attribute docstrings."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text(encoding="utf-8"))
    found: dict[str, Field] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        body = node.body
        for index, item in enumerate(body):
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            nxt = body[index + 1] if index + 1 < len(body) else None
            doc = ""
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                doc = " ".join(nxt.value.value.split())
            default = _default_text(item.value)
            found[item.target.id] = Field(item.target.id, default, doc)
    return found


def _default_text(value: ast.expr | None) -> str:
    if value is None:
        return "(required)"
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
    return ast.unparse(value)


def _row(variable: str, field: Field) -> str:
    doc = field.doc.replace("|", "\\|")
    default = field.default.replace("|", "\\|")
    return f"| `{variable}` | `{default}` | {doc} |"


def _kafka() -> list[str]:
    rows = [
        _row(f"{core_settings.ENV_PREFIX}KAFKA_{name.upper()}", field)
        for name, field in fields_of(core_settings, "KafkaSettings").items()
    ]
    return [
        "## Kafka (`TUNELOOP_KAFKA_*`)",
        "",
        "Lists (`TOPICS_IN`) are comma-separated; durations are seconds.",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *rows,
    ]


def _kubernetes() -> list[str]:
    from runtimes.kubernetes import backend, manifests

    backend_fields = fields_of(backend, "BackendSettings")
    manifest_fields = fields_of(manifests, "Settings")
    mapping = {
        "NAMESPACE": backend_fields["namespace"],
        "REQUEST_TIMEOUT": backend_fields["request_timeout"],
        "WATCH_TIMEOUT": backend_fields["watch_timeout"],
        "JOBSET_TIMEOUT": backend_fields["jobset_timeout"],
        "TRAINER_IMAGE": manifest_fields["image"],
        "OUTPUT_BASE_URI": manifest_fields["output_base_uri"],
        "DATASET_SECRET": manifest_fields["dataset_secret"],
        "MODEL_SECRET": manifest_fields["model_secret"],
    }
    return [
        "## Kubernetes backend (`TUNELOOP_KUBERNETES_*`)",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        *(_row(f"{backend.ENV_PREFIX}{key}", field) for key, field in mapping.items()),
    ]


def _worker() -> list[str]:
    import typer.main

    from handlers.cli.main import app

    command = typer.main.get_command(app)
    run = command.commands["run"]  # type: ignore[attr-defined]
    rows = []
    for param in run.params:
        if not param.envvar:
            continue
        default = "(required)" if param.required else repr(param.default)
        flag = param.opts[0]
        help_text = (param.help or "").replace("|", "\\|")
        rows.append(f"| `{param.envvar}` | `{flag}` | `{default}` | {help_text} |")
    return [
        "## The worker (`tuneloop run`)",
        "",
        "| variable | option | default | meaning |",
        "| --- | --- | --- | --- |",
        *rows,
    ]


def settings_page() -> str:
    """The whole settings reference page."""
    lines = [
        "# Settings reference",
        "",
        "Generated from the settings' docstrings by `tuneloop reference settings`; do not edit.",
        "Every variable is optional unless marked required; unset ones keep their default.",
        "",
        *_worker(),
        "",
        *_kafka(),
        "",
        *_kubernetes(),
    ]
    return "\n".join(lines) + "\n"


def cli_page() -> str:
    """Every `tuneloop` command with its arguments and options."""
    import typer.main

    from handlers.cli.main import app

    lines = [
        "# CLI reference",
        "",
        "Generated from the commands by `tuneloop reference cli`; do not edit by hand.",
        "",
    ]

    # typer vendors its own click, so commands are inspected by shape, not by class.
    def walk(command: Any, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name in sorted(subcommands):
                walk(subcommands[name], f"{path} {name}")
            return
        summary = " ".join((command.help or "").split())
        lines.extend([f"## `{path}`", "", summary, ""])
        rows = []
        for param in command.params:
            if param.param_type_name == "argument":
                rows.append(f"| `{(param.name or '').upper()}` | (argument) | |")
                continue
            if param.param_type_name != "option" or param.name == "help":
                continue
            default = "" if param.required or param.default is None else repr(param.default)
            meaning = " ".join((param.help or "").split()).replace("|", "\\|")
            env = f" (`{param.envvar}`)" if param.envvar else ""
            rows.append(f"| `{'`, `'.join(param.opts)}`{env} | `{default}` | {meaning} |")
        if rows:
            lines.extend(["| option | default | meaning |", "| --- | --- | --- |", *rows, ""])

    walk(typer.main.get_command(app), "tuneloop")
    return "\n".join(lines).rstrip() + "\n"
